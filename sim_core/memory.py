"""Peak GPU memory of the worst rank, by category, and whether it fits.

Model states (weights, gradients, optimizer) follow the sharding of ZeRO / the distributed
optimizer / FSDP over the data-parallel group (dp x cp). Activations follow Korthikanti et al.
(2022), re-derived per op so that GQA, SwiGLU, MoE, sequence parallelism, CP and the recompute
modes change the coefficients instead of the famous 34. The peak is the larger of two phases:
forward/backward (states + activations in flight + working buffers) and the optimizer step
(states + the optimizer's temporaries), as TorchSim observes (seed 003, Tables 3-4).

Constants that are not exact byte counts are named below with their reason.
"""

from __future__ import annotations

import numpy as np

from .columns import Batch
from .workload import ACT_BYTES, Workload

GIB = 1024.0**3
# CUDA context, cuBLAS workspaces and NCCL channel buffers: not visible to PyTorch's allocator
# but resident on the device. Typical figures: context 0.3-0.5 GiB, NCCL 0.2-1 GiB with 8+
# channels per communicator (modeling notes §3).
RUNTIME_GIB = 1.0
# PyTorch's caching allocator reserves more than it allocates (block rounding, fragmentation);
# peak reserved / peak allocated is ~1.05-1.15 in published traces. Applied to the dynamic part.
FRAGMENTATION = 1.10
# Bytes per logit held around the loss: bf16 logits (2) + fp32 upcast (4) + log-softmax output
# (4) + part of the fp32/bf16 gradient (2). Fitted between the two memory sets we check:
# TorchSim Tables 3-4 imply ~10 B (their runs), torchtitan's Dec-2024 benchmark rows imply
# 14-18 B (eager, unfused CE). 12 B keeps TorchSim over (the safe side) and torchtitan close.
# Megatron's fused vocab-parallel CE needs less: this is a margin for it.
LOGIT_BYTES = 12.0
# Torch's multi-tensor (foreach) AdamW allocates a temporary as large as the fp32 shard it
# updates (sqrt(v) as a new tensor list); FSDP frameworks use it (ZeRO-3 here). Megatron's
# fused Adam works in place. TorchSim Table 4 (an optimizer-phase peak) fits one temporary.
FOREACH_TEMP_BYTES = 4.0


def activation_bytes_per_layer(b: Batch, T, t, sp, dims: dict) -> dict:
    """Bytes one micro-batch leaves stored per transformer layer, for each recompute mode."""
    h = dims["h"]
    rep = np.where(sp, t, 1.0)  # replicated-under-TP tensors are sharded only with SP
    moe_frac = dims["n_moe_layers"] / b.layers
    # FP8 (Transformer Engine) saves the FP8-cast input of each GEMM for its weight gradient:
    # 1 byte instead of 2 for the QKV, out-proj, FC1 and FC2 inputs
    g_in = np.where((b.precision == 1) & (b.has_fp8 > 0), 1.0, ACT_BYTES)
    # attention block: norm input, QKV input, Q/K/V, attention output (= out-proj input),
    # softmax statistics (fp32 log-sum-exp per head)
    qkv = dims["q_dim"] + 2 * dims["kv_dim"]
    attn = ((ACT_BYTES + g_in) * T * h / rep + ACT_BYTES * T * qkv / t
            + g_in * T * dims["a"] * dims["dv"] / t + 4.0 * T * dims["a"] / t)
    # MLP block: norm input, FC1 input, FC1 output(s) and the activation output (FC2 input)
    fc1_out = np.where(b.activation == 1, 2.0, 1.0)
    dense_mlp = ((ACT_BYTES + g_in) * T * h / rep + ACT_BYTES * T * b.ffn * fc1_out / t
                 + g_in * T * b.ffn / t)
    # MoE: each token is routed to top_k experts (+ shared): dispatched copies of the hidden
    # state and the expert FC1/activation outputs, plus router probabilities
    routed = (b.top_k + b.shared_experts)
    moe_mlp = ((ACT_BYTES + g_in) * T * h / rep + g_in * T * routed * h / t
               + ACT_BYTES * T * routed * b.expert_ffn * fc1_out / t
               + g_in * T * routed * b.expert_ffn / t + 4.0 * T * b.experts / t)
    mlp = (1 - moe_frac) * dense_mlp + moe_frac * moe_mlp
    none = attn + mlp
    # selective = op-level selective checkpointing (torchtitan's op SAC; Megatron's selective
    # recompute with modules): keep the layer input, the attention output and statistics, and
    # every other GEMM output; recompute the rest in backward
    f_width = (1 - moe_frac) * b.ffn + moe_frac * routed * b.expert_ffn
    gemm_out = (dims["q_dim"] + 2 * dims["kv_dim"]) / t + h / rep + f_width * fc1_out / t + h / rep
    selective = (ACT_BYTES * T * h / rep + ACT_BYTES * T * dims["a"] * dims["dv"] / t
                 + 4.0 * T * dims["a"] / t + 0.5 * ACT_BYTES * T * gemm_out)
    full = ACT_BYTES * T * h / rep  # only the layer input is kept
    return {"none": none, "selective": selective, "full": full}


def estimate(b: Batch, wl: Workload) -> dict:
    """Memory per category (bytes) for the worst rank, plus peak and fits."""
    dims = wl.dims
    t, p, v = b.tp, b.pp, b.vpp
    T = wl.tokens
    m = wl.num_microbatches
    sp = b.sequence_parallel & (t > 1)
    z = b.zero
    ds = wl.dp * b.cp  # data-parallel sharding group (CP ranks hold the same weights)
    edp = np.maximum(wl.dp * b.cp * t / (b.ep * np.where(b.etp > 0, b.etp, t)), 1.0)
    P = wl.params_stage
    P_exp = P * wl.expert_fraction
    P_dense = P - P_exp
    # parameters as a sharded count: dense ones over ds, expert ones over expert-dp
    P_shard = P_dense / ds + P_exp / edp

    # ---- model states ----------------------------------------------------------------------
    fsdp = z == 3
    weights = np.where(fsdp, 2.0 * P_shard, 2.0 * P)
    # FP8 (Transformer Engine) caches an FP8 copy of each layer weight for the step
    fp8 = (b.precision == 1) & (b.has_fp8 > 0)
    # (with fp8_param_gather the FP8 copy is the primary weight: no bf16 copy of layer weights)
    fp8_primary = fp8 & b.fp8_param_gather
    weights = weights + np.where(fp8 & ~fsdp & ~fp8_primary, 1.0 * (P - wl.params_embed),
                                 np.where(fp8_primary & ~fsdp, -1.0 * (P - wl.params_embed), 0.0))
    g_bytes = np.where(b.grad_reduce_fp32, 4.0, 2.0)  # fp32 or bf16 main-grad buffer
    grads = np.where(z >= 2, g_bytes * P_shard, g_bytes * P)
    master_adam = 12.0
    optimizer = np.where(z >= 1, master_adam * P_shard, master_adam * P)

    # ---- activations -----------------------------------------------------------------------
    per_layer = activation_bytes_per_layer(b, T, t, sp, dims)
    rc = b.recompute
    stored = np.where(rc == 2, per_layer["full"],
                      np.where(rc == 1, per_layer["selective"], per_layer["none"]))
    L_stage = wl.layers_per_stage
    # micro-batches in flight on the first stage: 1F1B keeps p; interleaving adds (p-1)/v
    # chunks (Korthikanti et al.: factor 1 + (p-1)/(p*v)); never more than the step has
    in_flight = np.where(p > 1, np.minimum(p + (p - 1) / v, m * 1.0), 1.0)
    in_flight = np.where((p > 1) & (v == 1), np.minimum(p, m), in_flight)
    act_first = stored * L_stage * in_flight
    # during backward one layer's full set of activations is live again (recomputed or not),
    # plus its gradients (same order of size)
    working = 2.0 * per_layer["none"]
    # SP / TP: the all-gathered input of a column-parallel GEMM is materialised
    working = working + np.where(sp, ACT_BYTES * T * dims["h"], 0.0)
    # the rank holding the LM head (the last stage; with pp == 1 the only one): one micro-batch
    # in flight with pp > 1, plus the logits and the loss buffers
    logits = LOGIT_BYTES * T * b.vocab / t
    act_head = np.where(p > 1, stored * L_stage, act_first)

    # ---- working buffers -------------------------------------------------------------------
    # FSDP/ZeRO-3: the unit being computed is all-gathered (bf16) with its bf16 grads and an
    # fp32 reduce-scatter buffer (8 B/param), and the next one is prefetched (2 B/param)
    unit_buf = lambda unit: np.where(fsdp, 8.0 * unit + 2.0 * wl.params_layer, 0.0)  # noqa: E731
    layer_buf = unit_buf(wl.params_layer)
    head_buf = unit_buf(wl.params_embed)
    # pipeline: send/recv buffers for activations in both directions
    pp_buf = np.where(p > 1, 2 * ACT_BYTES * T * dims["h"] / np.where(sp, t, 1.0), 0.0)

    # ---- peak: the phases do not coincide ----------------------------------------------------
    # end of forward / start of backward (head rank): all activations + the gathered LM-head
    # weights (2 B/param) + either the logits/loss buffers or, once the logits' gradient has
    # been consumed, the head's gradient buffers (they do not coexist);
    # backward of a layer (every rank): all activations + that layer's working set + its unit
    head_w = np.where(fsdp, 2.0 * wl.params_embed, 0.0)
    loss_part = np.maximum(logits * FRAGMENTATION, head_buf - head_w)
    loss_phase = loss_part + head_w
    layer_phase = working * FRAGMENTATION + layer_buf
    loss_wins = loss_phase >= layer_phase
    states = weights + grads + optimizer
    # worst rank: each candidate's own peak (the first stage, with the most micro-batches in
    # flight, exists as a separate rank only with pp > 1)
    head_peak = act_head * FRAGMENTATION + np.maximum(loss_phase, layer_phase)
    first_peak = np.where(p > 1, act_first * FRAGMENTATION + layer_phase, 0.0)
    head_worse = head_peak >= first_peak
    activations = np.where(head_worse, act_head, act_first)
    loss_wins = head_worse & loss_wins
    fwd_bwd_peak = states + np.maximum(head_peak, first_peak) + pp_buf
    opt_peak = states + np.where(fsdp, FOREACH_TEMP_BYTES * P_shard, 0.0)
    peak = np.maximum(fwd_bwd_peak, opt_peak) + RUNTIME_GIB * GIB
    fits = peak / GIB <= b.hbm_gib
    return {
        "mem_weights": weights / GIB,
        "mem_grads": grads / GIB,
        "mem_optimizer": optimizer / GIB,
        "mem_activations": activations * FRAGMENTATION / GIB,
        "mem_logits": np.where(loss_wins, loss_part, 0.0) / GIB,
        "mem_working": np.where(loss_wins, 0.0, working * FRAGMENTATION) / GIB,
        "mem_buffers": (np.where(loss_wins, head_w, layer_buf) + pp_buf) / GIB,
        "mem_optimizer_temp": np.maximum(opt_peak - fwd_bwd_peak, 0.0) / GIB,
        "mem_runtime": np.full_like(peak, RUNTIME_GIB),
        "peak_memory_gib": peak / GIB,
        "fits": fits,
    }
