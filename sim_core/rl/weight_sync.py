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
from .inputs import RL_FRAMEWORK, network

GIB = 2.0 ** 30


def _pp_nodes(b: Batch, train_pp, stride):
    """Nodes a pipeline group spans: its ranks are `stride` apart (Megatron's rank order puts
    TP, CP, EP and DP inside a stage)."""
    per_node = np.maximum(np.floor(b.gpus_per_node / np.maximum(stride, 1.0)), 1.0)
    return np.clip(np.ceil(train_pp / per_node), 1.0, train_pp)


def sync_time(b: Batch, train_tp, train_pp, train_dp_shard, train_ep=None,
              train_gpus=None) -> dict:
    """Seconds of one refit. train_dp_shard: the data-parallel ranks the weights are sharded
    over (ZeRO-3 / FSDP; 1 otherwise).

    With pipeline stages (Megatron), the gather follows NeMo RL v0.3.0
    `nemo_rl/models/megatron/refit_utils.py gather_params`: each tensor is all-gathered over
    TP inside its owner stage, then the full tensor is **broadcast over the PP group** (every
    rank ends with the whole model, whichever stage it trains), then routed-expert tensors are
    all-gathered over EP. So every GPU receives the full bf16 model; the PP broadcast crosses
    nodes when a stage fills a node. Without PP or EP this is the all-gather over TP x shards."""
    net = network(b)
    full = b.params * 2.0  # bf16 bytes of the model
    n = np.shape(b.params)
    ep = np.ones(n) if train_ep is None else np.maximum(np.asarray(train_ep, float), 1.0)
    tg = b.train_gpus if train_gpus is None else train_gpus
    group = train_tp * train_pp * train_dp_shard
    nodes = np.maximum(np.ceil(group / b.gpus_per_node), 1.0)
    flat = nccl.collective_time("all_gather", full, group, nodes, net)["time_s"]
    # per-stage TP gather (within a stage, its 1/pp of the model), then the PP broadcast of
    # the full model, then the EP all-gather of the routed experts
    stage = full / train_pp
    tp_nodes = np.maximum(np.ceil(train_tp / b.gpus_per_node), 1.0)
    tp_g = nccl.collective_time("all_gather", stage, train_tp, tp_nodes, net)["time_s"]
    stride = np.maximum(tg / np.maximum(train_pp, 1.0), 1.0)
    pp_b = nccl.collective_time("broadcast", full, train_pp, _pp_nodes(b, train_pp, stride),
                                net)["time_s"]
    ep_nodes = np.maximum(np.ceil(ep * train_tp / b.gpus_per_node), 1.0)
    ep_g = nccl.collective_time("all_gather", b.routed_params * 2.0, ep, ep_nodes,
                                net)["time_s"]
    staged = np.where(train_pp > 1, tp_g + pp_b, flat) + np.where(ep > 1, ep_g, 0.0)
    gather = np.where((train_pp > 1) | (ep > 1), staged, flat)
    # the engine's shard copied into place (IPC or NCCL receive buffer -> weights), read + write
    shard = full * np.where(b.rollout_precision == 1, 0.5, 1.0) / (b.rollout_tp * b.rollout_pp)
    load = 2 * shard / (b.hbm_bw_gbs * 1e9)
    split = b.placement == 1
    # verl: rank 0 of the actor and the rollout GPUs. NeMo RL non-colocated: one NCCL group of
    # every training and every inference GPU (NVIDIA-NeMo/RL v0.7.0 nemo_rl/algorithms/grpo.py
    # `world_size = train_world_size + inference_world_size` -> init_collective), into which
    # every training worker runs `packed_broadcast_producer(..., src=0)`
    # (models/policy/workers/megatron_policy_worker.py broadcast_weights_for_collective;
    # utils/packed_tensor.py: the full bf16 tensors packed into buffers of 2% of the GPU's
    # memory, at most 5 GiB, two in flight), the engines `packed_broadcast_consumer`
    nemo = b.rl_framework == RL_FRAMEWORK.index("nemo_rl")
    members = np.where(nemo, b.num_gpus, b.rollout_gpus + 1)
    # (the actor's rank 0 on a node of its own, unless the whole job fits in fewer nodes)
    all_nodes = np.ceil(b.num_gpus / b.gpus_per_node)
    r_nodes = np.where(nemo, all_nodes,
                       np.minimum(np.ceil(b.rollout_gpus / b.gpus_per_node) + 1, all_nodes))
    bcast = nccl.collective_time("broadcast", full, members, r_nodes, net)["time_s"]
    transfer = np.where(split, bcast, 0.0)
    return {"weight_sync_time_s": gather + transfer + load, "sync_gather_s": gather,
            "sync_transfer_s": transfer, "sync_load_s": load}
