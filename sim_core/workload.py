"""The workload graph of one training step, as arrays over configurations.

For every configuration this module derives, from shapes alone:
- per-op FLOPs and HBM bytes for one micro-batch on one GPU, split into forward, backward
  input-grad, backward weight-grad and recompute (`ops`),
- parameter counts per GPU (what the memory and optimizer models need),
- the communication each parallel dimension issues (`comms`): collective, bytes, group size,
  nodes spanned under the rank order, calls per step, and what it can overlap with.

Conventions: b = micro-batch (sequences), s = sequence length, T = tokens one GPU processes per
micro-batch = b*s/cp, h = hidden, t = tp, bytes of a 16-bit activation = 2.
FLOPs count a multiply-add as 2. Causal attention does half the work of full attention; the
model-FLOPs figure used for MFU follows the Megatron/PaLM convention (full attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import distinct, finetune, fp4, moe
from .arrays import select
from .columns import Batch

ACT_BYTES = 2.0  # bf16 activations and communicated tensors
# Bytes each cross-entropy implementation (specs.LOSS_IMPL order) moves per logit of the bf16
# logits the LM head writes, forward and backward, summed over the kernels it launches on the
# T x V/t tensor (rows too long for shared memory); docs/accuracy-edges.md ("The loss")
# lists the kernels, with file and tag.
LOSS_TRAFFIC_FWD = np.array([22.0, 2.0, 22.0, 38.0, 38.0, 38.0, 6.0])
LOSS_TRAFFIC_BWD = np.array([10.0, 4.0, 26.0, 38.0, 14.0, 14.0, 4.0])
# Op classes that the compute model prices differently.
OP_CLASSES = ("gemm", "attention", "elementwise")


@dataclass
class Op:
    """One op class summed over a layer (or stage part), per micro-batch, per GPU."""

    name: str
    op_class: str
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray  # input grad + weight grad
    bwd_wgrad_flops: np.ndarray  # the weight-grad share of bwd_flops (0 for attention/elementwise)
    fwd_bytes: np.ndarray  # HBM traffic for memory-bound ops
    bwd_bytes: np.ndarray
    gemm_m: np.ndarray = None  # representative GEMM dims (for size-dependent efficiency)
    gemm_n: np.ndarray = None
    gemm_k: np.ndarray = None
    where: str = "layer"  # layer | first_stage | last_stage
    # attention only: keys per query the kernel's efficiency curve sees (a sliding window's
    # width); None = the sequence length
    attn_keys: np.ndarray = None


@dataclass
class Comm:
    """One kind of communication: per call bytes (nccl-tests convention), calls per step."""

    dim: str  # tp | cp | ep | dp | pp
    op: str  # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv
    nbytes: np.ndarray
    group: np.ndarray
    nodes: np.ndarray
    calls_per_step: np.ndarray  # on the critical-path GPU
    overlap: str  # what it can hide behind: none | gemm | attention | backward | forward | compute


@dataclass
class Workload:
    tokens: np.ndarray  # T, tokens per GPU per micro-batch
    layers_per_stage: np.ndarray
    num_microbatches: np.ndarray
    dp: np.ndarray
    ops: list = field(default_factory=list)
    comms: list = field(default_factory=list)
    # parameters (counts, not bytes) held per GPU before ZeRO sharding
    params_layer: np.ndarray = None  # one average transformer layer on this GPU
    params_stage: np.ndarray = None  # worst stage: layers + embedding/head it holds
    params_embed: np.ndarray = None  # embedding or LM-head shard (vocab-parallel)
    params_total: np.ndarray = None  # whole model
    params_active: np.ndarray = None  # per token (MoE: routed top-k + shared)
    model_flops_per_step: np.ndarray = None  # MFU convention, whole cluster
    expert_fraction: np.ndarray = None  # share of a stage's params that are expert weights
    moe_load: np.ndarray = None  # busiest EP rank's load / balanced load (expert_load_factor)
    moe_stage_share: np.ndarray = None  # MoE share of the busiest rank's layers (stage_moe_share)
    dims: dict = None  # model_dims(b), shared with the memory estimator
    # parameters this GPU trains (LoRA / QLoRA: the adapters); None = every parameter
    params_trainable: np.ndarray = None


def model_dims(b: Batch) -> dict:
    """Derived per-layer dimensions shared by workload and memory."""
    h, a = b.hidden, b.heads
    kv = np.where(b.kv_heads > 0, b.kv_heads, a)
    hd = np.where(b.head_dim > 0, b.head_dim, h / a)
    mla = b.kv_lora_rank > 0
    dqk = np.where(mla, b.qk_nope_head_dim + b.qk_rope_head_dim, hd)
    dv = np.where(mla, b.v_head_dim, hd)
    q_dim = a * dqk
    kv_dim = np.where(mla, a * (dqk + dv) / 2.0, kv * hd)  # K+V width per token / 2 (for GQA: kv*hd)
    # attention projection weights (full, before TP)
    gqa_params = h * q_dim + 2 * h * kv * hd + a * hd * h
    q_params = np.where(b.q_lora_rank > 0, h * b.q_lora_rank + b.q_lora_rank * q_dim, h * q_dim)
    mla_params = (q_params + h * (b.kv_lora_rank + b.qk_rope_head_dim)
                  + b.kv_lora_rank * a * (b.qk_nope_head_dim + dv) + a * dv * h)
    attn_params = np.where(mla, mla_params, gqa_params)
    n_mats = np.where(b.activation == 1, 3.0, 2.0)  # swiglu has gate, up, down
    mlp_params = n_mats * h * b.ffn
    moe = b.experts > 0
    expert_params = n_mats * h * b.expert_ffn
    n_moe_layers = np.where(moe, b.layers - b.first_dense_layers, 0.0)
    n_dense_layers = b.layers - n_moe_layers
    return dict(h=h, a=a, kv=kv, hd=hd, dqk=dqk, dv=dv, q_dim=q_dim, kv_dim=kv_dim, mla=mla,
                attn_params=attn_params, mlp_params=mlp_params, n_mats=n_mats, moe=moe,
                expert_params=expert_params, n_moe_layers=n_moe_layers,
                n_dense_layers=n_dense_layers)


def stage_moe_share(b: Batch, d: dict) -> np.ndarray:
    """Share of MoE layers on the busiest pipeline rank. The dense layers lead the model
    (first_dense_layers), so they sit in the first chunks (chunk c on rank c mod pp, Megatron-
    Core's interleaved assignment): where they fill fewer chunks than there are ranks, some rank
    holds only MoE layers, and that rank sets the pipeline's pace (a MoE layer costs more than a
    dense one of the same active FLOPs: grouped GEMMs, dispatch, router). With pp 1 the one
    stage holds the model's mix."""
    share = d["n_moe_layers"] / np.maximum(b.layers, 1)
    chunk = np.ceil(b.layers / np.maximum(b.pp * b.vpp, 1))
    dense_chunks = np.ceil(d["n_dense_layers"] / np.maximum(chunk, 1))
    all_moe = (b.pp > 1) & (d["n_moe_layers"] > 0) & (dense_chunks < b.pp)
    return np.where(all_moe, 1.0, share)


def window_layers(b: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(share of layers that are sliding-window layers, window in keys) per configuration.

    Layer l (1-indexed) is windowed unless l % window_attn_skip_freq == 0 (Megatron-Core
    core_v0.15.3 transformer/utils.py is_layer_window_attention; 0 = every layer). A window
    that covers the whole sequence is full causal attention: its share is 0.
    """
    zero = np.zeros(np.shape(b.layers))
    w = np.asarray(b.get("sliding_window", zero), dtype=np.float64)
    freq = np.asarray(b.get("window_attn_skip_freq", zero), dtype=np.float64)
    n_win = np.where(freq > 0, b.layers - np.floor(b.layers / np.maximum(freq, 1.0)), b.layers)
    binds = (w > 0) & (w < b.seq_len)
    return np.where(binds, n_win / b.layers, 0.0), np.where(binds, w, b.seq_len)


def window_pairs(n, w):
    """Query-key pairs of the first n positions of a causal sliding window of w keys:
    sum over i < n of min(i + 1, w) (HF's mask: key j visible to query i iff i - w < j <= i)."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n <= w, n * (n + 1) / 2, w * (w + 1) / 2 + (n - w) * w)


def window_pairs_per_gpu(b: Batch, w) -> np.ndarray:
    """Pairs one micro-batch's windowed layer computes on the busiest CP rank.

    CP splits the sequence into 2*cp chunks, rank r holding chunks r and 2cp-1-r (Megatron's
    load balancing of the causal mask); Transformer Engine runs a window under CP only with
    all-gathered K/V (TE v2.8 attention/dot_product_attention/context_parallel.py:
    attn_forward_func_with_cp asserts cp_comm_type a2a or all_gather; AttnFuncWithCPAndKVAllGather
    narrows each chunk's K/V range to its window). A chunk's pairs rise with its position until
    the window fills, concavely, so the middle rank cp-1 (chunks cp-1 and cp) is the busiest.
    """
    c = b.cp
    L = b.seq_len / (2 * c)
    chunks = b.micro_batch * (window_pairs((c + 1) * L, w) - window_pairs((c - 1) * L, w))
    # cp_comm a2a (Ulysses) attends over the whole sequence with heads / cp on every rank
    # (TE AttnFuncWithCPAndQKVOA2A): each rank computes 1/cp of the pairs, no busiest rank
    return np.where(b.cp_comm == 2, b.micro_batch * window_pairs(b.seq_len, w) / c, chunks)


def _gemm_shapes(b: Batch, d: dict, T, t, etp, moe_frac, load, tok_expert) -> list:
    """(name, forward FLOPs per layer and micro-batch on one GPU, m, n, k) of every GEMM.

    Column-parallel layers shard their output (n / tp), row-parallel ones their input (k / tp),
    as Megatron does; ops present in only some layers (dense MLP vs MoE) carry that share.
    """
    h, a, n_up = d["h"], d["a"], np.where(b.activation == 1, 2.0, 1.0)
    dense, moe = 1.0 - moe_frac, moe_frac
    shapes = []

    def add(name, share, m, n, k):
        shapes.append((name, share * 2 * m * n * k, m, n, k))

    mla = d["mla"]
    # attention projections: MHA/GQA (q, k, v fused) or MLA (low-rank down and up projections)
    gqa = ~mla
    add("qkv_proj", gqa * 1.0, T, (d["q_dim"] + 2 * d["kv"] * d["hd"]) / t, h)
    ql = b.q_lora_rank
    add("q_down_proj", mla * (ql > 0), T, ql / t, h)
    add("q_up_proj", mla * 1.0, T, d["q_dim"] / t, np.where(ql > 0, ql, h))
    add("kv_down_proj", mla * 1.0, T, (b.kv_lora_rank + b.qk_rope_head_dim) / t, h)
    add("kv_up_proj", mla * 1.0, T, a * (b.qk_nope_head_dim + d["dv"]) / t, b.kv_lora_rank)
    add("out_proj", 1.0, T, h, a * d["dv"] / t)
    # dense MLP: FC1 (gate+up for SwiGLU) and FC2
    add("fc1", dense, T, n_up * b.ffn / t, h)
    add("fc2", dense, T, h, b.ffn / t)
    # MoE: router, shared experts (all tokens), routed experts (grouped GEMM, busiest rank)
    add("router", moe * (b.experts > 0), T, b.experts / t, h)
    add("shared_fc1", moe * (b.shared_experts > 0), T, n_up * b.shared_experts * b.expert_ffn / t, h)
    add("shared_fc2", moe * (b.shared_experts > 0), T, h, b.shared_experts * b.expert_ffn / t)
    local = np.maximum(b.experts / b.ep, 1.0)  # experts one GPU holds
    for name, n, k in (("expert_fc1", n_up * b.expert_ffn / etp, h),
                       ("expert_fc2", h, b.expert_ffn / etp)):
        m = tok_expert
        shapes.append((name, moe * (b.experts > 0) * local * 2 * m * n * k, m, n, k))
    return shapes


# routing skew lives with the rest of the MoE dispatch path (moe.py); kept under this name too
expert_load_factor = moe.expert_load_factor


def param_counts(b: Batch, dims: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Total and active (per token) parameter counts of the whole model."""
    d = dims or model_dims(b)
    h = d["h"]
    norms = 2 * h
    dense_layer = d["attn_params"] + d["mlp_params"] + norms
    moe_layer_total = (d["attn_params"] + norms + h * b.experts
                       + (b.experts + b.shared_experts) * d["expert_params"])
    moe_layer_active = (d["attn_params"] + norms + h * b.experts
                        + (b.top_k + b.shared_experts) * d["expert_params"])
    embed = b.vocab * h * np.where(b.tied_embeddings, 1.0, 2.0) + h
    total = d["n_dense_layers"] * dense_layer + d["n_moe_layers"] * moe_layer_total + embed
    active = d["n_dense_layers"] * dense_layer + d["n_moe_layers"] * moe_layer_active + embed
    return total, active


def _layout(b: Batch) -> dict:
    """What both the ops and the rest of the workload derive first from a configuration."""
    d = distinct.on_distinct("workload.model_dims", b, model_dims)  # once per model
    t, p, c, v = b.tp, b.pp, b.cp, b.vpp
    etp = np.where(b.etp > 0, b.etp, t)
    T = b.micro_batch * b.seq_len / c
    sp = b.sequence_parallel & (t > 1)
    # layers on the busiest pipeline rank: uneven splits give some chunks one layer more
    L_stage = np.ceil(b.layers / (p * v)) * v
    moe_frac = d["n_moe_layers"] / b.layers  # share of layers that are MoE
    # the busiest rank's share (its ops, compute and the EP transfers use it)
    moe_stage = stage_moe_share(b, d)
    load = expert_load_factor(b)  # slowest EP rank's load / balanced load (>= 1)
    return dict(d=d, etp=etp, T=T, sp=sp, L_stage=L_stage, moe_frac=moe_frac, load=load,
                moe_stage=moe_stage)


def _ops(b: Batch, lay: dict) -> list:
    """The ops of one micro-batch on one GPU (layer, first and last stage)."""
    d, etp, T, sp = lay["d"], lay["etp"], lay["T"], lay["sp"]
    L_stage, moe_frac, load = lay["L_stage"], lay["moe_stage"], lay["load"]
    h, a = d["h"], d["a"]
    t, e, s = b.tp, b.ep, b.seq_len

    # ---- GEMMs of one (average) layer, forward, per GPU --------------------------------------
    # attention projections and dense MLPs see all T tokens; a MoE layer's routed experts see
    # only the tokens routed to them, so their GEMMs are smaller (grouped GEMM over local experts)
    # rows of one local expert's GEMM: each EP rank dispatches T*top_k copies (split over the
    # tp ranks unless experts are tensor-parallel too: etp) spread over all experts
    tok_expert = np.maximum(T * b.top_k * e * etp / (np.maximum(b.experts, 1) * t), 1.0) * load
    gemm_shapes = _gemm_shapes(b, d, T, t, etp, moe_frac, load, tok_expert)

    # ---- attention core (flash-style, causal) -------------------------------------------------
    # Each query attends to on average s/2 keys (causal); CP load-balances the causal mask.
    # Sliding-window layers (a share win_frac of the layers) attend to at most `window` keys:
    # their pairs are counted exactly (window_pairs_per_gpu); full layers keep the s/2 convention
    win_frac, window = window_layers(b)
    attn_core_fwd = 2 * T * (s / 2) * (a / t) * (d["dqk"] + d["dv"]) * (1.0 - win_frac)
    swa_core_fwd = (2 * window_pairs_per_gpu(b, window) * (a / t) * (d["dqk"] + d["dv"])
                    * win_frac)

    # ---- memory-bound elementwise ops (norms, residuals, rotary, activation function) ---------
    h_shard = np.where(sp, t, 1.0)
    act_rw = np.where(b.activation == 1, 6.0, 4.0)  # swiglu reads 2 f-wide inputs
    f_width = (1 - moe_frac) * b.ffn + moe_frac * (b.top_k + b.shared_experts) * b.expert_ffn
    # MoE: permutation, unpermutation and router passes of the dispatcher in use (moe.py)
    permute = moe_frac * moe.elementwise_bytes(b, T / t, load)
    elem_fwd_bytes = ACT_BYTES * (20 * T * h / h_shard + act_rw / 2 * T * f_width / t
                                  + 2 * T * (d["q_dim"] + 2 * d["kv_dim"]) / t)
    zero = 0 * T
    # forward = 2*m*n*k per layer that has the op; backward = input grad + weight grad (2x)
    ops = [Op(name, "gemm", fwd * L_stage, 2 * fwd * L_stage, fwd * L_stage, zero, zero,
              m_, n_, k_) for name, fwd, m_, n_, k_ in gemm_shapes]
    ops += [
        Op("attention", "attention", attn_core_fwd * L_stage, 2.5 * attn_core_fwd * L_stage,
           0 * T, 0 * T, 0 * T),
        # the kernel skips key blocks outside the window; its efficiency follows the window
        Op("attention_window", "attention", swa_core_fwd * L_stage,
           2.5 * swa_core_fwd * L_stage, 0 * T, 0 * T, 0 * T, attn_keys=window),
        Op("elementwise", "elementwise", 0 * T, 0 * T, 0 * T, elem_fwd_bytes * L_stage,
           2 * elem_fwd_bytes * L_stage),
        # the MoE layer's own memory-bound work (moe.MLP_OPS: scheduled with the experts)
        Op("moe_permute", "elementwise", 0 * T, 0 * T, 0 * T, permute * L_stage,
           2 * permute * L_stage),
    ]
    # ---- embedding, LM head and loss (first / last stage) -------------------------------------
    # multi-token prediction (specs mtp_layers): each MTP layer applies the shared output head
    # and the loss once more (Megatron-Core models/gpt/gpt_model.py L549-561, core_v0.15.3)
    heads = 1.0 + b.mtp_layers
    head_fwd = 2 * T * h * b.vocab / t * heads
    logits = T * b.vocab / t * heads
    ops.append(Op("lm_head", "gemm", head_fwd, 2 * head_fwd, head_fwd, 0 * T, 0 * T,
                  T, b.vocab / t, h, where="last_stage"))
    ops.append(Op("loss", "elementwise", 0 * T, 0 * T, 0 * T,
                  LOSS_TRAFFIC_FWD[b.loss_impl] * logits, LOSS_TRAFFIC_BWD[b.loss_impl] * logits,
                  where="last_stage"))
    # and, before its transformer layer (priced in step.compose as one more layer of the
    # stage), eh_proj: [T, 2h] -> [T, h], column-parallel (multi_token_prediction.py L464-474)
    # and its memory-bound ops: the embedding lookup (3 passes, as on the first stage), enorm,
    # hnorm and the final norm (read + write each) and the concatenation (read + write 2h)
    if np.any(b.mtp_layers > 0):
        eh_fwd = 2 * T * 2 * h * h / t * b.mtp_layers
        ops.append(Op("mtp_eh_proj", "gemm", eh_fwd, 2 * eh_fwd, eh_fwd, 0 * T, 0 * T,
                      T, h / t, 2 * h, where="last_stage"))
        mtp_bytes = ACT_BYTES * T * h / h_shard * (3 + 3 * 2 + 4) * b.mtp_layers
        ops.append(Op("mtp_elementwise", "elementwise", 0 * T, 0 * T, 0 * T, mtp_bytes,
                      2 * mtp_bytes, where="last_stage"))
    ops.append(Op("embedding", "elementwise", 0 * T, 0 * T, 0 * T, 3 * ACT_BYTES * T * h,
                  3 * ACT_BYTES * T * h, where="first_stage"))
    # fine-tuning (LoRA / QLoRA / packed samples): sim_core/finetune.py; pre-training unchanged
    return finetune.adjust_ops(b, lay, ops, Op)


def op_workload(b: Batch) -> Workload:
    """The part of the workload the compute model prices (ops, tokens, layers per stage, MoE
    load, model dims), without what depends on the data-parallel size or the batch: the
    compute model evaluates it once per distinct (model, sequence, tp, cp, micro-batch, ...)."""
    lay = _layout(b)
    return Workload(tokens=lay["T"], layers_per_stage=lay["L_stage"], num_microbatches=None,
                    dp=None, ops=_ops(b, lay), moe_load=lay["load"], dims=lay["d"],
                    moe_stage_share=lay["moe_stage"])


def build(b: Batch, ops: bool = True) -> Workload:
    """The workload of every configuration. ops False leaves `ops` None: compute.stage_times
    then builds them itself, once per distinct input of the compute model (sim_core.distinct)."""
    lay = _layout(b)
    d, etp, T, sp = lay["d"], lay["etp"], lay["T"], lay["sp"]
    L_stage, moe_frac, load = lay["L_stage"], lay["moe_frac"], lay["load"]
    h, a = d["h"], d["a"]
    t, p, c = b.tp, b.pp, b.cp
    e = b.ep
    s = b.seq_len
    dp = select(b.dp > 0, b.dp, b.num_gpus / (t * p * c))
    m = b.global_batch / (dp * b.micro_batch)

    # ---- parameters per GPU ------------------------------------------------------------------
    norms = 2 * h
    dense_layer_gpu = d["attn_params"] / t + d["mlp_params"] / t + norms
    expert_gpu = (b.experts / e) * d["expert_params"] / etp
    moe_layer_gpu = (d["attn_params"] / t + norms + h * b.experts
                     + b.shared_experts * d["expert_params"] / t + expert_gpu)
    params_layer = (1 - moe_frac) * dense_layer_gpu + moe_frac * moe_layer_gpu
    params_embed = b.vocab * h / t
    # worst stage: with pp == 1 one GPU holds both embedding and LM head (unless tied)
    n_embed_mats = select(p > 1, 1.0, np.where(b.tied_embeddings, 1.0, 2.0))
    params_stage = params_layer * L_stage + params_embed * n_embed_mats
    expert_fraction = np.where(params_stage > 0, moe_frac * expert_gpu * L_stage / params_stage, 0)
    # the model's counts: once per distinct model (sim_core.distinct)
    counts = distinct.on_distinct("workload.param_counts", b, lambda sb: dict(
        zip(("total", "active"), param_counts(sb))))
    total, active = counts["total"], counts["active"]

    # model FLOPs per step (MFU convention: 6 * active params * tokens + full attention)
    tokens_step = b.global_batch * s
    attn_flops_token = 6 * 2 * s * a * (d["dqk"] + d["dv"]) / 2 * b.layers
    nonembed_active = active - b.vocab * h * np.where(b.tied_embeddings, 1.0, 2.0) - h
    model_flops = tokens_step * (6 * (nonembed_active + b.vocab * h) + attn_flops_token)
    if finetune.any_finetune(b):
        # frozen weights: forward + input gradient (4 FLOPs per weight and token), adapters 6
        # (NVIDIA's LoRA rows count Model TFLOP/s this way: 735 TFLOP/s at 2643 tokens/s/GPU
        # for Llama 3 70B is 2.8e11 FLOPs per token, 4 x 70B); packed samples' attention
        fz = finetune.frozen(b)
        mean = finetune.col(b, "mean_seq_len").astype(np.float64)
        packed = finetune.col(b, "packing").astype(bool) & (mean > 0) & (mean < s)
        attn = attn_flops_token * np.where(packed, mean / s, 1.0)
        lora = tokens_step * (4 * (nonembed_active + b.vocab * h) + attn
                              + 6 * finetune.adapter_params_total(b, d))
        model_flops = np.where(fz, lora, tokens_step * (6 * (nonembed_active + b.vocab * h)
                                                       + attn))

    wl = Workload(tokens=T, layers_per_stage=L_stage, num_microbatches=m, dp=dp,
                  ops=_ops(b, lay) if ops else None,
                  params_layer=params_layer, params_stage=params_stage, params_embed=params_embed,
                  params_total=total, params_active=active, model_flops_per_step=model_flops,
                  expert_fraction=expert_fraction, moe_load=load, dims=d,
                  moe_stage_share=lay["moe_stage"])
    if np.any(finetune.frozen(b)):
        wl.params_trainable = finetune.trainable_params(b, wl)
    wl.comms = _comms(b, wl, d, sp, etp)
    return wl


def span_nodes(group: np.ndarray, stride: np.ndarray, gpn: np.ndarray) -> np.ndarray:
    """Nodes a group spans when its ranks are `stride` apart in the global rank order.

    Rank order is tp innermost, then cp, then dp (ep lives inside dp), pp outermost, the
    Megatron default. A group of size g with stride r covers g*r consecutive ranks if r < gpn.
    """
    per_node = np.maximum(np.floor(gpn / np.minimum(stride, gpn)), 1.0)
    per_node = np.minimum(per_node, group)
    return np.ceil(group / per_node)


def _a2a_comms(b: Batch, d: dict, T, layer_mbs, full_rc, cp_nodes) -> list:
    """Ulysses context parallelism (cp_comm a2a): the all-to-alls of one step.

    Before attention q, k and v are each all-to-all'd over the CP group, turning (s/cp tokens,
    all local heads) into (s tokens, heads/cp); after it the output goes back the same way: 4
    all-to-alls per layer forward, mirrored in backward (dO in, dQ, dK, dV out), replayed by a
    full recompute. Read in TE v2.8 attention/dot_product_attention/context_parallel.py
    AttnFuncWithCPAndQKVOA2A (forward: flash_attn_a2a_communicate([q, k, v]) then of out_;
    backward: of dout, then of [dq, dk, dv]; one torch.distributed.all_to_all_single per
    tensor), DeepSpeed deepspeed/sequence/layer.py DistributedAttention (_SeqAllToAll of
    query, key, value and of the context; its backward is the reverse all-to-all) and verl
    v0.5.0 models/transformers/monkey_patch.py _ulysses_flash_attention_forward
    (gather_seq_scatter_heads of q, k, v; gather_heads_scatter_seq of the output). Each
    message is one rank's whole local tensor (nccl.py's all-to-all bytes, of which (cp-1)/cp
    leave the rank). K/V carry the KV heads of the TP rank; with cp_kv_repeat (verl) they are
    repeated up to cp first. Exposed: TE waits on each all-to-all before the attention
    (cp_stream only reorders the chunks), DeepSpeed's overlap pipelines them with the
    projections only when an sp_stream is given."""
    c, t = b.cp, b.tp
    a2a = (b.cp_comm == 2) & (c > 1)
    width = (d["dqk"] + d["dv"]) / 2.0  # mean of the q/k and v/o head widths (MLA: unequal)
    kvh = np.where(d["mla"], d["a"], d["kv"]) / t
    kvh = np.where(np.asarray(b.get("cp_kv_repeat", 0 * c)) > 0, np.maximum(kvh, c), kvh)
    per_pass = layer_mbs * (2.0 + full_rc)  # forward (+ full recompute) and backward passes
    return [Comm("cp", "all_to_all", ACT_BYTES * T * (d["a"] / t) * width, c, cp_nodes,
                 select(a2a, 2.0 * per_pass, 0.0), "none"),  # q and o (dO and dQ)
            Comm("cp", "all_to_all", ACT_BYTES * T * kvh * width, c, cp_nodes,
                 select(a2a, 2.0 * per_pass, 0.0), "none")]  # k and v (dK and dV)


def _comms(b: Batch, wl: Workload, d: dict, sp: np.ndarray, etp: np.ndarray) -> list:
    t, p, c = b.tp, b.pp, b.cp
    T, m, dp, L = wl.tokens, wl.num_microbatches, wl.dp, wl.layers_per_stage
    gpn = b.gpus_per_node
    h = d["h"]
    act = ACT_BYTES * T * h  # one hidden-state tensor for a micro-batch on one CP rank
    full_rc = b.recompute == 2
    comms = []
    # ---- TP: per layer 2 forward + 2 backward all-reduces (no SP), or AG/RS pairs (SP) ----------
    tp_nodes = span_nodes(t, np.ones_like(t), gpn)
    n_fwd = 2.0 * L * (1 + full_rc)  # a full recompute replays the forward collectives
    n_bwd = 2.0 * L
    # without SP: all-reduce of the full activation; with SP: AG + RS (+ AG re-gather in bwd)
    comms.append(Comm("tp", "all_reduce", act, t, tp_nodes,
                      select(sp, 0.0, (n_fwd + n_bwd) * m), "gemm"))
    comms.append(Comm("tp", "all_gather", act, t, tp_nodes,
                      select(sp, (n_fwd + 2 * n_bwd) * m, 0.0), "gemm"))
    comms.append(Comm("tp", "reduce_scatter", act, t, tp_nodes,
                      select(sp, (n_fwd + n_bwd) * m, 0.0), "gemm"))
    # vocab-parallel embedding / LM head / cross-entropy (first and last stage only)
    comms.append(Comm("tp", "all_reduce", act, t, tp_nodes, select(p > 1, 1.0, 2.0) * m,
                      "none"))
    # LoRA adapters of row-parallel linears gather their output over TP (sim_core/finetune.py)
    comms += finetune.adapter_comms(b, wl, d, tp_nodes, Comm)
    # ---- CP: K/V of the other sequence shards ------------------------------------------------
    # ring (Megatron cp_comm_type p2p): c-1 send/recv steps of one K,V block per layer, forward
    # (+ recompute) and backward (K,V and dK,dV), each hidden behind the attention of the block
    # in hand; all-gather: K,V gathered once per layer pass (+ dK,dV reduce-scattered in
    # backward), exposed, but with c-1 fewer latencies
    cp_nodes = span_nodes(c, t, gpn)
    kv_block = ACT_BYTES * T * 2 * d["kv_dim"] / t
    ring = (b.cp_comm == 0) & (c > 1)
    gather = (b.cp_comm == 1) & (c > 1)
    n_cp = L * m * (c - 1) * (1 + full_rc + 2)  # fwd (+recompute) K,V; bwd K,V and dK,dV
    comms.append(Comm("cp", "send_recv", kv_block, c, cp_nodes, select(ring, n_cp, 0.0),
                      "attention"))
    n_pass = L * m * (1 + full_rc + 1)
    comms.append(Comm("cp", "all_gather", kv_block * c, c, cp_nodes,
                      select(gather, n_pass, 0.0), "none"))
    comms.append(Comm("cp", "reduce_scatter", kv_block * c, c, cp_nodes,
                      select(gather, L * m, 0.0), "none"))
    comms += _a2a_comms(b, d, T, L * m, full_rc, cp_nodes)
    # ---- PP: one activation forward and one gradient backward per micro-batch per boundary ----
    pp_nodes = span_nodes(np.full_like(p, 2.0), t * c * dp, gpn)
    p2p = act / select(sp, t, 1.0)
    comms.append(Comm("pp", "send_recv", p2p, select(p > 1, 2.0, 1.0), pp_nodes,
                      select(p > 1, 2 * m * b.vpp, 0.0), "compute"))
    # ---- DP: gradients (fp32 main grads) and parameters, over dp x cp ranks -------------------
    dp_group = dp * c
    dp_nodes = span_nodes(dp_group, t, gpn)
    dense_params = wl.params_stage * (1 - wl.expert_fraction)
    g_bytes = select(b.grad_reduce_fp32, 4.0, 2.0)  # main grads reduced in fp32 or bf16
    grad_bytes = g_bytes * dense_params
    # parameters are gathered in bf16, or in FP8 with fp8_param_gather (TE FP8 primary weights)
    param_bytes = select(b.fp8_param_gather & (b.precision == 1) & (b.has_fp8 > 0), 1.0,
                           2.0) * dense_params
    # FP4 primary weights (Megatron --fp4-param-gather, on in Megatron-Bridge's NVFP4 recipe;
    # the run field fp8_param_gather asks for it): gathered in FP4 with their scales
    fp4_rows = fp4.active(b)
    if fp4_rows.any():
        param_bytes = select(fp4_rows & b.fp8_param_gather, fp4.arrays(b)["gather_bytes"] *
                             dense_params, param_bytes)
    if wl.params_trainable is not None:  # LoRA / QLoRA (sim_core/finetune.py)
        fz = finetune.frozen(b)
        adapters = wl.params_trainable
        grad_bytes = select(fz, g_bytes * adapters, grad_bytes)
        # ZeRO-1/2 gather the updated adapters; FSDP gathers the frozen weights too (NF4 under
        # QLoRA) with the adapters, for forward and backward
        base = finetune.base_weight_bytes(b, wl, dense_params, wl.params_embed)
        param_bytes = select(fz, select(b.zero == 3, base + 2.0 * adapters, 2.0 * adapters),
                             param_bytes)
    z = b.zero
    per_mb = z >= 2  # sharded grads must be reduced every micro-batch (ZeRO-2/3, FSDP)
    # ZeRO-0: one all-reduce of all grads per step; ZeRO>=1 reduce-scatter + param all-gather
    comms.append(Comm("dp", "all_reduce", grad_bytes, dp_group, dp_nodes,
                      select((z == 0) & (dp_group > 1), 1.0, 0.0), "backward"))
    comms.append(Comm("dp", "reduce_scatter", grad_bytes, dp_group, dp_nodes,
                      select((z >= 1) & (dp_group > 1), select(per_mb, m, 1.0), 0.0),
                      "backward"))
    # ZeRO-1/2 gather updated params once per step; ZeRO-3/FSDP gathers them for forward and
    # again for backward in every micro-batch (parameters are resharded after forward)
    n_ag = select(z == 3, 2.0 * m, 1.0)
    comms.append(Comm("dp", "all_gather", param_bytes, dp_group, dp_nodes,
                      select((z >= 1) & (dp_group > 1), n_ag, 0.0), "forward"))
    # ---- EP: token dispatch and combine, forward and backward, per MoE layer ----------------
    # (inventory only: step.py prices and overlaps them through moe.py; flex/DeepEP is not an
    # NCCL collective and is not listed)
    e = b.ep
    moe_layers = L * select(d["moe"], (b.layers - b.first_dense_layers) / b.layers, 0.0)
    # (once per distinct layer shape and EP layout: sim_core.distinct)
    by = distinct.on_distinct("moe.dispatch_bytes", b, lambda sb: moe.dispatch_bytes(
        sb, sb.micro_batch * sb.seq_len / sb.cp / sb.tp, expert_load_factor(sb)))
    n_a2a = moe_layers * m * 2 * (2 + full_rc)  # dispatch + combine, fwd (+rc) and bwd
    a2a = (b.moe_dispatcher == moe.ALLTOALL) & (e > 1)
    comms.append(Comm("ep", "all_to_all", by["a2a"], e, by["nodes"], select(a2a, n_a2a, 0.0),
                      "none"))
    ag = (b.moe_dispatcher == moe.ALLGATHER) & (by["ag_group"] > 1) & d["moe"]
    ag_nodes = np.ceil(by["ag_group"] / np.minimum(by["ag_group"], gpn))
    for op in ("all_gather", "reduce_scatter"):
        comms.append(Comm("ep", op, by["ag"], by["ag_group"], ag_nodes,
                          select(ag, n_a2a / 2, 0.0), "none"))
    # expert gradients reduce over the expert-data-parallel group
    edp = dp * c * t / (e * etp)
    exp_grad = g_bytes * wl.params_stage * wl.expert_fraction
    comms.append(Comm("dp", "reduce_scatter", exp_grad, edp, span_nodes(edp, t * c * e, gpn),
                      select((wl.expert_fraction > 0) & (edp > 1), 1.0, 0.0), "backward"))
    return comms
