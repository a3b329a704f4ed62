"""Enumeration order, derivations, rules, statuses, ranking and Pareto sets (no Ray)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweep.config import parse_space
from sweep.errors import SweepError
from sweep.engine.evaluate import evaluate
from sweep.results import add_costs, pareto_mask, rank
from sweep.engine.space import Space, census, normalise, require_valid, rule_reasons
from tests.fakes import fake_check, fake_simulate


def make_space(space: dict, **over) -> Space:
    d = {"name": "t", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}, "space": space, **over}
    return Space.from_config(parse_space(d))


SMALL = {"num_gpus": [8, 16], "tp": [1, 2, 4, 8, 3], "pp": [1, 2], "micro_batch": [1, 2, 3],
         "recompute": ["none", "full"], "sequence_parallel": [False, True]}


def test_order_is_itertools_product():
    space = make_space(SMALL)
    names = space.axis_names
    expected = list(itertools.product(*[v for _, v in space.axes]))
    assert space.size == len(expected)
    df = space.frame(0, space.size)
    got = list(df[names].itertuples(index=False, name=None))
    assert got == expected
    assert df["config_id"].tolist() == list(range(space.size))
    # any chunk equals the same slice of the whole
    part = space.frame(37, 101)
    pd.testing.assert_frame_equal(part.reset_index(drop=True),
                                  df.iloc[37:101].reset_index(drop=True))


def test_index_roundtrip_and_batches():
    space = make_space(SMALL)
    df = space.frame_of_ids([5, 0, 191])
    for row in df.to_dict("records"):
        assert space.index_of({n: row[n] for n in space.axis_names}) == row["config_id"]
    b = space.batches(50)
    assert b[0] == (0, 0, 50) and b[-1][2] == space.size
    covered = np.concatenate([np.arange(s, e) for _, s, e in b])
    assert (covered == np.arange(space.size)).all()


def test_columns_typed():
    df = make_space(SMALL).frame(0, 10)
    assert df["tp"].dtype == np.int64 and df["sequence_parallel"].dtype == bool
    assert pd.api.types.is_string_dtype(df["recompute"]) and df["model"].iloc[0] == "llama3.1-8b"


def test_nodes_and_token_budget_derivations():
    space = make_space({"nodes": [1, 2], "seq_len": [4096, 8192, 3000]},
                       global_batch=None, global_batch_tokens=1 << 19,
                       cluster={"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8})
    df = space.frame(0, space.size)
    assert df["num_gpus"].tolist() == [8, 8, 8, 16, 16, 16]
    assert df["global_batch"].tolist()[:2] == [128, 64]
    reasons = rule_reasons(df, fake_check)
    assert reasons[2] == "global_batch_tokens % seq_len != 0"


def test_rule_reasons_and_census():
    space = make_space(SMALL)
    df = space.frame(0, space.size)
    reasons = rule_reasons(df, fake_check)
    bad = dict(zip(df["config_id"], reasons))
    row = df[(df.tp == 3)].iloc[0]
    assert bad[row.config_id] == "num_gpus % (tp*pp*cp) != 0"
    row = df[(df.tp == 1) & (df.pp == 1) & (df.micro_batch == 3)].iloc[0]
    assert bad[row.config_id] == "global_batch % (dp*micro_batch) != 0"
    row = df[(df.tp == 1) & df.sequence_parallel].iloc[0]
    assert "sequence_parallel" in bad[row.config_id]  # the rules alone refuse it...
    # ...but a search normalises it (sequence parallelism off at tp 1, as Megatron does)
    normal = rule_reasons(normalise(df), fake_check)
    assert dict(zip(df["config_id"], normal))[row.config_id] == ""
    c = census(space, fake_check, chunk=17)  # chunked counting == whole
    assert c.total == space.size and c.valid == int((normal == "").sum())
    assert c.valid > int((reasons == "").sum())
    assert sum(c.reasons.values()) == c.total - c.valid


def test_impossible_space():
    space = make_space({"tp": [3, 5, 7]})
    c = census(space, fake_check)
    with pytest.raises(SweepError, match="no valid configuration: all 3 candidates"):
        require_valid(c, space.name)


def test_evaluate_statuses():
    space = make_space(SMALL)
    df = space.frame(0, space.size)
    out = evaluate(df, fake_simulate, fake_check)
    assert len(out) == len(df) and (out["config_id"] == df["config_id"]).all()
    assert set(out["status"]) == {"ok", "oom", "invalid"}
    inv = out[out.status == "invalid"]
    assert (inv["invalid_reason"] != "").all() and inv["step_time_s"].isna().all()
    assert not inv["fits"].any()
    oom = out[out.status == "oom"]
    assert oom["peak_memory_gib"].notna().all() and not oom["fits"].any()
    ok = out[out.status == "ok"]
    assert ok["fits"].all() and (ok["invalid_reason"] == "").all()
    # only valid rows were simulated
    calls = []
    evaluate(df, lambda f: calls.append(len(f)) or fake_simulate(f), fake_check)
    assert calls == [int((out.status != "invalid").sum())]


def test_evaluate_all_invalid_batch():
    space = make_space({"tp": [3, 5]})
    out = evaluate(space.frame(0, 2), fake_simulate, fake_check)
    assert (out["status"] == "invalid").all() and not out["fits"].any()


def test_costs_and_rank():
    space = make_space(SMALL)
    out = evaluate(space.frame(0, space.size), fake_simulate, fake_check)
    out = add_costs(out, {"h100-sxm": 3.6})
    r = out.dropna(subset=["step_time_s"]).iloc[0]
    assert r["cost_per_step_usd"] == pytest.approx(r["num_gpus"] * r["step_time_s"] * 3.6 / 3600)
    tokens = r["global_batch"] * r["seq_len"]
    assert r["cost_per_mtok_usd"] == pytest.approx(r["cost_per_step_usd"] / tokens * 1e6)
    out = rank(out, ["step_time", "cost"])
    ranked = out[out["rank"].notna()].sort_values("rank")
    assert (ranked["status"] == "ok").all()
    assert ranked["step_time_s"].is_monotonic_increasing
    assert ranked["pareto"].any() and ranked.iloc[0]["pareto"]
    par = ranked[ranked.pareto]
    # nobody dominates a Pareto row
    for _, p in par.iterrows():
        dom = (ranked.step_time_s <= p.step_time_s) & (ranked.cost_usd <= p.cost_usd) & (
            (ranked.step_time_s < p.step_time_s) | (ranked.cost_usd < p.cost_usd))
        assert not dom.any()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 5)),
                min_size=1, max_size=40), st.sampled_from([2, 3]))
def test_pareto_mask_matches_brute_force(points, k):
    v = np.array(points, dtype=float)[:, :k]
    got = pareto_mask(v)
    for i in range(len(v)):
        dominated = any(np.all(v[j] <= v[i]) and np.any(v[j] < v[i]) for j in range(len(v)))
        if dominated:
            assert not got[i]
        elif k > 2:
            assert got[i]
    # 2 objectives: ties (identical points) keep one representative
    if k == 2:
        kept = {tuple(x) for x in v[got]}
        front = {tuple(v[i]) for i in range(len(v)) if not any(
            np.all(v[j] <= v[i]) and np.any(v[j] < v[i]) for j in range(len(v)))}
        assert kept == front


def test_fingerprint():
    a, b = make_space(SMALL), make_space(SMALL)
    assert a.fingerprint(batch_size=10) == b.fingerprint(batch_size=10)
    assert a.fingerprint(batch_size=10) != a.fingerprint(batch_size=11)
    c = make_space({**SMALL, "tp": [1, 2]})
    assert a.fingerprint() != c.fingerprint()


# ---------------------------------------------------------------------------------------------
# `sweep check` counts without walking the space
# ---------------------------------------------------------------------------------------------
COUNTED = {"num_gpus": [8, 16, 24], "tp": [1, 2, 4, 3], "pp": [1, 2, 4], "vpp": [1, 2],
           "micro_batch": [1, 2, 3], "gpu": ["h100-sxm", "a100-80gb"],
           "overlap_grad_reduce": [False, True], "sequence_parallel": [False, True]}


def test_count_factors_out_the_axes_no_rule_reads_and_equals_the_census():
    import sweep.engine.space

    space = make_space(COUNTED)
    brute = census(space)  # every candidate, one by one
    c = sweep.engine.space.count(space)
    assert c.exact and set(c.free) == {"gpu", "overlap_grad_reduce"}
    assert c.census.total == space.size == brute.total
    assert c.census.valid == brute.valid and 0 < brute.valid < brute.total
    assert c.census.reasons == brute.reasons


def test_count_of_a_space_too_large_to_enumerate_is_a_sample(monkeypatch):
    import sweep.engine.space

    space = make_space(COUNTED)
    brute = census(space)
    monkeypatch.setattr(sweep.engine.space, "CHECK_ENUMERATE_MAX", 10)
    monkeypatch.setattr(sweep.engine.space, "CHECK_SAMPLE", 20_000)
    c = sweep.engine.space.count(space)
    assert not c.exact and c.census.total == space.size
    assert abs(c.census.valid / space.size - brute.valid / brute.total) < 0.03
    assert "estimated from a uniform sample of 20,000" in "\n".join(c.lines())


def test_check_of_a_1e10_space_computes_its_size(monkeypatch, capsys):
    import math

    import yaml

    import sweep.engine.space
    from sweep.cli import main

    def no_census(space, *a, **k):
        assert space.size <= sweep.engine.space.CHECK_ENUMERATE_MAX, "the whole space was walked"
        return census(space, *a, **k)

    monkeypatch.setattr(sweep.engine.space, "census", no_census)
    path = Path(__file__).resolve().parents[1] / "search_spaces" / "llama3.1-405b-huge.yaml"
    axes = yaml.safe_load(path.read_text())["space"]
    size = math.prod(len(range(v["range"][0], v["range"][1] + 1, v.get("step", 1)))
                     if isinstance(v, dict) else len(v) for v in axes.values())
    assert size > 10**10
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"configurations: {size:,}" in out and "estimated from a uniform sample" in out
