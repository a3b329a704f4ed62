"""The refit's gather out of a Megatron training layout, as each framework's code walks it.

Both frameworks hand the rollout engine full Hugging Face tensors, and in both every rank ends
up holding the whole model (every stage's tensors), but they move the bytes in a different
order, which changes what crosses the pipeline-parallel (PP) group, usually between nodes:

- **NeMo RL** (NVIDIA-NeMo/RL v0.3.0 `nemo_rl/models/megatron/refit_utils.py gather_params`,
  called per buffer group by `megatron_policy_worker.py get_weights_ipc_handles`): for every
  Megatron key, in one loop every rank walks, the stage that owns it all-gathers the TP
  shards (`torch.distributed.all_gather` + `torch.cat`; routed experts over ETP), then the
  **full** tensor is broadcast over the PP group from the owner stage, then routed-expert
  keys (local to an EP rank) are all-gathered over EP. The stages' TP gathers therefore run
  one after another (all keys of all stages: the whole non-expert model through a TP
  all-gather on the critical path), and the PP broadcast carries the full non-expert model
  plus one EP rank's experts.
- **verl** (volcengine/verl v0.4.0-v0.7.0 `verl/utils/megatron_utils.py per_tensor_generator`;
  mbridge v0.1.13 `mbridge/core/bridge.py export_weights`, which the DeepSeek-V3 recipe uses,
  walks the same order): the owner broadcasts its **TP shard** over PP
  (`broadcast_from_megatron_pp`), then routed experts are all-gathered over EP (and ETP), and
  every rank all-gathers the non-expert keys over its TP group (all stages at once, one key
  after another: again the whole non-expert model through a TP all-gather). The PP hop carries
  1/TP of NeMo RL's bytes.

Device copies on every rank (NeMo RL's colocated path only, where each training worker packs
what it gathered for the engine on its GPU; HBM bandwidth at the simulator's elementwise
efficiency, read + write):
- `torch.cat` of the gathered slices, for every TP-dim key, also at TP 1 and ETP 1 (a cat of
  one tensor still copies): the whole model;
- the Megatron -> HF conversion (`converters/common.py`): `split_qkv_gpu` indexes the fused
  QKV with index tensors (a copy of the QKV weights); `split_fc1_tp` is an
  `einops.rearrange("(t c d) a1 -> c (t d) a1")`, a view at TP 1 and a copy of the dense
  gate/up weights at TP > 1 (routed experts: `split_fc1_etp`, a view at ETP 1);
- the packing of each group's HF tensors into one buffer per dtype (`packed_tensors[dtype]
  [offset:...].copy_`, groups of >= 32 tensors): the whole model.
The engine's own copy of its shard is weight_sync.py's `load`. verl's generator feeds the
engine without packing (colocated: an in-process vLLM; split: the broadcast to the rollout
GPUs); its `torch.cat` of the TP slices at TP > 1 (`default_tp_concat_fn`) is counted, its
QKV / gate-up split (`convert_qkv_gate_up_by_simple_split`) is not. Other frameworks with a
Megatron layout (slime) are priced in NeMo RL's order without its packing copies.

verl's walk also pays a chain of small collectives per Megatron key that NeMo RL does not (NeMo
RL's per-key chain is `refit_host.py`'s): `broadcast_str_from_megatron_pp` (the name: an
`all_gather_object` over PP, i.e. two all-gathers, sizes then pickled bytes, then a
`broadcast_object_list`, two broadcasts) and `broadcast_from_megatron_pp` (the tensor's spec:
another `all_gather_object`, then the broadcast), then the TP all-gather (non-expert keys) or
the EP all-gather and one ETP all-gather per gathered expert. Each collective is priced at the
NCCL model's latency (a one-byte message); the keys are every stage's (verl v0.4.0
`layer_list_meta`, gathered over PP), one EP rank's experts. Beyond those latencies each key
costs host work (pickling, the host syncs of the object collectives, the HF conversion and the
engine's load of what it yields): `catalogs/rl.yaml refit.verl_key_s` seconds per key, fitted
on verl issue 5311's DeepSeek-V3.1 weight-transfer totals (`verl_refit_fit.py`), applied with
PP > 1 as in those points.
"""

from __future__ import annotations

import numpy as np

from .. import compute, nccl
from .inputs import constants
from .refit_host import collective_latency, megatron_keys

# The ranks of a PP group are stride = (GPUs of the job) / pp apart (Megatron's rank order puts
# TP, CP, EP and DP inside a stage)


def pp_nodes(b, pp, stride):
    """Nodes a pipeline group spans when its ranks are `stride` apart."""
    per_node = np.maximum(np.floor(b.gpus_per_node / np.maximum(stride, 1.0)), 1.0)
    return np.clip(np.ceil(pp / per_node), 1.0, pp)


def volumes(b, tp, pp, ep, etp, verl) -> dict:
    """Bytes of one refit's gather per rank, by collective (all-gather: the output bytes,
    broadcast: the buffer, the nccl.py convention). verl: bool array, True for verl's order."""
    full = b.params * 2.0
    routed = b.routed_params * 2.0
    nonexp = full - routed
    ep = np.maximum(ep, 1.0)
    etp = np.maximum(etp, 1.0)
    # PP: NeMo RL broadcasts full non-expert tensors and one EP rank's full experts; verl the
    # owner's TP (ETP) shard of each
    pp_nemo = nonexp + routed / ep
    pp_verl = nonexp / np.maximum(tp, 1.0) + routed / (ep * etp)
    # routed experts sharded over ETP > 1: NeMo RL all-gathers each local expert key over ETP
    # on its owner stage (one EP rank's experts); verl after the EP all-gather (all of them)
    etp_bytes = np.where(etp > 1, np.where(verl, routed, routed / ep), 0.0)
    return {"tp_gather_bytes": np.where(tp > 1, nonexp, 0.0), "etp_gather_bytes": etp_bytes,
            "pp_bcast_bytes": np.where(pp > 1, np.where(verl, pp_verl, pp_nemo), 0.0),
            "ep_gather_bytes": np.where(ep > 1, routed, 0.0),
            # what every rank ends up holding: the whole model, whichever stage it trains
            "received_bytes": full}


def fused_qkv_bytes(b) -> np.ndarray:
    """bf16 bytes of a non-MLA model's fused QKV weights (heads + 2 KV heads of head_dim per
    layer), which a refit splits into q, k and v with a copy; MLA's projections are split by
    the DeepSeek converter's own transforms: not counted."""
    return np.where(b.mla > 0, 0.0,
                    b.layers * b.hidden * (b.heads + 2 * b.kv_heads) * b.head_dim * 2.0)


def copy_seconds(b, nbytes) -> np.ndarray:
    """Seconds of device copies of `nbytes` (read + write counted by the caller) at HBM
    bandwidth times the elementwise efficiency."""
    return nbytes / (b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise"))


def group_nodes(b, tp, pp, ep, etp, train_gpus) -> dict:
    """Nodes each group of a Megatron layout spans: TP; PP (ranks train_gpus / pp apart);
    EP (Megatron's expert rank generator, parallel_state.py `expert_decoder_rank_generator`,
    order tp-ep-dp-pp with tp = ETP: an EP group is ETP x EP consecutive ranks); ETP."""
    gpn = b.gpus_per_node
    etp = np.maximum(etp, 1.0)
    return {"tp": np.maximum(np.ceil(tp / gpn), 1.0),
            "pp": pp_nodes(b, pp, np.maximum(train_gpus / pp, 1.0)),
            "ep": np.maximum(np.ceil(ep * etp / gpn), 1.0),
            "etp": np.maximum(np.ceil(etp / gpn), 1.0)}


def copy_bytes(b, tp, etp, nemo) -> np.ndarray:
    """HBM bytes (read + write) one rank copies while converting and packing the gathered
    model (module docstring). nemo: NeMo RL's colocated path; elsewhere verl's cat at TP > 1."""
    full = b.params * 2.0
    routed = b.routed_params * 2.0
    nonexp = full - routed
    qkv = fused_qkv_bytes(b)
    dense_fc1 = (b.layers - b.moe_layers) * 2 * b.hidden * b.ffn * 2.0
    nemo_bytes = 2 * (full + qkv + np.where(tp > 1, dense_fc1, 0.0)
                      + np.where(np.maximum(etp, 1.0) > 1, routed * 2.0 / 3.0, 0.0) + full)
    verl_bytes = 2 * np.where(tp > 1, nonexp, 0.0)
    return np.where(nemo, nemo_bytes, verl_bytes)


def pp_key_latency(pp, p_nodes, net) -> np.ndarray:
    """The latency one key pays over PP in verl's per-tensor walk: the object collectives'
    sizes and bytes (4 all-gathers) and the broadcast_object_list / spec / tensor broadcasts
    (3); also cann-recipes-train's chain keys (alltoallv_reshard.py)."""
    return (4 * collective_latency("all_gather", pp, p_nodes, net)
            + 3 * collective_latency("broadcast", pp, p_nodes, net))


def verl_key_chain(b, tp, pp, ep, etp, tp_nodes, p_nodes, ep_nodes, etp_nodes, net):
    """verl's per-key work (module docstring): (collectives, their latency in seconds, the keys
    walked, the fitted host seconds)."""
    non_expert, expert = megatron_keys(b, ep)
    keys = non_expert + expert
    per_pp = pp_key_latency(pp, p_nodes, net)
    t = (keys * per_pp + non_expert * collective_latency("all_gather", tp, tp_nodes, net)
         + expert * (collective_latency("all_gather", ep, ep_nodes, net)
                     + ep * collective_latency("all_gather", etp, etp_nodes, net)))
    n = keys * 7 * (pp > 1) + non_expert * (tp > 1) + expert * ((ep > 1) + ep * (etp > 1))
    host = np.where(pp > 1, keys * float(constants()["refit"].get("verl_key_s", 0.0)), 0.0)
    return n, t, keys, host


def gather_time(b, tp, pp, ep, etp, train_gpus, net, verl, nemo_colocated) -> dict:
    """Seconds of the gather (and NeMo RL's conversion copies) for Megatron layouts."""
    tp = np.maximum(tp, 1.0)
    pp = np.maximum(pp, 1.0)
    ep = np.maximum(ep, 1.0)
    v = volumes(b, tp, pp, ep, etp, verl)
    g = group_nodes(b, tp, pp, ep, etp, train_gpus)
    etp1 = np.maximum(etp, 1.0)
    t_tp = nccl.collective_time("all_gather", v["tp_gather_bytes"], tp, g["tp"], net)["time_s"]
    t_pp = nccl.collective_time("broadcast", v["pp_bcast_bytes"], pp, g["pp"], net)["time_s"]
    t_ep = nccl.collective_time("all_gather", v["ep_gather_bytes"], ep, g["ep"], net)["time_s"]
    t_etp = nccl.collective_time("all_gather", v["etp_gather_bytes"], etp1, g["etp"],
                                 net)["time_s"]
    n_coll, t_chain, keys, t_host = verl_key_chain(b, tp, pp, ep, etp1, g["tp"], g["pp"],
                                                   g["ep"], g["etp"], net)
    t_chain = np.where(verl, t_chain, 0.0)
    t_host = np.where(verl, t_host, 0.0)
    cb = copy_bytes(b, tp, etp, nemo_colocated)
    t_copy = copy_seconds(b, cb)
    out = {"gather_s": t_tp + t_pp + t_ep + t_etp + t_copy + t_chain + t_host,
           "tp_gather_s": t_tp, "pp_bcast_s": t_pp, "ep_gather_s": t_ep, "copy_s": t_copy,
           "copy_bytes": cb, "verl_chain_s": t_chain, "verl_key_host_s": t_host,
           "verl_keys": np.where(verl, keys, 0.0),
           "verl_key_collectives": np.where(verl, n_coll, 0.0)}
    out.update(v)
    return out
