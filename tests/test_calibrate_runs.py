"""`sweep calibrate runs`: the terms of the step fitted to a user's own runs, chosen by grouped
cross-validation.

The runs are real public run tables shipped in sim_core/data/runs/ (README there cites them);
the perturbation tests scale their measured step times to stand for a cluster that differs in
a known way."""

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim_core import memory, profiles, terms
from sim_core.calibration import runs as runs_fit
from sim_core.simulate import simulate_frame

pytestmark = pytest.mark.usefixtures("isolated_profiles")

TABLES = Path(str(resources.files("sim_core").joinpath("data/runs")))
LAUNCHER = TABLES / "table_nemo_launcher_gpt3_scaling.csv"
MLM2020 = TABLES / "table_megatron_readme_2020.csv"
JAN2021 = TABLES / "table_megatron_readme_jan2021.csv"
LONGSEQ = TABLES / "table_nemo_long_sequence_cp.csv"


def _copy(tmp_path, src, name="runs.csv", status=None, drop=(), time_factor=None):
    raw = pd.read_csv(src, dtype=str, keep_default_na=False)
    if status is not None:
        raw["status"] = [status.get(i, "ok") for i in raw["id"]]
    if time_factor is not None:
        f = time_factor(raw)
        for col in ("step_time_s", "derived_step_time_s"):
            v = pd.to_numeric(raw[col], errors="coerce") * f
            raw[col] = v.map(lambda x: "" if pd.isna(x) else f"{x:.6g}")
        for col in ("tokens_per_s_per_gpu", "derived_tokens_per_s_per_gpu", "tflops_per_gpu",
                    "mfu_pct", "hfu_pct"):
            v = pd.to_numeric(raw[col], errors="coerce") / f
            raw[col] = v.map(lambda x: "" if pd.isna(x) else f"{x:.6g}")
    raw = raw.drop(columns=list(drop))
    p = tmp_path / name
    raw.to_csv(p, index=False)
    return p


def test_failed_is_unknown_by_default_and_an_oom_bound_when_asked(tmp_path):
    p = _copy(tmp_path, JAN2021, status={"mlmjan2021-1": "failed"})
    ids = pd.read_csv(p)["id"]
    assert "mlmjan2021-1" in set(ids)
    runs = runs_fit.load_runs(p)
    row = runs[runs["id"] == "mlmjan2021-1"].iloc[0]
    assert row["skip"].startswith("status failed: unknown cause")
    runs = runs_fit.load_runs(p, failed_as="oom")
    row = runs[runs["id"] == "mlmjan2021-1"].iloc[0]
    assert row["skip"] == "" and row["status"] == "oom" and row["failed_as_oom"]
    bad = _copy(tmp_path, JAN2021, status={"mlmjan2021-1": "crashed"}, name="bad.csv")
    with pytest.raises(ValueError, match="status: 'crashed' is not one of ok, oom, failed"):
        runs_fit.load_runs(bad)


def test_messy_table_calibrates_and_says_what_it_skipped(tmp_path, capsys):
    """Rows the simulator rejects (the launcher's 5B on 5/9/10/18/20 nodes: GBS 2048 does not
    divide by DP x MBS), a failed row and no memory column: the fit runs, the summary counts
    each reason, and --failed-as oom counts the OOM bounds."""
    from sweep.cli import main

    p = _copy(tmp_path, LAUNCHER, status={"nemolauncher-v2023-5B-4n": "failed"},
              drop=("peak_mem_gib",))
    assert main(["calibrate", "runs", str(p), "--profile", "messy"]) == 0
    out = capsys.readouterr().out
    assert "simulator rejects the layout: global_batch % (dp*micro_batch) != 0" in out
    assert "skipped     5: simulator rejects" in out
    assert "skipped     1: status failed: unknown cause" in out
    assert "21 runs, 15 usable, 6 skipped" in out
    assert main(["calibrate", "runs", str(p), "--profile", "messy", "--failed-as", "oom"]) == 0
    out = capsys.readouterr().out
    assert "1 failed runs taken as OOM bounds" in out and "(1 OOM bounds" in out


def test_no_usable_run_says_why(tmp_path, capsys):
    from sweep.cli import main

    raw = pd.read_csv(MLM2020, dtype=str, keep_default_na=False)
    raw = raw[raw["gpu"].str.contains("V100")]
    p = tmp_path / "v100.csv"
    raw.to_csv(p, index=False)
    assert main(["calibrate", "runs", str(p), "--profile", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("error: v100.csv: no usable run (unknown GPU 'V100 (DGX-2)' x4)")


def test_a_numerical_failure_is_one_line_naming_the_runs(tmp_path):
    d = runs_fit.prepare(runs_fit.load_runs(JAN2021))
    d.t_meas[2] = 0.0  # a measured step time of zero: log residual is infinite
    with pytest.raises(runs_fit.CalibrationError, match=r"run\(s\) mlmjan2021-3"):
        runs_fit.fit(d, ["compute"])


def test_a_node_count_slowdown_is_found_by_cv_and_fitted_with_its_uncertainty(tmp_path):
    """Measured times of a real table made (1 + 0.03 log2 nodes) slower: grouped CV frees
    node_c, the fit lands near 0.03 with a finite uncertainty, and the calibrated model beats
    the white-box on both groupings."""
    def factor(raw):
        nodes = np.ceil(pd.to_numeric(raw["num_gpus"]) / 8)
        return 1 + 0.03 * np.log2(nodes)

    p = _copy(tmp_path, JAN2021, time_factor=factor)
    d = runs_fit.prepare(runs_fit.load_runs(p))
    cal = runs_fit.calibrate(d)
    assert cal.accepted and "node_c" in cal.free
    assert 0.015 < cal.fit.params["node_c"] <= 0.05
    assert np.isfinite(cal.fit.sd["node_c"]) and cal.fit.sd["node_c"] > 0
    for k in cal.folds:
        assert cal.cv_after[k]["step"] < cal.cv_before[k]["step"]


def test_a_term_the_runs_do_not_need_stays_at_its_prior(tmp_path):
    """Times that the white-box model's own predictions explain exactly: no term lowers the
    grouped-CV error, so none is freed and the white-box is kept."""
    d = runs_fit.prepare(runs_fit.load_runs(JAN2021))
    d.t_meas = runs_fit.predict_arrays(d, runs_fit.white_box().params)["step_s"].copy()
    cal = runs_fit.calibrate(d)
    assert not cal.accepted and cal.free == []
    assert cal.fit.params == runs_fit.white_box().params


def test_an_oom_run_bounds_memory_from_below(tmp_path):
    """A run that the model says fits, marked out of memory: the memory terms grow until the
    model no longer fits it."""
    d = runs_fit.prepare(runs_fit.load_runs(LONGSEQ))
    before = runs_fit.predict_arrays(d, runs_fit.white_box().params)
    i = int(np.argmax(before["device_gib"] / d.cap))
    assert before["fits"][i]
    d.oom[i], d.ok[i] = True, False
    d.t_meas[i] = np.nan
    f = runs_fit.fit(d, ["mem_fixed_gib", "mem_act_scale"])
    after = runs_fit.predict_arrays(d, f.params)
    assert after["device_gib"][i] > before["device_gib"][i]


def test_fitted_terms_are_applied_inside_simulate_and_deactivate_restores(tmp_path):
    runs = runs_fit.load_runs(JAN2021)
    use = runs[runs["skip"] == ""].reset_index(drop=True)
    base = simulate_frame(use)
    params = {"compute": 1.1, "tp_cp_ep": 1.5, "host_step_s": 0.2, "host_mb_s": 0.003,
              "node_c": 0.02, "mem_fixed_gib": 2.0, "mem_fw:megatron-core": 1.0}
    runs_fit.install(params)
    try:
        cal = simulate_frame(use)
    finally:
        runs_fit.uninstall()
    parts = [c for c in cal.columns if c.startswith("time_")]
    assert {"time_host", "time_nodes"} <= set(parts)
    assert np.allclose(cal[parts].sum(axis=1), cal["step_time_s"])
    d = runs_fit.prepare(runs)
    fast = runs_fit.predict_arrays(d, params)
    assert np.allclose(cal["step_time_s"], fast["step_s"], rtol=1e-9)
    assert np.allclose(cal["peak_reserved_gib"] - base["peak_reserved_gib"], 3.0)
    assert terms.current() == terms.DEFAULT and memory._overhead is None
    assert np.array_equal(simulate_frame(use)["step_time_s"], base["step_time_s"])


def test_cli_profile_changes_simulate_and_names_itself(tmp_path, capsys):
    from sweep.cli import main

    assert main(["calibrate", "runs", str(LONGSEQ), "--fit", "label == 'LLAMA2-7B'",
                 "--profile", "cp", "--markdown", "--plot", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "grouped CV, leave one cluster size out (white-box -> calibrated)" in out
    assert "OOM verdict accuracy" in out and "by cluster size:" in out
    assert "+-" in out  # uncertainties of the fitted terms
    assert sorted(p.name for p in (tmp_path / "plots").iterdir())[0].endswith("gpus.png")
    man = profiles.activate("cp")
    try:
        assert man["components"]["runs"]["accepted"]
        line = profiles.active_line()
        assert f"cp version {man['version']}" in line and "grouped-CV median step error" in line
        runs = runs_fit.load_runs(LONGSEQ)
        use = runs[runs["skip"] == ""].reset_index(drop=True)
        on = simulate_frame(use)["step_time_s"].to_numpy()
    finally:
        profiles.deactivate()
    off = simulate_frame(use)["step_time_s"].to_numpy()
    ok = np.isfinite(on) & np.isfinite(off)
    assert not np.allclose(on[ok], off[ok])
    assert "runs (" in profiles.describe("cp")


@pytest.mark.parametrize("table,small", [
    (LAUNCHER, "params_b < 175"), (MLM2020, "params_b < 8"), (JAN2021, "params_b < 1000"),
    (LONGSEQ, "label == 'LLAMA2-7B'")])
def test_shipped_tables_grouped_cv_never_worse(table, small):
    """Fit on the smaller models of each shipped table: on grouped CV the calibrated model is
    never worse than the white-box (it is kept otherwise)."""
    runs = runs_fit.load_runs(table)
    runs = runs[runs["skip"] == ""]
    d = runs_fit.prepare(runs)
    mask = d.runs.eval(small, engine="python").to_numpy(bool)
    cal = runs_fit.calibrate(d.subset(np.flatnonzero(mask)))
    for k in cal.folds:
        assert cal.cv_after[k]["step"] <= cal.cv_before[k]["step"]


def test_fit_small_models_predict_large_ones_better_on_a_shipped_table():
    """The NeMo long-sequence table: fitted on Llama-2-7B (H100), the calibrated model predicts
    the held-out Llama-3-8B runs better than the white-box; so does the Jan-2021 Megatron table
    for its largest model (1T on 3072 GPUs) fitted on the others."""
    for table, small in ((LONGSEQ, "label == 'LLAMA2-7B'"), (JAN2021, "params_b < 1000")):
        d = runs_fit.prepare(runs_fit.load_runs(table))
        mask = d.runs.eval(small, engine="python").to_numpy(bool)
        cal = runs_fit.calibrate(d.subset(np.flatnonzero(mask)))
        held = d.subset(np.flatnonzero(~mask))
        before = runs_fit.metrics(held, runs_fit.predict_arrays(held, runs_fit.white_box().params))
        after = runs_fit.metrics(held, runs_fit.predict_arrays(held, cal.fit.params))
        assert after["step"] < before["step"]


def _split(table, small):
    d = runs_fit.prepare(runs_fit.load_runs(table))
    mask = d.runs.eval(small, engine="python").to_numpy(bool)
    return d.subset(np.flatnonzero(mask)), d.subset(np.flatnonzero(~mask))


def _held_errors(held, params):
    return (runs_fit.metrics(held, runs_fit.predict_arrays(held, runs_fit.white_box().params))[
        "step"], runs_fit.metrics(held, runs_fit.predict_arrays(held, params))["step"])


@pytest.mark.parametrize("table,small", [
    (LAUNCHER, "params_b < 175"), (MLM2020, "params_b < 8"), (JAN2021, "params_b < 1000"),
    (LONGSEQ, "label == 'LLAMA2-7B'")])
def test_held_out_larger_models_are_never_worse_than_the_white_box(table, small):
    """The issue's bar: fitted on the smaller models of each shipped table, the held-out larger
    models are predicted no worse than by the white-box model."""
    train, held = _split(table, small)
    cal = runs_fit.calibrate(train)
    before, after = _held_errors(held, cal.fit.params)
    assert after <= before + 1e-9


def test_a_correction_that_drifts_with_model_size_is_not_extrapolated_upwards():
    """Megatron 2020: the white-box error drifts with size (1-4B slower than predicted), so a
    term selected on 1-4B overshoots above them; the upward fold (fit on 1-2B, predict 4B) and
    the extrapolation check both see it on the fitted runs alone and keep the white-box, and the
    held-out 8B stays at the white-box error (freeing the selected terms would make it worse)."""
    train, held = _split(MLM2020, "params_b < 8")
    cal = runs_fit.calibrate(train)
    assert cal.selected and not cal.accepted
    assert cal.rejected_by in ("the upward check", "extrapolation to a larger model")
    up = cal.up_folds["model size"]
    assert runs_fit.fold_metrics(train, cal.selected, up)["step"] > \
        runs_fit.fold_metrics(train, [], up)["step"]
    ext = cal.extrapolation
    assert abs(ext["calibrated"]) > abs(ext["white_box"]) and ext["trend_white_box"] > 0
    forced = runs_fit.fit(train, cal.selected)
    before, after = _held_errors(held, forced.params)
    assert after > before  # what the check prevented


def test_the_extrapolation_check_follows_the_trend_of_the_largest_sizes():
    """A synthetic drift: measured = white-box x (1 + 5% per doubling of model size) on the
    Jan-2021 table. The white-box error extrapolated one size up follows that trend (about -5%
    per doubling), while a table with a flat error extrapolates flat."""
    d = runs_fit.prepare(runs_fit.load_runs(JAN2021))
    wb = runs_fit.predict_arrays(d, runs_fit.white_box().params)
    x = runs_fit.model_size(d.runs)
    d.t_meas = wb["step_s"] * np.exp(0.05 * (x - x.min()))
    e = runs_fit.size_extrapolation(d, wb)
    assert e["per_doubling"] == pytest.approx(-0.05, abs=1e-6)
    top = np.unique(x)[-3:]
    assert e["error"] == pytest.approx(np.expm1(-0.05 * (top[-1] + np.median(np.diff(top))
                                                         - x.min())), rel=1e-6)
    d.t_meas = wb["step_s"] * 1.1
    assert runs_fit.size_extrapolation(d, wb)["per_doubling"] == pytest.approx(0.0, abs=1e-9)
    two = d.subset(np.flatnonzero(x <= np.unique(x)[1]))  # two sizes: no trend to check
    assert runs_fit.size_extrapolation(
        two, runs_fit.predict_arrays(two, runs_fit.white_box().params)) is None


def test_learning_curve_command_prints_a_row_per_size(capsys):
    from sweep.cli import main

    assert main(["calibrate", "learning-curve", str(JAN2021), "--sizes", "3,6,20",
                 "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [r for r in out if r.startswith("| table_megatron_readme_jan2021")]
    assert [r.split("|")[3].strip() for r in rows] == ["3", "6"]  # 20 > the 10 usable runs


def test_cli_bad_expression_is_one_line(capsys):
    from sweep.cli import main

    assert main(["calibrate", "runs", str(JAN2021), "--fit", "nonsense ==", "--profile",
                 "x"]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --fit: cannot evaluate")


def test_a_learned_residual_is_kept_where_cv_shows_it_helps_and_flags_extrapolation(
        tmp_path, capsys):
    """The shipped published runs with every run of 4 pipeline stages or more made 1.5x
    slower: no global term expresses a slowdown of deep pipelines only (the pipeline scale
    moves the bubble and transfers of every pipelined run), the XGBoost residual on scale-free
    features does (the upward fold over GPU counts says so), it is applied inside simulate, and
    a configuration outside the fitted range is flagged and takes the residual of its edge."""
    from sim_core.accuracy.validation import dataset_path
    from sweep.cli import main

    piped = lambda raw: np.where(pd.to_numeric(raw["pp"], errors="coerce") >= 4,  # noqa
                                 1.5, 1.0)
    p = _copy(tmp_path, dataset_path(), time_factor=piped)
    assert main(["calibrate", "runs", str(p), "--profile", "res"]) == 0
    out = capsys.readouterr().out
    assert "kept: it lowers the upward error" in out
    man = profiles.load_manifest(profiles.profile_dir("res"))
    c = man["components"]["runs"]
    gating = {k: v for k, v in c["residual_cv"].items()
              if not k.startswith(runs_fit.UP) or v["timed"] >= runs_fit.MIN_UP_RUNS}
    assert "residual" in c and all(v["with"] < v["without"] for v in gating.values())
    runs = runs_fit.load_runs(dataset_path())
    use = runs[(runs["skip"] == "") & (runs["pp"] >= 4)].head(3).reset_index(drop=True)
    big = use.iloc[[0]].copy()
    rng = c["residual"]["range"]
    # far more micro-batches per pipeline stage than any fitted run: outside the range
    hi = 2.0 ** rng["hi"][rng["names"].index("log2_microbatches_per_stage")]
    big["global_batch"] = big["global_batch"] * 2.0 ** np.ceil(np.log2(4 * hi))
    frame = pd.concat([use, big], ignore_index=True)
    off = simulate_frame(frame)["step_time_s"].to_numpy()
    profiles.activate("res")
    try:
        on = simulate_frame(frame)
    finally:
        profiles.deactivate()
    flag = on["residual_extrapolated"].to_numpy()
    assert list(flag) == [0, 0, 0, 1]
    terms_only = runs_fit.predict_arrays(runs_fit.prepare(frame.assign(status="ok")),
                                         c["terms"])["step_s"]
    step_on = on["step_time_s"].to_numpy()
    assert np.all(step_on > 1.2 * off)  # the profile learned the 1.5x, flagged row included
    assert not np.allclose(step_on, terms_only, rtol=1e-6)  # the residual acts inside simulate
    assert "residual_extrapolated" not in simulate_frame(frame).columns


def test_search_recommend_and_report_say_the_profile_is_active(tmp_path, capsys):
    """A profile with a runs component: `sweep search --profile` simulates with it and says
    so (name, version, grouped-CV error); the results remember it for recommend and the
    report."""
    from sweep.cli import main

    info = {"terms": {"compute": 1.3}, "free": ["compute"], "accepted": True, "rows": 4,
            "cv_before": {}, "cv_after": {}, "cv_step_error": 0.05}
    man = profiles.save_component("slowc", "runs", info, [JAN2021], lambda d: [])
    quick = Path(__file__).resolve().parents[1] / "search_spaces" / "quickstart.yaml"
    line = (f"calibration profile slowc version {man['version']} active (runs); run "
            "calibration accepted at grouped-CV median step error 5.0%")
    assert main(["search", str(quick), "--out", str(tmp_path / "q"), "--workers", "1",
                 "--no-progress", "--profile", "slowc"]) == 0
    out = capsys.readouterr().out
    assert out.count(line) == 2  # at the start of the search and in its recommendation
    assert main(["recommend", str(tmp_path / "q"), "--no-write"]) == 0
    assert line in capsys.readouterr().out
    assert main(["report", str(tmp_path / "q"), "--out", str(tmp_path / "r")]) == 0
    assert line in (tmp_path / "r" / "report.html").read_text()
    profiles.deactivate()
    assert main(["search", str(quick), "--out", str(tmp_path / "d"), "--workers", "1",
                 "--no-progress"]) == 0
    assert "calibration profile" not in capsys.readouterr().out
