"""What verl's FSDP workers run in the training phases, priced from verl's code.

`training.py` prices every log-prob pass and update as the pre-training step over sequences
of the mean length packed up to `train_seq_len` tokens: what NeMo RL's packing and verl's
`use_dynamic_bsz` with `use_remove_padding` run. verl's FSDP workers (`verl/workers/
fsdp_workers.py`, `actor/dp_actor.py`, `critic/dp_critic.py`, volcengine/verl tags v0.4.0 and
v0.5.0, the versions of the 2025 logs; unchanged in these respects at v0.7.0) run other
micro-batches when a script says so, and move weights between host and GPU in every phase.
On for `rl_framework: verl` rows trained with FSDP (`zero >= 3`); each rule below is read
from that code, nothing is fitted on the validation rows.

1. **Micro-batches as the worker forms them.** `use_dynamic_bsz` (the `sequence_packing`
   column) splits each GPU's sequences with `seqlen_balancing.rearrange_micro_batches`:
   `ceil(effective tokens / max_token_len)` micro-batches (effective = the attention mask's
   sum, whatever the padding). Without it, `batch.split(micro_batch_size_per_gpu)`:
   `micro_batch_seqs` sequences per micro-batch (`ppo_micro_batch_size_per_gpu`; the log-prob
   passes `log_prob_micro_batch_size_per_gpu`, `logprob_micro_batch_seqs`). The budgets are
   the update's `ppo_max_token_len_per_gpu` (`train_seq_len`) and the log-prob passes' own
   `log_prob_max_token_len_per_gpu` (`logprob_seq_len`, defaulting to the update's), each
   times the Ulysses size (v0.7.0 dp_actor.py L367 and L441).
2. **Padding.** With `use_remove_padding` the model runs the unpadded tokens (`unpad_input`,
   varlen attention); without it, the `[batch, prompt_max + response_max]` tensor: prompts are
   left-padded to `max_prompt_length` (`RLHFDataset` -> `tokenize_and_postprocess_data`) and
   responses to `response_length` (vLLM rollout `pad_2d_list_to_length`), so every layer's
   GEMMs and the LM head run over `prompt_max + response_max` tokens per sequence.
3. **The critic is its own model** (`dp_critic.py`): its own `use_remove_padding` (default
   **False**: `critic.model.use_remove_padding`, ppo_trainer.yaml v0.4.0, critic/dp_critic.yaml
   v0.7.0), its own token budget (`critic.ppo_max_token_len_per_gpu` 32768, also
   `forward_max_token_len_per_gpu`) and micro-batch (`critic_micro_batch_seqs`); the values
   pass (`compute_values`) and `update_critic` are priced on that frame, not the actor's.
4. **The reference model streams its weights from the host in every forward.**
   `fsdp_workers.py _build_model_optimizer`: "We force reference policy to use CPUOffload"
   (`CPUOffload(offload_params=True)` for FSDP1, `CPUOffloadPolicy(pin_memory=True)` for FSDP2),
   with bf16 weights (`torch_dtype = bfloat16` for a non-actor role). FSDP copies each unit's
   shard to the GPU before its all-gather in every forward (`FlatParamHandle.pre_unshard` ->
   `flat_param_to(device)`; the shard is pinned: `init_flat_param_attributes` pins
   `_local_shard`, torch/distributed/fsdp/_flat_param.py): per reference micro-batch, the
   per-GPU bf16 shard over PCIe.
5. **`param_offload` / `optimizer_offload` move states in every phase.** `compute_log_prob`,
   `compute_values` load the model (`load_fsdp_model_to_gpu`) and offload it after;
   `update_actor` / `update_critic` load and offload the model and the optimizer states
   (`load_fsdp_optimizer` / `offload_fsdp_optimizer`); the rollout's sharding manager loads and
   offloads the actor's weights around generation (`phases.py` prices that one). The copies
   are `.to(device, non_blocking=True)`: a non-blocking device-to-host copy lands in pinned
   memory, so both ways run at PCIe rate. The states are fp32 (`torch_dtype = float32` for the
   actor and the critic: 4 B/param of weights, 8 B/param of Adam moments) sharded over the
   FSDP ranks. The optimizer is never moved around generation, so `phases.py`'s pageable
   optimizer round trip (NeMo RL's) is not charged to these rows.
6. **The kernels** of the Hugging Face model in eager PyTorch (`KERNELS`): unfused RMSNorm,
   RoPE and SwiGLU, flash-attn 2, flash-attn's Triton cross-entropy for the log-probs.
7. **The host floor** (`host.py`): eager PyTorch issues every one of those kernels from the
   host, and the loops synchronise every micro-batch, so each micro-batch lasts at least the
   host time of the kernels it issues: a pass is max(its GPU time, micro-batches x host time
   per micro-batch), an optimizer step max(GPU step, its micro-batches' and the optimizer's
   host time).
8. **An MoE model's expert path** (`hf_moe.py`): transformers 4.x's `SparseMoeBlock` loops over
   the experts in Python with a host sync per expert; zero for dense models. (The critic's
   passes are not given it.)

Each pass is the pre-training simulator's step on a frame of verl's micro-batches: forward
passes (`compute_log_prob`, `compute_values`) split the GPU's whole batch, an update each
mini-batch (`update_policy`: `batch.split(ppo_mini_batch_size)`, one optimizer step each).
The actor's packed passes (dynamic batching with remove-padding) keep `training.py`'s packed
sequences at the length-biased length (varlen attention costs sum L^2).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import compute
from ..simulate import simulate_frame
from . import fsdp_experts, hf_moe, host, nemo_rl
from .inputs import RL_FRAMEWORK, forward_seconds, fsdp, train_col

# bytes per parameter of the fp32 FSDP shards verl keeps (fsdp_workers.py: actor and critic
# loaded in fp32, MixedPrecision computes in bf16) and of the Adam moments (exp_avg,
# exp_avg_sq, fp32)
WEIGHT_BYTES = 4.0
ADAM_BYTES = 8.0
# the reference model's weights (bf16, fsdp_workers.py: non-actor roles load in bfloat16)
REF_WEIGHT_BYTES = 2.0


def fsdp_rows(b, tf: pd.DataFrame, framework: str) -> np.ndarray:
    """Rows of `rl_framework: framework` trained with FSDP / FSDP2 (ZeRO-3)."""
    return (b.rl_framework == RL_FRAMEWORK.index(framework)) & fsdp(tf)


def active(b, tf: pd.DataFrame) -> np.ndarray:
    """Rows priced by verl's FSDP workers: `rl_framework: verl` trained with FSDP / FSDP2."""
    return fsdp_rows(b, tf, "verl")


def micro_batching(seqs_per_gpu, real_len, dynamic, budget, mb_seqs):
    """(sequences per micro-batch, micro-batches) one GPU runs for `seqs_per_gpu` sequences.

    dynamic (`use_dynamic_bsz`): ceil(effective tokens / budget) micro-batches, at most one
    per sequence (`rearrange_micro_batches` counts the attention mask's tokens, so padding
    does not split them further); else `mb_seqs` per micro-batch (`batch.split`). A count of
    micro-batches is whole: a GPU holding a fractional mean of sequences (a mini-batch that
    does not divide by the ranks, 2048 over 384) runs at most ceil(sequences) of them, never
    that fraction (which left the frame's global batch off a multiple of the ranks)."""
    s = np.maximum(seqs_per_gpu, 1.0)
    n_dyn = np.minimum(np.ceil(s * real_len / np.maximum(budget, 1.0)), np.ceil(s))
    n_fix = np.ceil(s / np.maximum(mb_seqs, 1.0))
    n = np.where(dynamic, n_dyn, n_fix)
    return s / n, n


# 6. the kernels: verl's FSDP workers run the Hugging Face model in eager PyTorch
# (fsdp_workers.py `AutoConfig.from_pretrained(..., attn_implementation="flash_attention_2")`;
# `use_liger` and `use_fused_kernels` default False, set in none of the rows' scripts):
# RMSNorm, RoPE and SiLU x mul as separate PyTorch ops, flash-attn 2; the token log-probs from
# flash-attn's Triton cross-entropy (`logprobs_from_logits`, verl/utils/torch_functional.py:
# one read of the bf16 logits forward, the gradient written in place, `inplace_backward`)
# after an in-place division by the temperature (`logits_rmpad.div_(temperature)`): the
# step simulator's `te` count (6 B forward, 4 B backward per logit) is the nearest
KERNELS = {"fused_elementwise": False, "fused_glu": False, "attention_kernel": "fa2",
           "loss_impl": "te",
           # MixedPrecision(reduce_dtype=torch.float32) unless the config says otherwise
           "grad_reduce_fp32": True}


def _checkpointing(tf: pd.DataFrame) -> np.ndarray:
    """Gradient checkpointing of every decoder layer (`enable_gradient_checkpointing`: the
    frame's `recompute` is "full"); a blank reads as verl's examples run it (full)."""
    if "recompute" not in tf:
        return np.ones(len(tf), dtype=bool)
    col = tf["recompute"].astype(str).str.lower()
    return (col == "full").to_numpy() | tf["recompute"].isna().to_numpy()


def _frame(tf: pd.DataFrame, dp, run_len, mb, n_mb) -> pd.DataFrame:
    """The training frame with verl's micro-batches (`n_mb` micro-batches per GPU of `mb`
    sequences of `run_len` tokens: whole sequences, the step simulator takes integers) and
    verl's kernels."""
    out = tf.copy()
    mbi = np.maximum(np.round(mb), 1.0)
    out["seq_len"] = np.round(run_len)
    out["micro_batch"] = mbi
    out["global_batch"] = n_mb * dp * mbi
    for k, v in KERNELS.items():
        out[k] = v
    return out


def forward(sim: pd.DataFrame, zero_gather_share: np.ndarray) -> np.ndarray:
    """A forward-only pass over the frame (inputs.forward_seconds) plus the FSDP all-gather
    every micro-batch's forward issues."""
    return forward_seconds(sim) + sim["time_dp"].to_numpy() * zero_gather_share


def _lm_head_step(b, fr: pd.DataFrame, idx: np.ndarray, sim: pd.DataFrame) -> np.ndarray:
    """Seconds of one optimizer step the LM head and the vocabulary loss take in `sim` (the
    frame `fr`, rows `idx`): the head's GEMMs (forward + two backward: 6 h V FLOPs per token)
    at the arch's GEMM ceiling and the loss's bytes per logit (`workload.LOSS_TRAFFIC_*` of
    the resolved loss) at the elementwise HBM efficiency, over one GPU's tokens of the step."""
    sub = fr.iloc[idx].reset_index(drop=True)
    tp = train_col(sub, "tp")
    tokens = (sim["num_microbatches"].to_numpy(float) * sub["micro_batch"].to_numpy(float)
              * sub["seq_len"].to_numpy(float))
    arch = b.sm_arch[idx]
    gemm = b.peak_bf16[idx] * 1e12 * compute._by_arch(arch, "gemm_max", "bf16")
    hbm = b.hbm_bw_gbs[idx] * 1e9 * compute._by_arch(arch, "elementwise")
    fwd, bwd = nemo_rl._sim_loss_bytes(sub)
    logits = tokens * b.vocab[idx] / tp
    return 6.0 * b.hidden[idx] * logits / gemm + (fwd + bwd) * logits / hbm


def phases(df: pd.DataFrame, b, tf: pd.DataFrame, dp: np.ndarray, pcie_bytes_per_s,
           pack_budget: np.ndarray, gather_share: np.ndarray, profile=None,
           logprob_budget=None) -> dict:
    """Per row, verl's phase seconds where `active` (NaN elsewhere): `old_log_prob_s`,
    `ref_s` (with `ref_stream_s`, its host-to-GPU weight streaming), `values_s` (PPO critic),
    `update_actor_s`, `update_critic_s`, `host_moves_s` (rule 5, inside those), and `on`.
    `logprob_budget`: tokens per log-prob micro-batch (rule 1; None = the update's)."""
    n = len(df)
    on = active(b, tf)
    nan = np.full(n, np.nan)
    out = {k: nan.copy() for k in ("old_log_prob_s", "ref_s", "ref_stream_s", "values_s",
                                   "update_actor_s", "update_critic_s", "host_moves_s",
                                   "update_micro_batches", "critic_micro_batches")}
    out["on"] = on
    if not on.any():
        return out
    real = b.prompt_len + b.response_mean
    padded_len = b.prompt_max + b.response_max
    dyn = b.sequence_packing > 0
    mb_train = np.maximum(b.micro_batch_seqs, 1.0)
    mb_lp = np.where(b.logprob_micro_batch_seqs > 0, b.logprob_micro_batch_seqs, mb_train)
    mb_critic = np.where(b.critic_micro_batch_seqs > 0, b.critic_micro_batch_seqs, mb_train)
    actor_len = np.where(b.remove_padding > 0, real, padded_len)
    critic_len = np.where(b.critic_remove_padding > 0, real, padded_len)
    all_seqs = b.sequences / dp            # per GPU: compute_log_prob / compute_values
    mini_seqs = all_seqs / b.mini_batches  # per GPU: one optimizer step
    ppo = b.algorithm == 2
    # the actor's packed passes (use_dynamic_bsz with use_remove_padding) run training.py's
    # packed sequences: varlen attention priced at the length-biased length, as many fewer
    # sequences as keep the tokens
    packed = dyn & (b.remove_padding > 0)
    biased = tf["seq_len"].to_numpy(float)
    a_len = np.where(packed, biased, actor_len)
    a_real = np.where(packed, biased, real)
    a_scale = np.where(packed, real / np.maximum(biased, 1.0), 1.0)
    frames = {
        "lp": (all_seqs * a_scale, a_real, a_len,
               pack_budget if logprob_budget is None else logprob_budget, mb_lp),
        "upd": (mini_seqs * a_scale, a_real, a_len, pack_budget, mb_train),
        "cval": (all_seqs, real, critic_len, b.critic_seq_len, mb_critic),
        "cupd": (mini_seqs, real, critic_len, b.critic_seq_len, mb_critic),
    }
    sims, fr_of, scale, mbs_of = {}, {}, {}, {}
    idx = np.flatnonzero(on)
    for key, (seqs, eff_len, run_len, budget, mbs) in frames.items():
        mb, n_mb = micro_batching(seqs, eff_len, dyn, budget, mbs)
        mbs_of[key] = n_mb[idx]
        fr = fr_of[key] = _frame(tf, dp, run_len, mb, n_mb)
        sims[key] = simulate_frame(fr.iloc[idx].reset_index(drop=True), profile)
        # whole sequences per micro-batch: the frame's time scaled back to the sequences
        # the GPU holds (a short last micro-batch, a fractional mean)
        scale[key] = (seqs / (n_mb * fr["micro_batch"].to_numpy(float)))[idx]

    def put(arr):
        full = nan.copy()
        full[idx] = arr
        return full

    g = gather_share[idx]
    # 3. the critic's head is hidden -> 1 (`AutoModelForTokenClassification`, num_labels 1,
    # fsdp_workers.py CriticWorker) and its loss a clipped value MSE per token: the LM head
    # GEMM and the vocabulary loss the step simulator prices for the model are taken out
    head_step = (_lm_head_step(b, fr_of["cupd"], idx, sims["cupd"]),
                 _lm_head_step(b, fr_of["cval"], idx, sims["cval"]))
    # forward passes over the whole batch; an update is mini_batches x ppo_epochs steps
    minis = b.mini_batches[idx]
    lp = forward(sims["lp"], g) * scale["lp"]
    upd_step = sims["upd"]["step_time_s"].to_numpy() * scale["upd"]
    cval = np.maximum(forward(sims["cval"], g) - head_step[1] / 3.0, 0.0) * scale["cval"]
    cupd_step = np.maximum(sims["cupd"]["step_time_s"].to_numpy() - head_step[0], 0.0) \
        * scale["cupd"]
    # 8. an MoE model's transformers expert path (hf_moe.py: transformers 4.x's per-expert
    # loop, one host sync per expert): zero for dense models
    sub = hf_moe.rows_at(b, idx)
    tf_i = tf.iloc[idx].reset_index(drop=True)
    ckpt = _checkpointing(tf)[idx]
    mb_tok = {k: (frames[k][2] * np.maximum(np.round(micro_batching(
        frames[k][0], frames[k][1], dyn, frames[k][3], frames[k][4])[0]), 1.0))[idx]
        for k in ("lp", "upd")}
    lp = lp + hf_moe.pass_seconds(sub, tf_i, sims["lp"], mb_tok["lp"], mbs_of["lp"], ckpt, True)
    upd_step = upd_step + hf_moe.pass_seconds(sub, tf_i, sims["upd"], mb_tok["upd"],
                                              mbs_of["upd"], ckpt, False)
    # ... and FSDP's gathers of the experts in every micro-batch (fsdp_experts.py)
    lp = lp + fsdp_experts.pass_seconds(sub, tf_i, sims["lp"], mbs_of["lp"], True)
    upd_step = upd_step + fsdp_experts.pass_seconds(sub, tf_i, sims["upd"], mbs_of["upd"], False)
    # 7. the host floor: every micro-batch lasts at least the host time of its kernels
    layers = b.layers[idx]
    lp = np.maximum(lp, host.forward_floor(layers, mbs_of["lp"]))
    upd_step = np.maximum(upd_step, host.update_floor(layers, mbs_of["upd"], ckpt))
    cval = np.maximum(cval, host.forward_floor(layers, mbs_of["cval"]))
    cupd_step = np.maximum(cupd_step, host.update_floor(layers, mbs_of["cupd"], ckpt))

    pcie = np.broadcast_to(pcie_bytes_per_s, (n,))[idx]
    params = b.params[idx]
    dpi = dp[idx]
    # 4. the reference model's bf16 shard copied to the GPU in every reference micro-batch
    lp_mbs = sims["lp"]["num_microbatches"].to_numpy(float)
    ref_stream = lp_mbs * params * REF_WEIGHT_BYTES / dpi / pcie
    # 5. param_offload / optimizer_offload: load + offload per phase (fp32 shards, pinned)
    w = params * WEIGHT_BYTES / dpi / pcie            # one copy of the weights shard
    opt = params * ADAM_BYTES / dpi / pcie            # one copy of the Adam moments
    p_off = b.offload_params[idx]
    o_off = b.offload_optimizer[idx]
    moves_lp = 2 * w * p_off
    moves_upd = 2 * w * p_off + 2 * opt * o_off
    epochs = b.ppo_epochs[idx]
    ppo_i = ppo[idx]

    out["old_log_prob_s"] = put(lp + moves_lp)
    out["ref_stream_s"] = put(ref_stream)
    out["ref_s"] = put((lp + ref_stream) * b.use_ref[idx])
    out["values_s"] = put(np.where(ppo_i, cval + moves_lp, 0.0))
    out["update_actor_s"] = put(upd_step * minis * epochs + moves_upd)
    out["update_critic_s"] = put(np.where(ppo_i, cupd_step * minis * epochs + moves_upd, 0.0))
    out["host_moves_s"] = put(moves_lp + moves_upd + np.where(ppo_i, moves_lp + moves_upd, 0.0))
    # update micro-batches per optimizer step on one GPU (verl_calls.py: the syncs per
    # micro-batch)
    out["update_micro_batches"] = put(mbs_of["upd"])
    out["critic_micro_batches"] = put(mbs_of["cupd"])
    return out
