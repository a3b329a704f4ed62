"""The Batch a grid batch builds from config ids' digits (sweep/engine/direct.py) is, bit for
bit, what frame_to_batch gives on the candidates' resolved frame, and a grid part evaluated
that way is the part the frame's way writes (issue 37: the fast path only skips work)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim_core.columns import frame_to_batch
from sim_core.frameworks import resolve_frame
from sweep.config import parse_space
from sweep.engine import direct, grid
from sweep.engine.direct import DirectBatch
from sweep.engine.evaluate import _with_model_shapes
from sweep.engine.space import Space, normalise, sim_frame
from sweep.results import objective_columns, row_prices

ROOT = Path(__file__).resolve().parents[1]

# axes the bundled spaces do not vary: the model, gpus_per_node, seq_len and a token budget
# seq_len does not always divide, the framework beside one of its fields, instances with
# frameworks (defaults at tp > 1, ROCm kernels)
MIXED = {
    "name": "direct-mix", "model": "llama3-8b", "seq_len": 8192,
    "global_batch_tokens": 1048576, "precision": "bf16",
    "cluster": {"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8},
    "space": {"model": ["llama3-8b", "llama3-70b"], "gpu": ["h100-sxm", "mi300x"],
              "nodes": [1, 2, 4], "gpus_per_node": [4, 8], "seq_len": [4096, 8192],
              "global_batch_tokens": [1048576, 1000000],
              "framework": ["megatron-core", "torchtitan", "deepspeed"],
              "attention_kernel": ["fa2", "fa3"], "tp": [1, 2, 8], "pp": [1, 2], "vpp": [1, 2],
              "sequence_parallel": [False, True], "micro_batch": [1, 2],
              "recompute": ["none", "full"], "zero": [1, 3], "precision": ["bf16", "fp8"]},
    "search": {"strategy": "grid"}}
INSTANCES = {
    "name": "direct-instances", "model": "llama3-70b", "seq_len": 8192, "global_batch": 512,
    "precision": "bf16", "cluster": {"nodes": 4},
    "space": {"instance": ["aws-p5", "oci-mi300x", "aws-p5en"], "nodes": [2, 4, 8],
              "framework": ["megatron-core", "nemo", "torchtitan", "llm-foundry", "nanotron"],
              "tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch": [1, 2],
              "recompute": ["none", "selective", "full"], "zero": [1, 3]},
    "search": {"strategy": "grid"}}
BUNDLED = sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml")
                 if "task: rl" not in p.read_text())  # RL files: their own schema (docs/rl.md)


def _space(name) -> Space:
    doc = name if isinstance(name, dict) else yaml.safe_load(
        (ROOT / "search_spaces" / name).read_text())
    return Space.from_config(parse_space(doc))


def _resolved(space: Space, ids) -> pd.DataFrame:
    return normalise(resolve_frame(space.frame_of_ids(ids)))


@pytest.mark.parametrize("name", BUNDLED + [MIXED, INSTANCES],
                         ids=BUNDLED + ["mixed", "instances"])
def test_the_batch_from_digits_is_frame_to_batch_bit_for_bit(name):
    space = _space(name)
    table = DirectBatch.of(space)
    assert table is not None
    ids = np.unique(np.random.default_rng(7).integers(0, space.size, 4000))
    digits = space.digits(ids)
    frame = _resolved(space, ids)
    expected = frame_to_batch(_with_model_shapes(sim_frame(frame)))
    got = table.batch(digits)
    assert list(got) == list(expected)
    for c, v in expected.items():
        assert got[c].dtype == v.dtype, c
        assert got[c].tobytes() == v.tobytes(), c  # the same bits, NaN included
    assert list(table.inputs) == list(frame.columns)
    pd.testing.assert_frame_equal(table.frame(ids, digits), frame, check_exact=True)
    rule = np.full(len(ids), "", dtype=object)
    if "global_batch_tokens" in frame.columns:
        bad = (frame["global_batch_tokens"] % frame["seq_len"] != 0).to_numpy()
        rule[bad] = "global_batch_tokens % seq_len != 0"
    assert (table.reasons(digits) == rule).all()
    prices = space.prices()
    np.testing.assert_array_equal(table.prices(digits, prices),
                                  row_prices(frame, prices).to_numpy(dtype=np.float64))


def test_the_mixed_space_breaks_the_token_rule_somewhere():
    space = _space(MIXED)
    reasons = DirectBatch.of(space).reasons(space.digits(np.arange(space.size)))
    assert 0 < (reasons != "").sum() < space.size


@pytest.mark.parametrize("doc,objectives", [(MIXED, ["step_time"]),
                                            (INSTANCES, ["cost", "step_time"]),
                                            ("multi-vendor.yaml", ["step_time"]),
                                            ("llama3-8b-frameworks-h100.yaml", ["mfu"])])
def test_a_part_from_digits_is_the_part_from_frames(tmp_path, monkeypatch, doc, objectives):
    space = _space(doc)
    job = grid.GridJob(str(tmp_path), "fp", space.prices(), "mtok", objectives, 20,
                       grid.grid_constants(space), True)
    size = min(space.size, 8000)
    stop = size // 2
    files = 0
    for threshold in (None, "median"):
        if threshold == "median":
            with monkeypatch.context() as m:  # the frame's way, for a threshold that prunes
                m.setattr(DirectBatch, "of", classmethod(lambda cls, s: None))
                (tmp_path / "probe").mkdir(exist_ok=True)
                entry = grid._eval_part(space, 0, 0, size, None, None, grid.GridJob(
                    str(tmp_path / "probe"), *list(vars(job).values())[1:]), None)[0]
            sim = pd.read_parquet(tmp_path / "probe" / entry["file"])
            col = objective_columns(objectives)[0][0]
            threshold = float(sim.loc[sim["status"] == "ok", col].median())
        got = []
        for way, bid in (("direct", 1), ("frame", 2)):
            out = tmp_path / way
            out.mkdir(exist_ok=True)
            j = grid.GridJob(str(out), *list(vars(job).values())[1:])
            with monkeypatch.context() as m:
                if way == "frame":
                    m.setattr(DirectBatch, "of", classmethod(lambda cls, s: None))
                got.append(grid._eval_part(space, 5, 0, stop, None, None, j, threshold))
        (e1, t1, p1), (e2, t2, p2) = got
        assert e1 == e2  # same counters, reasons, rows and part sha256
        if e1["file"]:
            files += 1
            assert (tmp_path / "direct" / e1["file"]).read_bytes() == \
                (tmp_path / "frame" / e2["file"]).read_bytes()
        pd.testing.assert_frame_equal(t1, t2)
        pd.testing.assert_frame_equal(p1, p2)
    assert files > 0


def test_an_axis_with_a_missing_value_goes_the_frames_way():
    """resolve_frame's output types then depend on which rows a batch holds (the file format
    refuses such a value; a Space built in code may hold one)."""
    space = _space(MIXED)
    space.axes = [(n, [None, "fa2"] if n == "attention_kernel" else v) for n, v in space.axes]
    assert DirectBatch.of(space) is None


def test_a_column_reading_too_many_combinations_goes_the_frames_way(monkeypatch):
    monkeypatch.setattr(direct, "MAX_TABLE", 4)
    space = _space("multi-vendor.yaml")
    assert DirectBatch.of(space) is None


def test_a_text_column_is_typed_by_the_whole_batch():
    """attention_kernel is str in a resolved frame with an AMD row, object without: the rows a
    part stores take the type of the batch they were framed in."""
    space = _space("multi-vendor.yaml")
    table = DirectBatch.of(space)
    ids = np.arange(space.size // 4 - 300, space.size // 2 + 300)  # h200, then mi300x
    digits = space.digits(ids)
    frame = _resolved(space, ids)
    amd = frame["gpu"].str.startswith("mi").to_numpy()
    assert amd.any() and not amd.all()
    rows = np.flatnonzero(~amd)[::7]
    got = table.frame(ids[rows], [d[rows] for d in digits], digits)
    pd.testing.assert_frame_equal(got, frame.iloc[rows].reset_index(drop=True),
                                  check_exact=True)
    alone = table.frame(ids[rows], [d[rows] for d in digits])
    pd.testing.assert_frame_equal(alone, _resolved(space, ids[rows]), check_exact=True)
    assert alone["attention_kernel"].dtype != got["attention_kernel"].dtype
