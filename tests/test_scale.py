"""Sweeps that scale (issue 16): the results dataset (compact schema, constants in metadata,
reads with column selection and filters), the incremental top K / Pareto merge, and no-op
settings normalised instead of invalid (duplicates evaluated once)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sweep.config import parse_space
from sweep.engine.evaluate import evaluate
from sweep.engine.execution import run_search
from sweep.results import Leaderboard, open_results, rank, read_results
from sweep.engine.space import Space, census

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("local_ray")  # one local Ray per module (conftest)


def doc(space: dict, **search) -> dict:
    return {"name": "s", "model": "llama3.1-8b", "seq_len": 4096, "global_batch": 64,
            "cluster": {"gpu": "h100-sxm", "num_gpus": 16}, "space": space,
            "search": {"strategy": "grid", "batch_size": 50, **search}}


# ---------------------------------------------------------------------------------------------
# Incremental top K and Pareto set == ranking everything at once
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("objectives", [["step_time"], ["step_time", "cost"]])
def test_leaderboard_merge_equals_full_ranking(objectives):
    rng = np.random.default_rng(7)
    n = 3000
    df = pd.DataFrame({
        "config_id": np.arange(n),
        # coarse values: many ties, broken by the next objective and by config_id
        "step_time_s": rng.integers(1, 60, n) / 10.0,
        "cost_usd": rng.integers(1, 40, n) / 7.0,
        "status": rng.choice(["ok", "oom"], n, p=[0.7, 0.3]),
    })
    df.loc[rng.choice(n, 20), "step_time_s"] = np.nan
    full = rank(df.copy(), objectives)
    board = Leaderboard(objectives, keep=25)
    for part in np.array_split(rng.permutation(n), 13):  # parts in any order
        board.add(*board.local(df.iloc[np.sort(part)]))
    top, pareto = board.ranked(lambda: iter([df]))
    want = full[full["rank"].notna()].sort_values("rank")
    assert top["config_id"].tolist() == want["config_id"].head(25).tolist()
    assert top["rank"].tolist() == list(range(1, 26))
    if len(objectives) > 1:
        front = full[full["pareto"]].sort_values("rank")
        assert pareto["config_id"].tolist() == front["config_id"].tolist()
        # exact ranks, also for Pareto rows beyond the top K
        assert pareto["rank"].tolist() == front["rank"].tolist()
        assert (pareto["rank"] > 25).any()


# ---------------------------------------------------------------------------------------------
# The results dataset
# ---------------------------------------------------------------------------------------------
MULTI = doc({"gpu": ["h100-sxm", "a100-80gb"], "num_gpus": [8, 16, 32], "tp": [1, 2, 4, 8],
             "pp": [1, 2, 4], "micro_batch": [1, 2], "recompute": ["selective", "full"]},
            objectives=["step_time", "cost"])


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi")
    o = run_search(parse_space(MULTI), out)
    return out, o


def test_dataset_layout_and_compact_schema(multi_run):
    out, o = multi_run
    res = out / "results.parquet"
    assert res.is_dir() and (res / "_sweep.json").is_file()
    _, meta = open_results(res)
    files = sorted(res.glob("part-*.parquet"))
    assert [f.name for f in files] == meta["files"] and len(files) == len(meta["files"]) > 1
    schemas = {str(pq.read_schema(f).remove_metadata()) for f in files}
    assert len(schemas) == 1  # one schema across parts
    schema = pq.read_schema(files[0])
    # constant columns are stored once, in the metadata, not per row
    for c in ("model", "seq_len", "global_batch", "framework", "valid", "invalid_reason"):
        assert c in meta["constants"] and c not in schema.names
    assert str(schema.field("gpu").type).startswith("dictionary")
    assert str(schema.field("recompute").type).startswith("dictionary")
    assert str(schema.field("time_compute").type) == "float"  # float32 breakdown
    assert str(schema.field("step_time_s").type) == "double"  # objectives stay float64
    assert meta["counts"] == o.counts
    assert meta["rows"] == o.counts["simulated"] == sum(pq.read_metadata(f).num_rows
                                                        for f in files)


def test_read_results_selects_and_filters(multi_run):
    out, o = multi_run
    full, _ = read_results(out)
    assert {"model", "seq_len", "rank", "pareto", "gpu"} <= set(full.columns)
    assert (full["model"] == "llama3.1-8b").all() and full["valid"].all()
    df, _ = read_results(out, columns=["config_id", "gpu", "num_gpus", "step_time_s", "model"],
                         filters={"status": "ok", "gpu": "a100-80gb", "num_gpus": [16, 32]})
    assert list(df.columns) == ["config_id", "gpu", "num_gpus", "step_time_s", "model"]
    want = full[(full["status"] == "ok") & (full["gpu"] == "a100-80gb")
                & full["num_gpus"].isin([16, 32])]
    assert df["config_id"].tolist() == want["config_id"].tolist() and len(df) > 0
    assert (df["model"] == "llama3.1-8b").all()
    # a filter on a constant column that no row has
    none, _ = read_results(out, columns=["config_id"], filters={"model": "gpt3-175b"})
    assert len(none) == 0
    # ranks and the Pareto set come from the metadata
    ranked = full[full["rank"].notna()].sort_values("rank")
    assert ranked["config_id"].head(len(o.top)).tolist() == o.top["config_id"].tolist()
    assert set(full.loc[full["pareto"], "config_id"]) == set(o.pareto["config_id"])


def test_results_equal_those_of_evaluating_everything(multi_run):
    """The streamed dataset holds exactly the simulated rows of a one-shot evaluation."""
    out, _ = multi_run
    cfg = parse_space(MULTI)
    space = Space.from_config(cfg)
    ref = evaluate(space.frame(0, space.size))
    ref = ref[ref["status"] != "invalid"].reset_index(drop=True)
    got, _ = read_results(out)
    for c in ("config_id", "gpu", "tp", "pp", "status", "step_time_s", "peak_memory_gib"):
        assert got[c].tolist() == ref[c].tolist(), c
    np.testing.assert_allclose(got["time_compute"], ref["time_compute"], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# No-op settings are normalised, not invalid; duplicates are evaluated once
# ---------------------------------------------------------------------------------------------
def test_sequence_parallel_true_keeps_tp1(tmp_path):
    cfg = parse_space(doc({"tp": [1, 2, 4], "pp": [1, 2], "sequence_parallel": [True],
                           "micro_batch": [1, 2]}))
    o = run_search(cfg, tmp_path)
    df, _ = read_results(tmp_path)
    tp1 = df[df["tp"] == 1]
    assert len(tp1) == 4 and not tp1["sequence_parallel"].any()  # turned off, as Megatron does
    assert df.loc[df["tp"] > 1, "sequence_parallel"].all()
    assert o.counts["invalid"] == 0 and o.counts.get("duplicate", 0) == 0
    assert census(Space.from_config(cfg)).valid == 12


def test_noop_duplicates_are_evaluated_once(tmp_path):
    cfg = parse_space(doc({"tp": [1, 2], "pp": [1, 2], "vpp": [1, 2],
                           "sequence_parallel": [False, True]}))
    space = Space.from_config(cfg)
    o = run_search(cfg, tmp_path)
    df, _ = read_results(tmp_path)
    keys = ["tp", "pp", "vpp", "sequence_parallel"]
    assert not df.duplicated(keys).any()
    # tp 1 x SP on, pp 1 x vpp 2: 16 candidates, 7 distinct configurations
    assert o.counts["duplicate"] == space.size - 9 == 7
    assert o.counts["total"] == space.size
    assert o.counts["invalid"] + o.counts["simulated"] + o.counts["duplicate"] == space.size
    assert set(map(tuple, df[keys].to_numpy().tolist())) == {
        (1, 1, 1, False), (1, 2, 1, False), (1, 2, 2, False),
        (2, 1, 1, False), (2, 1, 1, True), (2, 2, 1, False), (2, 2, 2, False),
        (2, 2, 1, True), (2, 2, 2, True)}


# ---------------------------------------------------------------------------------------------
# Divisibility decided from the config ids, before any frame is built
# ---------------------------------------------------------------------------------------------
def _bundled():
    from pathlib import Path

    from sweep.config import load_space

    root = Path(__file__).resolve().parents[1] / "search_spaces"
    return [load_space(p) for p in sorted(root.glob("*.yaml"))
            if "task: rl" not in p.read_text()]  # RL spaces: tests/test_rl.py


@pytest.mark.parametrize("cfg", _bundled(), ids=lambda c: c.name)
def test_precheck_gives_the_full_checks_first_reason(cfg):
    from sweep.engine.space import normalise, rule_reasons

    space = Space.from_config(cfg)
    rng = np.random.default_rng(1)
    ids = np.unique(rng.integers(0, space.size, min(space.size, 4000)))
    cols = space.structural_columns(ids)
    assert cols is not None
    pre = space.precheck(cols)
    full = rule_reasons(normalise(space.frame_of_ids(ids)))
    caught = pre != ""
    assert (pre[caught] == full[caught]).all()
    # what it lets through breaks no structural rule
    from sim_core.columns import frame_to_batch
    from sim_core.rules import structural_rules

    texts = {t for t, _ in structural_rules(frame_to_batch(space.frame_of_ids(ids[:2])))}
    assert not set(full[~caught]) & texts


@pytest.mark.parametrize("name", ["quickstart", "llama3-8b-frameworks-h100",
                                  "llama3.1-405b-h100", "llama3-70b-h100"])
def test_streamed_search_ranks_as_evaluating_everything(name, tmp_path):
    """The grid as it runs (precheck, duplicates skipped, parts streamed, top K merged) gives
    the top rows of one evaluation of every candidate ranked at once."""
    from pathlib import Path

    from sweep.config import load_space
    from sweep.results import add_costs, gpu_prices

    cfg = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / f"{name}.yaml")
    space = Space.from_config(cfg)
    frame = space.frame(0, space.size)
    ref = evaluate(frame[~space.duplicates(frame)])  # repeats of a no-op setting: once
    ref = add_costs(ref, gpu_prices(ref["gpu"].unique(), space.price_per_hour),
                    cfg.search.cost_unit)
    ref = rank(ref, cfg.search.objectives)
    want = ref[ref["rank"].notna()].sort_values("rank").head(20)
    o = run_search(cfg, tmp_path)
    got = o.top.head(20)
    assert got["config_id"].tolist() == want["config_id"].tolist()
    assert got["step_time_s"].tolist() == want["step_time_s"].tolist()
    if len(cfg.search.objectives) > 1:
        assert set(o.pareto["config_id"]) == set(ref.loc[ref["pareto"], "config_id"])
