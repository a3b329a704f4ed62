"""Unpadded one-sequence micro-batches in lockstep across the data-parallel replicas of an
expert-parallel group (SkyRL's Megatron worker).

Why a module of its own: the training frame prices a micro-batch without sequence packing as
one sequence padded to the budget (prompt + max response), which is what NeMo RL v0.3.0 and
verl's padded paths run. SkyRL's Megatron worker removes the padding instead
(NovaSky-AI/SkyRL f6bf2f91, `trainer.use_sample_packing` True by default:
skyrl/backends/skyrl_train/workers/megatron/megatron_model_wrapper.py `forward` and
`forward_backward_mini_batch` call `preprocess_packed_seqs`,
skyrl/backends/skyrl_train/distributed/megatron/megatron_utils.py: THD input of the sequence's
own tokens, rounded up to a multiple of tp), so each micro-batch of
`micro_train_batch_size_per_gpu` = 1 runs its own response length.

With expert parallelism the micro-batches of different data-parallel replicas meet in every MoE
layer: Megatron-Core's alltoall dispatcher exchanges the routed tokens of the whole EP group in
one NCCL all-to-all per dispatch and per combine (token_dispatcher.py, core 0.16.0 as SkyRL
pins it), a collective that finishes when its slowest member arrives. An EP group of ep x etp
ranks spans g = ep x etp / (tp x cp) replicas of the dense layers (Megatron orders expert
ranks etp-ep-dp-pp inside the same GPUs as tp-cp-dp-pp), each on its own sequence, so every
layer runs at the pace of the longest of g sequences: the micro-batch costs E[max of g
response lengths] + the prompt, under generation.py's length law (a share p at the cap and a
clipped exponential body: S(k) = p + (1 - p) exp(-k / theta) below the cap). g = 1 (no EP, or
an EP group inside one replica) gives the mean.

Nothing here is fitted: the length law is generation.py's, the group size the layout's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import generation
from .inputs import RL_FRAMEWORK, fsdp, train_col

GRID = 512  # points of the response-length integral per row


def rows(b, tf: pd.DataFrame) -> np.ndarray:
    """SkyRL rows trained by Megatron-Core (not FSDP) whose micro-batches are one unpadded
    sequence: `remove_padding` (SkyRL's use_sample_packing) and no token packing."""
    skyrl = np.asarray(b.rl_framework) == RL_FRAMEWORK.index("skyrl")
    unpadded = np.asarray(b.remove_padding, dtype=float) > 0
    packed = np.asarray(b.sequence_packing, dtype=float) > 0
    return skyrl & ~fsdp(tf) & unpadded & ~packed


def replicas(tf: pd.DataFrame) -> np.ndarray:
    """Data-parallel replicas of the dense layers inside one EP group: ep x etp / (tp x cp),
    at least 1 (etp blank or 0: tp, Megatron's default expert TP)."""
    tp, cp, ep = (train_col(tf, c) for c in ("tp", "cp", "ep"))
    etp = train_col(tf, "etp") if "etp" in tf else tp
    etp = np.where(np.nan_to_num(etp, nan=0.0) > 0, etp, tp)
    g = np.nan_to_num(ep, nan=1.0) * etp / np.maximum(np.nan_to_num(tp * cp, nan=1.0), 1.0)
    return np.maximum(np.floor(g), 1.0)


def expected_max_response(b, g) -> np.ndarray:
    """E[max of g responses] under the length law: the integral over [0, cap] of
    1 - (1 - S(k))^g, on a grid per row (g = 1: the mean)."""
    mx = np.maximum(np.asarray(b.response_max, dtype=float), 1.0)
    p = generation.truncated_fraction(b)
    th, _, _ = generation.length_law(b.response_mean, mx, p)
    x = (np.arange(GRID) + 0.5) / GRID                      # midpoints of [0, 1]
    k = mx[:, None] * x[None, :]
    s = p[:, None] + (1 - p[:, None]) * np.exp(-k / np.maximum(th, 1e-9)[:, None])
    return mx * np.mean(1.0 - (1.0 - s) ** np.asarray(g, dtype=float)[:, None], axis=1)


def seq_len(b, tf: pd.DataFrame, padded) -> np.ndarray:
    """Tokens each micro-batch is priced at: the prompt + the longest response of the g
    replicas in lockstep on these rows (rounded up as SkyRL aligns it), `padded` (the
    frame's) elsewhere."""
    on = rows(b, tf)
    if not on.any():
        return np.asarray(padded, dtype=float)
    longest = b.prompt_len + expected_max_response(b, replicas(tf))
    # preprocess_packed_seqs pads each sequence to a multiple of tp (2 x tp x cp with CP)
    tp, cp = train_col(tf, "tp"), train_col(tf, "cp")
    align = np.maximum(np.where(cp > 1, 2 * tp * cp, tp), 1.0)
    return np.where(on, np.minimum(np.ceil(longest / align) * align, padded), padded)
