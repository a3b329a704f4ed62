"""What slime's (and miles') Megatron actor adds around its log-prob and training passes.

Read at THUDM/slime 05370bf9 `slime/backends/megatron_utils/actor.py` (`train_actor`) and
`slime/utils/tensor_backper.py`. slime keeps host copies of the weights (`TensorBackuper`:
pinned `torch.empty_like(..., pin_memory=True)`, `copy_(non_blocking=True)` both ways) and
switches the one Megatron model between them: with a reference model (`--ref-load`, loaded
when `use_kl_loss` or `kl_coef != 0`), `train_actor` restores the "ref" copy
(`_switch_model("ref")`, every parameter host -> device), runs the reference log-prob pass,
then restores "actor" (`_switch_model("actor")`) before the actor's passes: two host -> device
copies of the rank's weights per RL step, on the critical path, at the PCIe rate
(`training.pcie_bytes_per_s`). Present since slime 8bf7d35f (2025-12-07, PR #1038).

Checked and already priced elsewhere (not added here):
- the wake-up restore of "actor" and the `backup("actor")` after training: the colocated
  offload's two weight moves in `phases.py` (`offload_params`: torch_memory_saver's pause
  frees the weights, the restore brings them back);
- `--optimizer-cpu-offload` (Megatron's HybridDeviceOptimizer: gradients D2H, host Adam,
  parameters H2D, overlapped by group): `training.py`'s `host_step`;
- `--recompute-granularity full`, `--use-dynamic-batch-size` / `--max-tokens-per-gpu`
  (packed micro-batches of at most that many tokens): the Megatron step's recompute and the
  row's `train_seq_len` / `sequence_packing`;
- the weight update's host -> device copy from the "actor" copy: `slime_refit.py`.
The actor's log-prob pass skipped (`reuse_log_probs`): from slime bf9b1a3b (2026-05-09, PR
#1897) `train_actor` leaves out the old policy's forward when the loss can take the log-probs
of the training forward itself (`can_reuse_log_probs_in_loss`, actor.py at 44d29ee L477-L491):
one optimizer step takes the whole rollout (`len(num_microbatches) == 1`: global batch =
rollout batch x samples), `loss_type == "policy_loss"` (the default), `kl_coef == 0` (the
reward KL; the KL *loss* keeps its reference pass), no critic, no rollout log-probs, no
mismatch metrics, no routing replay, not GSPO. Applied only where a row says its code has it
(column `reuse_log_probs`; the reader sets it for vime rows: vllm-project/vime's main is a
snapshot of slime 44d29ee, 2026-06-04, SLIME_GAP_ANALYSIS.md at 53a5cb64, and keeps the rule:
vime/backends/megatron_utils/actor.py `train_actor`), not for the slime / miles rows, measured
before bf9b1a3b (05370bf9).
"""

from __future__ import annotations

import numpy as np

from .inputs import RL_FRAMEWORK


def ref_swap_seconds(b, weights_gib, pcie_bytes_per_s) -> np.ndarray:
    """Seconds of the two weight restores around slime's reference pass (module docstring),
    per RL step, for slime rows with a reference model; zero elsewhere. weights_gib: the
    rank's training weights (GiB)."""
    on = (b.rl_framework == RL_FRAMEWORK.index("slime")) & (b.use_ref > 0)
    return np.where(on, 2.0 * weights_gib * 2.0 ** 30 / pcie_bytes_per_s, 0.0)


def reuses_log_probs(b) -> np.ndarray:
    """Rows whose actor log-prob pass slime's `can_reuse_log_probs_in_loss` removes (module
    docstring): the row's code has the rule (`reuse_log_probs`), one optimizer step per
    rollout (mini_batches x ppo_epochs == 1), no critic (not PPO), old log-probs not taken
    from the rollout engine. (kl_coef, the reward KL, is not a column: every such row states
    or defaults to slime's 0.00.)"""
    reuse = b.reuse_log_probs if "reuse_log_probs" in b else np.zeros(len(b.algorithm))
    one_step = np.nan_to_num(b.mini_batches * b.ppo_epochs, nan=1.0) == 1
    return (np.nan_to_num(reuse) > 0) & one_step & (b.algorithm != 2) \
        & ~(b.use_rollout_log_probs > 0)
