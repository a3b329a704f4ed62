"""Log-probability passes and the policy update, in the training layout, through the
pre-training simulator (`sim_core.simulate`), not a copy of it.

The generated sequences (prompt + response) are packed into bins of `train_seq_len` tokens
(verl's `use_dynamic_bsz` / `ppo_max_token_len_per_gpu`, NeMo RL's sequence packing), so a
mini-batch is `tokens / mini_batches / train_seq_len` packed sequences, rounded up to whole
micro-batches of the data-parallel ranks. One mini-batch is one optimizer step of the
pre-training simulator; the update is `mini_batches x ppo_epochs` of them (verl v0.7.0
`verl/workers/actor/*_actor.py update_policy`: a loop over epochs and mini-batches, one
optimizer step each). Attention over a packed bin is priced as one causal sequence of its
length, an over-estimate of the packed documents' varlen attention.

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

# the training layout's columns an RL row carries, with the simulator's names
TRAIN_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "recompute", "zero",
                "sequence_parallel", "framework", "precision")


def training_frame(df: pd.DataFrame, b) -> pd.DataFrame:
    """One pre-training row per RL configuration: one mini-batch of the packed tokens."""
    out = pd.DataFrame(index=df.index)
    out["model"] = df["model"].to_numpy()
    out["gpu"] = df["gpu"].to_numpy()
    out["num_gpus"] = b.train_gpus
    out["gpus_per_node"] = b.gpus_per_node
    for f in TRAIN_FIELDS:
        col = f"train_{f}"
        if col in df.columns:
            out[f] = df[col].to_numpy()
    seq = df["train_seq_len"].to_numpy(dtype=float) if "train_seq_len" in df.columns else \
        np.full(len(df), np.nan)
    seq = np.where(np.isnan(seq), b.prompt_len + b.response_max, seq)
    out["seq_len"] = seq
    tokens = b.sequences * (b.prompt_len + b.response_mean)
    tp = out["tp"].to_numpy(float) if "tp" in out else np.ones(len(df))
    pp = out["pp"].to_numpy(float) if "pp" in out else np.ones(len(df))
    cp = out["cp"].to_numpy(float) if "cp" in out else np.ones(len(df))
    mb = out["micro_batch"].to_numpy(float) if "micro_batch" in out else np.ones(len(df))
    dp = np.maximum(np.floor(b.train_gpus / (tp * pp * cp)), 1.0)
    per_mb = np.ceil(tokens / b.mini_batches / seq)
    out["global_batch"] = np.ceil(per_mb / (dp * mb)) * dp * mb
    return out


def passes(df: pd.DataFrame, b, profile=None) -> dict:
    """Seconds of the log-prob passes and of the update, and the training peak memory."""
    tf = training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True), profile)
    step = sim["step_time_s"].to_numpy()
    comm = sum(sim[c].to_numpy() for c in ("time_tp", "time_cp", "time_ep", "time_pp"))
    fwd = sim["time_compute"].to_numpy() / 3 + comm / 2 + sim["time_bubble"].to_numpy() / 3
    n_fwd = 1 + b.use_ref + (b.algorithm == 2)  # old log-prob, ref, PPO critic values
    updates = b.mini_batches * b.ppo_epochs
    update = step * updates * np.where(b.algorithm == 2, 2.0, 1.0)  # PPO: critic update too
    return {
        "old_log_prob_time_s": fwd * b.mini_batches,
        "ref_time_s": fwd * b.mini_batches * b.use_ref,
        "log_prob_time_s": fwd * b.mini_batches * n_fwd,
        "update_time_s": update,
        "train_step_time_s": step,
        "train_valid": sim["valid"].to_numpy(),
        "train_invalid_reason": sim["invalid_reason"].to_numpy(),
        "train_peak_gib": sim["peak_memory_gib"].to_numpy(),
        "train_dp": sim["dp"].to_numpy(),
        "train_global_batch": tf["global_batch"].to_numpy(),
        "train_seq_len": tf["seq_len"].to_numpy(),
        "train_mfu": sim["mfu"].to_numpy(),
        # resident between phases when nothing is offloaded: weights, grads, optimizer
        "train_states_gib": sum(sim[c].to_numpy() for c in
                                ("mem_weights", "mem_grads", "mem_optimizer")),
        "train_optimizer_gib": sim["mem_optimizer"].to_numpy(),
        "train_weights_gib": sim["mem_weights"].to_numpy(),
    }
