"""Peak GPU memory of the worst rank, by category, and whether it fits.

Model states (weights, gradients, optimizer) follow the sharding of ZeRO / the distributed
optimizer / FSDP over the data-parallel group (dp x cp). Activations follow Korthikanti et al.
(2022), re-derived per op so that GQA, SwiGLU, MoE, sequence parallelism, CP and the recompute
modes change the coefficients instead of the famous 34. The peak is the larger of two phases:
forward/backward (states + activations in flight + working buffers) and the optimizer step
(states + the optimizer's temporaries), as TorchSim observes (seed 003, Tables 3-4).

Two counters come out, because measurements use both: bytes allocated (live tensors, what
TorchSim and torch.cuda.max_memory_allocated count) and bytes the caching allocator reserves
(what torchtitan logs; the allocator keeps freed blocks, so the loss tensors, larger than any
block a layer left behind, take fresh segments on top). `peak_memory_gib` = reserved + the CUDA
context and NCCL buffers, the device's own total, which decides `fits`.

Constants that are not exact byte counts are named below with their reason.
"""

from __future__ import annotations

import numpy as np

from . import distinct, finetune, fp4, frameworks, moe, pp_split, recompute, workload
from .arrays import where
from .columns import Batch
from .specs import ATTENTION_KERNEL
from .workload import ACT_BYTES, Workload

GIB = 1024.0**3
# CUDA context, cuBLAS workspaces and NCCL channel buffers: not visible to PyTorch's allocator
# but resident on the device. Typical figures: context 0.3-0.5 GiB, NCCL 0.2-1 GiB with 8+
# channels per communicator (modeling notes §3).
RUNTIME_GIB = 1.0
# PyTorch's caching allocator reserves more than it allocates (block rounding, fragmentation);
# peak reserved / peak allocated is ~1.05-1.15 in published traces. Applied to activations and
# layer working sets; the loss tensors are counted by segment instead (LOSS_SEGMENT_BYTES).
FRAGMENTATION = 1.10
# Bytes per logit held at the loss's peak, per implementation (specs.LOSS_IMPL order), counted
# from each implementation's code (live tensors at its peak, T*V/t logits per rank):
#   fused and vocab_parallel (Megatron-Core fusions/fused_cross_entropy.py and
#     tensor_parallel/cross_entropy.py, core_r0.8.0 and core_v0.15.3: the same steps, fused or
#     not): the bf16 logits (2) and their fp32 copy (4), which becomes the softmax in place and is
#     saved; backward writes the gradient into it and casts it to bf16 (4 + 2) -> 6
#   compiled (torch.compile'd F.cross_entropy): Inductor saves the bf16 logits and a per-row
#     log-sum-exp and writes the bf16 gradient in one fused kernel -> 2 + 2 = 4
#   eager (F.cross_entropy(logits.float())): forward bf16 (2) + fp32 copy (4) + log-softmax (4);
#     backward: saved log-softmax (4) + NLL gradient (4) + log-softmax gradient (4) -> 12
#   eager_parallel (torch.distributed.tensor.parallel.loss_parallel, vocab-sharded): its
#     decomposed log-softmax keeps x, x - max and exp(x - max) (2 + 4 + 4 + 4 = 14); backward
#     holds the saved result, a zero-filled gradient, exp(result) and their sum -> 16
#   fp32_parallel (nanotron models/llama.py cast_to_fp32 + tensor_parallel/functional.py
#     _ShardedCrossEntropy, 2411b022): the fp32 logits (4) and their shifted copy, exponentiated
#     and normalised in place and saved (4); the bf16 logits are freed when the model's forward
#     returns; backward turns the saved softmax into the gradient in place and casts it to bf16
#     -> 4 + 4 = 8
#   te (TransformerEngine v2.7 pytorch/cross_entropy.py + triton/cross_entropy.py): the kernel
#     reads the bf16 logits and writes the bf16 gradient over them in the forward -> 2
LOSS_BYTES = np.array([6.0, 4.0, 12.0, 16.0, 8.0, 6.0, 2.0])
# ... and the allocator segments the loss leaves reserved per logit: a freed block is reused only
# by a tensor that fits in it, so a backward tensor finding no free fp32-sized block takes a new
# segment. eager: bf16, fp32 copy, log-softmax, + 1 new fp32 in backward -> 14; eager_parallel:
# bf16, x, x - max, exp, + 1 new in backward (grad, exp and sum reuse x, shifted and exp) -> 18;
# fused, vocab_parallel, compiled and te reuse their own blocks -> same as allocated;
# fp32_parallel: the bf16 logits' block, the fp32 logits and the shifted copy (the bf16 gradient
# reuses the first) -> 10.
LOSS_SEGMENT_BYTES = np.array([6.0, 4.0, 14.0, 18.0, 10.0, 6.0, 2.0])
# Torch's multi-tensor (foreach) AdamW allocates a temporary as large as the fp32 shard it
# updates (sqrt(v) as a new tensor list); FSDP frameworks use it (ZeRO-3 here). Megatron's
# fused Adam works in place. TorchSim Table 4 (an optimizer-phase peak) fits one temporary.
FOREACH_TEMP_BYTES = 4.0


def activation_bytes_per_layer(b: Batch, T, t, sp, dims: dict, load=1.0) -> dict:
    """Bytes one micro-batch leaves stored per transformer layer, for each recompute mode."""
    h = dims["h"]
    rep = where(sp, t, 1.0)  # replicated-under-TP tensors are sharded only with SP
    moe_frac = dims["n_moe_layers"] / b.layers
    # FP8 (Transformer Engine) saves the FP8-cast input of each GEMM for its weight gradient:
    # 1 byte instead of 2 for the QKV, out-proj, FC1 and FC2 inputs
    g_in = where((b.precision == 1) & (b.has_fp8 > 0), 1.0, ACT_BYTES)
    # FP4 (sim_core/fp4.py): the columnwise FP4 copy with its block scales (0.53-0.56 B)
    fp4_rows = fp4.active(b)
    if fp4_rows.any():
        g_in = where(fp4_rows, fp4.arrays(b)["saved_bytes"], g_in)
    # attention block: norm input, QKV input, Q/K/V, attention output (= out-proj input),
    # softmax statistics (fp32 log-sum-exp per head)
    qkv = dims["q_dim"] + 2 * dims["kv_dim"]
    attn = ((ACT_BYTES + g_in) * T * h / rep + ACT_BYTES * T * qkv / t
            + g_in * T * dims["a"] * dims["dv"] / t + 4.0 * T * dims["a"] / t)
    # the unfused kernel keeps the s x s softmax output for its backward, and with dropout the
    # 1-byte mask and the dropped probabilities (Korthikanti et al. 2022's 5as/h term;
    # compute.unfused_attention_times): T x s scores per head, cp == 1 (rules)
    unfused = np.asarray(b.attention_kernel) == ATTENTION_KERNEL.index("unfused")
    scores = where(unfused, T * b.seq_len * dims["a"] / t, 0.0)  # score elements per GPU
    score_bytes = where(np.asarray(b.get("attention_dropout", 0.0 * T)) > 0, 5.0, 2.0)
    attn = attn + score_bytes * scores
    # MLP block: norm input, FC1 input, FC1 output(s) and the activation output (FC2 input).
    # An eager GLU, act(gate) * up (torchtitan without compile, nanotron's GLUActivation, Hugging
    # Face modules), also keeps act(gate) for the multiply: one more ffn-wide tensor than a fused
    # SwiGLU kernel, which saves its input and recomputes act(gate) in backward
    glu = b.activation == 1
    fc1_gemm = where(glu, 2.0, 1.0)  # FC1 output width in ffn units (gate and up for a GLU)
    fc1_out = fc1_gemm + where(glu & ~b.fused_glu, 1.0, 0.0)
    dense_mlp = ((ACT_BYTES + g_in) * T * h / rep + ACT_BYTES * T * b.ffn * fc1_out / t
                 + g_in * T * b.ffn / t)
    # MoE: each token is routed to top_k experts (+ shared): dispatched copies of the hidden
    # state and the expert FC1/activation outputs (the busiest EP rank holds `load` times the
    # balanced share of routed copies), the expert outputs unpermute keeps for the gradient of
    # the routing probabilities (moe_utils.py unpermute, core_v0.15.3), router probabilities
    routed = (b.top_k * load + b.shared_experts)
    moe_mlp = ((ACT_BYTES + g_in) * T * h / rep + g_in * T * routed * h / t
               + ACT_BYTES * T * routed * b.expert_ffn * fc1_out / t
               + g_in * T * routed * b.expert_ffn / t + 4.0 * T * b.experts / t
               + ACT_BYTES * T * b.top_k * load * h / t)
    # what the layer holds live again during its backward, whatever was recomputed
    live = attn + (1 - moe_frac) * dense_mlp + moe_frac * moe_mlp
    # Megatron's selective recompute modules (sim_core/recompute.py): under recompute selective
    # with recompute_modules, and the MoE ones (moe_recompute) under recompute none, the layer
    # keeps what the modules in effect do not drop
    bits = recompute.effective(b)
    drop = recompute.dropped_bytes(
        b, bits, T, t, rep, dims, load, g_in, fc1_out, moe_frac,
        {"attn_scores_lse": 4.0 * T * dims["a"] / t + score_bytes * scores,
         "dense_mlp": dense_mlp, "moe_mlp": moe_mlp})
    modules = where(bits > 0, live - drop, live)
    none = where(b.recompute == 0, modules, live)
    # selective = op-level selective checkpointing (torchtitan's op SAC; recompute selective
    # with no recompute_modules listed): keep the layer input, the attention output and
    # statistics, and every other GEMM output; recompute the rest in backward
    f_width = (1 - moe_frac) * b.ffn + moe_frac * routed * b.expert_ffn
    gemm_out = (dims["q_dim"] + 2 * dims["kv_dim"]) / t + h / rep + f_width * fc1_gemm / t + h / rep
    selective = (ACT_BYTES * T * h / rep + ACT_BYTES * T * dims["a"] * dims["dv"] / t
                 + 4.0 * T * dims["a"] / t + 0.5 * ACT_BYTES * T * gemm_out)
    full = ACT_BYTES * T * h / rep  # only the layer input is kept
    return {"none": none, "selective": selective, "full": full, "live": live, "modules": modules,
            "scores_buffer": ACT_BYTES * scores}


def _per_layer(b: Batch) -> dict:
    """activation_bytes_per_layer with the MoE dispatcher's transient and whole-run buffers:
    what estimate needs that depends on the layer's shape only (not on dp, pp or ZeRO)."""
    t = b.tp
    T = b.micro_batch * b.seq_len / b.cp  # workload's tokens per micro-batch
    sp = b.sequence_parallel & (t > 1)
    load = workload.expert_load_factor(b)
    out = activation_bytes_per_layer(b, T, t, sp, workload.model_dims(b), load)
    out["lora_delta"] = finetune.frozen_activation_bytes(b, workload.model_dims(b), T, t, sp)
    out["moe_transient"] = moe.transient_bytes(b, T / t, load)
    out["moe_buffers"] = moe.buffer_bytes(b)
    return out


_overhead = None  # optional run calibration: f(batch) -> {part: array} (OVERHEAD_KEYS)
# what a run calibration may scale (issue 35): the parts grow differently with the model
# (states with parameters, activations with tokens x hidden x layers, the loss with tokens x
# vocabulary), so one activation scale fitted where the logits dominate must not carry them
OVERHEAD_KEYS = ("fixed_gib", "states", "activations", "logits")


def set_overhead(fn) -> None:
    """Install a per-configuration memory overhead fitted to a user's runs
    (sim_core.calibration.runs): f(batch) -> {"fixed_gib": GiB added to the peak, "states":
    scale of weights + gradients + optimizer state, "activations": scale of the per-token
    activation bytes, "logits": scale of the loss buffers}; missing keys are neutral; None
    removes it."""
    global _overhead
    _overhead = fn


_NO_OVERHEAD = {"fixed_gib": 0.0, "states": 1.0, "activations": 1.0, "logits": 1.0}


def _overhead_parts(b) -> tuple:
    """(fixed GiB, states, activations, logits scales): the installed overhead's, else neutral."""
    if _overhead is None:
        return tuple(_NO_OVERHEAD[k] for k in OVERHEAD_KEYS)
    o = _overhead(b)
    return tuple(np.asarray(o.get(k, _NO_OVERHEAD[k]), dtype=np.float64) for k in OVERHEAD_KEYS)


def estimate(b: Batch, wl: Workload) -> dict:
    """Memory per category (bytes) for the worst rank, plus peak and fits."""
    dims = wl.dims
    t, p, v = b.tp, b.pp, b.vpp
    T = wl.tokens
    m = wl.num_microbatches
    sp = b.sequence_parallel & (t > 1)
    z = b.zero
    ds = wl.dp * b.cp  # data-parallel sharding group (CP ranks hold the same weights)
    edp = np.maximum(wl.dp * b.cp * t / (b.ep * where(b.etp > 0, b.etp, t)), 1.0)
    P = wl.params_stage
    P_exp = P * wl.expert_fraction
    P_dense = P - P_exp
    # parameters as a sharded count: dense ones over ds, expert ones over expert-dp
    P_shard = P_dense / ds + P_exp / edp

    # ---- model states ----------------------------------------------------------------------
    fsdp = z == 3
    # bf16 weights (2 B) + fp32 master weights and Adam m, v (12 B), each sharded per its stage.
    # ZeRO-3/FSDP is counted the same way (DeepSpeed keeps a bf16 shard). PyTorch FSDP2 holds
    # only the fp32 shard (16 B in all), yet its measured runs sit above that: TorchSim's
    # optimizer-phase rows (Table 4) imply ~25 B per sharded parameter, so the 2 B stay as margin.
    weights = where(fsdp, 2.0 * P_shard, 2.0 * P)
    # FP8 (Transformer Engine) caches an FP8 copy of each layer weight for the step
    fp8 = (b.precision == 1) & (b.has_fp8 > 0)
    # (with fp8_param_gather the FP8 copy is the primary weight: no bf16 copy of layer weights)
    fp8_primary = fp8 & b.fp8_param_gather
    weights = weights + where(fp8 & ~fsdp & ~fp8_primary, 1.0 * (P - wl.params_embed),
                                 where(fp8_primary & ~fsdp, -1.0 * (P - wl.params_embed), 0.0))
    # FP4 (sim_core/fp4.py) caches its FP4 weight copies (with scales) beside the bf16 weights
    fp4_rows = fp4.active(b)
    if fp4_rows.any():
        weights = weights + where(fp4_rows & ~fsdp, fp4.arrays(b)["weight_cache_bytes"]
                                     * (P - wl.params_embed), 0.0)
    # the framework's gradient layout (catalogs/frameworks.yaml): the main-grad buffer (fp32 or
    # bf16) is sharded from the framework's stage on (nanotron's fp32 accumulator never is), and
    # torch DDP keeps bf16 gradient buckets beside it when dp > 1
    fw = frameworks.memory_arrays(frameworks.column(b, "framework"), z)
    g_bytes = where(b.grad_reduce_fp32, 4.0, 2.0)  # fp32 or bf16 main-grad buffer
    grads = where(z >= fw["grad_shard_zero"], g_bytes * P_shard, g_bytes * P)
    grads = grads + where(ds > 1, fw["ddp_bucket_bytes"] * P, 0.0) + fw["lp_grad_bytes"] * P
    master_adam = fw["optimizer_bytes"]  # 12: fp32 master + Adam m, v (frameworks.yaml)
    # bf16 Adam moments (specs adam_bf16_states): 2 + 2 B instead of 4 + 4 beside fp32 master
    master_adam = where(b.adam_bf16_states & (master_adam >= 12), master_adam - 4.0, master_adam)
    P_opt_shard = P_shard  # what the optimizer step updates on this GPU (sharded)
    optimizer = where(z >= fw["optimizer_shard_zero"], master_adam * P_shard, master_adam * P)
    if wl.params_trainable is not None:
        # LoRA / QLoRA (sim_core/finetune.py): frozen base weights (bf16, or NF4 for QLoRA's
        # linears; FP8 caches as above), and the adapters' weights, gradients and Adam state
        fz = finetune.frozen(b)
        A = wl.params_trainable
        A_shard = A / ds
        base = where(fsdp, finetune.base_weight_bytes(b, wl, P_shard, wl.params_embed / ds),
                        finetune.base_weight_bytes(b, wl, P, wl.params_embed))
        weights = where(fz, weights - where(fsdp, 2.0 * P_shard, 2.0 * P) + base
                           + 2.0 * where(fsdp, A_shard, A), weights)
        a_grads = where(z >= fw["grad_shard_zero"], g_bytes * A_shard, g_bytes * A)
        a_grads = a_grads + where(ds > 1, fw["ddp_bucket_bytes"] * A, 0.0) \
            + fw["lp_grad_bytes"] * A
        grads = where(fz, a_grads, grads)
        optimizer = where(fz, where(z >= fw["optimizer_shard_zero"], master_adam * A_shard,
                                          master_adam * A), optimizer)
        P_opt_shard = where(fz, A_shard, P_shard)

    # ---- activations -----------------------------------------------------------------------
    # the per-layer activations, the dispatcher's buffers: once per distinct input
    per_layer = distinct.on_distinct("memory.activation_bytes_per_layer", b, _per_layer)
    rc = b.recompute
    # selective with recompute modules listed: what the modules keep (sim_core/recompute.py)
    listed = recompute.column(b) > 0
    stored = where(rc == 2, per_layer["full"],
                      where(rc == 1, where(listed, per_layer["modules"], per_layer["selective"]),
                               per_layer["none"]))
    if wl.params_trainable is not None:
        # frozen linears keep no input for a weight gradient; adapters keep their own
        # (finetune.frozen_activation_bytes; a full recompute keeps only the layer input)
        stored = stored + where(rc == 0, per_layer["lora_delta"], 0.0)
    fixed_extra, state_scale, act_scale, logit_scale = _overhead_parts(b)
    stored = stored * act_scale
    L_stage = wl.layers_per_stage
    # micro-batches in flight on the first stage: 1F1B keeps p; interleaving adds (p-1)/v
    # chunks (Korthikanti et al.: factor 1 + (p-1)/(p*v)); never more than the step has
    in_flight = where(p > 1, np.minimum(p + (p - 1) / v, m * 1.0), 1.0)
    in_flight = where((p > 1) & (v == 1), np.minimum(p, m), in_flight)
    # all-forward-all-backward (GPipe, nanotron's AFAB) finishes every forward first
    afab = frameworks.column(b, "pp_schedule") == 1
    in_flight = where((p > 1) & afab, m * 1.0, in_flight)
    act_first = stored * L_stage * in_flight
    # Megatron-Core's embedding/loss-counted split (sim_core/pp_split.py): the first rank holds
    # a layer fewer (its first chunk, which keeps the most micro-batches), the last rank too;
    # the second rank holds the full stage with one micro-batch fewer in flight (1F1B:
    # p - rank; interleaved: 2 chunks fewer, core_v0.15.0 pipeline_parallel/schedules.py
    # get_pp_rank_microbatches' warm-up) and can be the worst
    split_on = pp_split.any_on(b)
    if split_on:
        lay = pp_split.stage_layers(b, L_stage)
        one_less = where(afab, 0.0, where(v > 1, 2.0 / v, 1.0))
        act_second = where(pp_split.has_middle(b),
                           stored * lay["middle"] * np.maximum(in_flight - one_less, 1.0), 0.0)
        # the worst rank other than the last: the first or, where it outweighs it, the second
        act_first = np.maximum(stored * lay["first"] * in_flight, act_second)
    # during backward one layer's full set of activations is live again (recomputed or not),
    # plus its gradients (same order of size)
    working = 2.0 * per_layer["live"]
    # the unfused kernel's scores: a buffer of T x s x heads (Megatron's global memory buffer)
    working = working + per_layer["scores_buffer"]
    # SP / TP: the all-gathered input of a column-parallel GEMM is materialised
    working = working + where(sp, ACT_BYTES * T * dims["h"], 0.0)
    working = working * act_scale
    # MoE: the dispatcher's send/receive (or gathered) token buffers of the layer in flight
    moe_frac = dims["n_moe_layers"] / b.layers
    working = working + where(moe_frac > 0, per_layer["moe_transient"], 0.0)
    # the dispatcher's communication buffers, held for the whole run (DeepEP NVL/RDMA buffers)
    dispatcher = per_layer["moe_buffers"]
    # the rank holding the LM head (the last stage; with pp == 1 the only one): one micro-batch
    # in flight with pp > 1, plus the logits and the loss buffers
    logits = LOSS_BYTES[b.loss_impl] * T * b.vocab / t * logit_scale
    logits_reserved = LOSS_SEGMENT_BYTES[b.loss_impl] * T * b.vocab / t * logit_scale
    # what the forward pass of one layer leaves cached in the allocator when the loss starts:
    # its intermediates and, under SP, the all-gathered input (unless TP overlap streams it in
    # chunks, as AsyncTP and TE's userbuffers do); all blocks too small to hold a loss tensor
    gathered = where(sp & ~b.tp_comm_overlap, ACT_BYTES * T * dims["h"], 0.0)
    cached_fwd = per_layer["none"] + gathered
    # the LM head's input (the final norm's output, all-gathered under SP) is kept for its
    # weight gradient, next to the norm's own input
    head_input = ACT_BYTES * T * dims["h"] * (1.0 + 1.0 / where(sp, t, 1.0))
    act_head = where(p > 1, stored * L_stage, act_first) + head_input
    if split_on:
        act_head = where(p > 1, stored * lay["last"], act_first) + head_input

    # ---- working buffers -------------------------------------------------------------------
    # FSDP/ZeRO-3: the unit being computed is all-gathered (bf16) with its bf16 grads and an
    # fp32 reduce-scatter buffer (8 B/param), and the next one is prefetched (2 B/param)
    unit_buf = lambda unit: where(fsdp, 8.0 * unit + 2.0 * wl.params_layer, 0.0)  # noqa: E731
    if wl.params_trainable is not None:  # frozen units: gathered, no gradient buffers
        unit_buf = lambda unit: where(fsdp, where(  # noqa: E731
            finetune.frozen(b), 2.0 * unit, 8.0 * unit) + 2.0 * wl.params_layer, 0.0)
    layer_buf = unit_buf(wl.params_layer)
    head_buf = unit_buf(wl.params_embed)
    # pipeline: send/recv buffers for activations in both directions; plus the framework's fixed
    # bf16 communication buckets (DeepSpeed ZeRO-2's reduce bucket)
    pp_buf = where(p > 1, 2 * ACT_BYTES * T * dims["h"] / where(sp, t, 1.0), 0.0)
    pp_buf = pp_buf + dispatcher + ACT_BYTES * fw["bucket_elems"]

    # ---- peak: the phases do not coincide ----------------------------------------------------
    if _overhead is not None:
        weights, grads, optimizer = (x * state_scale for x in (weights, grads, optimizer))
    states = weights + grads + optimizer
    head_w = where(fsdp, 2.0 * wl.params_embed, 0.0)
    # optimizer step: the states plus foreach AdamW's temporary (the same in both counters)
    opt = states + where(fsdp, FOREACH_TEMP_BYTES * P_opt_shard, 0.0)

    def peak_of(reserved: bool):
        """Peak over the phases, in bytes allocated or bytes reserved (see the module doc).
        End of forward / start of backward (head rank): all activations + the gathered LM-head
        weights + either the loss buffers or, once the logits' gradient has been consumed, the
        head's gradient buffers (they do not coexist); backward of a layer (every rank): all
        activations + that layer's working set + its FSDP unit."""
        frag = FRAGMENTATION if reserved else 1.0
        loss = cached_fwd + logits_reserved if reserved else logits
        loss_part = np.maximum(loss, head_buf - head_w)
        loss_phase = loss_part + head_w
        layer_phase = working * frag + layer_buf
        # worst rank: each candidate's own peak (the first stage, with the most micro-batches
        # in flight, exists as a separate rank only with pp > 1)
        head_peak = act_head * frag + np.maximum(loss_phase, layer_phase)
        first_peak = where(p > 1, act_first * frag + layer_phase, 0.0)
        head_worse = head_peak >= first_peak
        fwd_bwd = states + np.maximum(head_peak, first_peak) + pp_buf
        parts = {"head_worse": head_worse, "loss_wins": head_worse & (loss_phase >= layer_phase),
                 "loss_part": loss_part, "fwd_bwd": fwd_bwd}
        return np.maximum(fwd_bwd, opt), parts

    allocated, _ = peak_of(reserved=False)
    reserved, pr = peak_of(reserved=True)
    allocated, reserved = allocated + fixed_extra * GIB, reserved + fixed_extra * GIB
    # the device also holds the CUDA context and NCCL's buffers, outside the allocator
    peak = reserved + RUNTIME_GIB * GIB
    fits = peak / GIB <= b.hbm_gib
    loss_wins = pr["loss_wins"]
    activations = where(pr["head_worse"], act_head, act_first)
    return {
        "mem_weights": weights / GIB,
        "mem_grads": grads / GIB,
        "mem_optimizer": optimizer / GIB,
        "mem_activations": activations * FRAGMENTATION / GIB,
        "mem_logits": where(loss_wins, pr["loss_part"], 0.0) / GIB,
        "mem_working": where(loss_wins, 0.0, working * FRAGMENTATION) / GIB,
        "mem_buffers": (where(loss_wins, head_w, layer_buf) + pp_buf - dispatcher) / GIB,
        "mem_dispatcher": dispatcher / GIB,
        "mem_optimizer_temp": np.maximum(opt - pr["fwd_bwd"], 0.0) / GIB,
        # the CUDA context and NCCL buffers, plus a run calibration's fixed overhead
        "mem_runtime": np.full_like(peak, RUNTIME_GIB) + fixed_extra,
        "peak_memory_gib": peak / GIB,
        "peak_reserved_gib": reserved / GIB,
        "peak_allocated_gib": allocated / GIB,
        "fits": fits,
    }
