"""The Python API (`sweep.simulate`, `sweep.search` -> Results, `sweep.validate`): the same
numbers as the CLI, the CLI's one-line errors, Ray joined when it runs, and the Optuna journal
readable by optuna's own JournalStorage (what optuna-dashboard opens)."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest
import yaml

import sweep
from sweep.cli import main

from .results_fixture import ROOT

QUICKSTART = ROOT / "search_spaces" / "quickstart.yaml"
GPT3_RUN = ROOT / "search_spaces" / "examples" / "gpt3-175b-1024xa100.yaml"
RUN = {"model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
       "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
       "parallel": {"tp": 2, "pp": 1, "micro_batch": 1}}


def cli_json(*argv) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(list(argv)) == 0
    return json.loads(buf.getvalue())


# ---------------------------------------------------------------------------------------------
# simulate
# ---------------------------------------------------------------------------------------------
def test_simulate_yaml_and_dict_match_the_cli(tmp_path):
    rep = cli_json("simulate", str(GPT3_RUN), "--json")
    df = sweep.simulate(GPT3_RUN)
    assert isinstance(df, pd.DataFrame) and len(df) == 1
    r = df.iloc[0]
    assert r["step_time_s"] == rep["step_time_s"] and r["mfu"] == rep["mfu"]
    for k, v in rep["breakdown"].items():
        assert r[f"time_{k}"] == pytest.approx(v, rel=1e-12)
    assert r["cost_per_mtok_usd"] == pytest.approx(rep["cost_per_mtok_usd"], rel=1e-12)
    as_dict = sweep.simulate(yaml.safe_load(GPT3_RUN.read_text()))
    assert as_dict["step_time_s"].iloc[0] == rep["step_time_s"]


def test_simulate_dataframe_many_rows_with_invalid_ones():
    grid = pd.DataFrame({"tp": [1, 2, 3, 4, 8]}).assign(
        model="llama3.1-8b", seq_len=8192, global_batch=64, gpu="h100-sxm", num_gpus=8)
    out = sweep.simulate(grid)
    assert list(out["tp"]) == [1, 2, 3, 4, 8]
    assert list(out["status"] == "invalid") == [False, False, True, False, False]
    assert "tp" in out.loc[2, "invalid_reason"]
    # each valid row is what the run file of that row gives
    for i in (0, 1, 3, 4):
        one = sweep.simulate({**RUN, "parallel": {"tp": int(grid.loc[i, "tp"]), "pp": 1,
                                                 "micro_batch": 1}})
        assert out.loc[i, "step_time_s"] == pytest.approx(one["step_time_s"].iloc[0], rel=1e-12)
        assert out.loc[i, "peak_memory_gib"] == pytest.approx(one["peak_memory_gib"].iloc[0])
    assert out["cost_per_mtok_usd"].notna().sum() == 4


@pytest.mark.parametrize("bad, expect", [
    ({**RUN, "cluster": {"gpu": "h100-sxmm", "num_gpus": 8}}, "cluster.gpu: unknown gpu"),
    ({**RUN, "parallel": {"tp": 3}}, "configuration is invalid"),
    ({**RUN, "space": {"tp": [1, 2]}}, "use sweep.search"),
    ({**RUN, "seq_lenn": 8192}, "seq_lenn"),
    (pd.DataFrame({"model": ["llama3.1-8b"], "seq_len": [8192], "global_batch": [64],
                   "gpu": ["h100-sxm"], "num_gpus": [8], "tpp": [2]}), "did you mean 'tp'"),
    (pd.DataFrame({"model": ["llama3.1-8b"], "seq_len": [8192], "global_batch": [64],
                   "gpu": ["h100-sxmm"], "num_gpus": [8]}), "h100-sxmm"),
    (42, "expected a dict, a YAML path or a DataFrame"),
    ("/nonexistent/run.yaml", "no such file"),
])
def test_simulate_errors_are_one_line(bad, expect):
    with pytest.raises(sweep.SweepError) as exc:
        sweep.simulate(bad)
    msg = str(exc.value)
    assert expect in msg and "\n" not in msg


# ---------------------------------------------------------------------------------------------
# search and Results
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def searched(tmp_path_factory, local_ray):
    out = tmp_path_factory.mktemp("api") / "qs"
    return sweep.search(QUICKSTART, out, workers=2)


def test_search_joins_the_running_ray_and_leaves_it(searched):
    import ray

    assert ray.is_initialized()  # the module's Ray was used, not shut down
    from sweep.config import load_space
    from sweep.engine.space import Space

    assert isinstance(searched, sweep.Results)
    # the streamed grid stores the simulated rows; its counters account for the whole space
    # (pruned by bound: not simulated, sweep/engine/prune.py)
    c = searched.counts
    assert c["total"] == Space.from_config(load_space(QUICKSTART)).size
    assert len(searched) == c["simulated"] == c["total"] - c["invalid"] - c.get("duplicate", 0) \
        - c["pruned"]
    assert c["pruned"] == c["pruned_memory"] + c["pruned_time"] > 0
    assert "quickstart" in repr(searched)


def test_top_best_and_to_pandas_are_the_cli_tables(searched):
    top = searched.top(10)
    assert isinstance(top, pd.DataFrame) and len(top) == 10
    assert list(top["rank"]) == list(range(1, 11))
    ranking = pd.read_csv(searched.path / "ranking.csv")
    assert list(top["config_id"]) == list(ranking["config_id"][:10])
    assert top["step_time_s"].is_monotonic_increasing
    assert searched.best()["config_id"] == top["config_id"].iloc[0]
    df = searched.to_pandas()
    df.loc[:, "step_time_s"] = 0.0  # a copy: the results object is unchanged
    assert searched.top(1)["step_time_s"].iloc[0] > 0
    fits = df[df["status"] == "ok"]
    assert len(top) <= len(fits)


def test_frontier_is_non_dominated(searched):
    front = searched.frontier()
    assert len(front) >= 1
    df = searched.to_pandas()
    ok = df[df["status"] == "ok"]
    thr = ok["global_batch"] * ok["seq_len"] / ok["step_time_s"]
    cost = ok["cost_per_mtok_usd"]
    for _, r in front.iterrows():
        better = (cost <= r["cost_per_mtok_usd"]) & (thr >= r["tokens_per_s"]) & (
            (cost < r["cost_per_mtok_usd"]) | (thr > r["tokens_per_s"] * (1 + 1e-12)))
        assert not better.any()


def test_recommend_is_the_cli_recommendation(searched, tmp_path):
    rec = searched.recommend(headroom="8GiB", max_gpus=8, out=tmp_path / "recipe")
    cli = cli_json("recommend", str(searched.path), "--headroom", "8GiB", "--max-gpus", "8",
                   "--format", "json", "--no-write")
    assert rec.found and int(rec.best["config_id"]) == cli["config_id"]
    assert rec.best["num_gpus"] == 8 and rec.best["headroom_gib"] >= 8
    assert "recommendation for quickstart" in str(rec)
    assert (tmp_path / "recipe" / "run.yaml").exists()
    assert int(searched.recommend(objective="cost").best["config_id"]) == cli_json(
        "recommend", str(searched.path), "--objective", "cost", "--format", "json",
        "--no-write")["config_id"]
    with pytest.raises(sweep.SweepError, match="unknown constraint 'max_gpu'.*did you mean"):
        searched.recommend(max_gpu=8)
    with pytest.raises(sweep.SweepError, match="--headroom"):
        searched.recommend(headroom="lots")


def test_report_and_trace(searched, tmp_path):
    html = searched.report(tmp_path / "rep")
    assert html == tmp_path / "rep" / "report.html" and html.exists()
    assert 'id="frontier-plot"' in html.read_text()
    trace = json.loads(searched.trace(tmp_path / "best.json").read_text())
    assert trace["otherData"]["step_time_s"] == pytest.approx(searched.best()["step_time_s"])
    rot = json.loads(searched.trace(tmp_path / "rot.json", "rule_of_thumb").read_text())
    assert rot["otherData"]["config"]["micro_batch"] == 1
    with pytest.raises(sweep.SweepError, match="which"):
        searched.trace(tmp_path / "x.json", "worst")


def test_open_results_reads_the_same_folder(searched):
    again = sweep.open_results(searched.path)
    pd.testing.assert_frame_equal(again.to_pandas(), searched.to_pandas())
    with pytest.raises(sweep.SweepError, match="no results.parquet"):
        sweep.open_results(searched.path / "parts")


def test_search_errors_are_one_line(tmp_path, local_ray):
    for kwargs, expect in (({"strategy": "annealing"}, "strategy: expected grid or optuna"),
                           ({"trials": 0}, "trials: expected a positive integer")):
        with pytest.raises(sweep.SweepError, match=expect):
            sweep.search(QUICKSTART, tmp_path / "x", **kwargs)
    with pytest.raises(sweep.SweepError, match="no such file"):
        sweep.search(tmp_path / "missing.yaml")
    with pytest.raises(sweep.SweepError, match="space.tp"):
        sweep.search({**RUN, "space": {"tp": "many"}}, tmp_path / "y")


def test_optuna_journal_loads_with_optunas_own_reader(tmp_path, local_ray):
    """optuna-dashboard opens results/<name>/optuna.journal with JournalStorage over a
    JournalFileBackend; the same reader sees the study and its trials."""
    import optuna
    from optuna.storages import JournalStorage

    try:
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # optuna < 4
        from optuna.storages import JournalFileStorage as JournalFileBackend
    space = {**{k: v for k, v in yaml.safe_load(QUICKSTART.read_text()).items()},
             "name": "qs-optuna", "search": {"strategy": "optuna", "trials": 40, "seed": 0}}
    res = sweep.search(space, tmp_path / "opt")
    journal = tmp_path / "opt" / "optuna.journal"
    storage = JournalStorage(JournalFileBackend(str(journal)))
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    assert names == ["qs-optuna"]
    study = optuna.load_study(study_name="qs-optuna", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(study.trials) >= 40 and done
    df = res.to_pandas()
    assert study.best_value == pytest.approx(df.loc[df["status"] == "ok", "step_time_s"].min())
    # a trial is a layout (sweep/engine/nested.py): its params are the sampled axes, the others are
    # enumerated inside the trial
    from sweep.config import load_space
    from sweep.engine.nested import split_axes
    from sweep.engine.space import Space

    nest = split_axes(Space.from_config(load_space(QUICKSTART)))
    assert set(study.best_params) == set(nest.outer) == {"num_gpus", "tp", "pp"}


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------
def test_validate_is_the_cli_table(capsys):
    table = sweep.validate(subset="dense")
    assert len(table) > 20 and {"predicted_step_s", "measured_step_s", "step_error"} <= set(
        table.columns)
    err = (table["predicted_step_s"] / table["measured_step_s"] - 1).to_numpy()
    assert np.allclose(err, table["step_error"].to_numpy(), equal_nan=True)
    assert main(["validate", "--subset", "dense"]) == 0
    out = capsys.readouterr().out
    first = table.iloc[0]
    assert f"{first['predicted_step_s']:.3f}" in out
    with pytest.raises(sweep.SweepError, match="subset: expected one of"):
        sweep.validate(subset="sparse")
    with pytest.raises(sweep.SweepError, match="dataset: no such file"):
        sweep.validate("/nonexistent.csv")
