"""The per-step work of an RL step that does not scale with the model.

A colocated step does more than generate, score and train: the engine goes to sleep and wakes
up around every generation, and the trainer's workers move their states and clean their
allocators between phases. The bytes of those moves are priced by `phases.py`
(`offload_time_s`, at PCIe rate; the engine's wake at the rate the blog below measured,
`wake_bytes_per_s`); what this module prices is the rest, which costs about the same for a
0.5B as for a 70B model and so weighs most on small-model steps:

1. **The engine's sleep and wake-up, beyond the bytes** (colocated vLLM). vLLM's level-1 sleep
   (vllm/device_allocator/cumem.py `CuMemAllocator.sleep`) backs the `weights` allocations up
   to pinned host memory, unmaps and releases every allocation, the KV cache's included, and
   runs `gc.collect()` and `torch.cuda.empty_cache()`; `wake_up` re-creates and maps every
   allocation and copies the weights back. NeMo RL calls them every step
   (`vllm_worker.py` `sleep` from `finish_generation`, `wake_up(tags=["weights"])` then
   `wake_up(tags=["kv_cache"])` from `refit_policy_generation`, v0.3.1 to 29f58809), and so
   does verl's rollout sharding manager (`fsdp_vllm.py` / `megatron_vllm.py` `__enter__`
   wake_up, `__exit__` sleep(level=1), v0.4.1 and v0.5.0, with `free_cache_engine` on).
   Priced from the vLLM blog's measured sleep and wake of two models of different size
   (catalogs/rl.yaml `step_fixed`): the fixed part of a line through them.
2. **The trainer workers' allocator cleaning.** Full `gc.collect()` passes and
   `torch.cuda.empty_cache()` calls the frameworks make around the phases, counted in their
   code (below), each at the cost huggingface/peft PR 2894 measured in a PyTorch training
   process (catalogs/rl.yaml `step_fixed`). All workers run them in parallel: the count on one
   worker is the critical path.

What is not priced (no published per-call figure found): SGLang's
`release_memory_occupation` / `resume_memory_occupation` (torch_memory_saver) that NeMo RL's
SGLang backend and slime call instead of vLLM's sleep; the extra `gc.collect()` +
`empty_cache()` NeMo RL's vLLM worker runs after `LLM.sleep` (in the engine's process, whose
collections the blog's 0.09 s sleep bounds well below the trainer's); Ray's dispatch of each
worker-group call (verl's: `verl_calls.py`); NeMo RL's math environment (math-verify in Ray
workers: inside the
`generation` timer, as the table's generation column is); verl's reward and advantage
(`timing_s/reward`, `timing_s/adv`, on the driver: `verl_driver.py`); SkyRL's and slime's own
calls.
"""

from __future__ import annotations

import numpy as np

from . import refit_host
from .inputs import RL_FRAMEWORK, constants

NEMO_RL = RL_FRAMEWORK.index("nemo_rl")
VERL = RL_FRAMEWORK.index("verl")

# (gc.collect, empty_cache) calls per step on one training worker, read in the code.
#
# NeMo RL DTensor workers (dtensor_policy_worker.py and _v2.py at v0.5.0 and 29f58809, the same
# in both): `offload_before_refit` 1 + 1; `offload_after_refit` = `move_to_cpu` (1 + 1) and
# `offload_before_refit` again (1 + 1) -> refit side 3 + 3, colocated only (grpo.py
# `refit_policy_generation` calls them when `colocated_inference`).
# `prepare_for_lp_inference` = `move_to_cuda` (1 + 1) and its own 1 + 1; `prepare_for_training`
# = `move_to_cuda` (1 + 1) and one more empty_cache -> phase side 3 + 4, every placement (grpo.py
# calls both every step).
NEMO_DTENSOR_REFIT = (3, 3)
# Before the streamed refit (v0.2.1 to v0.3.1, the controller path: refit_host.streams False)
# the refit side cleans more (dtensor_policy_worker.py at v0.3.0, the same at v0.2.1 and
# v0.3.1): `offload_before_refit` 1 + 1, `prepare_weights_for_ipc` calls `move_to_cuda` (1 + 1),
# `offload_after_refit` = `move_to_cpu` (1 + 1), `offload_before_refit` again (1 + 1) and its
# own closing pair (1 + 1) -> 5 + 5. The phase side is the same as now (3 + 4).
NEMO_DTENSOR_REFIT_V03 = (5, 5)
NEMO_DTENSOR_PHASES = (3, 4)
# NeMo RL Megatron worker (megatron_policy_worker.py at 29f58809): `offload_before_refit` 1 + 1,
# `offload_after_refit` calls it again -> 2 + 2; `prepare_for_lp_inference` 1 + 1,
# `prepare_for_training` one empty_cache at `empty_unused_memory_level` >= 1 (the recipes'
# default 1, grpo_math_1B_megatron.yaml) -> 1 + 2.
NEMO_MEGATRON_REFIT = (2, 2)
# v0.3.0 / v0.3.1 (megatron_policy_worker.py): `offload_after_refit` also ends with its own
# `gc.collect()` + `empty_cache()` after rerunning `offload_before_refit` -> 3 + 3; the phase
# side is the same (`prepare_for_lp_inference` 1 + 1, `prepare_for_training` one empty_cache).
NEMO_MEGATRON_REFIT_V03 = (3, 3)
NEMO_MEGATRON_PHASES = (1, 2)
# verl (v0.4.1 and v0.5.0): the rollout sharding manager's `__enter__` empties the cache before
# the state_dict and again between the two wake-ups, `__exit__` once after the sleep, and the
# worker's `generate_sequences` once more (fsdp_workers.py / megatron_workers.py) -> 0 + 4,
# colocated. The Megatron workers also empty it at the end of `compute_log_prob`,
# `compute_ref_log_prob` and `update_actor` (megatron_workers.py v0.5.0); the FSDP workers do
# not.
VERL_ROLLOUT = (0, 4)
# NeMo RL's streamed refit (v0.4.0 on, refit_host.streams): both ends of the stream clean once
# more when it ends, concurrently (v0.5.0 policy/utils.py stream_weights_via_ipc_zmq_impl
# `finally: gc.collect(); torch.cuda.empty_cache()`; vllm_backend.py update_weights_via_ipc_zmq
# the same after its last ACK, before the call the driver waits on returns) -> one pair on the
# refit's path, colocated vLLM (SGLang's HTTP stream was not read for it)
NEMO_STREAM_REFIT = (1, 1)


def _intercept(small: str, large: str) -> float:
    """The fixed part of a sleep-mode call: the intercept of the line through the blog's two
    models (the slope is the bytes)."""
    k = constants()["step_fixed"]
    gb0, gb1 = k["sleep_mode_small_gb"], k["sleep_mode_large_gb"]
    t0, t1 = k[small], k[large]
    return t0 - gb0 * (t1 - t0) / (gb1 - gb0)


def wake_fixed_s() -> float:
    """Seconds of one vLLM `wake_up` that do not scale with the weights' bytes (NeMo RL calls
    it from `refit_policy_generation`, inside its refit timer: refit_timer.py)."""
    return _intercept("wake_small_s", "wake_large_s")


def sleep_fixed_s() -> float:
    """Seconds of one level-1 `sleep` that do not scale with the weights' bytes (NeMo RL:
    `finish_generation`, inside its generation timer)."""
    return _intercept("sleep_small_s", "sleep_large_s")


# the blog's GPU: A100 (SM 8.0), whose host link catalogs/rl.yaml `pcie_gbs` prices at Gen4
BLOG_SM_ARCH = 80


def wake_bytes_per_s(pcie_bytes_per_s) -> np.ndarray:
    """The rate at which a level-1 `wake_up` brings the weights back, per GPU: the slope of the
    blog's wake line (0.078 s per GB of weights on the A100: 12.8 GB/s, half of the Gen4 link's
    25.6 GB/s that a plain pinned copy gets), carried to other GPUs in proportion to their
    host link (`pcie_gbs`). vLLM's CuMemAllocator.wake_up re-creates, maps and copies each
    allocation in turn (cuMemCreate + cuMemMap + cuMemSetAccess, then a synchronous
    cudaMemcpy from the pinned backup), so the copy does not stream at the link's rate.
    `pcie_bytes_per_s`: the GPU's host link per direction (training.pcie_bytes_per_s)."""
    k = constants()["step_fixed"]
    measured = ((k["sleep_mode_large_gb"] - k["sleep_mode_small_gb"])
                / (k["wake_large_s"] - k["wake_small_s"]))
    link = float(constants()["pcie_gbs"][BLOG_SM_ARCH])
    return np.asarray(pcie_bytes_per_s, float) * measured / link


def sleep_wake_fixed_s() -> float:
    """Seconds of one level-1 sleep plus one wake-up of a vLLM engine that do not scale with the
    weights' bytes: the intercepts of the lines through the blog's two models."""
    return wake_fixed_s() + sleep_fixed_s()


def fixed_time(b, fsdp: np.ndarray) -> dict:
    """Per row: `engine_s`, the fixed part of the engine's sleep and wake (colocated vLLM);
    `refit_side_s`, the trainer's allocator cleaning around the refit and the generation
    (colocated); `phase_side_s`, the cleaning before the log-prob pass and the update (every
    placement, NeMo RL; verl's Megatron workers). `fsdp`: the training side is sharded with
    FSDP / DTensor (ZeRO-3), else Megatron."""
    k = constants()["step_fixed"]
    gc, ec = k["gc_collect_s"], k["empty_cache_s"]
    n = len(b.placement)
    colo = b.placement == 0
    vllm = b.rollout_engine == 0
    nemo = b.rl_framework == NEMO_RL
    verl = b.rl_framework == VERL
    fsdp = np.asarray(fsdp, bool) * np.ones(n, bool)

    def cost(calls):
        return calls[0] * gc + calls[1] * ec

    engine = np.where(colo & vllm & (nemo | verl), sleep_wake_fixed_s(), 0.0)
    # the release decides the counts: the streamed refit (v0.4.0 on, or not stated) cleans as
    # the current code does, plus the stream's closing pair; the controller path (before 0.4) as
    # v0.3.x does
    streams = refit_host.streams(b)
    current = (np.where(fsdp, cost(NEMO_DTENSOR_REFIT), cost(NEMO_MEGATRON_REFIT))
               + np.where(vllm, cost(NEMO_STREAM_REFIT), 0.0))
    v03 = np.where(fsdp, cost(NEMO_DTENSOR_REFIT_V03), cost(NEMO_MEGATRON_REFIT_V03))
    nemo_refit = np.where(streams, current, v03)
    verl_refit = cost(VERL_ROLLOUT)
    refit = np.where(colo & nemo, nemo_refit, np.where(colo & verl & vllm, verl_refit, 0.0))
    nemo_phase = np.where(fsdp, cost(NEMO_DTENSOR_PHASES), cost(NEMO_MEGATRON_PHASES))
    # verl's Megatron workers: one empty_cache after the log-prob pass, the reference's (when
    # there is one) and the update
    verl_phase = np.where(fsdp, 0.0, (2 + (b.use_ref > 0)) * ec)
    phase = np.where(nemo, nemo_phase, np.where(verl, verl_phase, 0.0))
    return {"engine_s": engine, "refit_side_s": refit, "phase_side_s": phase}
