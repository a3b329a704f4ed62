"""MoE dispatch path (sim_core/moe.py): byte counts derived by hand, DeepEP buffer sizes from
DeepEP's formula worked out by hand, the 1F1B overlap schedule on hand-made numbers, the rules
Megatron-Core enforces, and the flags they export."""

import math

import numpy as np
import pandas as pd
import pytest

from sim_core import moe, rules, workload
from sim_core.columns import batch_from_arrays, frame_to_batch
from sim_core.simulate import simulate_frame
from sweep.advice import export

DSV3 = dict(model="deepseek-v3", seq_len=4096, global_batch=8192, gpu="h100-sxm",
            num_gpus=1024, tp=2, pp=8, vpp=4, ep=64, etp=1, micro_batch=1,
            recompute="selective", precision="fp8", sequence_parallel=True,
            moe_permute_fusion=True, moe_router_fusion=True)


def batch(base, **over):
    return frame_to_batch(pd.DataFrame([{**base, **over}]))


def small(**over):
    """8 experts, top-2, EP 4 on nodes of 2 GPUs (2 nodes), hidden 1024."""
    base = dict(experts=8.0, top_k=2.0, ep=4.0, etp=1.0, tp=1.0, hidden=1024.0,
                gpus_per_node=2.0, moe_dispatcher=0, moe_permute_fusion=False,
                moe_router_fusion=False, expert_skew=0.0, moe_dropless=True,
                capacity_factor=1.0)
    base.update(over)
    return batch_from_arrays(base, n=1)


def test_dispatch_bytes_by_hand():
    """100 tokens on a rank, 2 of 8 experts each, 2 experts per EP rank, 4 per node.
    P(a rank is hit) = 1 - C(6,2)/C(8,2) = 13/28; P(a node is hit) = 1 - C(4,2)/C(8,2) = 22/28."""
    by = moe.dispatch_bytes(small(), np.array([100.0]), np.array([1.0]))
    row = 2 * 1024  # bf16 hidden state
    assert by["a2a"][0] == 100 * 2 * row  # every routed copy
    assert by["ranks_hit"][0] == pytest.approx(4 * 13 / 28)
    assert by["nodes_hit"][0] == pytest.approx(2 * 22 / 28)
    assert by["nodes"][0] == 2 and by["ep_local"][0] == 2
    # DeepEP: one copy to each other node hit over RDMA: nodes hit less the own one when hit
    assert by["rdma"][0] == pytest.approx(100 * row * (2 * 22 / 28 - 22 / 28))
    # ... and one per destination rank over NVLink, less the one it lands on (1 of 2 per node)
    assert by["nvl"][0] == pytest.approx(100 * row * (4 * 13 / 28) * 1 / 2)
    # allgather: the 4 ranks' tokens with their routing map (1 B) and fp32 probs (4 B) per expert
    assert by["ag"][0] == 100 * 4 * (row + 5 * 8)
    # the busiest rank's load multiplies what it receives
    by2 = moe.dispatch_bytes(small(), np.array([100.0]), np.array([1.5]))
    assert by2["a2a"][0] == pytest.approx(1.5 * by["a2a"][0])


def test_deepep_dedups_what_alltoall_sends_per_copy():
    """DeepSeek-V3 (256 experts, top-8) on EP64 over 8 nodes (etp 1: EP ranks adjacent):
    a token reaches 64 (1 - C(252,8)/C(256,8)) = 7.7 ranks and 8 (1 - C(224,8)/C(256,8)) = 5.3
    nodes, so DeepEP's RDMA carries 4.6 copies where the all-to-all sends 8 x 7/8 = 7."""
    b = batch(DSV3)
    assert b.router_groups[0] == 8  # the catalog's group-limited routing ...
    b["router_groups"] = b["router_group_topk"] = np.zeros(1)  # ... off: unrestricted top-8
    by = moe.dispatch_bytes(b, np.array([2048.0]), np.array([1.0]))
    assert by["nodes"][0] == 8 and by["ep_local"][0] == 8
    assert 7.6 < by["ranks_hit"][0] < 7.8 and 5.2 < by["nodes_hit"][0] < 5.4
    assert by["rdma"][0] / (2048 * 2 * 7168) == pytest.approx(by["nodes_hit"][0] * 7 / 8)


def _miss(n, g, k):
    """C(n - g, k) / C(n, k): k of n experts miss a block of g."""
    return math.comb(n - g, k) / math.comb(n, k)


def test_group_limited_routing_fanout_by_hand():
    """DeepSeek-V3 routes group-limited (8 groups of 32 experts, top-4 groups, then top-8 of
    their 128 experts: the catalog's router_groups / router_group_topk). EP64 over 8 nodes: a
    node holds one group, hit with P = 4/8 (1 - C(96,8)/C(128,8)); a rank (4 experts of one
    group) with 4/8 (1 - C(124,8)/C(128,8)). EP32 over 4 nodes: a node holds 2 groups, j of
    them chosen with hypergeometric P(j) = C(2,j) C(6,4-j) / C(8,4), then hit with
    1 - C(128 - 32 j, 8)/C(128, 8)."""
    b = batch(DSV3)
    by = moe.dispatch_bytes(b, np.array([2048.0]), np.array([1.0]))
    p_node = 0.5 * (1 - _miss(128, 32, 8))
    assert by["nodes_hit"][0] == pytest.approx(8 * p_node)
    assert by["ranks_hit"][0] == pytest.approx(64 * 0.5 * (1 - _miss(128, 4, 8)))
    assert by["rdma"][0] / (2048 * 2 * 7168) == pytest.approx(8 * p_node - p_node)
    b32 = batch(DSV3, num_gpus=256, ep=32)
    by32 = moe.dispatch_bytes(b32, np.array([2048.0]), np.array([1.0]))
    hyp = {j: math.comb(2, j) * math.comb(6, 4 - j) / math.comb(8, 4) for j in (1, 2)}
    p32 = sum(hyp[j] * (1 - _miss(128, 32 * j, 8)) for j in (1, 2))
    assert by32["nodes_hit"][0] == pytest.approx(4 * p32)
    # fewer nodes than unrestricted top-8 (5.3 of 8 at EP64, 3.6 of 4 at EP32)
    assert by["nodes_hit"][0] < 3.7 and by32["nodes_hit"][0] < 3.0


def test_router_groups_catalog_errors():
    from sim_core import catalog
    base = dict(layers=4, hidden=1024, heads=8, ffn=0, vocab=1000, experts=16, top_k=2,
                expert_ffn=512)
    with pytest.raises(catalog.CatalogError, match="router_group_topk"):
        catalog.model_from_dict({**base, "router_groups": 4})
    with pytest.raises(catalog.CatalogError, match="router_groups"):
        catalog.model_from_dict({**base, "router_groups": 3, "router_group_topk": 2})
    assert catalog.model_from_dict({**base, "router_groups": 4,
                                    "router_group_topk": 2}).router_groups == 4


def test_permutation_bytes_fused_vs_unfused_by_hand():
    """100 tokens x 2 copies, hidden 1024 (2048 B a row), 8 experts, EP 4 (2 local experts):
    fused: permute reads+writes each copy, unpermute reads the copies and writes the tokens;
    unfused adds the index build (9 B per token and expert), the probability multiply and the
    zero-fill + scatter-add; alltoall sorts received chunks (2 local experts) both ways; the
    router makes 2 (fused) or 8 passes over [T, E] fp32."""
    row, copies, T, E = 2048, 200, 100, 8
    fused = moe.elementwise_bytes(small(moe_permute_fusion=True, moe_router_fusion=True),
                                  np.array([100.0]), np.array([1.0]))[0]
    sort = 2 * 2 * copies * row
    assert fused == 2 * copies * row + (copies * row + T * row) + sort + T * E * 4 * 2
    eager = moe.elementwise_bytes(small(), np.array([100.0]), np.array([1.0]))[0]
    assert eager == (2 * copies * row + T * E * 9 + 3 * copies * row + 3 * T * row + sort
                     + T * E * 4 * 8)
    # flex has no chunk sort
    flex = moe.elementwise_bytes(small(moe_permute_fusion=True, moe_router_fusion=True,
                                       moe_dispatcher=2), np.array([100.0]), np.array([1.0]))[0]
    assert fused - flex == sort


def test_deepep_buffer_by_hand():
    """EP16, hidden 7168, 20 SMs (10 channels), 8 NVL x 2 RDMA ranks; dispatch Config(36, 288,
    20, 128), combine Config(4, 288, 12, 128) (deep_ep/buffer.py v1.2.1); per token
    14336 + 8 (SourceMeta) + 128*8 + 128*4 (top-k idx, weights) + 128*4 (scales) = 16392 B."""
    b = batch(DSV3, ep=16, num_gpus=256, moe_dispatcher="flex")
    nvl = 10 * 8 * (2 * 2 + 3) * 4 + 10 * 8 * 288 * 16392
    rdma = 10 * 2 * (8 * 2 + 2) * 2 * 4 + 10 * 2 * 128 * 2 * (16392 + 16)
    assert moe.buffer_bytes(b)[0] == nvl + rdma + 32 * 1024**2
    # alltoall keeps no such buffer; DeepEP's shows up in the memory breakdown
    assert moe.buffer_bytes(batch(DSV3, ep=16, num_gpus=256))[0] == 0
    out = simulate_frame(pd.DataFrame([{**DSV3, "ep": 16, "num_gpus": 256,
                                        "moe_dispatcher": "flex"}]))
    assert out["mem_dispatcher"].iloc[0] * 1024**3 == pytest.approx(nvl + rdma + 32 * 1024**2)


def _parts(attn_f=2.0, attn_b=3.0, mlp_f=0.3, mlp_dgrad=0.5, mlp_wgrad=0.8, shared_f=0.0,
           shared_b=0.0):
    return {k: np.array([v]) for k, v in dict(attn_f=attn_f, attn_b=attn_b, mlp_f=mlp_f,
                                              mlp_dgrad=mlp_dgrad, mlp_wgrad=mlp_wgrad,
                                              shared_f=shared_f, shared_b=shared_b).items()}


def test_1f1b_overlap_schedule_by_hand():
    """One MoE layer, pp 1, 101 micro-batches (the first forward and last backward alone:
    f = 100/101). Transfers d_f 0.5, c_f 1, d_b 1, c_b 1; compute attn 2 + 3, mlp 0.3/0.5/0.8.
    Pair, no delayed wgrad: max(c_b, 2) + max(d_f, 0.5+0.8) + max(d_b, 0.3) + max(c_f, 3)
    = 2 + 1.3 + 1 + 3 = 7.3 against 6.6 of compute -> 0.7 exposed.
    Delayed wgrad: max(d_f, 0.5) + max(d_b, 0.8+0.3) = 0.5 + 1.1 -> 6.6, nothing exposed."""
    times = {k: np.array([v]) for k, v in dict(d_f=0.5, c_f=1.0, d_b=1.0, c_b=1.0).items()}
    b = batch_from_arrays(dict(pp=1.0, vpp=1.0, ep=8.0, moe_dispatcher=0, sm_count=132.0,
                               sm_arch=90, moe_a2a_overlap=True, moe_delay_wgrad=False,
                               moe_shared_expert_overlap=False), n=1)
    m = np.array([101.0])
    f = 100 / 101
    exp, _ = moe.exposed(b, times, _parts(), np.array([1.0]), m, np.array([False]))
    assert exp[0] == pytest.approx(f * 0.7 + (1 - f) * 3.5)
    b["moe_delay_wgrad"] = np.array([True])
    exp, extra = moe.exposed(b, times, _parts(), np.array([1.0]), m, np.array([False]))
    assert exp[0] == pytest.approx((1 - f) * 3.5)
    assert extra[0] > 0  # the hidden transfers slow the compute under them
    # the MoE-layer recompute replays dispatch + combine outside the pairing: exposed
    exp_rc, _ = moe.exposed(b, times, _parts(), np.array([1.0]), m, np.array([True]))
    assert exp_rc[0] == pytest.approx((1 - f) * 3.5 + 1.5)
    # no overlap: everything exposed, a full recompute replays dispatch + combine
    b["moe_a2a_overlap"] = np.array([False])
    exp, extra = moe.exposed(b, times, _parts(), np.array([1.0]), m, np.array([True]))
    assert exp[0] == pytest.approx(3.5 + 1.5) and extra[0] == 0
    # shared-expert overlap hides the transfers behind the shared experts only
    b["moe_shared_expert_overlap"] = np.array([True])
    exp, _ = moe.exposed(b, times, _parts(shared_f=0.4, shared_b=5.0), np.array([1.0]), m,
                         np.array([False]))
    assert exp[0] == pytest.approx(3.5 - 0.4 - 2.0)


def test_overlapped_fraction_interleaved_warmup():
    b = batch_from_arrays(dict(pp=8.0, vpp=4.0), n=1)
    # first rank: (8-1)*2 + (4-1)*8 + 1 = 39 chunk passes alone out of 128 * 4
    assert moe.overlapped_fraction(b, np.array([128.0]))[0] == pytest.approx(1 - 39 / 512)


def test_flex_and_overlap_speed_up_deepseek_as_the_recipes_claim():
    frame = pd.DataFrame([{**DSV3, "moe_dispatcher": d, "moe_a2a_overlap": o,
                           "moe_delay_wgrad": o} for d in ("alltoall", "flex")
                          for o in (False, True)])
    out = simulate_frame(frame)
    ep = out["time_ep"].to_numpy()
    assert ep[2] < ep[0]  # DeepEP dedups the inter-node copies
    assert ep[1] < ep[0] / 2 and ep[3] < ep[2] / 2  # 1F1B overlap hides most of the rest
    assert out["step_time_s"].iloc[3] == out["step_time_s"].min()


def test_allgather_dispatcher_inventory():
    b = batch(DSV3, moe_dispatcher="allgather")
    wl = workload.build(b)
    ag = [c for c in wl.comms if c.dim == "ep" and c.op == "all_gather"]
    a2a = [c for c in wl.comms if c.dim == "ep" and c.op == "all_to_all"]
    assert ag[0].calls_per_step[0] > 0 and a2a[0].calls_per_step[0] == 0
    T = 4096 / 2
    assert ag[0].nbytes[0] == pytest.approx(T * 64 * (2 * 7168 + 5 * 256))


def test_launch_overhead_counts():
    """Eager: router 12 + permute 10 + chunk sorts 2 + collectives 4 + 2 GEMMs per local expert
    + activation, at 2 us, plus one 20 us host sync; fused: router 3, permute 2."""
    b = small()  # 2 local experts, alltoall
    over = moe.launch_overhead_s(b)
    assert over["fwd"][0] == pytest.approx((12 + 10 + 2 + 4 + 4 + 1) * 2e-6 + 20e-6)
    assert over["bwd"][0] == pytest.approx((12 + 10 + 2 + 4 + 8 + 1) * 2e-6)
    fused = moe.launch_overhead_s(small(moe_permute_fusion=True, moe_router_fusion=True))
    assert over["fwd"][0] - fused["fwd"][0] == pytest.approx((9 + 8) * 2e-6)


@pytest.mark.parametrize("over, reason", [
    (dict(moe_a2a_overlap=True, ep=1, num_gpus=1024), "needs ep > 1"),
    (dict(moe_a2a_overlap=True, moe_dispatcher="allgather"), "alltoall or flex"),
    (dict(moe_a2a_overlap=True, recompute="full"), "full recompute"),
    (dict(moe_a2a_overlap=True, vpp=1), "needs vpp > 1"),
    (dict(moe_a2a_overlap=True, moe_shared_expert_overlap=True), "cannot both be on"),
    (dict(moe_delay_wgrad=True), "needs moe_a2a_overlap"),
    (dict(moe_shared_expert_overlap=True, moe_dispatcher="flex"), "needs the alltoall"),
    (dict(moe_dispatcher="flex", ep=32, etp=3, tp=2), "ep*etp"),
])
def test_rules_megatron_refuses(over, reason):
    ok, why = rules.check(batch(DSV3, **over))
    assert not ok[0] and reason in why[0], why[0]


def test_rules_accept_the_recipe_combinations():
    for over in (dict(moe_dispatcher="flex", moe_a2a_overlap=True, moe_delay_wgrad=True),
                 dict(moe_dispatcher="alltoall", moe_shared_expert_overlap=True),
                 dict(moe_dispatcher="allgather")):
        ok, why = rules.check(batch(DSV3, **over))
        assert ok[0], why[0]
    ok, why = rules.check(batch({**DSV3, "model": "qwen3-30b-a3b", "ep": 8, "tp": 1, "pp": 1,
                                 "vpp": 1, "num_gpus": 64, "sequence_parallel": False},
                                moe_shared_expert_overlap=True))
    assert not ok[0] and "shared experts" in why[0]


def test_export_moe_flags():
    row = {**DSV3, "moe_dispatcher": "flex", "moe_a2a_overlap": True, "moe_delay_wgrad": True,
           "global_batch": 8192, "num_gpus": 1024, "dp": 64}
    args = export.megatron_args(row)
    ns = export.megatron_parser().parse_args(args)
    assert ns.moe_token_dispatcher_type == "flex" and ns.moe_enable_deepep
    assert ns.overlap_moe_expert_parallel_comm and ns.delay_wgrad_compute
    assert ns.moe_permute_fusion and ns.moe_router_fusion and ns.moe_grouped_gemm
    assert not ns.moe_shared_expert_overlap
    row = {**row, "moe_dispatcher": "alltoall", "moe_a2a_overlap": False,
           "moe_delay_wgrad": False, "moe_shared_expert_overlap": True,
           "moe_permute_fusion": False, "moe_dropless": False, "capacity_factor": 1.25}
    ns = export.megatron_parser().parse_args(export.megatron_args(row))
    assert ns.moe_token_dispatcher_type == "alltoall" and not ns.moe_enable_deepep
    assert ns.moe_shared_expert_overlap and not ns.overlap_moe_expert_parallel_comm
    assert not ns.moe_permute_fusion and float(ns.moe_expert_capacity_factor) == 1.25
    known = export.known_megatron_flags()
    assert all(a in known for a in export.megatron_args(row) if a.startswith("--"))


def test_bundled_deepseek_space_varies_the_dispatch_path_and_exports_it():
    from pathlib import Path

    from sweep.config import load_space
    from sweep.engine.evaluate import evaluate
    from sweep.engine.space import Space

    path = Path(__file__).resolve().parents[1] / "search_spaces" / "deepseek-v3-1024xh100.yaml"
    cfg = load_space(path)
    for axis in ("moe_dispatcher", "moe_a2a_overlap", "moe_delay_wgrad",
                 "moe_shared_expert_overlap"):
        assert len(cfg.space[axis]) == 2, axis
    space = Space.from_config(cfg)
    df = evaluate(space.frame(0, space.size))
    assert set(df.loc[df["status"] == "ok", "moe_dispatcher"]) == {"alltoall", "flex"}
    assert (df["invalid_reason"].str.contains("moe_a2a_overlap")).any()
    best = df[df["status"] == "ok"].sort_values("step_time_s").iloc[0]
    ns = export.megatron_parser().parse_args(export.megatron_args(best))
    assert ns.moe_token_dispatcher_type == best["moe_dispatcher"]
    assert bool(ns.moe_enable_deepep) == (best["moe_dispatcher"] == "flex")
    assert bool(ns.overlap_moe_expert_parallel_comm) == bool(best["moe_a2a_overlap"])
    assert bool(ns.delay_wgrad_compute) == bool(best["moe_delay_wgrad"])
    assert bool(ns.moe_shared_expert_overlap) == bool(best["moe_shared_expert_overlap"])
    assert ns.moe_permute_fusion and ns.moe_router_fusion


def test_moe_recompute_modules_memory_and_time_by_hand():
    """DeepSeek-V3 bf16, tp 2 with SP, T = 4096 tokens, 58 of 61 layers MoE. moe_act drops the
    routed experts' activation output, 2 B x T x top-8 x 2048 / tp per MoE layer; moe keeps only
    the pre-MLP norm's input and the MoE layer's input, 2 x 2 B x T x 7168 / tp."""
    from sim_core import memory

    def per_layer(mode):
        b = batch(DSV3, precision="bf16", recompute="none", moe_recompute=mode)
        wl = workload.build(b)
        return memory.activation_bytes_per_layer(b, wl.tokens, b.tp, b.sequence_parallel,
                                                 wl.dims, wl.moe_load), wl

    base, wl = per_layer("none")
    act, _ = per_layer("moe_act")
    whole, _ = per_layer("moe")
    frac = 58 / 61
    assert base["none"][0] - act["none"][0] == pytest.approx(frac * 2 * 4096 * 8 * 2048 / 2)
    assert base["none"][0] == base["live"][0]  # nothing recomputed
    # what a MoE layer keeps without recompute (h 7168, 8 routed + 1 shared of 2048, SwiGLU):
    # norm + router/shared inputs, expert inputs, FC1 outputs (2 f), activation outputs,
    # router probabilities (fp32 x 256 experts), the copies unpermute keeps
    T, h, f, t = 4096, 7168, 2048, 2
    moe_mlp = (4 * T * h / t + 2 * T * 9 * h / t + 2 * T * 9 * f * 2 / t + 2 * T * 9 * f / t
               + 4 * T * 256 / t + 2 * T * 8 * h / t)
    assert base["none"][0] - whole["none"][0] == pytest.approx(frac * (moe_mlp - 4 * T * h / t))
    assert whole["live"][0] == base["live"][0]  # the backward holds the layer again
    out = simulate_frame(pd.DataFrame([{**DSV3, "recompute": "none", "moe_recompute": m}
                                       for m in ("none", "moe_act", "moe")]))
    rc = out["time_recompute"].to_numpy()
    assert rc[0] == 0 and 0 < rc[1] < rc[2]
    # the MoE-layer module replays dispatch and combine
    no_ov = pd.DataFrame([{**DSV3, "recompute": "none", "moe_recompute": m,
                           "moe_a2a_overlap": False} for m in ("none", "moe")])
    ep = simulate_frame(no_ov)["time_ep"].to_numpy()
    assert ep[1] == pytest.approx(ep[0] * 6 / 4)


def test_moe_recompute_rules_and_flags():
    ok, why = rules.check(batch(DSV3, recompute="selective", moe_recompute="moe"))
    assert not ok[0] and "needs recompute none" in why[0]
    row = {**DSV3, "recompute": "none", "moe_recompute": "moe_act", "dp": 64}
    ns = export.megatron_parser().parse_args(export.megatron_args(row))
    assert ns.recompute_granularity == "selective" and ns.recompute_modules == ["moe_act"]


def test_memory_categories_add_up_with_the_dispatcher_buffers():
    out = simulate_frame(pd.DataFrame([{**DSV3, "moe_dispatcher": "flex"}]))
    cats = [c for c in out.columns if c.startswith("mem_")]
    assert out["mem_dispatcher"].iloc[0] > 0.5
    assert out[cats].iloc[0].sum() == pytest.approx(out["peak_memory_gib"].iloc[0], rel=1e-9)


def test_validation_takes_each_moe_rows_dispatch_path_from_its_recipe():
    from sim_core.accuracy import validation

    data = validation.load_published()
    by_id = data.set_index("id")
    assert by_id.loc["117", "moe_dispatcher"] == "flex" and by_id.loc["117", "moe_a2a_overlap"]
    assert by_id.loc["118", "moe_dispatcher"] == "alltoall"
    assert not by_id.loc["118", "moe_a2a_overlap"]
    assert by_id.loc["125", "moe_dispatcher"] == "alltoall" and by_id.loc["125", "moe_a2a_overlap"]
    assert by_id.loc["129", "moe_dispatcher"] == "flex"
    assert by_id.loc["123", "moe_dispatcher"] == "alltoall"
    moe = data[data["is_moe"] & (data["skip"] == "")]
    assert moe["moe_permute_fusion"].all() and moe["moe_router_fusion"].all()
    # a row whose release has no recipe in the table is imputed (fastest valid choice)
    assert validation._moe_recipe("deepseek-v3", "some 2025 blog", "h100-sxm") == (None, None)
    t = validation._impute(moe.assign(moe_dispatcher=None, moe_a2a_overlap=None).head(1))
    assert t["moe_dispatcher"].iloc[0] in ("alltoall", "flex")
    assert "moe_dispatcher" in t["imputed"].iloc[0]
    assert t["moe_delay_wgrad"].iloc[0] == bool(t["moe_a2a_overlap"].iloc[0])
