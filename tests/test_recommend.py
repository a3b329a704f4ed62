"""`sweep recommend`: objective, constraints (headroom, max GPUs, budget, deadline), robust
runner-ups, recipe files and the hook at the end of a search."""

from __future__ import annotations

import numpy as np

import json

import pytest

from sweep.advice import recommend as R
from sweep.cli import main
from sweep.errors import SweepError

from .results_fixture import make_results

SPACE = {
    "name": "rec", "model": "gpt3-175b", "seq_len": 2048, "global_batch": 1536,
    "cluster": {"gpu": "a100-80gb", "num_gpus": 512},
    "space": {"gpu": ["a100-80gb", "h100-sxm"], "num_gpus": [512, 1024], "tp": [4, 8],
              "pp": [4, 8, 16], "vpp": [1, 2], "micro_batch": [1, 2],
              "recompute": ["none", "selective", "full"], "sequence_parallel": [True],
              "zero": [1]},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_results(SPACE, tmp_path_factory.mktemp("rec") / "run")


@pytest.fixture(scope="module")
def df(run):
    return R.load_run(run)[0]


def test_parsers():
    assert R.parse_tokens("300B") == 300e9 and R.parse_tokens("1.5T") == 1.5e12
    assert R.parse_tokens("3e11") == 3e11 and R.parse_tokens("500M tokens") == 5e8
    assert R.parse_headroom("8") == (8.0, "gib") and R.parse_headroom("8GiB") == (8.0, "gib")
    assert R.parse_headroom("10%") == (0.1, "frac") and R.parse_headroom("0.25") == (0.25, "frac")
    for bad in ("x", "-1", "150%"):
        with pytest.raises(SweepError):
            R.parse_headroom(bad)
    with pytest.raises(SweepError):
        R.parse_tokens("lots")


def test_best_is_fastest_fit(df):
    # by default: the fastest that fits with an OOM risk within the margin
    rec = R.recommend(df)
    ok = df[(df["status"] == "ok") & (df["oom_risk"] <= R.DEFAULT_MAX_RISK)]
    assert rec.found and rec.best["step_time_s"] == ok["step_time_s"].min()
    assert rec.best["status"] == "ok" and rec.best["oom_risk"] <= R.DEFAULT_MAX_RISK
    assert dict(rec.dropped)["oom_risk"] > 0  # this space has fits that are too risky
    # --headroom 0: the raw ranking
    raw = R.recommend(df, constraints=R.Constraints(headroom="0"))
    assert raw.best["step_time_s"] == df[df["status"] == "ok"]["step_time_s"].min()
    assert raw.best["step_time_s"] < rec.best["step_time_s"]
    assert "OOM risk <= 10%" in " ".join(rec.constraints.describe())


def test_oom_risk_grows_with_peak_and_framework_spread():
    from sim_core.risk import oom_risk
    from sim_core.specs import FRAMEWORK
    mt, tt = FRAMEWORK.index("megatron-core"), FRAMEWORK.index("torchtitan")
    r = oom_risk(np.array([40.0, 70.0, 79.0, 90.0]), 80.0, np.full(4, mt))
    assert np.all(np.diff(r) > 0) and r[0] < 0.01 and r[-1] > 0.5
    # torchtitan's memory error is measured (narrow); an unmeasured framework's is wide
    assert oom_risk(np.array([72.0]), 80.0, [tt])[0] < oom_risk(np.array([72.0]), 80.0, [mt])[0]


def test_objective_cost(df):
    rec = R.recommend(df, "cost", constraints=R.Constraints(headroom="0"))
    assert rec.best["cost_per_mtok_usd"] == df[df["status"] == "ok"]["cost_per_mtok_usd"].min()


def test_constraints(df):
    d = R.derive(df)
    rec = R.recommend(df, constraints=R.Constraints(headroom="20"))
    assert rec.best["headroom_gib"] >= 20
    fit = d[(d["status"] == "ok") & (d["headroom_gib"] >= 20)]
    assert rec.best["step_time_s"] == fit["step_time_s"].min()
    rec = R.recommend(df, constraints=R.Constraints(headroom="40%"))
    assert rec.best["peak_memory_gib"] <= 0.6 * rec.best["capacity_gib"] + 1e-9
    rec = R.recommend(df, constraints=R.Constraints(max_gpus=512, gpus=["a100-80gb"]))
    assert rec.best["num_gpus"] <= 512 and rec.best["gpu"] == "a100-80gb"
    # budget and deadline on a token budget
    d = R.derive(df, 300e9)
    fit = d[d["status"] == "ok"]
    budget = fit["total_cost_usd"].median()
    rec = R.recommend(df, constraints=R.Constraints(tokens=300e9, budget=budget, headroom="0"))
    assert rec.found and rec.best["total_cost_usd"] <= budget
    assert rec.best["step_time_s"] == fit[fit["total_cost_usd"] <= budget]["step_time_s"].min()
    slow_ok = R.recommend(df, "cost", R.Constraints(tokens=300e9, deadline=30))
    assert slow_ok.best["days"] <= 30
    none = R.recommend(df, constraints=R.Constraints(tokens=300e9, budget=1.0))
    assert not none.found and "no configuration meets" in R.render(none)
    with pytest.raises(SweepError):
        R.recommend(df, constraints=R.Constraints(budget=1e6))  # no --tokens


def test_robust_runner_ups(df):
    rec = R.recommend(df, within=0.10, runner_ups=50)
    best = rec.best
    assert len(rec.runner_ups)
    r = rec.runner_ups
    assert (r["step_time_s"] <= best["step_time_s"] * 1.10 + 1e-12).all()
    assert (r["headroom_gib"] > best["headroom_gib"]).all()
    assert list(r["headroom_gib"]) == sorted(r["headroom_gib"], reverse=True)
    # nothing that qualifies is missing
    d = R.derive(df)
    q = d[(d["status"] == "ok") & (d["step_time_s"] <= best["step_time_s"] * 1.10)
          & (d["headroom_gib"] > best["headroom_gib"])]
    assert len(q) == len(r)


def test_cli_table_formats_and_recipe(run, capsys):
    assert main(["recommend", str(run), "--headroom", "10%", "--tokens", "300B"]) == 0
    out = capsys.readouterr().out
    assert "best" in out and "$/Mtok" in out and "days" in out
    rec = json.loads((run / "recipe" / "recommendation.json").read_text())
    assert rec["best"]["status"] == "ok"
    for name in ("megatron_args.sh", "torchtitan.toml", "run.yaml", "recommendation.txt"):
        assert (run / "recipe" / name).exists()
    assert main(["recommend", str(run), "--format", "megatron", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "--tensor-model-parallel-size" in out and "MEGATRON_ARGS=(" in out
    assert main(["recommend", str(run), "--format", "torchtitan", "--no-write"]) == 0
    assert "[parallelism]" in capsys.readouterr().out
    assert main(["recommend", str(run), "--tokens", "1T", "--budget", "1"]) == 1
    assert main(["recommend", str(run), "--budget", "1"]) == 2
    assert "need --tokens" in capsys.readouterr().err
    assert main(["recommend", str(run.parent / "missing")]) == 2


def test_price_override(df):
    cheap = R.reprice(df, {"h100-sxm": 0.5})
    rec = R.recommend(cheap, "cost")
    assert rec.best["gpu"] == "h100-sxm" and rec.best["price_per_hour"] == 0.5


def test_recommend_after_search(run):
    text = R.recommend_after_search(run)
    assert "recommendation for rec" in text and "recipe" in text
    assert "(no recommendation" in R.recommend_after_search(run.parent / "nothing-here")


@pytest.mark.parametrize("objective,constraints", [
    ("step_time", {}), ("cost", {"max_gpus": 512}), ("throughput", {"headroom": "10%"}),
    ("days", {"tokens": 3e11, "gpus": ["h100-sxm"], "num_gpus": [1024]}),
    ("step_time", {"headroom": "0"}),
])
def test_streamed_recommendation_is_the_whole_frame_one(run, df, objective, constraints):
    """`sweep recommend` reads the results in pieces (two scans, pushdown near the best): the
    same best, runner-ups and counts as the selection over the whole frame."""
    import pandas as pd

    whole = R.recommend(df[R.SELECT_COLUMNS][df["status"] == "ok"].reset_index(drop=True),
                        objective, R.Constraints(**constraints), within=0.2, runner_ups=5)
    chunks, _ = R.fit_chunks(run)
    pieces = R.recommend_chunks(lambda near=None, only=None: (
        p for part in chunks(near, only) for p in (part.iloc[:7], part.iloc[7:])),
                                objective, R.Constraints(**constraints), within=0.2,
                                runner_ups=5)
    assert whole.found and pieces.found
    assert whole.best["config_id"] == pieces.best["config_id"]
    assert list(whole.runner_ups["config_id"]) == list(pieces.runner_ups["config_id"])
    assert len(whole.runner_ups) > 0 or objective == "days"
    assert (whole.candidates, whole.fits, whole.dropped) == \
        (pieces.candidates, pieces.fits, pieces.dropped)
    pd.testing.assert_series_equal(whole.best.drop("config_id"), pieces.best.drop("config_id"),
                                   check_names=False)


def _sorted_selection(df, objective, c, within, runner_ups):
    """The selection as one sort of every row (what recommend_chunks gave before it read the
    rows in two passes): best = first feasible row in the objective's order, runner-ups = the
    feasible rows within `within` of it with more headroom, most first."""
    col, asc = R.objective_column(objective, c.failures)
    d = R.derive(df, c.tokens, c.failures)
    mask, dropped = R.feasible(d, c)
    cand = d[mask & d[col].notna()]
    fits = int(((d["status"] == "ok") & d["step_time_s"].notna()).sum())
    if not len(cand):
        return None, [], len(cand), fits, dropped
    best = cand.sort_values([col, "headroom_gib", "num_gpus", "config_id"],
                            ascending=[asc, False, True, True], kind="stable").iloc[0]
    b = float(best[col])
    close = cand[cand[col] <= b * (1 + within)] if asc else cand[cand[col] >= b * (1 - within)]
    more = close[(close["headroom_gib"] > float(best["headroom_gib"]) + 1e-9)
                 & (close["config_id"] != best["config_id"])]
    ups = more.sort_values(["headroom_gib", col, "num_gpus", "config_id"],
                           ascending=[False, asc, True, True], kind="stable").head(runner_ups)
    return int(best["config_id"]), list(ups["config_id"]), len(cand), fits, dropped


@pytest.mark.parametrize("objective,constraints", [
    ("step_time", {}), ("step_time", {"headroom": "0"}), ("step_time", {"headroom": "20GiB"}),
    ("cost", {}), ("cost", {"failures": False, "max_gpus": 512}),
    ("throughput", {"num_gpus": [1024]}),
    ("days", {"tokens": 3e11, "deadline": 1e4}), ("cost", {"tokens": 3e11, "budget": 1e9}),
    ("step_time", {"gpus": ["a100-80gb"], "max_oom_risk": 0.5}),
])
@pytest.mark.parametrize("within,runner_ups", [(0.05, 3), (0.3, 1), (0.3, 6)])
def test_two_pass_selection_is_one_sort_of_every_row(run, df, objective, constraints, within,
                                                     runner_ups):
    """The first pass reads a few columns of every row that fits (count_columns), the second
    every column of the rows near the best value only, and the runner-ups are kept a piece at a
    time: the best, runner-ups and counts are still those of one sort of every row, for every
    objective, with constraints and without (pieces of 5 rows, so that the runner-ups and ties
    span pieces)."""
    c = R.Constraints(**constraints)
    ok = df[df["status"] == "ok"].reset_index(drop=True)
    want = _sorted_selection(ok, objective, c, within, runner_ups)
    chunks, _ = R.fit_chunks(run)
    seen = []

    def pieces(near=None, only=None):
        for part in chunks(near, only):
            seen.append((near, list(part.columns)))
            yield from (part.iloc[i:i + 5] for i in range(0, len(part), 5))

    rec = R.recommend_chunks(pieces, objective, c, within, runner_ups)
    assert want[0] is not None and rec.found
    assert (int(rec.best["config_id"]), list(rec.runner_ups["config_id"]), rec.candidates,
            rec.fits, rec.dropped) == want
    first = [cols for near, cols in seen if near is None]
    assert first and "framework" not in first[0]  # the first pass reads a few columns only
    if objective in ("step_time", "throughput") or (objective == "cost" and not c.failures):
        assert any(near is not None for near, _ in seen)  # the second pass is pushed down


def test_after_search_recipe_equals_a_full_scan(run, tmp_path):
    """recommend_after_search (two passes) writes the recipe files that the selection over the
    whole frame writes."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    R.recommend_after_search(copy)
    full, meta = R.load_run(copy)
    obj = R._default_objective(meta)
    rec = R.read_full(copy, R.recommend(full[R.READ_COLUMNS if "step_time_hi_s" in full
                                             else R.SELECT_COLUMNS], obj,
                                        run_name=str(meta.get("space", ""))))
    from sweep.engine.evaluate import profile_line

    rec.profile = profile_line(meta) or ""
    R.write_recipe(rec, tmp_path / "whole")
    got = sorted(p.name for p in (copy / "recipe").iterdir())
    assert got == sorted(p.name for p in (tmp_path / "whole").iterdir())
    for name in got:
        assert (copy / "recipe" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


@pytest.mark.parametrize("within,runner_ups", [(0.05, 3), (0.3, 2)])
def test_two_pass_selection_with_a_calibrated_quantile(df, within, runner_ups):
    """Results of a run calibration rank the step time objective by its 90% quantile, which is
    no stored column to push down: the second pass reads every row (near None) and still gives
    one sort's answer, which differs here from the step time's."""
    ok = df[df["status"] == "ok"].reset_index(drop=True)
    ok["step_time_hi_s"] = ok["step_time_s"] * (1.0 + 0.37 * ((ok["config_id"] * 7919) % 13) / 13)
    ok.loc[::4, "step_time_hi_s"] = np.nan  # rows without a quantile rank by the step time
    fastest = _sorted_selection(ok.drop(columns="step_time_hi_s"), "step_time", R.Constraints(),
                                within, runner_ups)[0]
    fast = ok["config_id"] == fastest  # the fastest, but uncertain
    ok.loc[fast, "step_time_hi_s"] = ok.loc[fast, "step_time_s"] * 1.5
    calls = []

    def chunks(near=None, only=None):
        calls.append(near)
        f = ok
        if near is not None:
            col, lo, hi = near
            f = f[(f[col] >= lo) & (f[col] <= hi)]
        if only is not None:
            f = f[[c for c in f.columns if c in only]]
        yield from (f.iloc[i:i + 5] for i in range(0, len(f), 5))

    c = R.Constraints()
    rec = R.recommend_chunks(chunks, "step_time", c, within, runner_ups)
    want = _sorted_selection(ok, "step_time", c, within, runner_ups)
    assert (int(rec.best["config_id"]), list(rec.runner_ups["config_id"]), rec.candidates,
            rec.fits, rec.dropped) == want
    assert calls == [None, None]
    plain = _sorted_selection(ok.drop(columns="step_time_hi_s"), "step_time", c, within,
                              runner_ups)
    assert plain[:2] != want[:2]
