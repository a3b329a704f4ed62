"""Log-probability passes and the policy update, in the training layout, through the
pre-training simulator (`sim_core.simulate`), not a copy of it.

The generated sequences (prompt + response) are packed into micro-batches of up to
`train_seq_len` tokens (verl's `use_dynamic_bsz` / `ppo_max_token_len_per_gpu`, NeMo RL's
sequence packing); see `training_frame` for how time and memory are priced. A mini-batch
(sequences / mini_batches, rounded up to whole micro-batches of the data-parallel ranks) is
one optimizer step of the pre-training simulator; the update is `mini_batches x ppo_epochs`
of them (verl v0.7.0 `verl/workers/actor/*_actor.py update_policy`: a loop over epochs and
mini-batches, one optimizer step each).

A log-probability pass (old policy; reference policy when a KL term uses it; PPO's critic
values) is a forward pass over the same tokens in the same layout: one third of the training
compute (forward of forward + backward), half the exposed TP/CP/EP communication and pipeline
transfers (forward only), the bubble in proportion, no gradient sync, no optimizer. verl
v0.7.0 `verl/trainer/ppo/ray_trainer.py` orders the phases gen -> reward -> old_log_prob ->
ref -> values -> adv -> update_critic -> update_actor, each timed by `marked_timer`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..simulate import simulate_frame
from . import (dtensor_host, ep_lockstep, fsdp_experts, generation, hf_moe, host, loss_memory,
               mla_rope, moe_glu, moe_host, moe_skew, nemo_rl, nemo_rl_host, skyrl,
               skyrl_megatron, slime_train, verl, verl_calls, verl_megatron)
from .inputs import RL_FRAMEWORK, constants, forward_seconds, fsdp, train_col, train_dp


def pcie_bytes_per_s(b) -> np.ndarray:
    """Host <-> device bandwidth per GPU and direction (catalogs/rl.yaml `pcie_gbs` by SM
    architecture)."""
    table = constants()["pcie_gbs"]
    archs = np.array(sorted(table), dtype=float)
    vals = np.array([table[a] for a in sorted(table)], dtype=float)
    idx = np.clip(np.searchsorted(archs, b.sm_arch, side="right") - 1, 0, len(archs) - 1)
    return vals[idx] * 1e9

# the training layout's columns an RL row carries, with the simulator's names
TRAIN_FIELDS = ("tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch", "recompute", "zero",
                "sequence_parallel", "framework", "precision",
                # the main-grad buffer's dtype (Megatron DDP `grad_reduce_in_fp32`: NeMo RL
                # v0.3.0 grpo_math_1B_megatron.yaml sets it false -> bf16 grads)
                "grad_reduce_fp32",
                # FP8 training's scaling recipe (NeMo RL megatron_cfg.fp8_cfg.fp8_recipe
                # `blockwise` in its FP8 recipes); blank = the framework profile's
                "fp8_recipe",
                # Megatron-Core's split counting the embedding / loss as a pipeline layer
                # (sim_core/pp_split.py; verl's override_transformer_config sets them)
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def ulysses(df: pd.DataFrame) -> np.ndarray:
    """verl's Ulysses sequence parallel size per row (`train_ulysses`, 1 where unset)."""
    if "train_ulysses" not in df.columns:
        return np.ones(len(df))
    return np.nan_to_num(pd.to_numeric(df["train_ulysses"], errors="coerce").to_numpy(float),
                         nan=1.0)


def ulysses_layout(df: pd.DataFrame, out: pd.DataFrame) -> None:
    """verl's FSDP workers with `ulysses_sequence_parallel_size` u > 1: the training frame runs
    cp = u with cp_comm a2a (q, k, v and the output all-to-all'd around attention, heads over
    the group: verl v0.5.0 verl/utils/ulysses.py gather_seq_scatter_heads /
    gather_heads_scatter_seq, called from models/transformers/monkey_patch.py), KV heads
    repeated up to u where fewer (cp_kv_repeat), so data parallelism is train GPUs / (tp x u x
    pp): verl's FSDP workers build a (dp, sp) device mesh of world / u by u
    (workers/fsdp_workers.py ulysses_device_mesh) and feed each sp group one data shard."""
    u = ulysses(df)
    on = u > 1
    if not on.any():
        return
    cp = out["cp"].to_numpy(float) if "cp" in out else np.ones(len(df))
    out["cp"] = np.where(on, u, np.nan_to_num(cp, nan=1.0))
    out["cp_comm"] = np.where(on, "a2a", "ring")
    out["cp_kv_repeat"] = on


def pack_budget(df: pd.DataFrame, b) -> np.ndarray:
    """Tokens per packed micro-batch: `train_seq_len`, default prompt + max response; times
    the Ulysses size, which verl's dynamic batching multiplies the per-GPU budget by (v0.7.0
    verl/workers/actor/dp_actor.py L367: max_token_len x ulysses_sequence_parallel_size)."""
    pack = df["train_seq_len"].to_numpy(dtype=float) if "train_seq_len" in df.columns else \
        np.full(len(df), np.nan)
    return np.where(np.isnan(pack), b.prompt_len + b.response_max, pack) * ulysses(df)


def logprob_budget(df: pd.DataFrame, b) -> np.ndarray:
    """Tokens per packed micro-batch of verl's log-prob passes: `logprob_seq_len`
    (`log_prob_max_token_len_per_gpu`) where stated, else the update's `pack_budget` (verl
    v0.7.0 defaults the log-prob budget to `ppo_max_token_len_per_gpu`); times the Ulysses
    size as the update's (v0.7.0 dp_actor.py `compute_log_prob` L367: `max_token_len x
    ulysses_sequence_parallel_size`, fsdp_workers.py L1015 passing
    `log_prob_max_token_len_per_gpu` as `max_token_len`)."""
    own = b.logprob_seq_len if "logprob_seq_len" in b else np.full(len(df), np.nan)
    return np.where(own > 0, own * ulysses(df), pack_budget(df, b))


def length_biased(b) -> np.ndarray:
    """E[L^2] / E[L] of prompt + response, the prompt at its mean."""
    p = generation.truncated_fraction(b)
    _, m1, m2 = generation.length_law(b.response_mean, b.response_max, p)
    return (b.prompt_len ** 2 + 2 * b.prompt_len * m1 + m2) / (b.prompt_len + m1)


def training_frame(df: pd.DataFrame, b, for_memory: bool = False) -> pd.DataFrame:
    """One pre-training row per RL configuration: one mini-batch of the generated sequences.

    Time: sequences of the mean length (prompt + mean response; attention per sequence, as
    varlen kernels run packed documents), as many per micro-batch as fill the packing budget
    (`train_seq_len` tokens, default prompt + max response: one longest sequence must fit).
    Memory (for_memory): one packed micro-batch of `train_seq_len` tokens, the activation
    peak dynamic batching allows."""
    out = pd.DataFrame(index=df.index)
    out["model"] = df["model"].to_numpy()
    out["gpu"] = df["gpu"].to_numpy()
    out["num_gpus"] = b.train_gpus
    out["gpus_per_node"] = b.gpus_per_node
    for f in TRAIN_FIELDS:
        col = f"train_{f}"
        if col in df.columns and df[col].notna().any():
            out[f] = df[col].to_numpy()
    ulysses_layout(df, out)
    # routing skew where the framework trains the router without load balancing (moe_skew.py)
    out["expert_skew"] = moe_skew.skew(df, b, out)
    pack = pack_budget(df, b)
    mean_len = b.prompt_len + b.response_mean
    cp = train_col(out, "cp")
    dp = train_dp(out, b)
    # context parallelism pads every sequence to a multiple of 2 x cp (Megatron's causal
    # load balancing; NeMo RL v0.3.0 `make_sequence_length_divisible_by` = tp x cp x 2)
    step_len = np.where(cp > 1, 2 * cp, 1.0)
    pack = np.ceil(pack / step_len) * step_len
    seqs = np.ceil(b.sequences / b.mini_batches)  # sequences per optimizer step
    if for_memory:
        out["seq_len"] = pack
        out["micro_batch"] = 1
        per = np.ceil(seqs * mean_len / pack)
        out["global_batch"] = np.ceil(per / dp) * dp
    else:
        packed = b.sequence_packing > 0
        # packed sequences keep their own attention (varlen kernels over cu_seqlens), which
        # costs sum L^2, not N E[L]^2: the sequences are priced near the length-biased mean
        # E[L^2] / E[L] (the response lengths' law of generation.length_law: truncated
        # responses at the cap + the clipped exponential body), as many fewer of them as keep
        # the tokens (N E[L]) the same. A micro-batch keeps the tokens the mean-length packing
        # gives it (whole sequences of the mean up to the budget), so the micro-batch count
        # and its per-micro-batch costs do not move: it holds the whole number of biased
        # sequences nearest that, each priced at the length that fills it exactly
        fill = np.maximum(np.floor(pack / mean_len), 1.0) * mean_len
        k = np.maximum(np.round(fill / np.minimum(length_biased(b), pack)), 1.0)
        seqs = np.where(packed, seqs * mean_len / (fill / k), seqs)
        mean_len = np.where(packed, fill / k, mean_len)
        mb = np.maximum(np.floor(pack / mean_len + 1e-9), 1.0)
        mb = np.minimum(mb, np.maximum(np.floor(seqs / dp), 1.0))
        # without packing every micro-batch is one sequence padded to the batch's longest,
        # which reaches the budget (prompt + max response) once any response is truncated
        # (catalogs/rl.yaml length.truncated_fraction x sequences >> 1 in an RL batch)
        mb = np.where(packed, mb, 1.0)
        seq = np.where(packed, np.round(mean_len), pack)
        # NeMo RL's dynamic batching: the micro-batches its sharding forms (sorted lengths,
        # each micro-batch padded to its longest; nemo_rl.dynamic_microbatches), as k
        # sequences of the mean padded length each, k = the rank's sequences / micro-batches
        gb = np.ceil(seqs / (dp * mb)) * dp * mb
        dyn = (b.dynamic_batching > 0) & (b.rl_framework == RL_FRAMEWORK.index("nemo_rl"))
        if dyn.any():
            width = np.minimum(b.prompt_len + b.response_max, pack)
            chunk = np.ceil(b.sequences / b.mini_batches)  # (seqs is length-biased here)
            n_mb, padded = nemo_rl.dynamic_microbatches(b, chunk, dp, pack, width)
            k = np.maximum(np.round(np.maximum(np.floor(chunk / dp), 1.0) / n_mb), 1.0)
            mb = np.where(dyn, k, mb)
            seq = np.where(dyn, padded / (n_mb * k), seq)
            gb = np.where(dyn, n_mb * k * dp, gb)
        # SkyRL's Megatron worker runs each one-sequence micro-batch unpadded, every MoE layer
        # at the pace of the longest sequence among the replicas of its EP group (ep_lockstep.py)
        seq = ep_lockstep.seq_len(b, out, seq)
        out["seq_len"] = np.ceil(seq / step_len) * step_len
        out["micro_batch"] = mb
        out["global_batch"] = gb
    # NeMo RL's DTensor worker runs the Hugging Face model in eager PyTorch (nemo_rl.py)
    nemo_rl.dtensor_fields(b, out)
    return out


def _grad_fp32(tf: pd.DataFrame) -> np.ndarray:
    """Gradients reduced in fp32 (the simulator's default) unless the frame says bf16."""
    if "grad_reduce_fp32" not in tf:
        return np.ones(len(tf), dtype=bool)
    col = tf["grad_reduce_fp32"]
    return col.where(col.notna(), True).astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy()


def _nemo_dtensor_moe(b, tf: pd.DataFrame, sim: pd.DataFrame, tok_ratio, gathers) -> dict:
    """hf_moe's and fsdp_experts' seconds for NeMo RL's DTensor (FSDP2) rows of an MoE model,
    per optimizer step of the training frame (`update_s`) and per forward pass over its
    sequences (`log_prob_s`, in log-prob micro-batches of tok_ratio / gathers training
    micro-batches' tokens); zero elsewhere."""
    on = (b.rl_framework == RL_FRAMEWORK.index("nemo_rl")) & (hf_moe.path(b, tf) > 0)
    zero = np.zeros(len(tf))
    if not on.any():
        return {"update_s": zero, "log_prob_s": zero}
    tok = tf["seq_len"].to_numpy(float) * tf["micro_batch"].to_numpy(float)
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    ckpt = verl._checkpointing(tf)
    g = np.maximum(np.asarray(gathers, dtype=float), 1e-9)
    ratio = np.asarray(tok_ratio, dtype=float) / g
    upd = hf_moe.pass_seconds(b, tf, sim, tok, m, ckpt, False) \
        + fsdp_experts.pass_seconds(b, tf, sim, m, False)
    lp = hf_moe.pass_seconds(b, tf, sim, tok * ratio, m * g, ckpt, True) \
        + fsdp_experts.pass_seconds(b, tf, sim, m * g, True, ratio)
    return {"update_s": np.where(on, upd, zero), "log_prob_s": np.where(on, lp, zero)}


def passes(df: pd.DataFrame, b, profile=None) -> dict:
    """Seconds of the log-prob passes and of the update, and the training peak memory."""
    tf = training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True), profile)
    tf_mem = training_frame(df, b, for_memory=True).reset_index(drop=True)
    mem = simulate_frame(tf_mem, profile)
    step = sim["step_time_s"].to_numpy()
    # the optimizer on the host (Megatron `optimizer_cpu_offload`, `optimizer_offload_fraction`
    # f, as verl's DeepSeek-V3 recipe runs it): f of the optimizer states (12 B/param: fp32
    # master + Adam m, v; sim_core/memory.py) leave the training peak, and every optimizer step
    # moves that shard's fp32 gradients to the host and its bf16 parameters back over PCIe
    # (`overlap_cpu_optimizer_d2h_h2d`: the two directions overlap, the longer counts). The
    # host runs PyTorch's CPU AdamW over that shard (catalogs/rl.yaml host_adam_bytes_per_param,
    # at the node's host memory bandwidth shared by its GPUs' processes); Megatron's
    # HybridDeviceOptimizer steps each group as its gradients arrive, so the copies and the
    # host arithmetic overlap: the longest counts.
    f = np.clip(b.optimizer_cpu_offload, 0.0, 1.0)
    opt_b = sim["mem_optimizer"].to_numpy() * 2.0 ** 30 * f
    pcie = pcie_bytes_per_s(b)
    host_adam = host.adam_seconds(opt_b / 12, host.memory_bytes_per_s(b))
    host_step = np.maximum(np.maximum(opt_b / 12 * 4, opt_b / 12 * 2) / pcie, host_adam)
    step = step + host_step
    fwd = forward_seconds(sim)
    # ZeRO-3 / FSDP: a forward-only pass still all-gathers the parameters in every
    # micro-batch (FSDP2 `fully_shard` per layer reshards after forward: NeMo RL v0.3.0
    # nemo_rl/models/dtensor/parallelize.py; the step's DP time counts, per micro-batch, a
    # bf16 gather for forward, one for backward and the gradient reduce-scatter, fp32 with
    # `reduce_dtype=torch.float32`). Log-prob micro-batches hold `logprob_batch_size` times the
    # training micro-batch's tokens (NeMo RL `logprob_mb_tokens` = max_total_sequence_length x
    # logprob_batch_size, `train_mb_tokens` = max_total_sequence_length x
    # train_micro_batch_size 1: examples/configs/grpo_math_1B.yaml at v0.3.0), so they gather
    # that many times less often.
    rs_bytes = np.where(_grad_fp32(tf), 4.0, 2.0)
    # the forward gather's share of the DP time, on the ZeRO-3 / FSDP rows only
    gather_share = np.where(fsdp(tf), 2.0 / (2.0 + 2.0 + rs_bytes), 0.0)
    budget = pack_budget(df, b)
    # NeMo RL's dynamic batching forms the log-prob micro-batches anew (whole batch, budget
    # logprob_mb_tokens): tokens and gathers per pass relative to the training frame's
    tok_ratio, gathers = nemo_rl.dynamic_logprob_ratios(b, tf, budget)
    fwd = fwd * tok_ratio + sim["time_dp"].to_numpy() * gather_share * gathers
    dp = sim["dp"].to_numpy(float)
    ext = nemo_rl.extras(b, tf, sim, pcie, budget)
    # Megatron-Core's MoE layers sync the host once per layer forward: the host time of a
    # layer beyond its GPU time is paid layer by layer (moe_host.py)
    mh = moe_host.exposed(b, df, tf, sim, tok_ratio, gathers)
    # NeMo RL's loss and log-prob collection one sequence at a time: host syncs and the
    # sliced logits' full-size gradients (nemo_rl_host.py)
    nh = nemo_rl_host.seconds(b, tf, sim, budget)
    # per micro-batch pass, beyond the pre-training step: NeMo RL's DTensor worker runs the
    # transformers MoE block (hf_moe.py: v0.3.0 locks transformers 4.52.4, the per-expert
    # loop; verl's and SkyRL's are priced in their phases); the routed experts' activation
    # run eagerly with wide router probabilities (moe_glu.py)
    hf = _nemo_dtensor_moe(b, tf, sim, tok_ratio, gathers)
    glu = moe_glu.exposed(b, df, tf, sim, tok_ratio)
    # NeMo RL's DTensor worker: DTensor's Python dispatch per op at TP > 1 (the host floor of
    # a micro-batch), the single-tensor AdamW over DTensor parameters, the SP plan's own
    # all-gathers (dtensor_host.py)
    dh = dtensor_host.seconds(b, tf, sim, tok_ratio, gathers, fwd)
    # SkyRL's Megatron worker: log-probs over the batch's padded width, its loss's host syncs
    # (skyrl_megatron.py)
    sm = skyrl_megatron.seconds(b, tf, sim)
    # Megatron-Core's unfused MLA RoPE on THD micro-batches: host syncs inside each attention
    # layer's forward (mla_rope.py; SkyRL's Megatron worker)
    mr = mla_rope.seconds(b, df, tf, sim)
    lp_pass = (fwd + mh["log_prob_s"] + hf["log_prob_s"] + glu["log_prob_s"]
               + sm["log_prob_s"] + mr["log_prob_s"]) * b.mini_batches \
        + ext["logprob_loss_s"] + ext["logprob_bins_s"] + nh["log_prob_s"] + dh["log_prob_s"]
    updates = b.mini_batches * b.ppo_epochs
    update = ((step + mh["update_s"] + hf["update_s"] + glu["update_s"] + sm["update_s"]
               + mr["update_s"] + ext["update_pad_s"]
               + ext["update_bins_s"] + dh["update_s"]) * updates
              + (ext["update_loss_s"] + nh["update_s"]) * b.ppo_epochs) \
        * np.where(b.algorithm == 2, 2.0, 1.0)  # PPO: critic update too
    # verl's Megatron workers load and offload the parameters in each phase (verl_megatron.py)
    vm = verl_megatron.phase_moves(b, tf, sim, pcie)
    update = update + vm["update_s"]
    # the weights swapped for the reference pass: NeMo RL's (nemo_rl.extras) or slime's
    # restores of its host copies (slime_train.py); zero for the other frameworks
    ref_swap = ext["ref_swap_s"] + slime_train.ref_swap_seconds(
        b, sim["mem_weights"].to_numpy(), pcie)
    ref = (lp_pass + ref_swap) * b.use_ref + vm["ref_s"]
    values = lp_pass * (b.algorithm == 2)  # PPO critic values
    old = lp_pass + vm["log_prob_s"]
    # verl's FSDP workers: their own micro-batches, padding, critic and host moves (verl.py)
    v = verl.phases(df, b, tf, dp, pcie, budget, gather_share, profile,
                    logprob_budget=logprob_budget(df, b))
    on = v["on"]
    old = np.where(on, v["old_log_prob_s"], old)
    ref = np.where(on, v["ref_s"], ref)
    values = np.where(on, v["values_s"], values)
    update = np.where(on, v["update_actor_s"] + v["update_critic_s"], update)
    # verl's worker-group calls: Ray dispatch, the DataProto's bytes, the offload's
    # empty_cache, the update loops' host syncs (verl_calls.py; zero off verl)
    vc = verl_calls.seconds(b, on, dp, pcie, {"update_actor": v["update_micro_batches"],
                                              "update_critic": v["critic_micro_batches"]})
    old = old + vc["old_log_prob"]
    ref = ref + vc["ref"]
    values = values + vc["values"]
    update = update + vc["update_actor"] + vc["update_critic"]
    # SkyRL's FSDP2 workers: count micro-batches, cpu_offload's host moves and AdamW (skyrl.py)
    s = skyrl.phases(df, b, tf, dp, pcie, gather_share, profile)
    son = s["on"]
    old = np.where(son, s["old_log_prob_s"], old)
    ref = np.where(son, s["ref_s"], ref)
    update = np.where(son, s["update_s"], update)
    # old log-probs from the rollout engine (verl fully_async use_rollout_log_probs): no pass
    old = np.where(b.use_rollout_log_probs > 0, 0.0, old)
    # slime's (vime's) loss reusing the training forward's log-probs: no pass (slime_train.py)
    old = np.where(slime_train.reuses_log_probs(b), 0.0, old)
    # FSDP2 cpu_offload: weights, grads and optimizer states never on the GPU between passes
    on_host = s["states_on_host"]
    state_cols = ("mem_weights", "mem_grads", "mem_optimizer")
    states = sum(sim[c].to_numpy() for c in state_cols)
    mem_states = sum(mem[c].to_numpy() for c in state_cols)
    return {
        "old_log_prob_time_s": old,
        "ref_time_s": ref,
        "ref_swap_time_s": ref_swap * b.use_ref,
        "log_prob_time_s": old + values + ref,
        "values_time_s": values,
        # verl keeps the optimizer on the host until its update (verl.py rule 5): no
        # optimizer round trip around generation
        "gen_optimizer_moves": np.where(on | on_host, 0.0, 1.0),
        "update_time_s": update,
        "verl_calls_time_s": vc["total_s"],
        # SkyRL's eager micro-batch floor above the GPU time, inside the passes (skyrl_host.py)
        "skyrl_host_floor_s": np.where(son, np.nan_to_num(s["host_floor_s"]), 0.0),
        "train_step_time_s": step,
        "train_valid": sim["valid"].to_numpy() & mem["valid"].to_numpy(),
        "train_invalid_reason": np.where(sim["invalid_reason"].to_numpy() != "",
                                         sim["invalid_reason"].to_numpy(),
                                         mem["invalid_reason"].to_numpy()),
        # (verl's colocated Megatron trainer runs with expandable segments: verl_megatron.py)
        # the frameworks' own loss tensors over the logits, in the update and the log-prob
        # passes, where larger than the frame's loss (loss_memory.py: NeMo RL DTensor, verl FSDP)
        "train_peak_gib": np.fmax(loss_memory.training_peak(
                                      b, tf_mem, mem, verl_megatron.training_peak_gib(b, tf, mem),
                                      logprob_budget(df, b))
                                  - np.where(on_host, mem_states, 0.0),
                                  verl_megatron.training_peak_gib(b, tf, sim)
                                  - np.where(on_host, states, 0.0))
        - f * mem["mem_optimizer"].to_numpy(),
        "optimizer_host_time_s": np.where(son, s["adam_s"], host_step * b.mini_batches
                                          * b.ppo_epochs),
        "train_dp": sim["dp"].to_numpy(),
        "train_global_batch": tf["global_batch"].to_numpy(),
        "train_seq_len": tf["seq_len"].to_numpy(),
        "train_mfu": sim["mfu"].to_numpy(),
        # resident between phases when nothing is offloaded: weights, grads, optimizer
        # (the host-resident fraction of a CPU optimizer is never on the GPU)
        "train_states_gib": states - f * sim["mem_optimizer"].to_numpy()
        - np.where(on_host, states, 0.0),
        "train_optimizer_gib": np.where(on_host, 0.0, (1 - f) * sim["mem_optimizer"].to_numpy()),
        "train_weights_gib": sim["mem_weights"].to_numpy(),
        # (FSDP2 cpu_offload: already counted off the GPU in train_states_gib)
        "train_grads_gib": np.where(on_host, 0.0, sim["mem_grads"].to_numpy()),
    }
