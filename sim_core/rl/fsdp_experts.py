"""FSDP's all-gathers of an MoE model's experts, per micro-batch: what the ZeRO-3 frame leaves out.

Why a module of its own: the pre-training step's ZeRO-3 inventory (sim_core/workload.py, the
"dp" comms) gathers the *dense* parameters in every micro-batch's forward and backward and
treats the routed experts as Megatron does: expert-parallel, replicated over the
expert-data-parallel group, their gradients reduce-scattered once per step and their weights
never gathered. An FSDP trainer that runs the Hugging Face model at EP 1 shards the experts
like every other weight: PyTorch's `fully_shard` per decoder layer (SkyRL a9564572
`distributed/fsdp_strategy.py`, verl `fsdp_workers.py` with FSDP2, NeMo RL v0.3.0
`models/dtensor/parallelize.py`) all-gathers the whole layer, experts included, before its
forward and again before its backward (`reshard_after_forward=True`), in every micro-batch,
and reduce-scatters all its gradients after the backward.

What this adds, per micro-batch, from the NCCL model (`nccl.collective_time`, bf16 weights
under FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16)):

* the experts' bf16 all-gather over the FSDP group: once per forward-only micro-batch, twice per
  training micro-batch (forward, backward; a checkpoint replay runs under the backward's
  unshard, no third gather);
* exposed as FSDP2 overlaps it: the all-gather of layer l+1 runs on its own stream during
  layer l's compute (`FSDPParamGroup` implicit forward prefetch and backward prefetch, torch
  `_fully_shard/_fsdp_param_group.py`), so a micro-batch's gathers hide behind its compute up
  to its length, and the first layer's gather is never hidden. The step already exposes the
  dense gathers that way (step.py ZeRO-2/3 overlap), so what is added is
  max(all gathers - compute, 0) - max(dense gathers - compute, 0) + the experts' share of the
  first layer's gather.
* The experts' gradient reduce-scatter is in the step once per step (over the expert-data-
  parallel group, which at EP 1 is the FSDP group); SkyRL's accumulating micro-batches pay the
  whole model's reduce-scatter serially already (skyrl.py rule 2b). Other micro-batches'
  reduce-scatters overlap the backward and are not added.

Zero at EP > 1 and wherever `hf_moe.path` is zero (dense models, Megatron-Core trainers).
"""

from __future__ import annotations

import numpy as np

from .. import nccl
from . import hf_moe, inputs
from .inputs import train_col

PARAM_BYTES = 2.0   # bf16 (MixedPrecisionPolicy param_dtype)


def _all_gather(b, params, dp) -> np.ndarray:
    """One bf16 all-gather of `params` parameters over the FSDP group of `dp` ranks."""
    net = {k: np.asarray(v) for k, v in inputs.network(b).items()}
    nodes = np.ceil(dp / np.maximum(b.gpus_per_node, 1.0))
    return nccl.collective_time("all_gather", np.maximum(params, 0.0) * PARAM_BYTES,
                                np.maximum(dp, 1.0), np.maximum(nodes, 1.0), net)["time_s"]


def pass_seconds(b, tf, sim, n_mb, forward_only, compute_scale=1.0) -> np.ndarray:
    """Seconds the experts' gathers add to a pass of `n_mb` micro-batches priced on `sim`
    (its compute per micro-batch, times `compute_scale` where the pass's micro-batches hold
    other tokens than the frame's, is what hides them)."""
    on = (hf_moe.path(b, tf) > 0) & (train_col(tf, "ep") <= 1)
    zero = np.zeros(len(tf))
    if not on.any():
        return zero
    dp = sim["dp"].to_numpy(float)
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    ag_exp = _all_gather(b, b.routed_params, dp)
    ag_dense = _all_gather(b, b.dense_params, dp)
    n_g = np.where(forward_only, 1.0, 2.0)
    comp = sim["time_compute"].to_numpy() + np.where(forward_only, 0.0,
                                                     sim["time_recompute"].to_numpy())
    c = np.where(forward_only, comp / 3.0, comp) / m * np.asarray(compute_scale, dtype=float)
    added = (np.maximum(n_g * (ag_exp + ag_dense) - c, 0.0)
             - np.maximum(n_g * ag_dense - c, 0.0)
             + n_g * ag_exp / np.maximum(b.layers, 1.0))
    return np.where(on, np.asarray(n_mb, dtype=float) * added, zero)
