"""Pruning by bounds (sweep/engine/prune.py): the properties it relies on, checked on random
configurations over a wide set of fields, and searches that return the same top K with pruning
on as with it off."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate_frame
from sweep.engine.prune import RECOMPUTE_ORDER, objective_bound, step_time_lower_bound

POW2 = [1, 2, 4, 8]
WIDE = settings(max_examples=50, deadline=None,
                suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@st.composite
def wide_configs(draw):
    """Fields a search space may vary, MoE and framework ones included."""
    model = draw(st.sampled_from(["gpt3-1.7b", "llama3-8b", "llama3-70b", "mixtral-8x7b",
                                  "gpt3-175b", "deepseek-v2-lite", "llama3.1-405b"]))
    moe = model.startswith(("mixtral", "deepseek"))
    return {
        "model": model,
        "framework": draw(st.sampled_from(["megatron-core", "nemo", "torchtitan",
                                           "deepspeed", "nanotron", "llm-foundry"])),
        "seq_len": draw(st.sampled_from([2048, 4096, 8192])),
        "global_batch": draw(st.sampled_from([64, 128, 256, 512])),
        "gpu": draw(st.sampled_from(["a100-80gb", "h100-sxm", "h200", "b200"])),
        "num_gpus": draw(st.sampled_from([8, 16, 64, 256])),
        "tp": draw(st.sampled_from(POW2)),
        "pp": draw(st.sampled_from(POW2)),
        "cp": draw(st.sampled_from([1, 2])),
        "ep": draw(st.sampled_from([1, 2, 4, 8] if moe else [1])),
        "vpp": draw(st.sampled_from([1, 2])),
        "micro_batch": draw(st.sampled_from([1, 2, 3, 4, 8])),
        "recompute": draw(st.sampled_from(RECOMPUTE_ORDER)),
        "sequence_parallel": draw(st.booleans()),
        "zero": draw(st.sampled_from([0, 1, 2, 3])),
        "precision": draw(st.sampled_from(["bf16", "fp8"])),
        "tp_comm_overlap": draw(st.booleans()),
        "overlap_grad_reduce": draw(st.booleans()),
        "attention_kernel": draw(st.sampled_from(["fa3", "fa2", "triton", "fa1", "flex"])),
        "loss_impl": draw(st.sampled_from(["fused", "compiled", "eager", "eager_parallel",
                                           "fp32_parallel"])),
        "pp_schedule": draw(st.sampled_from(["1f1b", "afab"])),
        "fp8_param_gather": draw(st.booleans()),
        "fused_glu": draw(st.booleans()),
        "expert_skew": draw(st.sampled_from([0.0, 0.8])) if moe else 0.0,
        "moe_recompute": draw(st.sampled_from(["none", "moe_act", "moe"])) if moe else "none",
        "moe_dispatcher": draw(st.sampled_from(["alltoall", "allgather", "flex"])) if moe
        else "alltoall",
    }


def _run(cfgs):
    return simulate_frame(pd.DataFrame(cfgs)).reset_index(drop=True)


@WIDE
@given(wide_configs(), st.sampled_from([1, 2, 3, 4, 8]), st.sampled_from([1, 2, 3, 4, 8]),
       st.sampled_from(RECOMPUTE_ORDER), st.sampled_from(RECOMPUTE_ORDER))
def test_memory_dominance_that_the_memory_bound_uses(cfg, mb_a, mb_b, rc_a, rc_b):
    """A (micro-batch a, recompute ra) and B (b >= a, rb no more recompute than ra), all else
    equal, both valid: B needs at least A's memory. So when A does not fit, B does not."""
    if mb_a > mb_b:
        mb_a, mb_b = mb_b, mb_a
    if RECOMPUTE_ORDER.index(rc_a) < RECOMPUTE_ORDER.index(rc_b):
        rc_a, rc_b = rc_b, rc_a
    out = _run([{**cfg, "micro_batch": mb_a, "recompute": rc_a},
                {**cfg, "micro_batch": mb_b, "recompute": rc_b}])
    assume(out["valid"].all())
    a, b = out["peak_memory_gib"].to_numpy()
    assert b >= a - 1e-9
    assert not (out["fits"].iloc[1] and not out["fits"].iloc[0])


@WIDE
@given(st.lists(wide_configs(), min_size=1, max_size=8))
def test_step_time_lower_bound_is_below_every_simulated_step_time(cfgs):
    frame = pd.DataFrame(cfgs)
    out = simulate_frame(frame).reset_index(drop=True)
    ok = out["valid"].to_numpy(bool)
    assume(ok.any())
    b = frame_to_batch(frame.loc[ok].reset_index(drop=True))
    lb = step_time_lower_bound(b)
    step = out.loc[ok, "step_time_s"].to_numpy()
    assert np.all(lb > 0) and np.all(lb <= step)


def test_objective_bounds_follow_the_step_time_bound():
    """Each objective's bound is the objective computed at the step-time bound: no better."""
    cfgs = [{"model": "llama3-70b", "seq_len": 8192, "global_batch": 128, "gpu": g,
             "num_gpus": 64, "tp": 4, "pp": 4, "micro_batch": 1, "precision": p}
            for g in ("h100-sxm", "a100-80gb") for p in ("bf16", "fp8")]
    frame = pd.DataFrame(cfgs)
    out = simulate_frame(frame)
    b = frame_to_batch(frame)
    prices = {"h100-sxm": 2.5, "a100-80gb": 1.5}
    from sweep.results import add_costs

    sim = add_costs(pd.concat([frame, out], axis=1), prices, "mtok")
    for obj, col, better in (("step_time", "step_time_s", np.less_equal),
                             ("cost", "cost_usd", np.less_equal),
                             ("throughput", "tokens_per_s_per_gpu", np.greater_equal),
                             ("mfu", "mfu", np.greater_equal)):
        bound = objective_bound(b, obj, frame["gpu"].map(prices).to_numpy(), "mtok")
        assert np.all(better(bound, sim[col].to_numpy())), obj


# ---------------------------------------------------------------------------------------------
# Searches with and without pruning
# ---------------------------------------------------------------------------------------------
BUNDLED = ["quickstart.yaml", "llama3.1-405b-128k-h100.yaml", "llama3-8b-frameworks-h100.yaml",
           "llama3-8b-nanotron-h100.yaml", "llama3.1-405b-h100.yaml", "multi-hardware.yaml"]


def _search(name, tmp_path, prune: bool, batch_size: int):
    from pathlib import Path

    from sweep.config import load_space
    from sweep.engine.execution import run_search

    cfg = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / name)
    cfg.search.prune = prune
    cfg.search.batch_size = batch_size
    out = tmp_path / f"{name}-{prune}"
    return cfg, run_search(cfg, out, fresh=True), out


@pytest.fixture(scope="module")
def pruned_and_full(tmp_path_factory, local_ray):
    tmp = tmp_path_factory.mktemp("prune")
    runs = {}
    for name in BUNDLED:
        # small batches: many tasks, so that the K-th best is known before the later ones
        runs[name] = [_search(name, tmp, p, 500 if name == "multi-hardware.yaml" else 200)
                      for p in (True, False)]
    return runs


@pytest.mark.parametrize("name", BUNDLED)
def test_pruned_search_returns_the_same_top_k_and_pareto_set(pruned_and_full, name):
    (cfg, on, out_on), (_, off, out_off) = pruned_and_full[name]
    k = cfg.search.top
    cols = ["config_id", "rank", "step_time_s", "cost_usd"]
    pd.testing.assert_frame_equal(on.top[cols].head(k).reset_index(drop=True),
                                  off.top[cols].head(k).reset_index(drop=True))
    # what the driver keeps beyond K (TOP_KEPT) is the same too, and the Pareto set with ranks
    pd.testing.assert_frame_equal(on.top[cols].reset_index(drop=True),
                                  off.top[cols].reset_index(drop=True))
    if len(cfg.search.objectives) > 1:
        pd.testing.assert_frame_equal(on.pareto[cols].reset_index(drop=True),
                                      off.pareto[cols].reset_index(drop=True))
    assert (out_on / "ranking.csv").read_text() == (out_off / "ranking.csv").read_text()
    # every candidate is accounted for: what pruning skipped is what the full search found
    # out of memory (memory bound) or outside the top K (time bound)
    a, b = on.counts, off.counts
    assert a["total"] == b["total"] and a["invalid"] == b["invalid"]
    assert a["pruned"] == a["pruned_memory"] + a["pruned_time"]
    assert a["simulated"] + a["pruned"] == b["simulated"] and b.get("pruned", 0) == 0
    assert a["ok"] + a["oom"] + a["pruned"] == b["ok"] + b["oom"]
    if not a["pruned_time"]:  # the memory bound alone skips only rows out of memory
        assert a["ok"] == b["ok"]
    # the stored rows of the pruned search are rows of the full one, with the same values
    from sweep.results import read_results

    got, _ = read_results(out_on, columns=["config_id", "status", "step_time_s"])
    ref, _ = read_results(out_off, columns=["config_id", "status", "step_time_s"])
    merged = got.merge(ref, on="config_id", suffixes=("", "_full"), validate="1:1")
    assert len(merged) == len(got) == a["simulated"]
    assert (merged["status"] == merged["status_full"]).all()
    assert np.allclose(merged["step_time_s"], merged["step_time_s_full"], equal_nan=True)
    assert json.loads((out_on / "results.parquet" / "_sweep.json").read_text())["counts"] == a
    # rows pruned by the memory bound are rows the full search found out of memory
    missing = ref[~ref["config_id"].isin(got["config_id"])]
    assert (missing["status"] == "oom").sum() >= a["pruned_memory"]
    assert len(missing) == a["pruned"]
    if not a["pruned_time"]:
        assert (missing["status"] == "oom").all()


def test_pruning_happened_on_the_bundled_spaces(pruned_and_full):
    """Not vacuous: the memory bound prunes on these spaces, and the time bound on the one
    whose cluster sizes and GPU types differ (multi-hardware)."""
    memory = sum(r[0][1].counts["pruned_memory"] for r in pruned_and_full.values())
    late = pruned_and_full["multi-hardware.yaml"][0][1].counts["pruned_time"]
    assert memory > 0 and late > 0


def test_subspace_ids_group_configurations_equal_but_for_micro_batch_and_recompute():
    from sweep.config import parse_space
    from sweep.engine.space import Space

    space = Space.from_config(parse_space({
        "name": "s", "model": "llama3-8b", "seq_len": 4096, "global_batch": 64,
        "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
        "space": {"tp": [1, 2], "micro_batch": [1, 2, 4], "zero": [0, 1],
                  "recompute": ["none", "full"]}}))
    frame = space.frame(0, space.size)
    group = space.subspace_ids(frame["config_id"])
    other = frame[["tp", "zero"]].astype(str).agg("-".join, axis=1)
    assert len(set(group)) == other.nunique() == 4
    for g in set(group):  # one sub-space: one (tp, zero), every micro_batch x recompute
        rows = frame[group == g]
        assert rows[["tp", "zero"]].nunique().max() == 1 and len(rows) == 6
