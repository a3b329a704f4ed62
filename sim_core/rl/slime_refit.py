"""slime's (and miles') colocated weight update, priced in the order slime's code walks it.

Read at THUDM/slime 05370bf9 (the commit `rl_runs.csv`'s slime/miles rows cite), colocated
(`--colocate`): `slime/backends/megatron_utils/actor.py update_weights` runs
`UpdateWeightFromTensor.update_weights` (`update_weight/update_weight_from_tensor.py`) with the
Megatron state paused by torch_memory_saver, its weights taken from the host copy
(`weights_getter=lambda: self.weights_backuper.get("actor")`, refreshed by
`weights_backuper.backup("actor")` after every training step). `HfWeightIteratorDirect`
(`update_weight/hf_weight_iterator_direct.py`) walks every parameter of the **whole** model
(every stage's, every EP rank's experts: `_get_megatron_local_param_infos` merges them over PP
and EP), sorted by name, in buckets of at most `--update-weight-buffer-size` bytes of full
(TP-gathered) tensors (default 512 MiB, `slime/utils/arguments.py`). Per bucket, on every
training rank:

1. the rank's own shards to the GPU (`.to(device=cuda, non_blocking=True)` from the host
   copy): over PCIe, the rank's share of the model;
2. PP > 1: each key broadcast over the PP group from its owner stage (its TP shard);
3. EP > 1: each routed-expert key (TE grouped GEMM: `weight<i>` per expert, fc1 and fc2)
   **broadcast** over the EP group from the EP rank that owns it: every rank receives every
   expert's (ETP shard of the) weights, one broadcast per expert key;
4. `all_gather_params_async` (`update_weight/common.py`): one async all-gather per TP-sharded
   key over TP (routed experts over ETP), then `torch.cat` of the slices (a copy);
5. `convert_to_hf` per key (name mapping; qkv split into q, k, v by index: a copy);
6. `FlattenedTensorBucket` (SGLang's `weight_sync/tensor_bucket.py`): the bucket's HF tensors
   flattened into one buffer (`torch.cat` of flattened views: a copy of the bucket), its
   metadata one entry per tensor (name, shape, dtype, offsets);
   `MultiprocessingSerializer.serialize` pickles the buffer as one CUDA IPC handle;
7. `dist.gather_object` over a Gloo group of the engine's GPUs to the engine's first rank,
   which sends one Ray call `update_weights_from_tensor(serialized_named_tensors=[one per
   GPU], load_format="flattened_bucket")` and `ray.get`s it before the next bucket; the
   engine fans the request out to its TP workers, each opens its GPU's handle
   (cudaIpcOpenMemHandle), rebuilds the tensors from the metadata and runs the model's
   `load_weights` (a weight loader per tensor; fused MoE: one call per expert and shard),
   copying its shard into place (`weight_sync.py`'s `load`); `torch.cuda.ipc_collect()`.

Priced with the simulator's models: the collectives with `nccl.collective_time` (bytes in
bulk, plus one latency per key collective: the alpha-beta split refit_host.py uses), the host
copy at the catalog's PCIe rate, the device copies at HBM bandwidth (the elementwise
efficiency), and the per-bucket and per-tensor host work with the constants NeMo RL's
colocated refit has for the same mechanisms (`catalogs/rl.yaml refit`): `ipc_handle_s` per
handle a worker opens (one per bucket: the same torch `rebuild_cuda_tensor` ->
cudaIpcOpenMemHandle), `controller_entry_s` per metadata entry pickled or unpickled on the
critical path (the bucket's handle and one entry per HF tensor: pickled into the Gloo
gather, unpickled by the engine's rank, pickled into the Ray call, unpickled by the engine,
forwarded to each TP worker and unpickled there: 4 x rollout TP passes of each rank's list is
an upper reading; counted as 4 x rollout TP), `tensor_s` per HF tensor loaded. Nothing here is
fitted on the rows of `rl_runs.csv`.
"""

from __future__ import annotations

import numpy as np

from .. import nccl
from .inputs import constants
from .megatron_gather import copy_seconds, fused_qkv_bytes, group_nodes
from .refit_host import collective_latency, hf_tensors, megatron_keys

MIB = 2.0 ** 20


def counts(b, ep, buffer_bytes=None) -> dict:
    """What scales with slime's walk: buckets, HF tensors, Megatron keys and the per-key
    collectives (every rank walks the whole model)."""
    k = constants()["slime"]
    buf = float(k["update_weight_buffer_mib"]) * MIB if buffer_bytes is None else buffer_bytes
    full = b.params * 2.0
    # buckets are filled key by key up to the buffer (a key larger than the buffer gets its own)
    buckets = np.maximum(np.ceil(full / buf), 1.0)
    non_expert, expert_local = megatron_keys(b, ep)
    expert_all = expert_local * np.maximum(ep, 1.0)  # every EP rank's experts, walked by all
    tensors = hf_tensors(b)
    return {"slime_buckets": buckets, "slime_hf_tensors": tensors,
            "slime_nonexpert_keys": non_expert, "slime_expert_keys": expert_all}


def volumes(b, tp, pp, ep, etp) -> dict:
    """Bytes one rank moves per update (all-gather: output bytes, broadcast: the buffer, the
    nccl.py convention; h2d: its own shards from the host copy)."""
    full = b.params * 2.0
    routed = b.routed_params * 2.0
    nonexp = full - routed
    tp, pp, ep, etp = (np.maximum(x, 1.0) for x in (tp, pp, ep, etp))
    return {"h2d_bytes": (nonexp / tp + routed / (ep * etp)) / pp,
            # the owner's TP (ETP) shard of every key of every stage
            "pp_bcast_bytes": np.where(pp > 1, nonexp / tp + routed / (ep * etp), 0.0),
            # every expert's ETP shard, each broadcast from its EP owner
            "ep_bcast_bytes": np.where(ep > 1, routed / etp, 0.0),
            "tp_gather_bytes": np.where(tp > 1, nonexp, 0.0),
            "etp_gather_bytes": np.where(etp > 1, routed, 0.0)}


def update_time(b, tp, pp, ep, etp, train_gpus, net, pcie_bytes_per_s) -> dict:
    """Seconds of one colocated slime weight update (module docstring), per component."""
    k = constants()["refit"]
    tp, pp, ep = (np.maximum(x, 1.0) for x in (tp, pp, ep))
    etp = np.maximum(etp, 1.0)
    c = counts(b, ep)
    v = volumes(b, tp, pp, ep, etp)
    g = group_nodes(b, tp, pp, ep, etp, train_gpus)
    tp_nodes, p_nodes, ep_nodes, etp_nodes = g["tp"], g["pp"], g["ep"], g["etp"]
    h2d = v["h2d_bytes"] / pcie_bytes_per_s
    t_pp = nccl.collective_time("broadcast", v["pp_bcast_bytes"], pp, p_nodes, net)["time_s"]
    t_ep = nccl.collective_time("broadcast", v["ep_bcast_bytes"], ep, ep_nodes, net)["time_s"]
    t_tp = nccl.collective_time("all_gather", v["tp_gather_bytes"], tp, tp_nodes, net)["time_s"]
    t_etp = nccl.collective_time("all_gather", v["etp_gather_bytes"], etp, etp_nodes,
                                 net)["time_s"]
    keys = c["slime_nonexpert_keys"] + c["slime_expert_keys"]
    chain = (keys * collective_latency("broadcast", pp, p_nodes, net)
             + c["slime_expert_keys"] * (collective_latency("broadcast", ep, ep_nodes, net)
                                         + collective_latency("all_gather", etp, etp_nodes, net))
             + c["slime_nonexpert_keys"] * collective_latency("all_gather", tp, tp_nodes, net))
    # device copies (read + write): the cat of gathered slices, the qkv split, the flatten
    full = b.params * 2.0
    routed = b.routed_params * 2.0
    qkv = fused_qkv_bytes(b)
    copy_bytes = 2 * (np.where(tp > 1, full - routed, 0.0) + np.where(etp > 1, routed, 0.0)
                      + qkv + full)
    t_copy = copy_seconds(b, copy_bytes)
    rollout_tp = b.rollout_tp * b.rollout_pp
    entries = c["slime_buckets"] + c["slime_hf_tensors"]
    t_entries = entries * 4.0 * rollout_tp * k["controller_entry_s"]
    t_handles = c["slime_buckets"] * k["ipc_handle_s"]
    t_load = c["slime_hf_tensors"] * k["tensor_s"]
    host = t_entries + t_handles + t_load
    total = h2d + t_pp + t_ep + t_tp + t_etp + chain + t_copy + host
    out = {"slime_update_s": total, "slime_h2d_s": h2d, "slime_pp_bcast_s": t_pp,
           "slime_ep_bcast_s": t_ep, "slime_tp_gather_s": t_tp + t_etp,
           "slime_chain_s": chain, "slime_copy_s": t_copy, "slime_host_s": host,
           "slime_entries_s": t_entries, "slime_handles_s": t_handles}
    out.update(c)
    out.update({f"slime_{key}": val for key, val in v.items()})
    return out
