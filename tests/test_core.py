"""The simulator core against closed forms: FLOPs (Megatron), activations (Korthikanti),
model states (ZeRO / distributed optimizer), pipeline memory, rules and input validation."""

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog, memory, rules, step, workload
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate, simulate_frame

GPT3 = dict(model="gpt3-175b", seq_len=2048, global_batch=1536, gpu="a100-80gb",
            num_gpus=1024, tp=8, pp=16, micro_batch=1, recompute="full")


def batch(**over):
    return frame_to_batch(pd.DataFrame([{**GPT3, **over}]))


def test_gemm_flops_match_megatron_formula():
    """Forward+backward GEMM FLOPs over all GPUs = 72*B*s*L*h^2*(1 + V/(12*L*h)) for GPT-3
    (the attention-score term is counted separately, causal)."""
    b = batch(recompute="none")
    wl = workload.build(b)
    ops = {op.name: op for op in wl.ops}
    per_gpu_mb = lambda op: float((op.fwd_flops + op.bwd_flops)[0])  # noqa: E731
    t, p, dp, m = 8, 16, float(wl.dp[0]), float(wl.num_microbatches[0])
    layer_ops = [op for op in wl.ops if op.op_class == "gemm" and op.where == "layer"]
    layers = sum(per_gpu_mb(op) for op in layer_ops) * t * p * dp * m
    head = per_gpu_mb(ops["lm_head"]) * t * dp * m
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    expected = 72 * B * s * L * h * h * (1 + V / (12 * L * h))
    # the layer GEMMs also include the 4 small norm-free bias-less projections exactly: 12h^2
    assert (layers + head) == pytest.approx(expected, rel=1e-9)


def test_attention_flops_are_causal_half_of_megatron_term():
    b = batch(recompute="none")
    wl = workload.build(b)
    attn = next(op for op in wl.ops if op.name == "attention")
    t, p, dp, m = 8, 16, float(wl.dp[0]), float(wl.num_microbatches[0])
    fwd_total = float(attn.fwd_flops[0]) * t * p * dp * m
    B, s, L, h = 1536, 2048, 96, 12288
    megatron_fwd = 4 * B * s * s * h * L  # QK^T and AV, full (non-causal) scores
    assert fwd_total == pytest.approx(megatron_fwd / 2, rel=1e-9)


def test_model_flops_per_step_matches_megatron_model_flops():
    b = batch()
    wl = workload.build(b)
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    expected = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    # ours also counts the norm weights (2h per layer): a 1e-4 relative difference
    assert float(wl.model_flops_per_step[0]) == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("t,sp", [(1, False), (4, False), (8, False), (4, True), (8, True)])
def test_activations_match_korthikanti(t, sp):
    """GPT (MHA, GeLU, ffn=4h), flash attention, no dropout masks: Korthikanti's
    s*b*h*(10 + 24/t) (TP) or 34*s*b*h/t (TP+SP) minus the two 1-byte dropout masks, plus the
    fp32 log-sum-exp that flash attention keeps (4 bytes per token and head)."""
    b = batch(tp=t, sequence_parallel=sp)
    dims = workload.model_dims(b)
    T = float(b.micro_batch[0] * b.seq_len[0])
    h, a = 12288.0, 96.0
    spb = np.array([sp])
    got = memory.activation_bytes_per_layer(b, T, np.array([float(t)]), spb, dims)
    rep = t if sp else 1
    none = T * h * (8 / rep + 24 / t) + 4 * T * a / t
    assert float(got["none"][0]) == pytest.approx(none, rel=1e-12)
    assert float(got["full"][0]) == pytest.approx(2 * T * h / rep, rel=1e-12)
    assert float(got["full"][0]) < float(got["selective"][0]) < float(got["none"][0])


def test_model_states_follow_zero_sharding():
    """bf16 weights 2 B, fp32 main grads 4 B, fp32 master+Adam 12 B per parameter."""
    out = {z: simulate(batch(zero=z, recompute="full")) for z in (0, 1, 2)}
    P = float(out[0]["params_per_gpu"][0])
    dp = float(out[0]["dp"][0])
    gib = 1024**3
    assert out[0]["mem_weights"][0] * gib == pytest.approx(2 * P)
    assert out[0]["mem_grads"][0] * gib == pytest.approx(4 * P)
    assert out[0]["mem_optimizer"][0] * gib == pytest.approx(12 * P)
    assert out[1]["mem_optimizer"][0] * gib == pytest.approx(12 * P / dp)
    assert out[1]["mem_grads"][0] * gib == pytest.approx(4 * P)
    assert out[2]["mem_grads"][0] * gib == pytest.approx(4 * P / dp)


def test_first_pipeline_stage_holds_pp_microbatches():
    """1F1B: stored activations scale with min(pp, microbatches) on the first stage;
    interleaving adds (pp-1)/vpp chunks."""
    a = simulate(batch(pp=8, recompute="full", num_gpus=1024))
    b = simulate(batch(pp=8, recompute="full", num_gpus=1024, micro_batch=2))
    ratio = b["mem_activations"][0] / a["mem_activations"][0]
    assert ratio == pytest.approx(2.0, rel=1e-9)  # twice the tokens per micro-batch
    c = simulate(batch(pp=8, vpp=2, recompute="full", num_gpus=1024))
    assert c["mem_activations"][0] / a["mem_activations"][0] == pytest.approx(
        (8 + 7 / 2) / 8, rel=1e-9)


def test_breakdowns_sum_to_totals():
    df = pd.DataFrame([GPT3, {**GPT3, "tp": 4, "pp": 8, "zero": 3, "recompute": "selective"},
                       {**GPT3, "gpu": "h100-sxm", "precision": "fp8", "vpp": 2,
                        "sequence_parallel": True, "tp_comm_overlap": True}])
    out = simulate_frame(df)
    times = out[[c for c in out.columns if c.startswith("time_")]].sum(axis=1)
    mems = out[[c for c in out.columns if c.startswith("mem_")]].sum(axis=1)
    np.testing.assert_allclose(times, out["step_time_s"], rtol=1e-12)
    np.testing.assert_allclose(mems, out["peak_memory_gib"], rtol=1e-12)


def test_last_dp_bucket_holds_the_embedding_shard():
    """Megatron-Core fills DP buckets in reverse parameter order, so the input embedding closes
    the final bucket: with one micro-batch nothing hides its reduce-scatter or its all-gather."""
    llama = dict(model="llama3-8b", seq_len=8192, global_batch=32, gpu="h100-sxm", num_gpus=32,
                 tp=1, pp=1, micro_batch=1, zero=1)
    b = frame_to_batch(pd.DataFrame([llama]))
    wl = workload.build(b)
    assert wl.num_microbatches[0] == 1
    emb = 128256 * 4096
    assert step.last_bucket_params(wl)[0] == pytest.approx(emb)  # 525M > max(40M, 1M x 32)
    rs, ag = (t[0] for cm, t in step.comm_times(b, wl)
              if cm.dim == "dp" and cm.op in ("reduce_scatter", "all_gather")
              and cm.calls_per_step[0] > 0)
    time_dp = simulate_frame(pd.DataFrame([llama]))["time_dp"].iloc[0]
    assert time_dp >= (rs + ag) * emb / wl.params_stage[0] * (1 - 1e-9)
    # GPT-3's embedding shard (51200 x 12288 / 8 = 79M) is below Megatron's bucket size at
    # dp 128, max(40M, 1M x 128)
    wl = workload.build(batch(num_gpus=16384))
    assert wl.dp[0] == 128
    assert step.last_bucket_params(wl)[0] == pytest.approx(128e6)


def test_rules_flag_each_violation():
    cases = {
        "heads % tp != 0": dict(tp=5, num_gpus=1040),
        "num_gpus % (tp*pp*cp) != 0": dict(num_gpus=1000),
        "global_batch % (dp*micro_batch) != 0": dict(global_batch=1004),
        "layers < pp*vpp (a pipeline chunk would have no layer)": dict(pp=128, num_gpus=1024,
                                                                       tp=8, global_batch=1024),
        "vpp > 1 needs pp > 1": dict(pp=1, vpp=2),
        "sequence_parallel needs tp > 1": dict(tp=1, sequence_parallel=True),
        "ep > 1 needs a MoE model": dict(ep=2),
    }
    for reason, over in cases.items():
        valid, why = rules.check(batch(**over))
        assert not valid[0] and why[0] == reason, (reason, why[0])
    valid, why = rules.check(batch())
    assert valid[0] and why[0] == ""


def test_invalid_rows_are_blank_not_errors():
    df = pd.DataFrame([GPT3, {**GPT3, "tp": 5}])
    out = simulate_frame(df)
    assert bool(out["valid"].iloc[0]) and not bool(out["valid"].iloc[1])
    assert np.isnan(out["step_time_s"].iloc[1]) and not bool(out["fits"].iloc[1])
    assert np.isfinite(out["step_time_s"].iloc[0])


def test_batch_equals_single_calls():
    rows = [GPT3, {**GPT3, "tp": 4, "pp": 4}, {**GPT3, "gpu": "h100-sxm", "zero": 3}]
    together = simulate_frame(pd.DataFrame(rows)).reset_index(drop=True)
    alone = pd.concat([simulate_frame(pd.DataFrame([r])) for r in rows], ignore_index=True)
    pd.testing.assert_frame_equal(together, alone)


def test_unknown_names_raise_one_line_catalog_errors():
    with pytest.raises(catalog.CatalogError, match="did you mean"):
        batch(gpu="h100")
    with pytest.raises(catalog.CatalogError, match="recompute"):
        batch(recompute="sometimes")
    with pytest.raises(catalog.CatalogError) as exc:
        batch(model="gpt4")
    assert "\n" not in str(exc.value)


def test_fp8_uses_fp8_peak_on_hopper_only():
    h_bf16 = simulate(batch(gpu="h100-sxm", precision="bf16"))["time_compute"][0]
    h_fp8 = simulate(batch(gpu="h100-sxm", precision="fp8"))["time_compute"][0]
    a_bf16 = simulate(batch(precision="bf16"))["time_compute"][0]
    a_fp8 = simulate(batch(precision="fp8"))["time_compute"][0]
    assert h_fp8 < 0.8 * h_bf16  # GEMMs at up to 2x: most of the compute
    assert a_fp8 == pytest.approx(a_bf16)  # A100 has no FP8 tensor cores


# A loss-dominated case: Llama 3.1 8B, one GPU's worth of 16k tokens under FSDP, full recompute.
LLAMA8 = dict(model="llama3.1-8b", seq_len=8192, global_batch=16, gpu="h100-96gb", num_gpus=8,
              tp=1, pp=1, micro_batch=2, recompute="full", zero=3)


def test_loss_bytes_per_logit_follow_the_implementation():
    """Allocated peak moves by exactly the per-logit difference between implementations
    (eager 12 B vs Megatron's fused 6 B, loss_parallel 16 B, compiled 4 B) x T*V/t logits."""
    impls = ["fused", "compiled", "eager", "eager_parallel"]
    out = simulate_frame(pd.DataFrame([{**LLAMA8, "loss_impl": i} for i in impls]))
    logits = 2 * 8192 * 128256
    alloc = out["peak_allocated_gib"].to_numpy() * 1024**3
    assert alloc[2] - alloc[0] == pytest.approx(6 * logits, rel=1e-9)
    assert alloc[3] - alloc[2] == pytest.approx(4 * logits, rel=1e-9)
    assert alloc[0] - alloc[1] == pytest.approx(2 * logits, rel=1e-9)
    # reserved: eager keeps one more fp32 segment (14 B) and loss_parallel two (18 B), both on
    # top of what one layer's forward left cached
    res = out["peak_reserved_gib"].to_numpy() * 1024**3
    assert res[3] - res[2] == pytest.approx(4 * logits, rel=1e-9)
    assert (res - alloc)[2] > 2 * logits  # 2 B/logit of segments + the cached layer blocks


def test_loss_traffic_per_logit_follows_the_implementation():
    """The loss op moves the implementation's bytes per logit (workload.LOSS_TRAFFIC, counted
    from each kernel list) over the T x V/t logits: Megatron's unfused vocab-parallel CE (.float()
    copy, max, in-place subtract, exp, sum, divide; multiply and cast back) moves 38 + 14, its
    fused native path 22 + 10, TE's Triton kernel 6 + 4 (two reads, the gradient written over
    the logits; one in-place scale in backward); the step time follows the bytes."""
    impls = ["vocab_parallel", "fused", "te"]
    rows = [{**GPT3, "tp": 8, "pp": 1, "num_gpus": 64, "global_batch": 64, "loss_impl": i}
            for i in impls]
    wl = workload.build(frame_to_batch(pd.DataFrame(rows)))
    loss = next(op for op in wl.ops if op.name == "loss")
    logits = 2048 * 51200 / 8  # T x V/t per micro-batch (catalog GPT-3: vocab 51200)
    assert loss.fwd_bytes / logits == pytest.approx([38.0, 22.0, 6.0])
    assert loss.bwd_bytes / logits == pytest.approx([14.0, 10.0, 4.0])
    t = simulate_frame(pd.DataFrame(rows))["step_time_s"].to_numpy()
    # everything but the loss is equal: time differences are in the ratio of the bytes
    assert (t[0] - t[1]) / (t[1] - t[2]) == pytest.approx((52 - 32) / (32 - 10), rel=1e-6)


def test_te_cross_entropy_holds_only_the_bf16_logits():
    """TE's kernel writes the bf16 gradient over the bf16 logits: 2 B per logit at the loss's
    peak where Megatron's (fused or not) holds the fp32 softmax beside them (6 B)."""
    out = simulate_frame(pd.DataFrame([{**LLAMA8, "loss_impl": i}
                                       for i in ("vocab_parallel", "fused", "te")]))
    held = out["mem_logits"].to_numpy() * 1024**3
    assert held[0] == pytest.approx(held[1], rel=1e-12)
    assert held[1] - held[2] == pytest.approx(4 * 2 * 8192 * 128256, rel=1e-9)
    # the peak falls by at most that (another phase may then set it)
    alloc = out["peak_allocated_gib"].to_numpy() * 1024**3
    assert 0 < alloc[1] - alloc[2] <= 4 * 2 * 8192 * 128256 * (1 + 1e-9)


def test_counters_are_ordered():
    """allocated <= reserved, and the device total adds the CUDA context and NCCL buffers."""
    df = pd.DataFrame([GPT3, {**GPT3, "zero": 3, "recompute": "selective"}, LLAMA8,
                       {**LLAMA8, "loss_impl": "eager_parallel", "tp": 8, "num_gpus": 64,
                        "sequence_parallel": True}])
    out = simulate_frame(df)
    assert (out["peak_allocated_gib"] <= out["peak_reserved_gib"]).all()
    np.testing.assert_allclose(out["peak_memory_gib"] - out["peak_reserved_gib"],
                               memory.RUNTIME_GIB)


def test_tp_overlap_does_not_leave_the_gathered_input_cached():
    """With SP and no TP overlap the all-gathered layer input (T x h bf16) stays in the cache
    when the loss starts; AsyncTP / userbuffers stream it in chunks instead."""
    base = {**LLAMA8, "model": "llama3.1-70b", "tp": 8, "num_gpus": 256, "global_batch": 512,
            "micro_batch": 16, "sequence_parallel": True, "loss_impl": "eager_parallel"}
    out = simulate_frame(pd.DataFrame([base, {**base, "tp_comm_overlap": True}]))
    gathered = 2 * (16 * 8192) * 8192 / 1024**3
    diff = out["peak_reserved_gib"][0] - out["peak_reserved_gib"][1]
    assert diff == pytest.approx(gathered, rel=1e-9)
    assert out["peak_allocated_gib"][0] == pytest.approx(out["peak_allocated_gib"][1])


def test_arch_constants_by_architecture_and_nearest_below_for_unknown():
    """compute._by_arch: each configuration's architecture row of efficiency.yaml; an
    architecture the table lacks takes the nearest row at or below it, the oldest for anything
    older: sm_89 / sm_120 stay NVIDIA (80 / 100), a future CDNA stays AMD, not Ascend's 2201."""
    from sim_core import compute

    table = compute.efficiency_table()
    known = sorted(table)
    arch = np.array([*known, 75.0, 89.0, 120.0, 960.0, 2300.0], dtype=float)
    got = compute._by_arch(arch, "gemm_max", "bf16")
    nearest = [80, 80, 100, 950, 2201]
    want = [table[a]["gemm_max"]["bf16"] for a in known + nearest]
    assert got.tolist() == want
    assert compute._by_arch(np.array([90.0]), "layer_overhead_us")[0] == table[90]["layer_overhead_us"]
