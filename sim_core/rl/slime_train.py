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
Not applied: at 05370bf9 `train_actor` skips the actor's log-prob pass when one optimizer
step uses the whole rollout with `kl_coef == 0` (`can_reuse_log_probs_in_loss`), but that
arrived in slime bf9b1a3b (2026-05-09), after the rows' measurements; nothing tells whether a
row's fork had it.
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
