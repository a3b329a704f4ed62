"""Shared test fixtures."""

import os
from pathlib import Path

import pytest

# Ray workers started by the tests import the fakes as `tests.fakes`: they inherit this
ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray for the tests of one module (left alone if one is already running)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def isolated_profiles(tmp_path, monkeypatch):
    """Calibration profiles in a fresh folder, default models before and after the test."""
    from sim_core import profiles

    monkeypatch.setenv("SWEEP_PROFILES", str(tmp_path / "profiles"))
    profiles.deactivate()
    yield
    profiles.deactivate()


RL_EXAMPLE = "search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"


@pytest.fixture
def rl_rollout_flag(tmp_path, capsys):
    """For a `rollout:` flag of the RL run file: (generation seconds of the shipped example,
    with the flag set, and the one-line error `sweep simulate` gives when the flag is set on
    an SGLang rollout, which none of these vLLM flags applies to)."""
    import yaml

    import sweep
    from sweep.cli.main import main

    def run(flag: str, value=True):
        src = yaml.safe_load(open(RL_EXAMPLE))
        base = sweep.simulate(RL_EXAMPLE).gen_time_s.iloc[0]
        src["rollout"][flag] = value
        f = tmp_path / f"{flag}.yaml"
        f.write_text(yaml.safe_dump(src))
        flagged = sweep.simulate(str(f)).gen_time_s.iloc[0]
        src["rollout"]["engine"] = "sglang"
        f.write_text(yaml.safe_dump(src))
        capsys.readouterr()
        rc = main(["simulate", str(f)])
        err = capsys.readouterr().err.strip().splitlines()
        return base, flagged, rc, err

    return run
