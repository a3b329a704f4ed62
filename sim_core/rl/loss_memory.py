"""The RL frameworks' own loss tensors over the logits, as device memory (issue 40).

Why: the training memory frame (`training.training_frame(..., for_memory=True)`) is priced by
the pre-training memory model, which holds `memory.LOSS_SEGMENT_BYTES[loss_impl]` bytes per
logit at the loss (6 B for `vocab_parallel`, 2 B for verl's `te`). NeMo RL's and verl's actors
compute the log-probabilities (and verl its entropy) with their own code, whose live tensors
per logit at the loss's peak are counted below, from the code at the releases the rows run.
The counts are of live tensors (bytes allocated); the logits per rank are the micro-batch's
tokens / cp x vocabulary / tp (vocab-parallel under TP, sequence-sharded under CP / Ulysses).

Two peaks are priced, and the training peak is the larger of them and the frame's own:
- the update's loss phase: the resident states + the stored activations (the frame's) + the
  framework's loss bytes x the update micro-batch's logits (they replace the frame's own loss
  count: never added to it);
- the log-prob passes' loss (forward only, under `torch.no_grad`: no activations kept, only
  the states): the framework's log-prob bytes x the log-prob micro-batch's logits, which is
  larger than the update's where `logprob_batch_size` > 1 (NeMo RL `logprob_mb_tokens` =
  max_total_sequence_length x logprob_batch_size) or verl's `log_prob_max_token_len_per_gpu`
  exceeds `ppo_max_token_len_per_gpu`.
Where the frame's peak is not its loss phase, the rebuilt update phase and the log-prob pass
leave out the LM head's gathered weight and the last layer's cached blocks (lower bounds).
Rows of other frameworks and of Megatron workers are left as the frame prices them (NaN here).

NeMo RL, DTensor (FSDP2) worker (`policy.dtensor_cfg`), bytes per logit:
- log-prob pass, TP 1: the bf16 logits (2, held by `outputs`) + their fp32 copy (4) + the
  fp32 log-softmax (4) = 10 (v0.3.0 nemo_rl/models/policy/dtensor_policy_worker.py
  get_logprobs L1011-1013 `log_softmax(outputs.logits.to(torch.float32))`; v0.7.0
  nemo_rl/models/automodel/train.py `_compute_local_logprobs`, `logprob_chunk_size` null in
  examples/configs/grpo_math_1B.yaml: the same tensors).
- log-prob pass, TP > 1 (vocab-sharded DTensor logits): bf16 (2) + fp32 copy (4) + inside
  `_compute_distributed_log_softmax` the shifted copy (4) and the `exp()` temporary (4), or,
  after it, the log-softmax (4) and its `clone()` (4) = 14 (v0.3.0 nemo_rl/distributed/
  model_utils.py L22-83 DistributedLogprob.forward; unchanged at v0.5.0).
- update, TP 1, before PR 875 (v0.2 / v0.3): the train loop keeps `outputs` and `logits` (bf16,
  2) through `loss.backward()`; ClippedPGLossFn casts to fp32 (4, freed when the loss returns:
  nothing saves it) and saves the fp32 log-softmax (4); backward holds the saved log-softmax,
  the gather's gradient (4) and the log-softmax's gradient (4) = 2 + 4 + 4 + 4 = 14 (v0.3.0
  nemo_rl/algorithms/loss_functions.py L140-169; dtensor_policy_worker.py train L655-741).
- update, TP 1, from PR 875 (NVIDIA-NeMo/RL 2b87def7 "fix: OOM in deepscaler1.5b", first in
  v0.4.0: `del outputs` / `del logits` once the loss returns): the bf16 logits are gone in
  backward -> 12 (forward 10).
- update, TP > 1, before PR 875: forward 14 (as the log-prob pass); backward of
  DistributedLogprob (v0.3.0 model_utils.py L86-102): the bf16 logits (2, still held), the
  saved fp32 softmax (4), `one_hot(masked_target)` (int64, 8) and its product with the mask
  (int64, 8) -> 22 (then `.float()`: 2 + 4 + 8 + 4 = 18).
- update, TP > 1, from v0.4.0: the 3-D backward skips `one_hot` (v0.4.0 model_utils.py
  L108-131: `softmax.neg()` 4, scatter_add_) and the bf16 logits are deleted -> backward 8,
  forward 14 -> 14 (v0.5.0, v0.7.0 model_utils.py: the same).

verl, FSDP actor (`verl/workers/actor/dp_actor.py`), bytes per logit:
- update before v0.4 (v0.2.0.post2 dp_actor.py L98-103, torch_functional.py L48-68 and
  L106-110): the bf16 logits (2, saved by flash-attn's Triton cross-entropy, called without
  `inplace_backward`) and the entropy from the same logits (`entropy_from_logits` under
  `torch.compile`: Inductor fuses the softmax into its reductions, no full-size forward
  tensor), which enters the loss (`entropy_coeff` 0.001 by default, ppo_trainer.yaml L31);
  backward writes the cross-entropy's gradient (2) and the entropy's (2), accumulated in place
  -> 6.
- update from v0.4.0: `logprobs_from_logits(..., inplace_backward=True)` (v0.4.1
  torch_functional.py L64-96) and `entropy_coeff: 0` by default (v0.4.1 ppo_trainer.yaml
  L211; v0.7.0 actor.yaml L89-92 `calculate_entropy: false`): no entropy in the update, the
  gradient over the logits -> 2 (the frame's `te`: nothing to add).
- log-prob passes, every version: forward only, the entropy compiled (`use_torch_compile`
  true) -> the bf16 logits, 2.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import memory
from . import nemo_rl, verl
from .inputs import train_col

GIB = 2.0 ** 30

# the release from which PR 875's frees and the one-hot-free backward apply (NeMo RL), and
# from which verl's in-place cross-entropy backward and entropy_coeff 0 apply (module doc)
NEMO_RL_FIX_VERSION = 0.4
VERL_INPLACE_VERSION = 0.4

# bytes per logit (module doc): NeMo RL DTensor worker {(pass, tp > 1, before the fix)}
NEMO_RL_DTENSOR = {
    ("update", False, True): 14.0, ("update", False, False): 12.0,
    ("update", True, True): 22.0, ("update", True, False): 14.0,
    ("log_prob", False, True): 10.0, ("log_prob", False, False): 10.0,
    ("log_prob", True, True): 14.0, ("log_prob", True, False): 14.0,
}
# verl FSDP actor {(pass, before v0.4)}
VERL_FSDP = {("update", True): 6.0, ("update", False): 2.0,
             ("log_prob", True): 2.0, ("log_prob", False): 2.0}


def _version(b, n: int) -> np.ndarray:
    """The row's framework release (NaN: the current release, newer than every threshold)."""
    v = b["rl_framework_version"] if "rl_framework_version" in b else np.full(n, np.nan)
    return np.nan_to_num(np.asarray(v, dtype=float), nan=np.inf)


def bytes_per_logit(b, tf: pd.DataFrame) -> dict:
    """Live bytes per logit at the loss's peak per row: {"update", "log_prob"}; NaN on the
    rows this module does not price (other frameworks, Megatron workers)."""
    n = len(tf)
    v = _version(b, n)
    tp_on = train_col(tf, "tp") > 1
    nemo = nemo_rl.dtensor_rows(b, tf)
    ver = verl.active(b, tf)
    pre_fix = v < NEMO_RL_FIX_VERSION
    out = {}
    for phase in ("update", "log_prob"):
        nr = np.select([tp_on & pre_fix, tp_on & ~pre_fix, ~tp_on & pre_fix],
                       [NEMO_RL_DTENSOR[(phase, True, True)],
                        NEMO_RL_DTENSOR[(phase, True, False)],
                        NEMO_RL_DTENSOR[(phase, False, True)]],
                       NEMO_RL_DTENSOR[(phase, False, False)])
        vr = np.where(v < VERL_INPLACE_VERSION, VERL_FSDP[(phase, True)],
                      VERL_FSDP[(phase, False)])
        out[phase] = np.select([nemo, ver], [nr, vr], np.nan)
    return out


def logprob_tokens(b, tf: pd.DataFrame, update_tokens: np.ndarray,
                   verl_budget: np.ndarray) -> np.ndarray:
    """Tokens of one log-prob micro-batch per rank (before CP): NeMo RL's
    `logprob_mb_tokens` = max_total_sequence_length x logprob_batch_size (examples/configs/
    grpo_math_1B.yaml at v0.3.0; also the padded bound without dynamic batching:
    logprob_batch_size sequences of at most the total), capped by nothing else; verl's
    `log_prob_max_token_len_per_gpu` (training.logprob_budget); elsewhere the update's."""
    lbs = np.maximum(np.nan_to_num(np.asarray(b.logprob_batch_size, dtype=float), nan=1.0), 1.0)
    width = np.minimum(b.prompt_len + b.response_max, update_tokens)
    nemo = nemo_rl.dtensor_rows(b, tf)
    return np.select([nemo, verl.active(b, tf)], [lbs * width, verl_budget], update_tokens)


def _frame_loss_bytes(tf: pd.DataFrame) -> np.ndarray:
    """The bytes per logit the memory frame already reserves at its loss (memory.py
    LOSS_SEGMENT_BYTES of the loss_impl the frame resolves to)."""
    return memory.LOSS_SEGMENT_BYTES[nemo_rl.loss_impl_index(tf)]


def peaks_gib(b, tf_mem: pd.DataFrame, mem: pd.DataFrame, verl_budget: np.ndarray) -> dict:
    """The update's loss phase and the log-prob pass's peak (GiB) per row of the memory frame
    `tf_mem` and its simulation `mem` (module doc); NaN where not priced."""
    bpl = bytes_per_logit(b, tf_mem)
    cp = train_col(tf_mem, "cp")
    tp = train_col(tf_mem, "tp")
    upd_tok = tf_mem["seq_len"].to_numpy(float) * tf_mem["micro_batch"].to_numpy(float)
    lp_tok = logprob_tokens(b, tf_mem, upd_tok, verl_budget)
    per_token = b.vocab / tp / cp / GIB  # GiB per byte per token of the micro-batch
    states = sum(mem[c].to_numpy() for c in ("mem_weights", "mem_grads", "mem_optimizer"))
    runtime = mem["mem_runtime"].to_numpy()
    # the update's loss phase: where the frame's peak is its loss phase (`mem_logits` > 0:
    # memory.py peak_of, the loss part = the last layer's cached blocks + the loss_impl's
    # segments), the framework's bytes replace the loss_impl's on top of that peak; elsewhere
    # the phase is rebuilt from the states, the stored activations and the framework's bytes
    own = _frame_loss_bytes(tf_mem)
    loss_wins = mem["mem_logits"].to_numpy() > 0
    update = np.where(
        loss_wins,
        mem["peak_memory_gib"].to_numpy()
        + np.maximum(bpl["update"] - own, 0.0) * upd_tok * per_token,
        states + mem["mem_activations"].to_numpy() + runtime + bpl["update"] * upd_tok * per_token)
    log_prob = states + runtime + bpl["log_prob"] * lp_tok * per_token
    return {"update_loss_gib": update, "log_prob_gib": log_prob,
            "update_bytes_per_logit": bpl["update"], "log_prob_bytes_per_logit": bpl["log_prob"],
            "log_prob_tokens": lp_tok}


def training_peak(b, tf_mem: pd.DataFrame, mem: pd.DataFrame, frame_peak: np.ndarray,
                  verl_budget: np.ndarray) -> np.ndarray:
    """The frame's training peak (GiB), raised to the framework's loss phase or log-prob pass
    where either is larger (module doc); unchanged on the rows not priced here."""
    p = peaks_gib(b, tf_mem, mem, verl_budget)
    return np.fmax(np.fmax(frame_peak, p["update_loss_gib"]), p["log_prob_gib"])
