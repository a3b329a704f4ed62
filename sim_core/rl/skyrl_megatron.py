"""What SkyRL's Megatron worker runs per micro-batch beyond the pre-training step: its
log-probabilities over the batch's padded width, and the host syncs of its loss.

Why a module of its own: the training frame prices each one-sequence micro-batch at its own
tokens (ep_lockstep.py), with the pre-training step's fused loss over them. SkyRL's Megatron
worker (NovaSky-AI/SkyRL f6bf2f91, megatron-core 0.16.0 pinned in pyproject.toml) unpads the
sequence for the model but scatters the logits back to the batch's padded width before its
loss (skyrl/backends/skyrl_train/workers/megatron/megatron_model_wrapper.py `forward_step` ->
distributed/megatron/megatron_utils.py `postprocess_packed_seqs`: `torch.zeros([batch, seq_len,
vocab / tp])`, `seq_len` the data's width = the longest prompt + the longest response of the
batch), then runs an fp32 vocab-parallel log-softmax and, in the update, an entropy over that
width (distributed/megatron/model_utils.py `DistributedLogprob`, `_VocabParallelEntropy`).
That is memory-bound GPU work proportional to the padded width, not to the sequence.

Bytes per logit element (reads + writes), counted from that code. Over the width W:
  forward: zeros 4; `DistributedLogprob.forward` (the logits arrive fp32: Megatron-Core's
  Float16Module casts the last stage's output) amax 4, subtract 8, exp 8, sum 4, log-softmax 8,
  the saved softmax `exp` 8 (run in inference_only too) -> 44;
  backward: `softmax.neg()` 8, `mul_` 8 -> 16.
Over the response width A (`num_actions`, the longest response): `vocab_parallel_entropy`
(run every update micro-batch, under no_grad with `use_entropy_loss` False): max 4, subtract
8, `exp_` 8, sum 4, `div_` 8, the compiled mul-reduce 8 -> 40.
Over the sequence's own tokens T: Float16Module's bf16 -> fp32 cast 6, the masked scatter into
the padded tensor 8; backward: the scatter's gather 8, the cast back 6.
The pre-training step already prices its own loss over T (workload.LOSS_TRAFFIC_FWD/BWD, as
nemo_rl.extras subtracts it): only the difference is added, at the elementwise HBM efficiency.

Host syncs per micro-batch (20 us each, catalogs/moe.yaml host_sync_us): `preprocess_packed_
seqs` three `.tolist()` and the boolean-mask gather `input_ids[i, attention_mask[i]]`
(a `nonzero`): 4; `postprocess_packed_seqs` two `.tolist()` and the boolean-mask scatter: 3;
the update's `loss_func` adds `valid_lens ... .tolist()`, `detach().cpu()` and four `.item()`:
6. Each forward_backward_func call holds the whole mini-batch (`num_microbatches =
len(micro_batches)`): its schedule set-up and the metrics all-reduce are per call, not per
micro-batch, and not counted.

Nothing is fitted: bytes from the code, bandwidth from the GPU catalog.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import compute
from . import host, nemo_rl
from .inputs import RL_FRAMEWORK, fsdp, train_col

# bytes per logit element (module docstring)
WIDTH_FWD, WIDTH_BWD = 44.0, 16.0
ENTROPY_FWD = 40.0
TOKENS_FWD, TOKENS_BWD = 14.0, 14.0
# host syncs per micro-batch: forward (pre/postprocess), the update's loss adds
SYNCS_FWD, SYNCS_LOSS = 7.0, 6.0


def rows(b, tf: pd.DataFrame) -> np.ndarray:
    """SkyRL rows trained by Megatron-Core (not FSDP)."""
    return (np.asarray(b.rl_framework) == RL_FRAMEWORK.index("skyrl")) & ~fsdp(tf)


def widths(b) -> tuple[np.ndarray, np.ndarray]:
    """(W, A): the batch's padded width (longest prompt + longest response) and the response
    width. In an RL batch of thousands of sequences some response reaches the cap whenever
    any is truncated (the frame's own assumption), so A = the cap and W = the prompt cap + A."""
    a = np.asarray(b.response_max, dtype=float)
    return np.asarray(b.prompt_max, dtype=float) + a, a


def per_micro_batch(b, tf: pd.DataFrame) -> dict:
    """Seconds one micro-batch adds, `fwd` (a log-prob micro-batch) and `upd` (an update
    micro-batch): the padded-width GPU bytes beyond the frame's loss, plus the host syncs."""
    on = rows(b, tf)
    tp = np.maximum(train_col(tf, "tp"), 1.0)
    v = np.asarray(b.vocab, dtype=float) / tp
    w, a = widths(b)
    t = tf["seq_len"].to_numpy(float) * tf["micro_batch"].to_numpy(float)
    sim_f, sim_b = nemo_rl._sim_loss_bytes(tf)
    fwd_bytes = v * (WIDTH_FWD * w + TOKENS_FWD * t - (sim_f + sim_b) / 3.0 * t)
    upd_bytes = v * ((WIDTH_FWD + WIDTH_BWD) * w + ENTROPY_FWD * a
                     + (TOKENS_FWD + TOKENS_BWD) * t - (sim_f + sim_b) * t)
    hbm = b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
    sync = host.sync_seconds()
    fwd = np.maximum(fwd_bytes, 0.0) / hbm + SYNCS_FWD * sync
    upd = np.maximum(upd_bytes, 0.0) / hbm + (SYNCS_FWD + SYNCS_LOSS) * sync
    zero = np.zeros(len(tf))
    return {"fwd": np.where(on, fwd, zero), "upd": np.where(on, upd, zero)}


def seconds(b, tf: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """Seconds added per optimizer step of the training frame (`update_s`: its micro-batches)
    and per log-prob pass over the same sequences (`log_prob_s`: one micro-batch each, per
    mini-batch as training.py counts the pass)."""
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    per = per_micro_batch(b, tf)
    return {"update_s": m * per["upd"], "log_prob_s": m * per["fwd"]}
