"""NeMo RL's DTensor worker with tensor parallelism: what DTensor itself costs, on the host and
on the GPU, beyond the eager kernels the pre-training step prices.

Why a module of its own: the training frame prices NeMo RL's DTensor worker (FSDP2 + DTensor
TP, `nemo_rl.dtensor_fields`) as GPU time. With TP > 1, NeMo RL v0.3.0
`nemo_rl/models/dtensor/parallelize.py _parallelize_llama` turns the seven projections of
every decoder layer into DTensors (`ColwiseParallel` q/k/v/gate/up, `RowwiseParallel` o/down)
and, with `sequence_parallel`, the two RMSNorms into `SequenceParallel` modules whose input
and output are DTensors sharded on the sequence. FSDP2 keeps the TP placement on the
unsharded parameters (torch 2.7.0 `_fsdp_param.py init_unsharded_param`:
`_from_local_no_grad(unsharded_param, self._tp_spec)`). Every aten op on a DTensor, forward
and (through `__torch_dispatch__`) backward, runs `OpDispatcher.dispatch` in Python (torch
2.7.0 `distributed/tensor/_dispatch.py`): unwrap, cached sharding propagation, redistribute,
the local op, re-wrap. At TP 1 the layers compute on plain unsharded tensors. Three costs
follow, all counted from code (NeMo RL v0.3.0, transformers 4.52.4 as its uv.lock pins,
torch 2.7.0); the seconds per DTensor op are `catalogs/rl.yaml dtensor_op_s` (PyTorch's own
dispatch-overhead test, 90 us), a plain kernel `eager_host_s_per_kernel` (9.7 us):

1. **The host floor of a micro-batch** (TP > 1). DTensor ops per decoder layer (Llama,
   `modeling_llama.py` 4.52.4):
   - each of the 7 TP projections, forward 4: `F.linear` without bias is
     `matmul(input, weight.t())`, which folds a 3-D input: `t`, `view` (reshape of a tensor
     subclass), `mm`, `_unsafe_view`; backward 9: the output view's grad 1, `mm`'s
     `mm_mat1_backward` (`t`, `mm`) 2 and `mm_mat2_backward` on the column-major `weight.t()`
     (`t`, `mm`, `t`) 3, `t`'s backward 1, the input view's backward 1, AccumulateGrad's
     `detach` of the DTensor gradient 1 (no detach fast path at 2.7.0);
   - with sequence parallel, each RMSNorm forward 8 (`to(float32)`, `pow`, `mean`, `+ eps`,
     `rsqrt`, `*`, `to(input_dtype)`, `weight *`) and backward 15 (host.py's 14 and the
     weight gradient's `detach`).
   The rest of the layer (RoPE, attention, SwiGLU's `silu` and `*`, residual adds) runs on
   local tensors: host.py's per-layer kernels less the ones above, at the plain rate. Outside
   the layers per micro-batch: the embedding (forward 1, backward 2), the final norm (as a
   layer's, with SP), the LM head (4, 9) and FSDP2's fp32 cast of the logits DTensor (1, 1).
   NeMo RL reads `loss.item()` after every micro-batch's backward (`dtensor_policy_worker.py
   train`), so the host cannot run ahead into the next one: a micro-batch lasts
   max(GPU time, host time). FSDP's own traffic overlaps the host time as it does the GPU's.
2. **The optimizer step over DTensor parameters** (every DTensor row: FSDP2's sharded
   parameters are DTensors at TP 1 too). NeMo RL's AdamW runs with `foreach: False, fused:
   False` ("when using Dtensor, we need to set foreach and fused to False",
   examples/configs/grpo_math_1B.yaml, inherited by grpo_math_8B.yaml): torch 2.7.0
   `_single_tensor_adam` per parameter `mul_` (decoupled weight decay), `lerp_`, `mul_`,
   `addcmul_`, `sqrt`, `/`, `add_`, `addcdiv_` = 8 DTensor ops, and `step_t += 1` on a CPU
   tensor. `get_grad_norm` and `clip_grad_by_total_norm_` (`parallelize.py`) take
   `p.grad.detach()` of each DTensor gradient (2 DTensor ops) and run `torch.norm`, `**`,
   `+=` on the local shard (3 plain). `get_grad_norm` ends in `.item()`, so the step runs
   after the GPU has drained: it lasts max(the simulator's optimizer time, host time).
   pytorch/pytorch issue 134191 (AdamW CPU-bound under FSDP2) shows the effect but gives no
   per-parameter figure; it is not used.
3. **The sequence-parallel plan's all-gathers (GPU)**. `_parallelize_llama`'s SP plan puts no
   `PrepareModuleInput` before attention or the MLP: q/k/v and gate/up are `ColwiseParallel()`
   with the default `input_layouts` Replicate, so the hook does not redistribute the norm's
   Shard(1) output, and each projection's own `view` of a [batch, seq, hidden] input flattens
   batch and sequence, which keeps a shard only on the leftmost flattened dim (torch 2.7.0
   `_ops/_view_ops.py propagate_shape_and_sharding`): with more than one sequence per
   micro-batch (dynamic batching's padded micro-batches) every projection all-gathers its
   input itself, synchronously: 5 all-gathers per layer forward where Megatron's SP issues 2
   (+3). The gathered input is saved for the weight gradient, so the backward does not
   re-gather it as the simulator's SP prices (`workload._comms`: 4 all-gathers and 2 reduce-
   scatters per layer backward, 2 and 2 forward): -2. Each is priced as the simulator's own
   SP collective of the micro-batch (time_tp over its 10 per layer).

What is left out: the hooks' own Python (`from_local`, `to_local`, `redistribute` in the
ParallelStyle hooks), redistribute planning inside dispatch, sharding-propagation cache misses
(once per op signature; dynamic batching's changing shapes may miss more often), the loss on
the logits DTensor (nemo_rl_host.py prices the loss's host work), Qwen's biases and q/k norms
(the Llama count is used for every model). Counts are read from code, not profiled: each good
to about a fifth. Zero for rows that are not NeMo RL DTensor rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import host
from .inputs import RL_FRAMEWORK, constants, fsdp, train_col

# DTensor ops per TP projection (forward, backward) and projections per decoder layer
LINEAR_DT_FWD = 4
LINEAR_DT_BWD = 9
TP_LINEARS = 7
# GEMMs of a projection in host.py's plain count (forward 1, backward 2)
LINEAR_PLAIN_FWD = 1
LINEAR_PLAIN_BWD = 2
# a sequence-parallel RMSNorm on a DTensor (forward, backward), two per layer
NORM_DT_FWD = 8
NORM_DT_BWD = 15
NORMS = 2
# host.py's plain kernels of one RMSNorm (forward, backward)
NORM_PLAIN_FWD = 8
NORM_PLAIN_BWD = 14
# outside the layers per micro-batch: embedding 1/2, LM head 4/9, the logits' fp32 cast 1/1
OUTSIDE_DT_FWD = 6
OUTSIDE_DT_BWD = 12
# the optimizer step per parameter: AdamW's 8 + the grad-norm and clip detaches 2 (DTensor);
# step_t += 1 and the local norm, pow, add (plain)
OPT_DT_PER_PARAM = 10
OPT_PLAIN_PER_PARAM = 4
# parameters outside the decoder layers: embedding, final norm, LM head
OUTSIDE_PARAMS = 3
# all-gathers the SP plan adds per layer (forward), and the backward re-gathers it saves
EXTRA_AG_FWD = 3
SAVED_AG_BWD = 2
# the simulator's SP collectives per layer per micro-batch (workload._comms: forward 2 AG + 2
# RS, backward 4 AG + 2 RS)
SP_COLLECTIVES = 10


def op_seconds() -> tuple[float, float]:
    """(seconds per DTensor op, seconds per plain eager kernel)."""
    k = constants()
    return float(k["dtensor_op_s"]), float(k["eager_host_s_per_kernel"])


def layer_counts(sp) -> dict:
    """DTensor ops and plain kernels per decoder layer, forward and backward, with sequence
    parallel (`sp`) or without (the norms then run on plain tensors)."""
    sp = np.asarray(sp, dtype=float)
    return {"dt_fwd": TP_LINEARS * LINEAR_DT_FWD + NORMS * NORM_DT_FWD * sp,
            "dt_bwd": TP_LINEARS * LINEAR_DT_BWD + NORMS * NORM_DT_BWD * sp,
            "plain_fwd": host.LAYER_FORWARD - TP_LINEARS * LINEAR_PLAIN_FWD
            - NORMS * NORM_PLAIN_FWD * sp,
            "plain_bwd": host.LAYER_BACKWARD - TP_LINEARS * LINEAR_PLAIN_BWD
            - NORMS * NORM_PLAIN_BWD * sp}


def micro_batch_host(layers, sp, checkpointing=False) -> tuple[np.ndarray, np.ndarray]:
    """Host seconds of (a forward micro-batch, an update micro-batch: forward + backward) on
    a TP > 1 DTensor model of `layers` decoder layers. NeMo RL's activation checkpointing
    wraps only each layer's MLP (`checkpoint_wrapper(layers[i].mlp)`): its 3 projections and
    `silu`, `*` replay in the backward."""
    s_d, s_k = op_seconds()
    layers = np.asarray(layers, dtype=float)
    sp = np.asarray(sp, dtype=float)
    c = layer_counts(sp)
    fwd = layers * (c["dt_fwd"] * s_d + c["plain_fwd"] * s_k) \
        + (OUTSIDE_DT_FWD + NORM_DT_FWD * sp) * s_d
    replay = np.where(np.asarray(checkpointing, dtype=bool),
                      layers * (3 * LINEAR_DT_FWD * s_d + 2 * s_k), 0.0)
    bwd = layers * (c["dt_bwd"] * s_d + c["plain_bwd"] * s_k) \
        + (OUTSIDE_DT_BWD + NORM_DT_BWD * sp) * s_d
    return fwd, fwd + replay + bwd


def optimizer_host(layers) -> np.ndarray:
    """Host seconds of one optimizer step (grad norm, clip, single-tensor AdamW) over the
    DTensor parameters of `layers` decoder layers."""
    s_d, s_k = op_seconds()
    params = np.asarray(layers, dtype=float) * host.PARAMS_PER_LAYER + OUTSIDE_PARAMS
    return params * (OPT_DT_PER_PARAM * s_d + OPT_PLAIN_PER_PARAM * s_k)


def _sequence_parallel(tf: pd.DataFrame) -> np.ndarray:
    if "sequence_parallel" not in tf:
        return np.zeros(len(tf), dtype=bool)
    return tf["sequence_parallel"].astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy()


def _checkpointing(tf: pd.DataFrame) -> np.ndarray:
    """NeMo RL's `activation_checkpointing_enabled` (default false, grpo_math_1B.yaml at
    v0.3.0): the frame's `recompute` stated and not "none"."""
    if "recompute" not in tf:
        return np.zeros(len(tf), dtype=bool)
    col = tf["recompute"].astype(str).str.lower()
    return (tf["recompute"].notna() & ~col.isin(["none", "nan", ""])).to_numpy()


def seconds(b, tf: pd.DataFrame, sim: pd.DataFrame, tok_ratio, gathers, fwd) -> dict:
    """Seconds DTensor adds on NeMo RL DTensor rows: `update_s` per optimizer step of the
    training frame, `log_prob_s` per log-prob pass (all its mini-batches), and the parts
    `update_host_s`, `optimizer_host_s`, `gather_update_s`, `gather_log_prob_s`. `fwd` is
    the log-prob pass's GPU seconds per mini-batch (training.passes' `fwd`), `tok_ratio` and
    `gathers` the log-prob pass's tokens and micro-batches over the frame's
    (nemo_rl.dynamic_logprob_ratios). Zero elsewhere."""
    n = len(tf)
    zero = np.zeros(n)
    dt = (b.rl_framework == RL_FRAMEWORK.index("nemo_rl")) & fsdp(tf)
    if not dt.any():
        return {k: zero for k in ("update_s", "log_prob_s", "update_host_s",
                                  "optimizer_host_s", "gather_update_s", "gather_log_prob_s")}
    tp = train_col(tf, "tp")
    on = dt & (tp > 1)
    sp = on & _sequence_parallel(tf)
    layers = np.asarray(b.layers, dtype=float)
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    step = sim["step_time_s"].to_numpy(float)
    t_opt = sim["time_optimizer"].to_numpy(float)
    tp_t = sim["time_tp"].to_numpy(float)
    host_fwd, host_upd = micro_batch_host(layers, sp, _checkpointing(tf))
    # 3. the SP plan's own all-gathers, where a micro-batch holds several sequences
    several = sp & (tf["micro_batch"].to_numpy(float) > 1)
    coll = tp_t / SP_COLLECTIVES  # one SP collective per layer, summed over the micro-batches
    gather_upd = np.where(several, (EXTRA_AG_FWD - SAVED_AG_BWD) * coll, 0.0)
    gather_lp = np.where(several, EXTRA_AG_FWD * coll * np.asarray(tok_ratio, float)
                         * b.mini_batches, 0.0)
    # 1. the host floor, micro-batch by micro-batch
    gpu_mb = (step - t_opt + gather_upd) / m
    upd_host = np.where(on, m * np.maximum(host_upd - gpu_mb, 0.0), 0.0)
    n_lp = np.asarray(gathers, float) * m * b.mini_batches
    gpu_lp = np.asarray(fwd, float) * b.mini_batches + gather_lp
    lp_host = np.where(on, np.maximum(n_lp * host_fwd - gpu_lp, 0.0), 0.0)
    # 2. the optimizer step after get_grad_norm's .item()
    opt = np.where(dt, np.maximum(optimizer_host(layers) - t_opt, 0.0), 0.0)
    return {"update_s": upd_host + opt + gather_upd, "log_prob_s": lp_host + gather_lp,
            "update_host_s": upd_host, "optimizer_host_s": opt,
            "gather_update_s": gather_upd, "gather_log_prob_s": gather_lp}
