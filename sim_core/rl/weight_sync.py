"""Weight sync (refit): the updated policy from the training layout into the rollout layout.

Two parts, both priced by the NCCL model (`sim_core.nccl`):
- **Gather in the training layout.** Each tensor is gathered across the training model
  parallel group (TP x PP, and the data-parallel shards under ZeRO-3/FSDP) into full tensors
  one by one (verl v0.7.0 `verl/workers/megatron_workers.py` / `verl/utils/megatron_utils.py`
  per-tensor generator `per_tensor_generator`: all-gather over TP, broadcast over PP; NeMo RL
  docs/design-docs/nccl-reshard-refit.md for the resharding path). Bytes: the model's
  parameters in bf16.
- **Transfer into the engine.** Colocated: the rollout engine on the same GPU receives the
  tensors through CUDA IPC handles (verl `verl/workers/rollout/vllm_rollout` `update_weights`;
  NeMo RL `refit_policy_generation` with colocated inference: ZMQ + CUDA IPC), a device copy of
  its own shard at HBM bandwidth (read + write). Split: an NCCL broadcast from a training rank
  to every rollout GPU over a group of rollout GPUs + 1 spanning their nodes (verl
  `recipe/one_step_off_policy` `sync_rollout_weights`: `collective.broadcast` of each tensor
  from actor rank 0; NeMo RL non-colocated refit: `broadcast` in a StatelessProcessGroup).
Then the engine loads its shard (a device copy, counted with the IPC copy).
"""

from __future__ import annotations

import numpy as np

from .. import nccl
from ..columns import Batch

GIB = 2.0 ** 30


def _net(b: Batch) -> dict:
    return {"sm_arch": b.sm_arch, "nvlink_bw_gbs": b.nvlink_bw_gbs, "nvls": b.nvls > 0,
            "mesh_links": b.mesh_links,
            "nic_bw_gbs": b.nic_bw_gbs * b.nics_per_node / b.gpus_per_node,
            "intra_latency_us": b.intra_latency_us, "inter_latency_us": b.inter_latency_us}


def sync_time(b: Batch, train_tp, train_pp, train_dp_shard) -> dict:
    """Seconds of one refit. train_dp_shard: the data-parallel ranks the weights are sharded
    over (ZeRO-3 / FSDP; 1 otherwise)."""
    net = _net(b)
    full = b.params * 2.0  # bf16 bytes of the model
    group = train_tp * train_pp * train_dp_shard
    nodes = np.maximum(np.ceil(group / b.gpus_per_node), 1.0)
    gather = nccl.collective_time("all_gather", full, group, nodes, net)["time_s"]
    # the engine's shard copied into place (IPC or NCCL receive buffer -> weights), read + write
    shard = full * np.where(b.rollout_precision == 1, 0.5, 1.0) / (b.rollout_tp * b.rollout_pp)
    load = 2 * shard / (b.hbm_bw_gbs * 1e9)
    split = b.placement == 1
    r_nodes = np.ceil(b.rollout_gpus / b.gpus_per_node) + 1
    bcast = nccl.collective_time("broadcast", full, b.rollout_gpus + 1, r_nodes, net)["time_s"]
    transfer = np.where(split, bcast, 0.0)
    return {"weight_sync_time_s": gather + transfer + load, "sync_gather_s": gather,
            "sync_transfer_s": transfer, "sync_load_s": load}
