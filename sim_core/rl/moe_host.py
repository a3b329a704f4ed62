"""The host floor of Megatron-Core's MoE layers: one device-to-host sync per MoE layer forward.

Why a module of its own: the pre-training step prices an MoE layer's launches as a small gap
per extra kernel plus one sync (sim_core/moe.py `launch_overhead_s`), which holds when the GPU
work per layer is long. RL trains on small micro-batches (NeMo RL without sequence packing: one
sequence per micro-batch), where the host that issues a layer's kernels can be the slower of
the two. Megatron-Core's MoE layer does not let the host run ahead of the GPU across layers, so
that host time cannot be banked: it is paid layer by layer.

What the code does (read at the versions the rows ran: Megatron-LM 2ff0f099, NeMo RL v0.3.0's
submodule, 1dcf0daf, slime 05370bf9's `docker/Dockerfile` MEGATRON_COMMIT, and the
megatron-core 0.16.0 wheel SkyRL f6bf2f91 pins;
`megatron/core/transformer/moe/token_dispatcher.py`, `experts.py`, `router.py`,
`moe_utils.py`):

- `MoEAlltoAllTokenDispatcher.preprocess` computes the tokens per expert on the GPU, all-gathers
  them over the expert group, and marks a sync point: "before_ep_alltoall" with EP or expert-TP
  > 1 (the all-to-all's `input_splits` / `output_splits` are Python sizes), else
  "before_finish" (TE GroupedLinear's `m_splits` is a Python list: `TEGroupedMLP.forward`
  `tokens_per_expert.tolist()`). `_maybe_dtoh_and_synchronize` copies the counts on a side
  stream and blocks the host on it (`cuda_dtoh_stream.synchronize()` at 2ff0f099,
  `d2h_event.synchronize()` at 1dcf0daf): the host waits for the GPU to finish everything up
  to the router. The all-gather dispatcher moves `tokens_per_expert` with `.cpu()`; DeepEP's
  dispatch (flex) waits on the CPU for the receive counts. Only `moe_pad_expert_input_to_
  capacity` (drop and pad) skips the sync; no row sets it.
- So each MoE layer forward is one synchronised segment: the GPU's queue is empty at the sync,
  and the segment lasts at least max(host time to issue the layer's kernels, GPU time of the
  layer). The backward uses the splits already on the host (the all-to-all's autograd swaps
  them; GroupedLinear keeps `m_splits`) and does not sync, so the host can run ahead there
  (priced per layer as max(host, GPU) all the same). A full recompute replays each layer's
  forward, dispatcher included, inside the backward: the replay's sync makes every layer's
  replay + backward one segment.
- Forward-only passes (log-probs) sync the same way.

Kernels per layer (catalogs/rl.yaml `megatron_moe_kernels`, where each count is derived),
counted from that code (not profiled; each good to about a fifth), with Transformer Engine
modules (NeMo's `Qwen3MoEConfig` at NeMo 33259f25 and slime's
`scripts/models/qwen3-30B-A3B.sh` both set grouped GEMM, the alltoall dispatcher and permute
fusion; neither sets router fusion):

- outside the MoE block (TE layer spec, QK-norm): input layernorm + QKV GEMM with its
  sequence-parallel all-gather 3, q/k norms 2, fused RoPE 2, fused attention 3, output GEMM +
  reduce-scatter 2, bias-dropout-add 2, pre-MLP norm 1 -> 15 forward; backward 30 (dgrad and
  wgrad GEMMs, the norms', RoPE's and attention's backward, the collectives).
- router (`TopKRouter`, `topk_softmax_with_capacity`): input and weight cast to the router
  dtype, the gating GEMM, topk, softmax, cast, two zeros + scatter (probs, map), int/bool
  casts, the per-expert sum -> 13; with `moe_router_fusion` (TE's fused top-k) 5.
- dispatcher: preprocess (sum, reshape-sum, the counts' all-gather, slice, two sums) 7, the D2H
  copies of five tensors and the stream waits 7; permute 4 fused (TE row-id map, tokens,
  probs) / 8 unfused (map transpose, index build, two masked selects, index_select); two
  all-to-alls out (tokens, probs) and one back 3; chunk sorts by local expert 3; unpermute 2
  fused / 4 unfused.
- experts: grouped GEMM (`TEGroupedMLP`: TE GroupedLinear launches one cuBLAS GEMM per local
  expert on several streams, Megatron-LM moe/README.md `--moe-grouped-gemm`) 2 GEMMs per
  local expert + 12 (stream events, workspace, the fused weighted SwiGLU); sequential
  (`SequentialMLP`, `moe_grouped_gemm` off) per local expert a TE MLP: two GEMMs, SwiGLU, the
  probs multiply and cast, 6, + 2 (split, cat). Backward: 4 GEMMs per local expert + 24
  grouped, 12 per local expert + 4 sequential.
- MoE block backward besides the experts: router 10, permute / unpermute 4, all-to-alls 3,
  sorts 3, activation 2.

Host seconds per kernel: catalogs/rl.yaml `eager_host_s_per_kernel` (the eager PyTorch figure
sim_core/rl/host.py uses; TE's modules add Python of their own, so a lower bound there).
GPU seconds per layer: the pre-training simulator's step for the same micro-batch
(time_compute, time_recompute and the exposed TP / CP / EP / PP transfers, not the bubble), per
micro-batch and layer;
they already hold moe.py's launch gaps and its one sync per layer forward, so what this adds is
the host time beyond the GPU's, never the sync twice.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .inputs import RL_FRAMEWORK, constants, fsdp, recompute_mode, stated_flag, train_col

# what the RL rows' frameworks set when the run does not say (NeMo 33259f25 Qwen3MoEConfig;
# slime 05370bf9 scripts/models/qwen3-30B-A3B.sh; verl's DeepSeek-V3 recipe sets permute fusion)
DEFAULTS = {"train_moe_grouped_gemm": True, "train_moe_permute_fusion": True,
            "train_moe_router_fusion": False}


def _flag(df: pd.DataFrame, col: str) -> np.ndarray:
    """A true/false column of the run table, its framework default where blank."""
    return stated_flag(df, col, DEFAULTS[col])


def local_experts(b, tf: pd.DataFrame) -> np.ndarray:
    """Experts per rank: experts / EP (at least 1)."""
    return np.maximum(b.experts / np.maximum(train_col(tf, "ep"), 1.0), 1.0)


def layer_kernels(local, grouped_gemm, permute_fusion, router_fusion) -> dict:
    """Kernels one MoE transformer layer issues per micro-batch: `fwd` (its forward, one
    synchronised segment) and `bwd` (its backward)."""
    c = constants()["megatron_moe_kernels"]
    local = np.asarray(local, dtype=float)
    g = np.asarray(grouped_gemm, dtype=bool)
    pf = np.asarray(permute_fusion, dtype=bool)
    rf = np.asarray(router_fusion, dtype=bool)
    gr, sq = c["grouped"], c["sequential"]
    experts_f = np.where(g, gr["fwd"][0] * local + gr["fwd"][1],
                         sq["fwd"][0] * local + sq["fwd"][1])
    experts_b = np.where(g, gr["bwd"][0] * local + gr["bwd"][1],
                         sq["bwd"][0] * local + sq["bwd"][1])
    fwd = (c["attn"]["fwd"] + np.where(rf, c["router"]["fwd_fused"], c["router"]["fwd"])
           + c["dispatch"]["fwd"]
           + np.where(pf, c["permute"]["fwd"], c["permute"]["fwd_unfused"]) + experts_f)
    bwd = (c["attn"]["bwd"] + c["router"]["bwd"] + c["dispatch"]["bwd"] + c["permute"]["bwd"]
           + c["permute"]["act_bwd"] + experts_b)
    return {"fwd": fwd, "bwd": bwd}


def rows(b, tf: pd.DataFrame) -> np.ndarray:
    """Rows this applies to: an MoE model trained by Megatron-Core (not FSDP / DTensor) under
    NeMo RL, verl, slime or SkyRL. SkyRL's Megatron worker pins megatron-core 0.16.0, whose
    alltoall dispatcher keeps the sync (token_dispatcher.py `preprocess` marks
    "before_ep_alltoall", `_maybe_dtoh_and_synchronize` blocks on `d2h_event.synchronize()`;
    experts.py `TEGroupedMLP.forward` `tokens_per_expert.tolist()`)."""
    megatron_fw = np.isin(b.rl_framework, [RL_FRAMEWORK.index(f)
                                           for f in ("nemo_rl", "verl", "slime", "skyrl")])
    return megatron_fw & ~fsdp(tf) & (b.experts > 0) & (b.moe_layers > 0)


def exposed(b, df: pd.DataFrame, tf: pd.DataFrame, sim: pd.DataFrame,
            tok_ratio, gathers) -> dict:
    """Host seconds beyond the GPU's, per optimizer step of the training frame:
    `update_s` (forward + backward of its micro-batches) and `log_prob_s` (one forward-only
    pass over the same sequences, in log-prob micro-batches of `tok_ratio / gathers` training
    micro-batches' tokens, `gathers` as many of them: nemo_rl.dynamic_logprob_ratios).
    Also `host_fwd_s`, `gpu_fwd_s` (per MoE layer forward of one training micro-batch) and
    `kernels_fwd`, `kernels_bwd`."""
    on = rows(b, tf)
    k = layer_kernels(local_experts(b, tf), _flag(df, "train_moe_grouped_gemm"),
                      _flag(df, "train_moe_permute_fusion"), _flag(df, "train_moe_router_fusion"))
    s = float(constants()["eager_host_s_per_kernel"])
    h_f, h_b = k["fwd"] * s, k["bwd"] * s
    pp = np.maximum(train_col(tf, "pp"), 1.0)
    layers = np.maximum(np.ceil(b.layers / pp), 1.0)           # on the busiest stage
    moe = np.minimum(np.ceil(b.moe_layers / pp), layers)
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    per = m * layers
    # the layer's GPU seconds per micro-batch: a third of the compute forward, two thirds
    # backward; the exposed TP / CP / EP / PP transfers half each, a third each when a full
    # recompute replays the forward's (the core counts them 1.5x then); the bubble is idle
    # time, not the layer's work. Only a full recompute replays the dispatcher (selective
    # recompute replays core attention or chosen modules, no sync)
    rc = recompute_mode(tf)
    replay = (rc == "full") & (sim["time_recompute"].to_numpy() > 0)
    comm = sum(sim[c].to_numpy() for c in ("time_tp", "time_cp", "time_ep", "time_pp"))
    share = np.where(replay, 1 / 3, 1 / 2)
    compute = sim["time_compute"].to_numpy()
    g_f = (compute / 3 + comm * share) / per
    g_b = (compute * 2 / 3 + comm * share) / per
    g_r = np.where(replay, sim["time_recompute"].to_numpy() + comm / 3, 0.0) / per
    fwd = np.maximum(h_f - g_f, 0.0)
    bwd = np.where(replay, np.maximum(h_f + h_b - g_r - g_b, 0.0), np.maximum(h_b - g_b, 0.0))
    update = m * moe * (fwd + bwd)
    tok_ratio = np.asarray(tok_ratio, dtype=float)
    gathers = np.maximum(np.asarray(gathers, dtype=float), 1e-9)
    lp_mb = m * gathers                                         # log-prob micro-batches
    log_prob = lp_mb * moe * np.maximum(h_f - g_f * tok_ratio / gathers, 0.0)
    zero = np.zeros(len(tf))
    return {"update_s": np.where(on, update, zero), "log_prob_s": np.where(on, log_prob, zero),
            "host_fwd_s": np.where(on, h_f, zero), "gpu_fwd_s": np.where(on, g_f, zero),
            "kernels_fwd": np.where(on, k["fwd"], zero),
            "kernels_bwd": np.where(on, k["bwd"], zero)}
