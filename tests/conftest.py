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
