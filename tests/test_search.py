"""Sweeps on a local Ray (one instance for the module): grid, resume after an interruption,
a worker killed mid-sweep, Optuna single- and multi-objective, Optuna resume."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sweep.config import parse_space
from sweep.errors import Interrupted, SweepError
from sweep.engine.execution import run_search
from sweep.results import SCHEMA_VERSION, open_results, read_results
from sweep.engine.space import Space
from tests.fakes import CountCalls, KillOnce, fake_check, fake_simulate

ray = pytest.importorskip("ray")

FAKE = dict(simulate=fake_simulate, check=fake_check)


pytestmark = pytest.mark.usefixtures("local_ray")  # one local Ray per module (conftest)


def space_cfg(strategy="grid", batch_size=100, **search):
    d = {"name": "t", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
         "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
         "space": {"num_gpus": [8, 16, 32], "tp": [1, 2, 4, 8], "pp": [1, 2, 4],
                   "micro_batch": [1, 2, 4], "recompute": ["none", "selective", "full"],
                   "zero": [1, 3]},
         "search": {"strategy": strategy, "batch_size": batch_size, **search}}
    return parse_space(d)


def frame_without_timing(path: Path) -> pd.DataFrame:
    return read_results(path)[0]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    run_search(space_cfg(), out, **FAKE)
    return frame_without_timing(out / "results.parquet")


def test_grid_results(tmp_path, undisturbed):
    cfg = space_cfg()
    o = run_search(cfg, tmp_path, **FAKE)
    size = Space.from_config(cfg).size
    df = frame_without_timing(tmp_path / "results.parquet")
    # the simulated rows are stored; those the rules reject are counted by reason
    meta = open_results(tmp_path / "results.parquet")[1]
    c = o.counts
    assert c == meta["counts"]
    assert c["total"] == size and c["invalid"] + c["simulated"] == size
    assert len(df) == c["simulated"] and df["config_id"].is_monotonic_increasing
    assert set(df["status"]) == {"ok", "oom"} and c["invalid"] > 0
    assert sum(meta["invalid_reasons"].values()) == c["invalid"]
    assert meta["schema_version"] == SCHEMA_VERSION
    # columns constant across the space are stored once, in the metadata, and read back
    assert "model" in meta["constants"] and "model" not in pq.read_schema(
        next((tmp_path / "results.parquet").glob("part-*.parquet"))).names
    assert (df["model"] == "llama3.1-8b").all()
    # the rank of every fitting row the ranking shows agrees with a full ranking
    from sweep.results import rank as full_rank

    ranked = full_rank(df.drop(columns=["rank", "pareto"]), cfg.search.objectives)
    top = ranked[ranked["rank"].notna()].sort_values("rank").head(len(o.top))
    assert top["config_id"].tolist() == o.top["config_id"].tolist()
    ranking = pd.read_csv(tmp_path / "ranking.csv")
    assert (ranking["status"] == "ok").all() and ranking["step_time_s"].is_monotonic_increasing
    assert ranking["rank"].tolist() == list(range(1, len(ranking) + 1))
    text = o.summary()
    assert "top 10 by step_time" in text and f"{size:,} total" in text
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["batches"]) == -(-size // 100)
    pd.testing.assert_frame_equal(df, undisturbed)


def test_resume_after_interruption(tmp_path, undisturbed):
    cfg = space_cfg()
    log1, log2 = tmp_path / "calls1", tmp_path / "calls2"
    out = tmp_path / "out"

    def stop_after_two(batch_id, done):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as ei:
        run_search(cfg, out, simulate=CountCalls(log1), check=fake_check, workers=1,
                   on_batch=stop_after_two)
    assert ei.value.done == 2 and "run the same command again to resume" in str(ei.value)
    assert not (out / "results.parquet").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and len(manifest["batches"]) == 2

    o = run_search(cfg, out, simulate=CountCalls(log2), check=fake_check)
    nbatches = len(Space.from_config(cfg).batches(100))
    calls2 = log2.read_text().split()
    assert len(calls2) <= nbatches - 2  # finished batches are skipped
    assert o.evaluated == Space.from_config(cfg).size - 200
    pd.testing.assert_frame_equal(frame_without_timing(out / "results.parquet"), undisturbed)


def test_killed_worker_is_retried(tmp_path, undisturbed):
    marker = tmp_path / "killed"
    run_search(space_cfg(), tmp_path / "out", simulate=KillOnce(marker), check=fake_check)
    assert marker.exists()  # a worker really died once
    pd.testing.assert_frame_equal(frame_without_timing(tmp_path / "out" / "results.parquet"),
                                  undisturbed)


def test_other_space_in_same_dir(tmp_path):
    run_search(space_cfg(batch_size=500), tmp_path, **FAKE)
    with pytest.raises(SweepError, match="different space"):
        run_search(space_cfg(batch_size=400), tmp_path, **FAKE)
    o = run_search(space_cfg(batch_size=400), tmp_path, fresh=True, **FAKE)
    assert o.evaluated == Space.from_config(space_cfg()).size


def test_rerun_of_finished_sweep_evaluates_nothing(tmp_path):
    run_search(space_cfg(batch_size=500), tmp_path, **FAKE)
    o = run_search(space_cfg(batch_size=500), tmp_path, **FAKE)
    assert o.evaluated == 0 and o.counts["total"] == Space.from_config(space_cfg()).size


def test_optuna_finds_the_grid_best(tmp_path, undisturbed):
    import optuna

    cfg = space_cfg("optuna", batch_size=8, seed=1, trials=120)
    o = run_search(cfg, tmp_path, **FAKE)
    grid_best = undisturbed.sort_values("rank").iloc[0]
    opt_best = o.best.iloc[0]
    assert opt_best["step_time_s"] <= grid_best["step_time_s"] * 1.02
    df = frame_without_timing(tmp_path / "results.parquet")
    # the budget counts trials; each trial is a layout (num_gpus, tp, pp) whose 18 combinations
    # of micro_batch, recompute and zero are all simulated, each configuration once
    study = optuna.load_study(study_name="t", storage=_journal(tmp_path))
    layouts = {(t.params["num_gpus"], t.params["tp"], t.params["pp"]) for t in study.trials}
    assert df["config_id"].is_unique and len(df) == 18 * len(layouts)
    assert set(df.groupby("trial")["config_id"].count()) == {18}
    # untried layouts are preferred: all 36 are sampled before the budget, and it stops there
    assert len(layouts) == 36 and len(study.trials) < 120
    # rows agree with the grid's for the same configuration
    fit = df[df.status == "ok"]  # the grid stores only simulated rows
    ref = undisturbed.set_index("config_id").loc[fit["config_id"]]
    for col in ("status", "step_time_s", "micro_batch", "recompute", "zero", "tp"):
        assert (ref[col].to_numpy() == fit[col].to_numpy()).all(), col
    assert "stopped: every one of the 36 layouts was sampled" in o.summary()
    assert opt_best["step_time_s"] == grid_best["step_time_s"]


def test_optuna_multi_objective_pareto(tmp_path):
    import optuna

    cfg = space_cfg("optuna", batch_size=16, trials=32, objectives=["step_time", "cost"],
                    inner=["micro_batch"])
    o = run_search(cfg, tmp_path, **FAKE)
    assert len(o.pareto) >= 1 and (tmp_path / "pareto.csv").exists()
    study = optuna.load_study(study_name="t", storage=_journal(tmp_path))
    states = {t.state.name for t in study.trials}
    asked = [t for t in study.trials if "front_of" not in t.user_attrs]
    assert len(asked) == 32 and states <= {"COMPLETE", "PRUNED"}
    assert "PRUNED" in states  # invalid/oom are pruned, not told as fast results
    df = frame_without_timing(tmp_path / "results.parquet")
    # each point of our Pareto set is a point some trial (or its front) was told
    told = {tuple(t.values) for t in study.trials if t.values}
    for _, r in df[df["pareto"]].iterrows():
        assert (r["step_time_s"], r["cost_usd"]) in told


def test_optuna_resume(tmp_path):
    import optuna

    cfg = space_cfg("optuna", batch_size=4, trials=40, inner=["zero"])

    def stop(batch_id, done):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        run_search(cfg, tmp_path, on_batch=stop, **FAKE)
    o = run_search(cfg, tmp_path, **FAKE)
    study = optuna.load_study(study_name="t", storage=_journal(tmp_path))
    assert all(t.state.is_finished() for t in study.trials) and len(study.trials) == 40
    layouts = {tuple(t.params[a] for a in ("num_gpus", "tp", "pp", "micro_batch", "recompute"))
               for t in study.trials}
    assert o.counts["total"] == 2 * len(layouts)  # zero: [1, 3] inside each trial
    df = frame_without_timing(tmp_path / "results.parquet")
    assert df["config_id"].is_unique


def _journal(d: Path):
    """The study journal read by Optuna's own file backend (the format is Optuna's)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(d / "optuna.journal")))


def test_optuna_agrees_with_grid_on_real_simulator(tmp_path):
    """Shipped llama3-70b space (12,288 candidates, 512 layouts), step time, 400 trials."""
    from sweep.config import load_space

    path = Path(__file__).resolve().parents[1] / "search_spaces" / "llama3-70b-h100.yaml"
    grid = load_space(path)
    grid.search.objectives = ["step_time"]
    g = run_search(grid, tmp_path / "grid")
    opt = load_space(path)
    opt.search.objectives = ["step_time"]
    opt.search.strategy, opt.search.seed, opt.search.trials = "optuna", 0, 400
    size = Space.from_config(opt).size
    o = run_search(opt, tmp_path / "optuna")
    assert o.counts["total"] < size  # a part of the space
    gb, ob = g.best.iloc[0], o.best.iloc[0]
    assert ob["step_time_s"] <= gb["step_time_s"] * 1.02
    # the configuration Optuna found has the same prediction in the grid's results
    same = g.results.set_index("config_id").loc[ob["config_id"]]
    assert same["step_time_s"] == pytest.approx(ob["step_time_s"])
