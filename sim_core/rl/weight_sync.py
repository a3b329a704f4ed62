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
from . import alltoallv_reshard, megatron_gather, slime_refit
from .inputs import RL_FRAMEWORK, network
from .training import pcie_bytes_per_s

GIB = 2.0 ** 30


def sync_time(b: Batch, train_tp, train_pp, train_dp_shard, train_ep=None,
              train_gpus=None, train_etp=None) -> dict:
    """Seconds of one refit. train_dp_shard: the data-parallel ranks the weights are sharded
    over (ZeRO-3 / FSDP; 1 otherwise).

    Megatron layouts (weights not sharded over data parallelism) gather in the order of their
    framework's code (`megatron_gather.py`): NeMo RL v0.3.0 `gather_params` all-gathers each
    key over TP on its owner stage, then broadcasts the full tensor over PP (every rank ends
    with the whole model) and all-gathers routed experts over EP; verl's
    `per_tensor_generator` broadcasts the owner's TP shard over PP, then all-gathers over TP on
    every rank. NeMo RL's colocated path also converts and packs the whole model on every rank
    (device copies). Sharded weights (FSDP / ZeRO-3, NeMo RL DTensor): one all-gather over TP x
    shards."""
    net = network(b)
    full = b.params * 2.0  # bf16 bytes of the model
    n = np.shape(b.params)
    ep = np.ones(n) if train_ep is None else np.maximum(np.asarray(train_ep, float), 1.0)
    tg = b.train_gpus if train_gpus is None else train_gpus
    group = train_tp * train_pp * train_dp_shard
    nodes = np.maximum(np.ceil(group / b.gpus_per_node), 1.0)
    # NeMo RL's DTensor worker holds fp32 parameters (v0.3.0 dtensor_policy_worker.py: "Always
    # load the model in float32 to keep master weights in float32") and gathers them as they
    # are (`full_tensor()`), casting to bf16 after the gather (`.to(self.dtype)`): 4 B each
    nemo_fp32 = b.rl_framework == RL_FRAMEWORK.index("nemo_rl")
    flat = nccl.collective_time("all_gather", np.where(nemo_fp32, 2.0 * full, full), group,
                                nodes, net)["time_s"]
    # ETP not stated (0 / NaN): Megatron's default, the TP size (megatron/core/parallel_state.py
    # initialize_model_parallel: `if expert_tensor_parallel_size is None: ... =
    # tensor_model_parallel_size`)
    etp = np.zeros(n) if train_etp is None else np.nan_to_num(np.asarray(train_etp, float),
                                                              nan=0.0)
    etp = np.where(etp >= 1, etp, train_tp * np.ones(n))
    megatron = np.asarray(train_dp_shard, float) * np.ones(n) <= 1
    verl = b.rl_framework == RL_FRAMEWORK.index("verl")
    nemo_colo = (b.rl_framework == RL_FRAMEWORK.index("nemo_rl")) & (b.placement == 0)
    mg = megatron_gather.gather_time(b, train_tp * np.ones(n), train_pp * np.ones(n), ep,
                                     etp, tg * np.ones(n), net, verl, nemo_colo & megatron)
    gather = np.where(megatron, mg["gather_s"], flat)
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
    # slime / miles colocated out of a Megatron layout: its own walk (slime_refit.py), from the
    # host copy of the weights, in buckets through Gloo, Ray and CUDA IPC into SGLang
    slime = ((b.rl_framework == RL_FRAMEWORK.index("slime")) & (b.placement == 0) & megatron)
    if slime.any():
        sr = slime_refit.update_time(b, train_tp * np.ones(n), train_pp * np.ones(n), ep, etp,
                                     tg * np.ones(n), net, pcie_bytes_per_s(b))
        gather = np.where(slime, sr["slime_update_s"], gather)
    # cann-recipes-train's reshard (TP then PP for most keys, an AlltoAllV for the routed
    # experts: alltoallv_reshard.py), on the rows that run it (`refit_alltoallv`)
    a2av = alltoallv_reshard.active(b) & megatron
    if a2av.any():
        ar = alltoallv_reshard.reshard_time(b, train_tp * np.ones(n), train_pp * np.ones(n),
                                            ep, np.maximum(b.rollout_ep, 1.0),
                                            tg * np.ones(n), net)
        gather = np.where(a2av, ar["reshard_s"], gather)
    return {"weight_sync_time_s": gather + transfer + load, "sync_gather_s": gather,
            "sync_transfer_s": transfer, "sync_load_s": load,
            "sync_copy_s": np.where(megatron, mg["copy_s"], 0.0),
            "sync_verl_key_host_s": np.where(megatron, mg["verl_key_host_s"], 0.0),
            "sync_verl_keys": np.where(megatron, mg["verl_keys"], 0.0),
            "sync_pp_bcast_bytes": np.where(megatron, mg["pp_bcast_bytes"], 0.0),
            "sync_tp_gather_bytes": np.where(megatron, mg["tp_gather_bytes"], 0.0)}
