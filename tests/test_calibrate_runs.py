"""`sweep calibrate runs`: interpretable scales fitted to a user's own runs, with priors.

The runs are rows of the shipped published-runs file (real measurements); the perturbation
tests scale their measured step times to stand for a slower cluster."""

import numpy as np
import pandas as pd
import pytest

from sim_core import compute, memory, nccl, profiles
from sim_core.calibration import runs as runs_fit
from sim_core.accuracy.validation import dataset_path

TITAN_8B_H100 = ["55", "56", "62", "63"]  # torchtitan Dec-2024, Llama 3.1 8B, H100 96GB


pytestmark = pytest.mark.usefixtures("isolated_profiles")


def _csv(tmp_path, ids, status=None, scale_time=1.0, name="runs.csv"):
    raw = pd.read_csv(dataset_path(), dtype=str, keep_default_na=False)
    raw = raw[raw["id"].isin(ids)].copy()
    for col in ("step_time_s", "derived_step_time_s", "tokens_per_s_per_gpu",
                "derived_tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct", "hfu_pct"):
        v = pd.to_numeric(raw[col], errors="coerce")
        f = scale_time if "step_time" in col else 1 / scale_time
        raw[col] = (v * f).map(lambda x: "" if pd.isna(x) else f"{x:.6g}")
    if status is not None:
        raw["status"] = [status.get(i, "ok") for i in raw["id"]]
    p = tmp_path / name
    raw.to_csv(p, index=False)
    return p


def test_status_column_oom_kept_failed_skipped_bad_value_named(tmp_path):
    p = _csv(tmp_path, TITAN_8B_H100 + ["57"], status={"57": "failed", "56": "OOM"})
    runs = runs_fit.load_runs(p)
    use = runs[runs["skip"] == ""]
    assert set(use["id"]) == {"55", "56", "62", "63"}
    assert runs.loc[runs["id"] == "57", "skip"].iat[0].startswith("status failed")
    assert use.loc[use["id"] == "56", "status"].iat[0] == "oom"
    bad = _csv(tmp_path, TITAN_8B_H100, status={"55": "crashed"}, name="bad.csv")
    with pytest.raises(ValueError, match="status: 'crashed' is not one of ok, oom, failed"):
        runs_fit.load_runs(bad)


def test_free_parameters_are_what_the_runs_can_see(tmp_path):
    runs = runs_fit.load_runs(_csv(tmp_path, TITAN_8B_H100))
    free = runs_fit.free_parameters(runs)
    names = [n for n, _ in free]
    assert ("gemm", "h100-96gb") in free and "nic_bw" in names  # 128 GPUs span nodes
    assert "mem_fixed_gib" in names  # peak memory is measured on these rows
    single = runs_fit.load_runs(_csv(tmp_path, ["55", "56"], name="one.csv"))
    assert "nic_bw" not in [n for n, _ in runs_fit.free_parameters(single)]


def test_a_slower_cluster_moves_compute_down_and_priors_limit_it(tmp_path):
    """Runs 25% slower than published: the compute scale falls, but a prior keeps four runs
    from explaining it all (the fit lands between the white-box model and the data)."""
    runs = runs_fit.load_runs(_csv(tmp_path, TITAN_8B_H100, scale_time=1.25))
    free = [("gemm", "h100-96gb"), ("attention", "h100-96gb")]
    base = runs_fit.errors(runs, runs_fit.predict(runs))["step_error"]
    s = runs_fit.fit(runs, free)
    after = runs_fit.errors(runs, runs_fit.predict(runs, s))["step_error"]
    assert s.gemm["h100-96gb"] < 0.95
    assert after.abs().median() < base.abs().median()
    # a tighter prior moves it less
    wide = s.gemm["h100-96gb"]
    old = dict(runs_fit.PRIOR_SIGMA)
    try:
        runs_fit.PRIOR_SIGMA.update(gemm=0.03, attention=0.03)
        tight = runs_fit.fit(runs, free).gemm["h100-96gb"]
    finally:
        runs_fit.PRIOR_SIGMA.clear()
        runs_fit.PRIOR_SIGMA.update(old)
    assert wide < tight < 1.0


def test_an_oom_run_bounds_memory_from_below(tmp_path):
    """Mark a run that the model says fits as out of memory: the fitted memory overhead must
    grow until the model no longer fits it."""
    runs = runs_fit.load_runs(_csv(tmp_path, ["55", "62"], status={"62": "oom"}))
    runs = runs.assign(measured_mem_gib=np.nan)  # only the OOM verdict speaks for memory
    before = runs_fit.predict(runs)
    assert before["fits"].all()
    free = [("mem_fixed_gib", None), ("mem_act_scale", None)]
    s = runs_fit.fit(runs, free)
    after = runs_fit.predict(runs, s)
    oom = (runs["status"] == "oom").to_numpy()
    assert s.mem_fixed_gib > 0 or s.mem_act_scale > 1
    assert after["device_gib"].to_numpy()[oom][0] > before["device_gib"].to_numpy()[oom][0]


def test_install_and_uninstall_are_exact(tmp_path):
    runs = runs_fit.load_runs(_csv(tmp_path, TITAN_8B_H100))
    base = runs_fit.predict(runs)
    s = runs_fit.RunScales(gemm={"h100-96gb": 0.8}, nic_bw=0.5, mem_fixed_gib=3.0,
                           mem_act_scale=1.1)
    p = runs_fit.predict(runs, s)
    assert (p["step_s"] > base["step_s"]).all()
    assert np.allclose(p["mem_gib"] - base["mem_gib"] > 3.0, True)
    assert compute._efficiency_scale is None and memory._overhead is None
    assert nccl.calibration()["scales"] == {}
    # other GPUs are not touched by an H100 scale
    a100 = runs_fit.load_runs(_csv(tmp_path, ["90"], name="a100.csv"))
    assert runs_fit.predict(a100, s)["step_s"].iat[0] == pytest.approx(
        runs_fit.predict(a100, runs_fit.RunScales(nic_bw=0.5))["step_s"].iat[0])


def test_cli_fits_saves_a_profile_that_simulate_applies(tmp_path, capsys):
    from sweep.cli import main

    p = _csv(tmp_path, TITAN_8B_H100 + ["90", "91"], scale_time=1.2)
    assert main(["calibrate", "runs", str(p), "--fit", "gpu == 'h100-96gb'", "--profile", "mine",
                 "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "leave-one-run-out" in out and "held-out runs (2)" in out
    assert "| runs | fitted on | held out |" in out
    man = profiles.activate("mine")
    assert man["components"]["runs"]["scales"]["gemm"]["h100-96gb"] < 1.0
    runs = runs_fit.load_runs(p).query("gpu == 'h100-96gb'")
    from sim_core.simulate import simulate_frame

    with_profile = simulate_frame(runs.reset_index(drop=True))["step_time_s"].to_numpy()
    profiles.deactivate()
    without = simulate_frame(runs.reset_index(drop=True))["step_time_s"].to_numpy()
    assert (with_profile > without).all()
    assert "runs (4 runs fitted)" in profiles.describe("mine")


def test_cli_bad_expression_is_one_line(tmp_path, capsys):
    from sweep.cli import main

    p = _csv(tmp_path, TITAN_8B_H100)
    assert main(["calibrate", "runs", str(p), "--fit", "nonsense ==", "--profile", "x"]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --fit: cannot evaluate")
