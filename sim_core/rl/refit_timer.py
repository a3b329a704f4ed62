"""What NeMo RL's refit timer encloses: the seconds a published "refit" figure should be held to.

`weight_sync.py` and `refit_host.py` price the weights' transfer (`weight_sync_time_s`), and
`phases.py` / `step_fixed.py` the moves and calls around it. A table's "refit" column is a
framework timer, and NeMo RL's holds more than the transfer. At v0.3.0 (NVIDIA-NeMo/RL tag
v0.3.0, `nemo_rl/algorithms/grpo.py` `grpo_train`) the step's timers are `data_processing`,
`prepare_for_generation`, `generation`, `reward_calculation`, `logprob_inference_prep`,
`policy_and_reference_logprobs`, `training_prep` and `policy_training`; only
`prepare_for_generation` holds the refit: it calls `refit_policy_generation` (when the engine
is stale, every step), which, colocated, runs in order:

1. `policy.offload_before_refit()`: the trainer's gradient buffers freed and the optimizer's
   state tensors moved to the host one by one with `v.to("cpu")` (pageable host memory), then
   `gc.collect()` + `torch.cuda.empty_cache()`. Megatron (`megatron_policy_worker.py`):
   `optimizer._get_state()` is the inner Adam's `state` (Megatron-LM
   megatron/core/optimizer/optimizer.py `_get_state`). NeMo RL's Megatron recipes set
   `use_precision_aware_optimizer: true` (examples/configs/grpo_math_1B_megatron.yaml, which
   every Megatron recipe inherits, v0.3.0 to main), under which the distributed optimizer
   keeps no fp32 main copy of its own (distrib_optimizer.py `if not
   config.use_precision_aware_optimizer`, Megatron-LM 2ff0f099) and the inner Adam is TE's
   FusedAdam with `master_weights` and `store_param_remainders` (optimizer/__init__.py,
   optimizer_config.py: default True from TE 2.1; NeMo RL v0.3.0 pins TE 2.3): its `state`
   holds the moments (4 + 4 B) and the 16-bit remainders of the fp32 main parameters (2 B),
   so the whole optimizer leaves the GPU. DTensor (`dtensor_policy_worker.py`): AdamW's
   state likewise;
2. `policy_generation.prepare_for_generation(tags=["weights"])`: vLLM's `wake_up` of the
   weights (mapped back and copied in from pinned host memory);
3. the transfer, group by group (`prepare_weights_for_ipc`, `get_weights_ipc_handles`,
   `update_weights_from_ipc_handles`): `weight_sync_time_s`;
4. `policy.offload_after_refit()`: the model moved to the host (Megatron `move_model` ->
   `param_and_grad_buffer.offload_to_cpu`, a pinned `param_data_cpu` of the bf16 weights,
   Megatron-LM 2ff0f099, NeMo RL v0.3.0's submodule; DTensor `move_to_cpu` ->
   `model.to("cpu")`, the fp32 parameters into pageable memory), `offload_before_refit` again
   (the states are already on the host), the cleaning calls (`step_fixed.py` counts them);
5. `policy_generation.prepare_for_generation(tags=["kv_cache"])`: vLLM's `wake_up` of the KV
   cache (re-mapped, nothing copied).

So the timer = weight sync + the engine's wake (its weights' bytes and the fixed part of the
wake, `step_fixed.wake_fixed_s`) + one direction of the trainer's offload (optimizer moments
out, pageable; the weights out: Megatron pinned bf16, DTensor pageable fp32) + the cleaning
around the refit (`step_fixed.py` refit side). The return trips (weights and optimizer back to
the GPU) run in `logprob_inference_prep` / `training_prep` and the engine's sleep in
`generation` (`finish_generation`): not in this timer. Bytes at the simulator's PCIe rate,
pageable ones slowed by `catalogs/rl.yaml pageable_slowdown`, as `phases.py` moves them.

Byte split by backend, against the simulator's training states (`training.py`:
`train_weights_gib` bf16, `train_optimizer_gib` 12 B per parameter = fp32 main copy + two
moments): Megatron's offload moves 10 B (`PRECISION_AWARE_SHARE` of the 12: the moments and
the main parameters' remainders; the simulator's 12 B count is 2 B high for this optimizer,
and those 2 B stay counted as resident) pageable and the bf16 weights pinned; DTensor's
moves the fp32 parameters (the model is loaded in float32, `dtensor_policy_worker.py`
"Always load the model in float32 to keep master weights in float32", mixed precision casts
to bf16 per forward) and the moments, the whole 12 B, pageable, and has no separate bf16
copy.

The step itself is not recomposed here (`phases.py` composes it from the same parts, both
directions); this module only says which of them a NeMo RL "refit" timer holds, so that
`sweep validate --rl` compares like with like (`refit_timer_s`). Other frameworks' rows (and
split NeMo RL rows, where the refit is an NCCL broadcast with no offload) keep
`weight_sync_time_s`.
"""

from __future__ import annotations

import numpy as np

from . import step_fixed
from .inputs import RL_FRAMEWORK, constants

NEMO_RL = RL_FRAMEWORK.index("nemo_rl")
GIB = 2.0 ** 30
# what NeMo RL's Megatron offload moves of the simulator's 12 B per parameter (fp32 main 4 +
# moments 8): TE FusedAdam's state under the precision-aware optimizer, exp_avg and exp_avg_sq
# (4 + 4 B) and the int16 remainders of the fp32 main parameters (2 B) (module docstring)
PRECISION_AWARE_SHARE = 10.0 / 12.0


def optimizer_moved_share(b, fsdp) -> np.ndarray:
    """The share of the simulator's optimizer states (`train_optimizer_gib`, 12 B per
    parameter) a run's offload moves to the host: NeMo RL's Megatron worker moves the inner
    Adam's `state`, which under its recipes' precision-aware optimizer is the moments and the
    main parameters' 16-bit remainders, 10 B (module docstring, item 1); everything else here
    moves the whole (NeMo RL DTensor: fp32 parameters and moments, the same 12 B)."""
    n = len(b.placement)
    fsdp = np.asarray(fsdp, bool) * np.ones(n, bool)
    return np.where((b.rl_framework == NEMO_RL) & ~fsdp, PRECISION_AWARE_SHARE, 1.0)


def timer(b, fsdp, sync, wake_bytes_s, train_weights_gib, train_optimizer_gib,
          optimizer_moves, pcie_bytes_per_s, refit_side_s) -> dict:
    """Per row, what NeMo RL's `prepare_for_generation` timer holds (module docstring).

    `sync`: the priced weight sync (s); `wake_bytes_s`: the engine's weights brought back
    by its wake-up (s, phases.py: vLLM at step_fixed.wake_bytes_per_s); `fsdp`: the
    training side is DTensor / FSDP, else Megatron; `optimizer_moves`: 1 where the optimizer
    leaves the GPU around generation (training.py `gen_optimizer_moves`); `refit_side_s`:
    step_fixed.py's cleaning around the refit. Returns `refit_timer_s` (weight sync
    elsewhere) and its parts: `refit_wake_s` (the engine's wake, bytes + fixed),
    `refit_offload_s` (the trainer's states out)."""
    sync = np.asarray(sync, dtype=float)
    n = len(sync)
    fsdp = np.asarray(fsdp, bool) * np.ones(n, bool)
    nemo_colo = (b.placement == 0) & (b.rl_framework == NEMO_RL)
    vllm = b.rollout_engine == 0
    slow = float(constants().get("pageable_slowdown", 1.0))
    opt = b.offload_optimizer * np.asarray(train_optimizer_gib, float) * optimizer_moves
    w = b.offload_params * np.asarray(train_weights_gib, float)
    # Megatron: the moments pageable, the bf16 weights pinned; DTensor: fp32 weights and the
    # moments (the simulator's 12 B) pageable
    pageable = optimizer_moved_share(b, fsdp) * opt
    pinned = np.where(fsdp, 0.0, w)
    offload = (pinned + pageable * slow) * GIB / pcie_bytes_per_s
    wake = (np.asarray(wake_bytes_s, float)
            + np.where(vllm, step_fixed.wake_fixed_s(), 0.0))
    extra = np.where(nemo_colo, wake + offload + refit_side_s, 0.0)
    return {"refit_timer_s": sync + extra,
            "refit_wake_s": np.where(nemo_colo, wake, 0.0),
            "refit_offload_s": np.where(nemo_colo, offload, 0.0)}
