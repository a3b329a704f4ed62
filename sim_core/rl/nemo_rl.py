"""What NeMo RL's training phases run beyond the pre-training step they are priced with.

`training.py` prices the log-prob passes and the update as the pre-training simulator's step
(forward = a third of it). NeMo RL v0.3.0 (NVIDIA-NeMo/RL tag v0.3.0) adds two costs of its
own, both read from its code; `rl_framework: nemo_rl` turns them on:

1. **The reference model lives on the host and is swapped in.** `megatron_policy_worker.py`
   `__init__` copies the reference model's state dict to the CPU (`.to("cpu",
   non_blocking=True)`: pinned), and `use_reference_model` (run by
   `get_reference_policy_logprobs`) copies the policy's state dict to the host, loads the
   reference's back to the GPU, and after the pass loads the policy's again: three copies of
   the per-GPU weights over PCIe per step. `dtensor_policy_worker.py` does the same with
   `get_cpu_state_dict(..., pin_memory=True)` and `copy_` both ways; its parameters are fp32
   (the model is loaded with `torch_dtype=torch.float32`, FSDP2's `MixedPrecisionPolicy` casts
   to bf16 for compute), so its copies are 4 bytes per parameter where Megatron's are the bf16
   weights. The blog's `Get logprobs` timer (`grpo.py`: `policy_and_reference_logprobs`)
   holds both passes and the swap.
2. **Token log-probabilities from the full logits, in fp32.** NeMo RL never runs the
   framework's cross-entropy: the model returns logits and `nemo_rl/distributed/model_utils.py
   DistributedLogprob` computes a log-softmax over the (vocab-parallel) vocabulary: max, a
   subtracted copy, exp, sum, the log-softmax into a new tensor, a clone, an in-place exp, a
   gather. The update's loss (`loss_functions.py ClippedPGLossFn`) first casts the logits to
   fp32 and keeps the softmax for backward, whose gradient builds an int64 one-hot over the
   vocabulary, casts it, subtracts the softmax and scales it. The log-prob passes of Megatron
   run the same forward over the packed bf16 logits (`from_parallel_logits_to_logprobs_packed_
   sequences`, `inference_only`; unpacked, they cast to fp32 first); DTensor's cast to fp32 first
   (`dtensor_policy_worker.py get_logprobs`: `logits.to(torch.float32)`; FSDP2's
   `output_dtype=torch.float32`, `nemo_rl/models/dtensor/parallelize.py`). Bytes per logit
   element below, counted from those kernels (reads + writes); the pre-training step already
   prices its own loss (`workload.LOSS_TRAFFIC_FWD/BWD` of the resolved `loss_impl`), so only the
   difference is added, at the elementwise HBM efficiency of `efficiency.yaml`.

What the training frame is told (not added seconds: inputs to the pre-training step):

3. **The DTensor worker's kernels** (`dtensor_fields`): the Hugging Face model in eager
   PyTorch 2.7 under FSDP2 + DTensor TP: FlashAttention-2, unfused norm / RoPE / SwiGLU, TP
   collectives exposed, sequence parallel only where stated.
4. **Dynamic batching's micro-batches** (`dynamic_microbatches`): sorted, strided over the DP
   ranks, cut greedily at `train_mb_tokens` padded tokens, each padded to its longest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import compute, frameworks, specs, workload
from .inputs import RL_FRAMEWORK, fsdp, train_col, train_dp

# NeMo RL v0.3.0 bytes moved per logit element (model_utils.py DistributedLogprob,
# loss_functions.py ClippedPGLossFn)
# update forward: bf16 -> fp32 cast 2+4, amax 4, subtract 4+4, exp 4+4, sum 4, log-softmax 4+4,
# clone 4+4, in-place exp 4+4 = 54
TRAIN_FWD_BYTES = 54.0
# update backward: one-hot int64 8, masked product 8+8, .float() 8+4, sub_ 4+4+4, mul_ 4+4,
# autograd's cast back to the bf16 logits 4+2 = 62
TRAIN_BWD_BYTES = 62.0
# log-prob pass, Megatron (packed bf16 logits, inference_only): amax 2, subtract 2+2, exp 2+2,
# sum 2, log-softmax 2+2, clone 2+2, in-place exp 2+2 = 24
LOGPROB_BYTES_BF16 = 24.0
# log-prob pass, DTensor: cast to fp32 2+4 then the same in fp32 (48) = 54
LOGPROB_BYTES_FP32 = 54.0


def loss_impl_index(tf: pd.DataFrame) -> np.ndarray:
    """Per row of a training frame, the index (specs.LOSS_IMPL order) of the loss
    implementation it resolves to (its own, else the framework profile's default): what the
    pre-training step prices at the loss, as traffic (workload) and as memory (memory.py)."""
    resolved = frameworks.resolve_frame(tf.reset_index(drop=True))
    impl = resolved["loss_impl"].astype(str)
    idx = pd.Categorical(impl, categories=specs.LOSS_IMPL).codes.astype(np.int64)
    if (idx < 0).any():
        raise ValueError(f"loss_impl {impl[idx < 0].iloc[0]!r} is not in {specs.LOSS_IMPL}")
    return idx


def _sim_loss_bytes(tf: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The loss bytes per logit the pre-training step already prices (forward, backward), for
    the loss implementation the training frame resolves to (framework profile default)."""
    idx = loss_impl_index(tf)
    return workload.LOSS_TRAFFIC_FWD[idx], workload.LOSS_TRAFFIC_BWD[idx]


def megatron_bin_padding(b, tf: pd.DataFrame, sim: pd.DataFrame,
                         pack_budget: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Extra tokens the busiest data-parallel rank runs through the layers in NeMo RL's packed
    Megatron passes, as a fraction of the tokens the step priced per rank (update per
    optimizer step, log-prob pass over the whole batch). Zero where it does not apply.

    NeMo RL v0.3.0 `distributed/batched_data_dict.py shard_by_batch_size` packs each chunk
    (the optimizer step's `train_global_batch_size` sequences for the update, the whole batch
    for log-probs: `lm_policy.py get_logprobs` passes `batch_size=None`) into bins of
    `max_tokens_per_microbatch` (train_mb_tokens; logprob_mb_tokens = max_total_sequence_length
    x logprob_batch_size) with first-fit-decreasing, after padding every sequence to a
    multiple of `sequence_length_pad_multiple` (tp, or 2 x cp x tp with CP), then deals the
    bins round-robin (`shard_idx = bin_idx % shards`): the busiest rank holds ceil(bins / dp)
    of them and the others wait for it at the gradient reduce. With pipeline parallelism,
    `megatron_policy_worker.py` `train` and `get_logprobs` pad every packed micro-batch to
    the rank's longest bin (`pad_full_seq_to` = max of `micro_batch_lengths`, "to maintain a
    static PP buffer"; `models/megatron/common.py _pack_sequences_for_megatron` pads the
    last sequence up to it): each bin then runs at the capacity (first-fit-decreasing fills
    its first bin to within a sequence of it). Bins are counted at their lower bound,
    tokens / capacity, which first-fit-decreasing meets within a bin or two when sequences are
    shorter than the capacity; the step's own rounding to whole micro-batches counts toward
    the padding (never below what it priced). Megatron with sequence packing only: DTensor
    pads each training bin to the capacity anyway (`update_pad_s`), dynamic batching and
    unpacked micro-batches are formed otherwise."""
    tp, pp, cp = (train_col(tf, c) for c in ("tp", "pp", "cp"))
    dp = np.maximum(sim["dp"].to_numpy(float), 1.0)
    on = (b.sequence_packing > 0) & (b.dynamic_batching <= 0) & ~fsdp(tf)
    multiple = np.where(cp > 1, 2.0 * cp * tp, tp)
    # mean padded length: a sequence gains (multiple - 1) / 2 tokens on average
    seq = b.prompt_len + b.response_mean + (multiple - 1.0) / 2.0
    # the tokens the step priced on one rank per optimizer step (training_frame's micro-batches)
    priced = tf["global_batch"].to_numpy(float) * tf["seq_len"].to_numpy(float) / dp

    def busiest(seqs, cap):
        tokens = seqs * seq
        bins = np.maximum(np.ceil(tokens / cap - 1e-9), 1.0)
        per_bin = np.where(pp > 1, cap, tokens / bins)
        return np.ceil(bins / dp - 1e-9) * per_bin

    cap = np.maximum(pack_budget, 1.0)
    up = busiest(np.ceil(b.sequences / b.mini_batches), cap) / priced - 1.0
    lp = busiest(b.sequences, cap * np.maximum(b.logprob_batch_size, 1.0)) \
        / (priced * b.mini_batches) - 1.0
    return (np.where(on, np.maximum(up, 0.0), 0.0), np.where(on, np.maximum(lp, 0.0), 0.0))


def extras(b, tf: pd.DataFrame, sim: pd.DataFrame, pcie_bytes_per_s: np.ndarray,
           pack_budget: np.ndarray) -> dict:
    """Seconds NeMo RL adds: `ref_swap_s` (to the reference log-prob pass, per RL step),
    `logprob_loss_s` and `logprob_bins_s` (per log-prob pass), `update_loss_s` (per update
    epoch), `update_pad_s` and `update_bins_s` (per optimizer step). Zero for rows that are
    not `rl_framework: nemo_rl`."""
    on = (b.rl_framework == RL_FRAMEWORK.index("nemo_rl")).astype(float)
    tp, cp = train_col(tf, "tp"), train_col(tf, "cp")
    sharded = fsdp(tf)
    # 1. the reference swap: policy out, reference in, policy back in (pinned, PCIe rate)
    # (DTensor copies each rank's local FSDP shard: `to_local_if_dtensor` in
    # get_cpu_state_dict; params_per_gpu is the model-parallel rank's, before the FSDP split)
    dp_shard = np.where(sharded, np.maximum(sim["dp"].to_numpy(float), 1.0), 1.0)
    weight_bytes = sim["params_per_gpu"].to_numpy(float) / dp_shard * np.where(sharded, 4.0, 2.0)
    ref_swap = 3.0 * weight_bytes / pcie_bytes_per_s * b.use_ref
    # 2. the fp32 log-softmax over the vocabulary: logits on one GPU of the last stage per
    # RL step = its data-parallel rank's tokens / cp x vocab / tp
    dp = sim["dp"].to_numpy(float)
    # (padded: without sequence packing every sequence runs at the batch's longest)
    packed_any = b.sequence_packing > 0
    seq_tokens = np.where(packed_any, b.prompt_len + b.response_mean, tf["seq_len"].to_numpy(float))
    tokens = b.sequences * seq_tokens / np.maximum(dp, 1.0) / cp
    logits = tokens * b.vocab / tp
    hbm = b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
    fwd, bwd = _sim_loss_bytes(tf)
    # the pre-training step's forward (training.py: a third of the step's compute) carries a
    # third of its loss bytes
    # Megatron casts to fp32 too when packing is off (`from_parallel_logits_to_logprobs(
    # output_tensor.to(torch.float32), ...)`, megatron_policy_worker.py get_logprobs)
    fp32_lp = sharded | (b.sequence_packing <= 0)
    lp_bytes = np.where(fp32_lp, LOGPROB_BYTES_FP32, LOGPROB_BYTES_BF16) - (fwd + bwd) / 3.0
    up_bytes = TRAIN_FWD_BYTES + TRAIN_BWD_BYTES - (fwd + bwd)
    # 3. DTensor pads every packed training micro-batch up to `train_mb_tokens`
    # (dtensor_policy_worker.py train: `pack_sequences(..., min_seq_len=train_mb_tokens)`, "a
    # WAR ... backward will fail when TP is enabled"); its log-prob passes do not. The padding
    # runs through the layers like real tokens: the update's compute grows by budget / filled
    packed = (b.sequence_packing > 0) & (b.dynamic_batching <= 0)
    filled = tf["micro_batch"].to_numpy(float) * tf["seq_len"].to_numpy(float)
    budget = np.maximum(pack_budget, filled)
    pad = np.where(sharded & packed, budget / np.maximum(filled, 1.0) - 1.0, 0.0)
    # 4. Megatron's packed bins: dealt round-robin over DP, padded to the longest with PP
    up_bins, lp_bins = megatron_bin_padding(b, tf, sim, pack_budget)
    pipe = sim["time_compute"].to_numpy(float) + sim["time_bubble"].to_numpy(float)
    return {
        "update_bins_s": on * up_bins * pipe,
        "logprob_bins_s": on * lp_bins * pipe / 3.0 * b.mini_batches,
        "update_pad_s": on * pad * sim["time_compute"].to_numpy(float),
        "ref_swap_s": on * ref_swap,
        "logprob_loss_s": on * np.maximum(lp_bytes, 0.0) * logits / hbm,
        "update_loss_s": on * np.maximum(up_bytes, 0.0) * logits / hbm,
    }


# ---- the DTensor policy worker (FSDP2 + DTensor TP): what the pre-training step is told -----
# NeMo RL v0.3.0 `dtensor_policy_worker.py` trains the Hugging Face model itself
# (`AutoModelForCausalLM.from_config`, transformers >= 4.51 per pyproject.toml), in eager
# PyTorch 2.7.0 (pyproject.toml / uv.lock `torch==2.7.0`), wrapped by
# `nemo_rl/models/dtensor/parallelize.py _parallelize_model`: `parallelize_module` with a
# per-module TP plan, then `fully_shard` per decoder layer and the root. The kernels it runs
# are therefore not the megatron-core profile's the training frame otherwise resolves to:
#  - elementwise ops unfused: `LlamaRMSNorm` (cast, pow, mean, add, rsqrt, mul, cast, weight
#    mul), `apply_rotary_pos_emb` (rotate_half: slices, neg, cat), `LlamaMLP`
#    down_proj(act_fn(gate_proj(x)) * up_proj(x)): no fused norm, RoPE or SwiGLU kernel;
#  - attention: `attn_implementation="flash_attention_2"` when sequence packing is on (the
#    config the worker builds), otherwise transformers' default SDPA, whose causal path
#    (the worker passes an all-ones mask: "DTensor requires the causal attention kernel to
#    hit") runs PyTorch's flash backend, FlashAttention-2: fa2 either way;
#  - TP collectives exposed: DTensor's `redistribute(..., async_op=True)` in the
#    ColwiseParallel / RowwiseParallel hooks is waited on by the next op; there is no
#    comm/GEMM overlap without async TP (`_micro_pipeline_tp`, never set by NeMo RL v0.3.0);
#  - sequence parallel only where `dtensor_cfg.sequence_parallel` says so (default false:
#    examples/configs/grpo_math_1B.yaml at v0.3.0), and it needs TP > 1.
# The FSDP2 parts (bf16 all-gathers per layer and micro-batch, fp32 reduce-scatters from
# `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32, output_dtype=float32)`,
# `reshard_after_forward` per layer) are what the ZeRO-3 frame with grad_reduce_fp32 already
# prices. The same field values are torchtitan's profile (frameworks.yaml), also FSDP2 + DTensor.
DTENSOR_KERNELS = {"attention_kernel": "fa2", "fused_elementwise": False, "fused_glu": False,
                   "tp_comm_overlap": False}


def dtensor_rows(b, tf: pd.DataFrame) -> np.ndarray:
    """Rows trained by NeMo RL's DTensor worker: `rl_framework: nemo_rl` sharded with FSDP."""
    return (b.rl_framework == RL_FRAMEWORK.index("nemo_rl")) & fsdp(tf)


def dtensor_fields(b, tf: pd.DataFrame) -> None:
    """Fill the training frame's kernel fields on DTensor rows (in place), where the row does
    not set them: DTENSOR_KERNELS, and sequence_parallel False unless stated (and never with
    TP 1). Other rows keep NaN, which the frame's framework profile fills."""
    on = dtensor_rows(b, tf)
    if not on.any():
        return
    for field, value in DTENSOR_KERNELS.items():
        have = tf[field] if field in tf else pd.Series(np.nan, index=tf.index, dtype=object)
        tf[field] = have.astype(object).where(have.notna() | ~on, value).to_numpy()
    sp = tf["sequence_parallel"] if "sequence_parallel" in tf else \
        pd.Series(np.nan, index=tf.index, dtype=object)
    stated = sp.astype(object).where(sp.notna(), False)
    tp = train_col(tf, "tp")
    sp_on = np.array([bool(x) for x in stated], dtype=bool) & (tp > 1)
    tf["sequence_parallel"] = sp.astype(object).where(~on, sp_on).to_numpy()


# ---- dynamic batching: the micro-batches NeMo RL forms ---------------------------------------
# `distributed/batched_data_dict.py shard_by_batch_size(dynamic_batching_args=...)` at v0.3.0:
# each chunk (an optimizer step's `train_global_batch_size` sequences; the whole batch for
# log-probs) is sorted by length and dealt strided over the DP shards (`indices[i::shards]`), so
# shard index i holds the i-th group of `shards` consecutive sorted sequences on every rank.
# Micro-batches are then cut greedily along the shard index: a micro-batch of c indices costs
# c x (the longest length among all shards at those indices, rounded up to
# `sequence_length_round` 64), and a sequence joins the current micro-batch while that stays
# <= `max_tokens_per_microbatch` (train_mb_tokens; logprob_mb_tokens for log-probs). Every rank
# runs the same micro-batches ("required for FSDP2"), each padded to its longest sequence
# (`make_microbatch_iterator_with_dynamic_shapes`). Lengths are sorted, so a micro-batch's
# longest is its last. The lengths come from the response-length law (generation.length_law:
# a point mass at the cap plus a clipped exponential body) at the quantile of each index.
SEQUENCE_LENGTH_ROUND = 64.0
RUN_SAMPLES = 17


def _law(b):
    """(p, theta, cap) of the response-length mixture (generation.length_law)."""
    from .generation import length_law, truncated_fraction
    p = truncated_fraction(b)
    th, _, _ = length_law(b.response_mean, b.response_max, p)
    return p, th, b.response_max


def _quantile_length(b, u: np.ndarray, law=None) -> np.ndarray:
    """Prompt + response length at quantile u of the response-length mixture (`law`: _law's
    result, when the caller has it)."""
    p, th, mx = _law(b) if law is None else law
    body = np.clip(u / np.maximum(1.0 - p, 1e-9), 0.0, 1.0 - 1e-12)
    resp = np.minimum(-th * np.log1p(-body), mx)
    return b.prompt_len + resp


def dynamic_microbatches(b, chunk: np.ndarray, shards: np.ndarray, budget: np.ndarray,
                         width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(micro-batches, padded tokens) every rank runs for one chunk of `chunk` sequences dealt
    over `shards` DP ranks, with micro-batches of at most `budget` padded tokens; `width` is
    the longest a sequence can be (`max_total_sequence_length`: prompt + response, the
    batch's padded width, which bounds a rounded length). Vectorized over rows.

    The greedy walks the sorted shard indices; as lengths only grow, the count c of a
    micro-batch never grows either, and a run of micro-batches of the same c lasts while
    their longest stays <= budget / c: the loop runs over runs (at most budget / shortest
    length of them), the first c of each found by bisection and the run's end from the
    length law's CDF. The micro-batch count is the greedy's exactly; a run's padded tokens
    are c x its micro-batches x the mean longest of RUN_SAMPLES of them evenly spread (each
    lies in (budget / (c + 1), budget / c]; within 1% of the greedy's on 300 random layouts,
    tests/test_rl_nemo_dtensor.py)."""
    chunk = np.maximum(np.asarray(chunk, dtype=float), 1.0)
    shards = np.maximum(np.asarray(shards, dtype=float), 1.0)
    size = np.maximum(np.floor(chunk / shards), 1.0)  # shard_size = batch_size // shards
    width = np.asarray(width, dtype=float)
    budget = np.maximum(np.asarray(budget, dtype=float), 1.0)
    law = _law(b)
    p, th, mx = law
    r = SEQUENCE_LENGTH_ROUND

    def longest(idx):  # rounded longest length over all shards at shard index idx (0-based)
        u = ((idx + 1.0) * shards - 0.5) / (size * shards)
        raw = np.minimum(_quantile_length(b, np.clip(u, 0.0, 1.0), law), width)
        return np.minimum(np.ceil(raw / r) * r, width)

    def last_within(x):  # the last shard index whose rounded longest is <= x (-1: none)
        y = np.floor(x / r) * r - b.prompt_len  # round up <= x  <=>  raw <= floor(x / r) r
        u = (1.0 - p) * -np.expm1(-np.maximum(y, 0.0) / np.maximum(th, 1e-9))
        j = np.floor((u * size * shards + 0.5) / shards - 1.0 + 1e-9)
        j = np.where(y < 0, -1.0, j)
        return np.where((x >= width) | (y >= mx), size - 1.0, np.minimum(j, size - 1.0))

    start = np.zeros_like(size)
    count = np.zeros_like(size)
    padded = np.zeros_like(size)
    steps = int(np.ceil(np.log2(max(float(size.max()), 2.0)))) + 1
    active = start < size
    while active.any():
        lo = np.ones_like(size)
        hi = np.maximum(size - start, 1.0)
        for _ in range(steps):  # the largest c with c x longest(start + c - 1) <= budget
            mid = np.floor((lo + hi + 1.0) / 2.0)
            ok = mid * longest(start + mid - 1.0) <= budget
            lo = np.where(ok & (mid <= hi), mid, lo)
            hi = np.where(ok, hi, np.maximum(mid - 1.0, lo))
        c = lo
        # micro-batches of c in a row: their last index stays within budget / c and the shard
        end = np.minimum(last_within(budget / c), size - 1.0)
        k = np.maximum(np.floor((end - start + 1.0) / c + 1e-9), 1.0)
        # (the CDF and the direct lengths agree but for rounding: one step back if needed)
        over = (k > 1) & (c * longest(start + k * c - 1.0) > budget)
        k = np.where(over, k - 1.0, k)
        k = np.where(active, k, 0.0)
        # the run's micro-batches' longest, averaged over RUN_SAMPLES of them evenly spread
        m = np.round(np.linspace(0.0, 1.0, RUN_SAMPLES)[:, None] * np.maximum(k - 1.0, 0.0))
        mean_longest = longest(start + m * c + c - 1.0).mean(axis=0)
        padded = padded + np.where(active, c * k * mean_longest, 0.0)
        count = count + k
        start = start + k * c
        active = start < size
    return count, padded


def dynamic_logprob_ratios(b, tf: pd.DataFrame, pack_budget: np.ndarray) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """Per optimizer step of the training frame: (the log-prob pass's padded tokens over the
    frame's, its micro-batches (FSDP gathers) over the frame's), one pass being
    `mini_batches` of these. Dynamic-batching NeMo RL rows: `lm_policy.py get_logprobs`
    shards the whole batch (`batch_size=None`) with `logprob_mb_tokens` = max_total_sequence_
    length x logprob_batch_size (grpo_math_1B.yaml at v0.3.0) and `dynamic_microbatches`
    counts them. Other rows: the same tokens, 1 / logprob_batch_size as many micro-batches
    (training.py's rule)."""
    lbs = np.maximum(b.logprob_batch_size, 1.0)
    tok = np.ones(len(tf))
    gathers = 1.0 / lbs
    dyn = (b.dynamic_batching > 0) & (b.rl_framework == RL_FRAMEWORK.index("nemo_rl"))
    if not dyn.any():
        return tok, gathers
    dp = train_dp(tf, b)
    width = np.minimum(b.prompt_len + b.response_max, pack_budget)
    n_lp, pad_lp = dynamic_microbatches(b, b.sequences, dp, width * lbs, width)
    gb, mb = tf["global_batch"].to_numpy(float), tf["micro_batch"].to_numpy(float)
    n_tr = gb / (dp * mb) * b.mini_batches
    pad_tr = gb * tf["seq_len"].to_numpy(float) / dp * b.mini_batches
    return (np.where(dyn, pad_lp / np.maximum(pad_tr, 1.0), tok),
            np.where(dyn, n_lp / np.maximum(n_tr, 1.0), gathers))
