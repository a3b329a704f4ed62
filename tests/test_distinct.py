"""Evaluating each distinct input once (sim_core.distinct, issue 37) changes no prediction: the
factorised simulator is compared with the direct, row-by-row evaluation (`distinct.direct()`)
on candidates of every bundled space and on the published runs, bit for bit. No stored
predictions: both sides are computed from today's physics."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim_core import distinct, nccl
from sim_core.columns import Batch
from sim_core.simulate import simulate_frame
from sim_core.specs import ALL_COLUMNS
from sim_core.specs import ATTENTION_KERNEL as ATTENTION_KERNEL_NAMES

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted(p for p in (ROOT / "search_spaces").glob("*.yaml")
                if "task: rl" not in p.read_text())  # RL spaces: tests/test_rl.py


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return np.array_equal(a, b)


def assert_same_frames(ref: pd.DataFrame, got: pd.DataFrame) -> None:
    assert list(ref.columns) == list(got.columns)
    bad = [c for c in ref.columns if not _same(ref[c].to_numpy(), got[c].to_numpy())]
    assert not bad, f"factorised differs from direct in {bad}"


# ---- the dedup helper ---------------------------------------------------------------------
def _columns(n: int, rng) -> list[np.ndarray]:
    return [rng.choice([1.0, 2.0, 4.0, -0.0, 0.0, np.nan], n),
            rng.integers(0, 5, n),
            rng.random(n) < 0.5,
            rng.choice([1e9, 3.5e9], n).astype(np.float32),
            np.full(n, 7.0)]  # constant: left out of the key


def _check_rows(cols, first, inverse):
    bits = [distinct._bits(c) for c in cols]
    for x in bits:  # every row equals its representative, bit for bit
        assert np.array_equal(x[first][inverse], x)
    # and rows with different inputs are in different groups
    exact = np.unique(np.stack(bits, axis=1), axis=0).shape[0]
    assert len(first) == exact
    assert np.array_equal(np.unique(inverse), np.arange(len(first)))


def test_rows_finds_each_distinct_tuple_once():
    rng = np.random.default_rng(1)
    cols = _columns(5000, rng)
    first, inverse = distinct.rows(cols)
    _check_rows(cols, first, inverse)
    assert len(first) < 5000 / 4


@pytest.mark.parametrize("pack_limit, dense_keys", [(1 << 4, 0), (1 << 62, 0), (1 << 62, 1 << 40)])
def test_rows_exact_when_the_packed_key_is_renumbered_or_hashed(monkeypatch, pack_limit,
                                                                dense_keys):
    # a small packing bound renumbers the key between columns; dense_keys 0 groups the packed
    # key through pandas' hash table (large keys), a huge one through the table indexed by it
    monkeypatch.setattr(distinct, "PACK_LIMIT", pack_limit)
    monkeypatch.setattr(distinct, "DENSE_KEYS", dense_keys)
    rng = np.random.default_rng(2)
    cols = _columns(3000, rng) + [rng.integers(0, 3, 3000) * 1000.0,  # integers, numbered
                                  rng.choice([0.5, 2.5], 3000)]  # fractions: by their bits
    first, inverse = distinct.rows(cols)
    _check_rows(cols, first, inverse)
    assert len(first) > 1


def test_codes_tell_apart_what_differs_in_bits():
    # -0.0 and 0.0 compare equal but are different inputs; NaN never equals itself
    for col in ([0.0, -0.0, 0.0], [np.nan, 1.0, np.nan], [1.0, 1.5, 1.0], [3, 300, 3]):
        a = np.array(col * 100)
        codes, k = distinct._codes(a)
        assert k == 2 and codes[0] == codes[2] != codes[1], col
    codes, k = distinct._codes(np.array([256.0, 512.0, 1024.0] * 10))  # numbered as present
    assert k == 3 and sorted(set(codes.tolist())) == [0, 1, 2]


def test_rows_of_constant_and_empty_columns():
    first, inverse = distinct.rows([np.full(10, 3.0), np.zeros(10, dtype=bool)])
    assert first.tolist() == [0] and inverse.tolist() == [0] * 10
    first, inverse = distinct.rows([np.zeros(0)])
    assert first.size == 0 and inverse.size == 0


def test_on_distinct_groups_by_every_column_the_part_reads():
    n = 4000
    rng = np.random.default_rng(3)
    b = Batch(x=rng.integers(0, 3, n).astype(float), y=rng.integers(0, 4, n).astype(float),
              z=rng.random(n))
    calls = []

    def part(sb):
        calls.append(len(sb))
        return {"out": sb.x * 10 + sb.get("y")}

    distinct._keys.pop("test.part", None)
    got = distinct.on_distinct("test.part", b, part, seed=("x",))
    assert np.array_equal(got["out"], b.x * 10 + b.y)
    # grouped first by x alone, then again by x and y once y was seen read; never by z
    assert calls == [3, 12]
    assert distinct._keys["test.part"] == {"x", "y"}
    with distinct.direct():
        assert distinct.on_distinct("test.part", b, part)["out"].shape == (n,)
    assert calls[-1] == n


def test_collective_time_factorised_equals_direct():
    rng = np.random.default_rng(4)
    n = 20000
    op = rng.integers(0, len(nccl.COLLECTIVES), n)
    nbytes = rng.choice([0.0, 4096.0, 2.0 ** 20, 3.3e7, 1e9], n)
    group = rng.choice([1, 2, 8, 16, 64], n)
    nodes = np.minimum(rng.choice([1, 2, 8], n), group)
    net = {"sm_arch": rng.choice([80, 90, 100], n).astype(float),
           "nvlink_bw_gbs": rng.choice([300.0, 450.0], n), "nvls": rng.random(n) < 0.5,
           "mesh_links": rng.choice([0.0, 7.0], n), "nic_bw_gbs": 50.0,
           "intra_latency_us": 2.0, "inter_latency_us": 5.0}
    got = nccl.collective_time(op, nbytes, group, nodes, net)
    with distinct.direct():
        ref = nccl.collective_time(op, nbytes, group, nodes, net)
    for k in ref:
        assert _same(ref[k], got[k]), k


# ---- the rules in two parts == every rule on every row ------------------------------------
def test_rules_checked_in_parts_equal_every_rule_on_every_row():
    from sim_core import rules
    from sim_core.columns import frame_to_batch

    rng = np.random.default_rng(7)
    n = 4000
    pick = lambda vals: rng.choice(np.asarray(vals, dtype=object), n)  # noqa: E731
    frame = pd.DataFrame({
        "model": pick(["llama3-8b", "mixtral-8x7b", "gpt3-175b"]), "seq_len": pick([4096, 6000]),
        "global_batch": pick([256, 1000]), "num_gpus": pick([64, 96, 256]),
        # NVIDIA and AMD parts (the rules peek at `rocm`), every attention kernel
        "gpu": pick(["h100-sxm", "a100-80gb", "mi300x", "b200"]),
        "framework": pick(["megatron-core", "torchtitan", "deepspeed", "nanotron"]),
        "tp": pick([1, 2, 3, 8]), "pp": pick([1, 2, 4]), "cp": pick([1, 2]), "vpp": pick([1, 2]),
        "ep": pick([1, 2, 8]), "micro_batch": pick([1, 2]), "zero": pick([0, 1, 2, 3]),
        "recompute": pick(["none", "selective", "full"]), "sequence_parallel": pick([False, True]),
        "precision": pick(["bf16", "fp8"]), "tp_comm_overlap": pick([False, True]),
        "attention_kernel": pick(list(ATTENTION_KERNEL_NAMES)),
    })
    b = frame_to_batch(frame)
    want_ok, want_why = rules.check_rows(b)
    for mode in (contextlib.nullcontext, distinct.direct):
        with mode():
            ok, why = rules.check(b)
        assert np.array_equal(ok, want_ok) and list(why) == list(want_why)
    # the batch breaks structural and setting rules alike, and leaves some rows valid
    assert 0 < want_ok.sum() < n and len(set(want_why)) > 12
    assert any("has no" in w for w in want_why) and any("%" in w for w in want_why)


# ---- the simulator: factorised == direct ---------------------------------------------------
def _space_frame(path: Path, n: int, seed: int) -> pd.DataFrame:
    from sweep.config.files import load_space
    from sweep.engine.space import Space, normalise, rule_reasons, sim_frame

    space = Space.from_config(load_space(path))
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(0, space.size, n)) if space.size > n else np.arange(space.size)
    frame = space.frame_of_ids(ids)
    frame = frame[rule_reasons(frame) == ""] if len(frame) > 200 else frame
    return sim_frame(normalise(frame)).reset_index(drop=True)


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_bundled_space_predictions_unchanged(path):
    frame = _space_frame(path, 3000, seed=0)
    got = simulate_frame(frame)
    with distinct.direct():
        ref = simulate_frame(frame)
    assert_same_frames(ref, got)


def test_published_runs_predictions_unchanged(monkeypatch):
    from sim_core.accuracy import validation

    data = validation.load_published()
    use = data[data["skip"] == ""]
    frame = validation._impute(use)
    frame = frame[[c for c in frame.columns if c in ALL_COLUMNS]]
    monkeypatch.setattr(distinct, "MIN_ROWS", 0)  # a hundred rows: factorise them all the same
    got = simulate_frame(frame)
    with distinct.direct():
        ref = simulate_frame(frame)
    assert_same_frames(ref, got)
    # and twice over, shuffled: rows of one group meet rows of another
    both = pd.concat([frame, frame]).sample(frac=1.0, random_state=0).reset_index(drop=True)
    got = simulate_frame(both)
    with distinct.direct():
        ref = simulate_frame(both)
    assert_same_frames(ref, got)


def test_select_is_np_where_bit_for_bit():
    from sim_core.arrays import select

    rng = np.random.default_rng(5)
    n = 5000
    a, b = rng.random(n), rng.random(n)
    a[::7], b[::11], a[::13] = np.nan, -0.0, np.inf
    for mask in (rng.random(n) < 0.5, np.zeros(n, bool), np.ones(n, bool)):
        for x, y in ((a, b), (a, 0.0), (0.0, b), (a, -0.0), (3.0, b), (a, np.nan), (2.0, 5.0)):
            want, got = np.where(mask, x, y), select(mask, x, y)
            assert got.dtype == np.float64 and got.shape == (n,)
            assert np.array_equal(want.view(np.uint64), got.view(np.uint64)), (x, y)


def test_where_is_np_where_in_dtype_and_bits():
    from sim_core.arrays import where

    rng = np.random.default_rng(6)
    n = 3000
    a, b = rng.random(n), rng.random(n)
    a[::7], b[::11], a[::13] = np.nan, -0.0, np.inf
    ints, f32, flags = rng.integers(0, 9, n), rng.random(n).astype(np.float32), rng.random(n) < .3
    mask = rng.random(n) < 0.5
    cases = [(a, b), (a, 0.0), (0.0, b), (a, -0.0), (3.0, b), (a, 2), (1, b), (2.0, 5.0), (2, 5),
             (ints, 0.5), (ints, 0), (f32, 1.0), (a, f32), (flags, 0.0), (flags, False),
             (np.float64(2.0), b), (a, np.array(4.0))]
    for x, y in cases:
        for m in (mask, mask.astype(np.int64), np.zeros(n, bool)):
            want, got = np.where(m, x, y), where(m, x, y)
            assert got.dtype == want.dtype and got.shape == want.shape, (x, y)
            assert np.array_equal(np.ascontiguousarray(want).view(np.uint8),
                                  np.ascontiguousarray(got).view(np.uint8)), (x, y)


def test_rules_group_by_the_columns_they_peek_at():
    # `rocm` is read through dict.get (so that a space's count does not record it): a batch
    # whose other rules read no GPU column must still keep AMD and NVIDIA rows apart
    from sim_core import rules
    from sim_core.columns import frame_to_batch

    n = 2000
    # the AMD rows in the middle: whichever row represents a group, it is an NVIDIA one
    gpu = np.array(["h100-sxm"] * (n // 4) + ["mi300x"] * (n // 2) + ["h100-sxm"] * (n // 4),
                   dtype=object)
    frame = pd.DataFrame({
        "model": "llama3-8b", "seq_len": 4096, "global_batch": 256, "num_gpus": 64,
        "precision": "bf16", "tp": 2, "pp": 1, "gpu": gpu,
        "framework": np.array(["megatron-core", "nanotron"] * (n // 2), dtype=object)})
    b = frame_to_batch(frame)
    distinct._keys.pop("rules.settings", None)  # as in a fresh process
    ok, why = rules.check(b)
    want_ok, want_why = rules.check_rows(b)
    assert np.array_equal(ok, want_ok) and list(why) == list(want_why)
    assert 0 < ok.sum() < n  # nanotron on the AMD part is refused, on the NVIDIA one not
