"""What verl's Megatron workers run around their training phases beyond the pre-training step.

`training.py` prices the log-prob passes and the update through the pre-training simulator;
`phases.py` prices the one round trip of the offloaded training states around generation
(colocated). verl's Megatron worker (volcengine/verl v0.7.0 `verl/workers/megatron_workers.py`)
moves the offloaded parameters once more in every training phase, inside the phase's timer:

- `compute_log_prob` (old log-probs): `load_megatron_model_to_gpu(actor_module,
  load_grad=False)` before the pass, `offload_megatron_model_to_cpu(actor_module)` after it,
  when `actor.megatron.param_offload`;
- `update_actor`: the same load (its gradient buffer is only re-allocated and zeroed, no copy)
  and offload around `update_policy` (the optimizer's round trip, `optimizer_offload`, is the
  one phases.py already prices);
- `compute_ref_log_prob`: the reference model's load and offload when
  `ref.megatron.param_offload` (`ref_offload`).

How the bytes move (`verl/utils/megatron_utils.py` v0.7.0): the actor's DDP parameter buffers
(bf16, the model-parallel rank's parameters: "bf16 parameter data chunked in model parallel
group") come back with `param_data.copy_(param_data.cpu_data, non_blocking=True)` from pinned
host memory, and leave with `param_data.data.cpu().pin_memory()`: a copy into pageable memory
(catalogs/rl.yaml `pageable_slowdown`), then a host-to-host copy into pinned memory that is not
priced (host memory bandwidth is in no catalog). The reference module is not DDP-wrapped: its
parameters go with `param.data.to("cpu", non_blocking=True)` (pinned: PyTorch pins the
destination of a non-blocking device-to-host `to`) and come back with `.to(device,
non_blocking=True)`, both at the pinned PCIe rate. Each load and offload also runs
`gc.collect()` and `empty_cache()`, not priced.

The training phases' allocator (`expandable_segments`): colocated, verl's hybrid-engine worker
switches into `trainer_mode` after every generation (`generate_sequences`, and `sleep` of the
async worker), which calls `set_expandable_segments(True)` (megatron_workers.py v0.7.0 L716;
`verl/utils/device.py`: `torch.cuda.memory._set_allocator_settings("expandable_segments:True")`),
and back to False for rollout. With expandable segments PyTorch's caching allocator maps
physical memory page by page into a virtual segment that grows, and before reporting an OOM
releases the pages of cached free blocks, which the growing segment can map again (PyTorch
`docs/source/notes/cuda.rst`, "expandable_segments"; c10/cuda/CUDACachingAllocator.cpp
`ExpandableSegment`): a cached block of the wrong size no longer blocks an allocation, so what
decides an OOM is the bytes allocated, not the bytes the default allocator reserves
(`sim_core/memory.py`'s FRAGMENTATION and loss segments).
The training peak of these rows is `peak_allocated_gib` + the CUDA context and NCCL buffers.
The split (fully-async) trainer never enters `trainer_mode` and keeps the default allocator.

Only for `rl_framework: verl` with a Megatron trainer (ZeRO below 3); verl's FSDP workers are
priced elsewhere.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..memory import RUNTIME_GIB
from .inputs import RL_FRAMEWORK, constants, fsdp


def phase_moves(b, tf: pd.DataFrame, sim: pd.DataFrame, pcie_bytes_per_s: np.ndarray) -> dict:
    """Seconds per RL step the per-phase parameter moves add: `log_prob_s` (old log-prob
    pass), `update_s` (the update) and `ref_s` (reference pass). Zero where they do not
    apply."""
    on = (b.rl_framework == RL_FRAMEWORK.index("verl")) & ~fsdp(tf)  # NaN: not FSDP
    weights = sim["params_per_gpu"].to_numpy(float) * 2.0  # bf16 parameter buffers
    slow = float(constants().get("pageable_slowdown", 1.0))
    # load from pinned memory, offload through pageable memory
    actor_trip = weights / pcie_bytes_per_s * (1.0 + slow)
    ref_trip = 2.0 * weights / pcie_bytes_per_s
    actor = np.where(on & (b.offload_params > 0), actor_trip, 0.0)
    return {
        "log_prob_s": actor,
        "update_s": actor,
        "ref_s": np.where(on & (b.ref_offload > 0) & (b.use_ref > 0), ref_trip, 0.0),
    }


def training_peak_gib(b, tf: pd.DataFrame, sim: pd.DataFrame) -> np.ndarray:
    """The simulator's device peak (GiB), with verl's expandable segments where they apply:
    colocated verl Megatron rows count the bytes allocated (+ context and NCCL buffers),
    every other row the caching allocator's reserved bytes (`peak_memory_gib`)."""
    on = expandable_segments(b, tf)
    return np.where(on, sim["peak_allocated_gib"].to_numpy() + RUNTIME_GIB,
                    sim["peak_memory_gib"].to_numpy())


def expandable_segments(b, tf: pd.DataFrame) -> np.ndarray:
    """Rows whose training phases run with `expandable_segments:True` (module doc): verl,
    Megatron trainer, colocated (hybrid engine)."""
    return (b.rl_framework == RL_FRAMEWORK.index("verl")) & ~fsdp(tf) & (b.placement == 0)
