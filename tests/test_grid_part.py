"""A grid batch (sweep/engine/grid.py `_eval_part`) gives what the straightforward way gives:
the whole batch evaluated into one frame, filtered to the simulated rows, the whole frame
sorted for the top K, pandas' own conversion to Arrow, one digit expansion per step. The part
file, its counters and invalid reasons, and the local top K and Pareto set must be the same
(issue 37: the fast path only skips work, it never changes a result)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sweep.config import parse_space
from sweep.engine import grid
from sweep.engine.evaluate import Bounds, evaluate
from sweep.engine.space import Space
from sweep.results.store import (
    Leaderboard, add_costs, compact_table, pareto_rows, rankable, sort_key,
)

ROOT = Path(__file__).resolve().parents[1]


def _space(name: str) -> Space:
    return Space.from_config(parse_space(yaml.safe_load((ROOT / "search_spaces" / name)
                                                        .read_text())))


def reference_part(space: Space, start: int, stop: int, job, threshold):
    """The batch the plain way: (simulated rows with costs, counts, reasons, top, pareto)."""
    ids = np.arange(start, stop, dtype=np.int64)
    cols = space.structural_columns(ids)
    dup = space.duplicates(cols)
    pre = space.precheck(cols)
    keep = ~dup & (pre == "")
    frame = space.frame_of_ids(ids[keep])
    price = frame["gpu"].map(job.prices).astype(float)
    if "instance" in frame.columns:
        named = (frame["instance"].notna() & (frame["instance"].astype(str) != "")).to_numpy()
        price = price.where(~named, frame["instance"].map(job.prices).astype(float))
    single = len(job.objectives) == 1
    bounds = Bounds(space.subspace_ids(ids[keep]), job.objectives[0],
                    threshold if single else None, price.to_numpy(dtype=np.float64),
                    job.cost_unit)
    df = evaluate(frame, None, None, bounds)
    early = pre[~dup & (pre != "")]
    status = np.concatenate([df["status"].to_numpy(), np.full(len(early), "invalid", object)])
    reasons = pd.Series(np.concatenate([df["invalid_reason"].to_numpy()[
        df["status"].to_numpy() == "invalid"], early])).value_counts()
    counts = {k: int((status == k).sum()) for k in ("ok", "oom", "pruned_memory",
                                                    "pruned_time")}
    counts["invalid"] = int((status == "invalid").sum())
    counts["duplicate"] = int(dup.sum())
    counts["total"] = len(ids)
    sim = df[df["status"].isin(("ok", "oom")).to_numpy()].reset_index(drop=True)
    sim = add_costs(sim, job.prices, job.cost_unit)
    sub = rankable(sim, job.objectives)
    cols_, asc = sort_key(job.objectives)
    if not len(sub):
        top = pareto = sub
    else:
        top = sub.sort_values(cols_, ascending=asc, kind="stable").head(job.keep)
        pareto = pareto_rows(sub, job.objectives)
    return (sim, counts, {str(k): int(v) for k, v in reasons.items()},
            top.reset_index(drop=True), pareto.reset_index(drop=True))


@pytest.mark.parametrize("name,objectives,threshold", [
    ("multi-hardware.yaml", ["step_time", "cost"], None),
    ("multi-hardware.yaml", ["step_time"], "median"),
    ("cloud-instances.yaml", ["cost", "step_time"], None),
])
def test_a_grid_part_is_what_the_plain_way_gives(tmp_path, name, objectives, threshold):
    space = _space(name)
    job = grid.GridJob(str(tmp_path), "fp", space.prices(), "mtok", objectives, 20,
                       grid.grid_constants(space), True)
    size = min(space.size, 6000)
    if threshold == "median":  # a time bound that prunes some of the valid rows
        sim = reference_part(space, 0, size, job, None)[0]
        threshold = float(sim.loc[sim["status"] == "ok", "step_time_s"].median())
    checked, pruned = 0, {"time": 0}
    for bid, (start, stop) in enumerate([(0, size // 2), (size // 2, size)]):
        entry, top, pareto = grid._eval_part(space, bid, start, stop, None, None, job,
                                             threshold)
        sim, counts, reasons, top0, pareto0 = reference_part(space, start, stop, job,
                                                             threshold)
        pruned["time"] += entry["counts"]["pruned_time"]
        for k, v in counts.items():
            assert entry["counts"][k] == v, k
        assert entry["reasons"] == reasons
        assert list(entry["reasons"]) == list(reasons)  # same order in the metadata
        pd.testing.assert_frame_equal(top, top0)
        pd.testing.assert_frame_equal(pareto, pareto0)
        assert entry["rows"] == len(sim)
        if not len(sim):
            continue
        checked += len(sim)
        written = pq.read_table(tmp_path / entry["file"])
        # the plain conversion: pandas' own, then the compact types
        plain = pa.Table.from_pandas(sim[[c for c in sim.columns if c not in job.constants]],
                                     preserve_index=False)
        expected = compact_table(sim, job.constants)
        assert [f.type for f in expected.schema] == [f.type for f in written.schema]
        assert written.schema.names == plain.schema.names
        assert written.replace_schema_metadata(None).equals(expected)
        meta = json.loads(written.schema.metadata[b"sweep"])
        assert meta["columns"] == list(sim.columns)
    assert checked > 0
    assert (pruned["time"] > 0) == (threshold is not None)


def test_the_local_top_k_and_pareto_set_are_those_of_the_sorted_frame():
    rng = np.random.default_rng(3)
    n = 500
    df = pd.DataFrame({
        "config_id": rng.permutation(n), "status": rng.choice(["ok", "oom"], n),
        "step_time_s": rng.choice([1.0, 2.0, 3.0, np.nan], n),
        "cost_usd": rng.choice([5.0, 6.0, np.nan, 7.5], n),
        "mfu": rng.random(n), "gpu": rng.choice(["h100-sxm", "b200"], n)},
        index=rng.permutation(n) + 1000)  # not a RangeIndex
    for objectives in (["step_time", "cost"], ["step_time"], ["cost", "step_time"],
                       ["mfu", "step_time"], ["mfu"]):
        for part in (df, df.iloc[:0], df[df["status"] == "oom"], df.iloc[::3]):
            top, pareto = Leaderboard(objectives, 25).local(part)
            sub = rankable(part, objectives)
            cols, asc = sort_key(objectives)
            pd.testing.assert_frame_equal(top, sub.sort_values(
                cols, ascending=asc, kind="stable").head(25).reset_index(drop=True))
            pd.testing.assert_frame_equal(pareto, pareto_rows(sub, objectives)
                                          .reset_index(drop=True))


def test_row_prices_looks_up_as_map_does():
    from sweep.results.store import row_prices

    prices = {"h100-sxm": 2.5, "b200": None, "p5.48xlarge": 98.3}
    df = pd.DataFrame({"gpu": ["h100-sxm", "b200", None, "a100-80gb", "h100-sxm"],
                       "instance": ["", "p5.48xlarge", None, "p4d.24xlarge", "p5.48xlarge"]})
    for frame in (df, df[["gpu"]], df.iloc[:0]):
        expected = frame["gpu"].map(prices).astype(float)
        if "instance" in frame.columns:
            inst = frame["instance"]
            named = (inst.notna() & (inst.astype(str) != "")).to_numpy()
            expected = expected.where(~named, inst.map(prices).astype(float))
        pd.testing.assert_series_equal(row_prices(frame, prices), expected)


def test_arrow_conversion_is_from_pandas_less_its_metadata():
    from sweep.results.store import _arrow_table

    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", None, "y"],
                       "c": pd.array([1, None, 3], dtype="Int64"),
                       "d": pd.Categorical(["p", "q", "p"]), "e": [True, False, True],
                       "f": np.array(["u", None, "v"], dtype=object), "g": [None] * 3,
                       "h": [1.5, np.nan, 2.0]})
    for frame in (df, df.iloc[:0], df[["g", "h"]]):
        plain = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
        fast = _arrow_table(frame)
        assert fast.schema == plain.schema and fast.equals(plain)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml")
                                         if "task: rl" not in p.read_text()))
def test_structural_reasons_by_combination_are_the_precheck(name):
    space = _space(name)
    ids = np.unique(np.random.default_rng(5).integers(0, space.size, 20_000))
    cols = space.structural_columns(ids)
    got = space.structural_reasons(space.digits(ids))
    if got is None:  # no table (too many combinations): the grid runs precheck itself
        return
    assert cols is not None
    expected = space.precheck(cols)
    assert got.dtype == expected.dtype and (got == expected).all()


def test_the_framed_share_is_estimated_from_a_sample_of_the_ids():
    """The driver-or-Ray choice rests on the share of candidates a batch frames: the sample's
    estimate is within sampling error of the count over every id, and exact on a small space."""
    for name in ("gpt3-175b-1024xa100.yaml", "deepseek-v3-1024xh100.yaml", "multi-hardware.yaml"):
        space = _space(name)
        assert space.size > 20_000  # larger than the sample
        ids = np.arange(space.size, dtype=np.int64)
        digits = space.digits(ids)
        cols = space.structural_columns(ids, digits)
        exact = ((space.precheck(cols) == "") & ~space.duplicates(cols, digits)).mean()
        assert 0.0 < exact < 1.0  # the space has invalid candidates or no-op repeats
        assert abs(space.framed_fraction() - exact) < 0.02
    small = _space("quickstart.yaml")
    ids = np.arange(small.size, dtype=np.int64)
    digits = small.digits(ids)
    cols = small.structural_columns(ids, digits)
    exact = ((small.precheck(cols) == "") & ~small.duplicates(cols, digits)).mean()
    assert small.framed_fraction() == pytest.approx(exact)


def test_a_grid_goes_to_ray_only_when_the_driver_would_take_longer_than_ray_s_start():
    small = _space("quickstart.yaml")
    assert grid.runs_in_driver(small, 2)
    huge = _space("llama3.1-405b-billion.yaml")
    assert grid.driver_seconds(huge) > 50 * grid.RAY_START_S
    assert not grid.runs_in_driver(huge, 2) and grid.runs_in_driver(huge, 1)


def test_the_rows_before_each_pareto_row_are_counted_as_one_by_one():
    from sweep.results.store import _counts_before, _sorts_before

    rng = np.random.default_rng(11)
    n = 3000
    df = pd.DataFrame({"a": rng.choice([1.0, 2.0, -0.0, 0.0, np.inf, np.nan, 3.5], n),
                       "b": rng.choice([5.0, 6.0, np.nan, -np.inf, 7.5], n),
                       "config_id": rng.permutation(n)})
    rows = pd.concat([df.sample(40, random_state=1),
                      pd.DataFrame({"a": [np.nan, 2.0, np.inf, 0.0], "b": [5.0, np.nan, 6.0, -0.0],
                                    "config_id": [-1, n + 5, 7, 3]})])
    for cols, asc in ((["a", "b", "config_id"], [True, False, True]),
                      (["b", "a", "config_id"], [False, True, True]), (["a"], [True])):
        for part in (df, df.iloc[:0], df.iloc[::5]):
            expected = [int(_sorts_before(part, r, cols, asc).sum()) for _, r in rows.iterrows()]
            assert _counts_before(part, rows, cols, asc).tolist() == expected


@pytest.mark.parametrize("name", ["gpt3-175b-1024xa100.yaml", "multi-hardware.yaml",
                                  "cloud-instances.yaml", "llama3.1-405b-wide.yaml"])
def test_digits_of_a_run_and_no_op_repeats_from_digits_are_the_plain_ones(name):
    space = _space(name)
    for start, stop in ((0, 1), (0, min(space.size, 5000)), (7, min(space.size, 20_011)),
                        (space.size - 999, space.size)):
        ids = np.arange(start, stop, dtype=np.int64)
        plain = space.digits(ids)
        fast = space.range_digits(start, stop)
        assert all(a.dtype == b.dtype and (a == b).all() for a, b in zip(plain, fast))
        dup = space.noop_repeats(fast)
        if dup is not None:
            assert (dup == space.duplicates(space.structural_columns(ids, plain), plain)).all()


def test_reasons_counted_by_combination_are_value_counts():
    """Counts and their order (count descending, first seen first among ties) as pandas
    gives them on the strings, whatever mix of judged and early reasons."""
    rng = np.random.default_rng(3)
    table = np.array(["", "tp must divide heads", "pp must divide layers", "tp must divide heads",
                      "dp must divide the batch"], dtype=object)
    for trial in range(200):
        codes = rng.integers(0, len(table), rng.integers(0, 40))
        codes = codes[table[codes] != ""]
        late = rng.choice(np.array(["out of memory rule", "pp must divide layers", "fp8 needs"],
                                   dtype=object), rng.integers(0, 6))
        expected = pd.Series(np.concatenate([late, table[codes]]), dtype=object).value_counts()
        got = grid.count_reasons(late, codes=codes, table=table)
        assert list(got.items()) == list(expected.items())


def test_batch_boundaries_change_no_fitting_row_and_no_rank(tmp_path):
    """The driver takes larger batches than a cluster (grid_batch_size): the memory bound
    prunes within a batch, so other boundaries may simulate other out-of-memory rows, but the
    rows that fit, their predictions, ranking.csv and pareto.csv are the same."""
    import sweep

    doc = yaml.safe_load((ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml").read_text())
    doc["search"] = {**(doc.get("search") or {}), "strategy": "grid",
                     "objectives": ["step_time", "cost"]}
    outs = []
    for bs in (5_000, 20_000):
        doc["search"]["batch_size"] = bs
        out = tmp_path / f"b{bs}"
        sweep.search(doc, out=out, progress=False)
        outs.append(out)
    for name in ("ranking.csv", "pareto.csv"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()
    fits = [sweep.open_results(o).to_pandas().query("status == 'ok'")
            .sort_values("config_id").reset_index(drop=True) for o in outs]
    pd.testing.assert_frame_equal(fits[0], fits[1])
    # the driver's batches are about twice a cluster's, within the same bounds
    assert grid.grid_batch_size(1_600_000, in_driver=True) == 2 * grid.grid_batch_size(1_600_000)
    assert grid.grid_batch_size(10**9, in_driver=True) == grid.MAX_GRID_BATCH
