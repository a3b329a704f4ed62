"""NeMo RL's loss and log-prob collection, one sequence at a time: the host loop and the
sliced-logits gradient it leaves on the GPU.

Why a module of its own: the pre-training step prices the loss as one fused pass over a
micro-batch's logits (and nemo_rl.extras adds NeMo RL's fp32 log-softmax bytes over the same
logits). NeMo RL v0.3.0 (NVIDIA-NeMo/RL tag v0.3.0) runs it differently when sequences are
packed: `nemo_rl/algorithms/loss_functions.py SequencePackingLossWrapper.__call__` loops over
the packed sequences in Python and calls the loss once per sequence on a slice of the packed
logits (Megatron: `models/megatron/common.py forward_step_arbitrary_loss`; DTensor:
`models/policy/dtensor_policy_worker.py train`). Two costs follow, both read from that code:

1. **The host loop.** Each call synchronises the host with the GPU many times, so the GPU
   drains its queue and then idles while Python issues the next small kernels (each sync
   ends a segment; a segment lasts max(host issue time, GPU time) plus the sync):
   - the wrapper, per sequence: `seq_starts[seq_idx].item()` and `seq_ends[...]` (2 syncs);
     each of the six 2-D data tensors (input_ids, advantages, generation_logprobs,
     token_mask, prev_logprobs, reference_policy_logprobs) sliced at
     `unpadded_seq_lengths[seq_idx]`, a CUDA tensor bound that Python's slice turns into an
     int (6); the logits slice's end `seq_start + padded_seq_lengths[seq_idx]` (an add and a
     floor-divide, then 1 sync); `loss_accum += loss` (1 kernel): WRAPPER_SYNCS 9,
     WRAPPER_KERNELS 3.
   - `ClippedPGLossFn.__call__`, per call: nine syncs (`mult_prob_error` `.item()`,
     `probs_ratio`, `probs_ratio_clamped`, and the metrics dict's `loss.item()`, `if kl`
     (a tensor's truth value), `kl.item()`, `sampling_importance_ratio.item()`,
     `sample_mask.sum().item()`, `approx_entropy.item()`): LOSS_SYNCS 9. Its kernels, with
     `masked_mean` (`nemo_rl/algorithms/utils.py`: mul, sum, add, div = 4) and the GRPO
     config (`reference_policy_kl_penalty` 0.01, on-policy KL approximation and importance
     sampling off, `ratio_clip_c` null: grpo_math_1B_megatron.yaml):
     segment A before the first sync: mask 1, |gen - prev| 2, exp(. x mask) 2, masked_mean 4
     = 9; segment C after `probs_ratio`: `probs_ratio_clamped`'s masked_mean 4,
     `sample_mask.sum()` 1 = 5 (LOSS_SMALL_KERNELS 14, over per-token tensors: host-bound).
     Segment B between them holds the log-probs over the vocabulary:
     `from_parallel_logits_to_logprobs` (`distributed/model_utils.py`): `roll` 1,
     `DistributedLogprob.forward` 18 (target mask 3, shift 1, masked fill 1, amax + all-reduce
     + subtract + exp + sum + all-reduce + log + subtract 8, clone, exp_, gather, masked fill,
     all-reduce 5); then the KL term 11 (ones_like, `calculate_kl_penalty_joschu2020`
     sub/exp/sub/sub 4, two muls, masked_mean 4), ratios 3 (sub, exp, clamp), the clipped
     objective 5 (two neg-muls, max), importance weights 9 (sub, exp, nan_to_num, ones_like,
     mul, masked_mean 4), `sampling_importance_ratio` 4, the entropy estimate 8, the sum 1,
     `probs_ratio`'s masked_mean 4: SEGMENT_B_KERNELS 64 (Megatron's logits are fp32 already:
     Megatron-Core `Float16Module.forward` casts the last stage's output, so `.to(float32)` is
     a no-op). Padding to a multiple (TP > 1 or CP) adds a `pad` 1; CP adds
     `_get_tokens_on_this_cp_rank`'s cat 1 and `allgather_cp_sharded_tensor` (all-gather,
     a copy per rank, cat: 2 + cp). DTensor casts its bf16 slice (+1); at TP 1 its logits are
     a plain tensor and the loss takes `log_softmax` + `gather` (2) instead of the 19 of
     `from_parallel_logits_to_logprobs`. Segment B's vocabulary passes run on the GPU
     (nemo_rl.TRAIN_FWD_BYTES per logit element, at the elementwise HBM rate): its host time
     counts only beyond them.
   - Megatron's packing, per sequence of every micro-batch (update and log-probs):
     `_pack_sequences_for_megatron` reads `seq_lengths[b].item()` (the lengths are on the GPU
     after `data_dict.to("cuda")`): 1 sync, and a second loop with another `.item()` and a
     `pad` when sequences are padded to a multiple (TP > 1 or CP), plus CP's cat.
   - Megatron's packed log-probs (`from_parallel_logits_to_logprobs_packed_sequences`): per
     sequence a loop with two `.item()`, a roll and a copy; with CP a second with two more,
     the all-gather (2 + cp) and a copy; the unpacking loop with two more and a copy.
     DTensor's packed `get_logprobs`: `cu_seqlens[i].item()` x2, `input_lengths[i].item()`
     and a copy.
   A sync is `catalogs/moe.yaml host_sync_us` (the GPU drained, the copy launched and
   returned: 20 us), a kernel `catalogs/rl.yaml eager_host_s_per_kernel` (9.7 us). The
   backward of the per-sequence graph is issued by the C++ autograd engine without syncs,
   behind the vocabulary-sized kernels: not charged.
2. **The sliced logits' gradient (GPU).** Each sequence's loss reads a slice of the packed
   logits; autograd's `SliceBackward` builds a zero tensor of the whole packed logits and
   copies the slice's gradient into it, and the autograd engine sums the N sequences'
   full-size gradients into one (PyTorch `slice_backward`: `at::zeros(input_sizes)` then
   `copy_`; the input buffer adds each further gradient). Per bin of N sequences over F bytes
   of logits: N zero fills (N F), the slice copies (2 F in all), N - 1 additions (3 F each):
   (4 N - 1) F bytes, with F = the bin's tokens / cp x vocab / tp x 4 bytes on Megatron (the
   fp32 output), 2 on DTensor (its bf16 logits under autocast). N = the bin's budget over
   the mean padded sequence.

Rows not packed (or dynamically batched) call the loss once per micro-batch (no wrapper, no
slicing): its syncs and host-bound kernels count per micro-batch. Zero for rows that are not
`rl_framework: nemo_rl`. Counts are read from code, not profiled: each good to about a fifth.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import compute
from . import host
from .inputs import RL_FRAMEWORK, constants, fsdp, train_col
from .nemo_rl import TRAIN_FWD_BYTES

WRAPPER_SYNCS = 9
WRAPPER_KERNELS = 3
LOSS_SYNCS = 9
LOSS_SMALL_KERNELS = 14
SEGMENT_B_KERNELS = 64
# Megatron's from_parallel_logits_to_logprobs (roll + DistributedLogprob.forward), replaced on
# DTensor TP 1 by log_softmax + gather
MEGATRON_LOGPROB_KERNELS = 19
PLAIN_LOGPROB_KERNELS = 2
# bytes per element of the packed logits whose gradient SliceBackward materialises
LOGIT_BYTES_MEGATRON = 4.0
LOGIT_BYTES_DTENSOR = 2.0


def per_call_counts(tp, cp, dtensor) -> dict:
    """Host-bound kernels, syncs and segment-B kernels of one `ClippedPGLossFn` call (the
    wrapper's per-sequence work not included)."""
    tp, cp = np.asarray(tp, float), np.asarray(cp, float)
    dtensor = np.asarray(dtensor, bool)
    padded = (tp > 1) | (cp > 1)
    cp_k = np.where(cp > 1, 1.0 + 2.0 + cp, 0.0)
    lp = np.where(dtensor & (tp <= 1), PLAIN_LOGPROB_KERNELS, MEGATRON_LOGPROB_KERNELS)
    seg_b = (SEGMENT_B_KERNELS - MEGATRON_LOGPROB_KERNELS + lp + padded + cp_k
             + dtensor.astype(float))
    return {"small": np.full(tp.shape, float(LOSS_SMALL_KERNELS)),
            "syncs": np.full(tp.shape, float(LOSS_SYNCS)), "segment_b": seg_b}


def per_sequence_counts(tp, cp, dtensor) -> dict:
    """(syncs, kernels) per packed sequence outside the loss: `update` (the wrapper, and
    Megatron's packing) and `log_prob` (Megatron's packing and packed log-prob loops, or
    DTensor's unpacking loop)."""
    tp, cp = np.asarray(tp, float), np.asarray(cp, float)
    dtensor = np.asarray(dtensor, bool)
    padded = (tp > 1) | (cp > 1)
    cpk = (cp > 1).astype(float)
    pack_s = 1.0 + padded                        # _pack_sequences_for_megatron's .item()s
    pack_k = padded + cpk                        # its pad, and CP's cat
    up_s = WRAPPER_SYNCS + np.where(dtensor, 0.0, pack_s)
    up_k = WRAPPER_KERNELS + np.where(dtensor, 0.0, pack_k)
    # from_parallel_logits_to_logprobs_packed_sequences: 2 loops (+1 with CP) of 2 .item()
    lp_s = np.where(dtensor, 3.0, pack_s + 4.0 + 2.0 * cpk)
    lp_k = np.where(dtensor, 1.0, pack_k + 2.0 + cpk + 1.0 + cpk * (3.0 + cp))
    return {"update_syncs": up_s, "update_kernels": up_k,
            "log_prob_syncs": lp_s, "log_prob_kernels": lp_k}


def seconds(b, tf: pd.DataFrame, sim: pd.DataFrame, pack_budget: np.ndarray) -> dict:
    """Seconds NeMo RL adds per DP rank: `update_s` (one update epoch: every sequence of the
    batch once), `log_prob_s` (one log-prob pass), and their parts `update_host_s`,
    `slice_grad_s`. Zero for other frameworks."""
    on = b.rl_framework == RL_FRAMEWORK.index("nemo_rl")
    s_k = float(constants()["eager_host_s_per_kernel"])
    s_y = host.sync_seconds()
    tp, cp = train_col(tf, "tp"), train_col(tf, "cp")
    dt = fsdp(tf)
    dp = np.maximum(sim["dp"].to_numpy(float), 1.0)
    packed = (b.sequence_packing > 0) & (b.dynamic_batching <= 0)
    seqs = b.sequences / dp                      # per rank, per epoch or log-prob pass
    calls = np.where(packed, seqs, sim["num_microbatches"].to_numpy(float) * b.mini_batches)
    call = per_call_counts(tp, cp, dt)
    seq = per_sequence_counts(tp, cp, dt)
    # segment B: host issue time beyond the GPU's vocabulary passes over the call's logits
    mean_len = b.prompt_len + b.response_mean
    call_tokens = np.where(packed, mean_len,
                           tf["seq_len"].to_numpy(float) * tf["micro_batch"].to_numpy(float))
    hbm = b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
    gpu_b = TRAIN_FWD_BYTES * call_tokens / cp * b.vocab / tp / hbm
    seg_b = np.maximum(call["segment_b"] * s_k - gpu_b, 0.0)
    per_call = call["syncs"] * s_y + call["small"] * s_k + seg_b
    per_seq = np.where(packed, seq["update_syncs"] * s_y + seq["update_kernels"] * s_k, 0.0)
    update_host = calls * per_call + seqs * per_seq
    # 2. SliceBackward's full-size gradients, per bin of n sequences: (4 n - 1) F bytes
    multiple = np.where(cp > 1, 2.0 * cp * tp, tp)
    padded_len = mean_len + (multiple - 1.0) / 2.0
    cap = np.maximum(pack_budget, padded_len)
    n = np.maximum(cap / padded_len, 1.0)
    full = cap / cp * b.vocab / tp * np.where(dt, LOGIT_BYTES_DTENSOR, LOGIT_BYTES_MEGATRON)
    slice_grad = np.where(packed, seqs / n * (4.0 * n - 1.0) * full / hbm, 0.0)
    lp = np.where(packed, seqs * (seq["log_prob_syncs"] * s_y + seq["log_prob_kernels"] * s_k),
                  0.0)
    zero = np.zeros(len(tf))
    return {"update_s": np.where(on, update_host + slice_grad, zero),
            "update_host_s": np.where(on, update_host, zero),
            "slice_grad_s": np.where(on, slice_grad, zero),
            "log_prob_s": np.where(on, lp, zero)}
