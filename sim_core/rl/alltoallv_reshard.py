"""cann-recipes-train's zero-redundancy reshard (Megatron/MindSpeed -> vLLM-Ascend, colocated).

Read at hicann/cann-recipes-train v0.1.0 (7294b1ab), `llm_rl/deepseek/verl_patches/`:
`workers/sharding_manager/megatron_vllm.py __enter__` (the report's "reshard" column: the
engine's buffers allocated, `rollout_model.load_weights(per_tensor_generator(...))`, MLA's
absorbed weights rebuilt; the actor's param offload and `init_cache_engine` run after it, in
the report's separate "offload etc." column) and `utils/megatron_utils.py
per_tensor_generator` with `utils/reshard.py`. Training layout TP x EP x PP with MindSpeed's
`moe_tp_extend_ep` (each rank holds 1 / (TP x EP) of every MoE layer's routed experts). The
walk has two paths, by `is_alltoall_optimization_supported`:

1. **verl's per-key chain** (verl v0.4.0's walk, kept for the keys the optimisation excludes:
   routed experts, `embedding`, `output_layer`, `linear_qkv`, `final_layernorm`, the
   `linear_fc1./linear_fc2./router.weight` keys of each stage's first `first_k_dense` local
   layers, every key of a stage's layers beyond the shortest stage, and `router.expert_bias`
   from the state dict): per key, over PP, `broadcast_str_from_megatron_pp` and
   `broadcast_from_megatron_pp` (three object collectives and a broadcast of the owner's TP
   shard); then
   - routed experts (`weight1` / `weight2`): `ep_param_reshard_by_alltoallv`, one
     `all_to_all` over the TP x EP group in which a training rank sends each rollout rank only
     the experts it serves (rollout EP a multiple of TP x EP): the busiest sender ships its
     1 / (TP x EP) shard, a receiver gets 1 / rollout EP; no EP all-gather. The result is
     expanded into one HF tensor per expert (gate, up / down; the others empty) which
     `load_weights` walks;
   - other TP-sharded keys: an all-gather over TP.
2. **TP then PP** (the rest: attention projections and norms, MoE layers' shared experts and
   router): per local key slot (the same count on every stage), an all-gather over TP, one
   `all_gather_object` of the names over PP, one `all_to_all` over PP sending the gathered
   tensor to every stage (`gather_pp_params_by_alltoall`).

Everything in bf16 (the Megatron parameters as held). Priced with the simulator's models: the
bytes with `nccl.collective_time` on the catalog's network (`ascend-a3` / `atlas-800t-a3`:
the UB/HCCS figure inside a 16-die server, RoCE across), one latency per key collective, and
the host work per key with the constants the catalog already has for the same mechanisms:
`refit.verl_key_s` for each key walked through verl's chain (fitted on verl issue 5311's
totals, never on these rows), a third of it per key slot of path 2 (one of the chain's three
object collectives), `refit.tensor_s` per further HF tensor the expert keys yield. Nothing
here is fitted on rl_runs.csv. The engine's copy of its shard stays weight_sync.py's `load`.
"""

from __future__ import annotations

import numpy as np

from .. import nccl
from .inputs import constants
from .megatron_gather import group_nodes, pp_key_latency
from .refit_host import collective_latency

# keys per layer the recipe's MindSpeed DeepSeek-V3 model registers (verl_patches/models/mcore/
# weight_converter.py): attention input_layernorm, linear_qkv, q_layernorm, linear_qb,
# k_layernorm, linear_kvb, linear_proj
ATTN_KEYS = 7
# MoE layer: pre_mlp_layernorm, router.weight, shared_experts fc1 / fc2 (path 2 eligible) +
# experts weight1 / weight2, router.expert_bias (always path 1)
MOE_A2A_KEYS = 4
MOE_CHAIN_KEYS = 3
# dense layer: pre_mlp_layernorm (path 2), linear_fc1 / linear_fc2
DENSE_A2A_KEYS = 1
DENSE_CHAIN_KEYS = 2


def active(b) -> np.ndarray:
    """Rows whose refit is this recipe's reshard (`refit_alltoallv`)."""
    return b.floats("refit_alltoallv", 0.0) > 0


def key_counts(b, pp) -> dict:
    """Keys through verl's chain (all stages), key slots of path 2 per stage, HF tensors the
    expert keys yield beyond one per key. Stages: layers / pp, the shortest floor(layers / pp)
    (the recipe's [7,7,8,8,8,8,8,7]: 7); `first_k_dense` = the model's dense layers."""
    pp = np.maximum(pp, 1.0)
    k = b.layers - b.moe_layers
    short = np.floor(b.layers / pp)
    extra = b.layers - pp * short  # layers beyond the shortest stage: all their keys in path 1
    dense_slots = np.minimum(k, short)
    # path-2 keys of a local slot: attention (less linear_qkv) + the MLP's eligible keys; in
    # the first k local slots the MLP keys but the norm go to path 1 (stage 0: the dense
    # layers' fc1 / fc2; other stages: the MoE layers' router and shared experts)
    a2a_attn = ATTN_KEYS - 1
    slots = short * (a2a_attn + 1) + (short - dense_slots) * (MOE_A2A_KEYS - 1)
    chain = (b.layers  # linear_qkv
             + b.moe_layers * MOE_CHAIN_KEYS
             + k * DENSE_CHAIN_KEYS
             + (pp - 1) * dense_slots * (MOE_A2A_KEYS - 1)
             + extra * (a2a_attn + MOE_A2A_KEYS)
             + 2 + (1 - b.tied_embeddings) * 1)
    expert_keys = b.moe_layers * 2
    hf_extra = b.moe_layers * (3 * b.experts - 2)
    return {"chain_keys": chain, "a2a_slots": slots, "expert_keys": expert_keys,
            "hf_extra": hf_extra, "extra_layers": extra, "dense_slots": dense_slots}


def volumes(b, tp, pp, ep, rollout_ep, kc=None) -> dict:
    """bf16 bytes per rank by collective (all-gather: output bytes; broadcast: the buffer;
    all-to-all: the rank's send buffer); kc: key_counts at this pp, where the caller has them."""
    tp, pp, ep = (np.maximum(x, 1.0) for x in (tp, pp, ep))
    routed = b.routed_params * 2.0
    nonexp = (b.params - b.routed_params) * 2.0
    kc = key_counts(b, pp) if kc is None else kc
    embed = b.vocab * b.hidden * 2.0 * (2.0 - b.tied_embeddings)
    qkv = np.maximum(b.replicated_params - b.moe_layers * b.hidden * b.experts, 0.0) * 2.0
    dense_mlp = (b.layers - b.moe_layers) * 3.0 * b.hidden * b.ffn * 2.0
    shared = 3.0 * b.hidden * b.expert_ffn * b.shared_experts * 2.0  # per MoE layer
    rest = np.maximum(nonexp - embed - qkv - dense_mlp - b.moe_layers * shared, 0.0) / b.layers
    chain_bytes = (embed + qkv + dense_mlp + (pp - 1) * kc["dense_slots"] * shared
                   + kc["extra_layers"] * (rest + shared))
    chain_bytes = np.minimum(chain_bytes, nonexp)
    a2a_bytes = nonexp - chain_bytes
    shard = routed / (tp * ep)
    micro = np.maximum(rollout_ep / (tp * ep), 1.0)
    return {"pp_bcast_bytes": np.where(pp > 1, shard + chain_bytes / tp, 0.0),
            "chain_tp_gather_bytes": np.where(tp > 1, chain_bytes, 0.0),
            # the busiest sender: its whole shard less the piece it keeps
            "expert_a2a_bytes": shard * (1.0 - 1.0 / micro),
            "a2a_tp_gather_bytes": np.where(tp > 1, a2a_bytes / pp, 0.0),
            "pp_a2a_bytes": np.where(pp > 1, a2a_bytes, 0.0),
            "chain_bytes": chain_bytes, "a2a_bytes": a2a_bytes,
            "received_bytes": nonexp + routed / np.maximum(rollout_ep, 1.0)}


def reshard_time(b, tp, pp, ep, rollout_ep, train_gpus, net) -> dict:
    """Seconds of the reshard (module docstring), before the engine's own copy."""
    tp, pp, ep = (np.maximum(np.asarray(x, float), 1.0) for x in (tp, pp, ep))
    kc = key_counts(b, pp)
    v = volumes(b, tp, pp, ep, rollout_ep, kc)
    etp = tp * ep
    g = group_nodes(b, tp, pp, ep, np.ones_like(tp), train_gpus)
    etp_nodes = np.maximum(np.ceil(etp / b.gpus_per_node), 1.0)
    ct = lambda op, s, n, nodes: nccl.collective_time(op, s, n, nodes, net)["time_s"]
    t_bytes = (ct("broadcast", v["pp_bcast_bytes"], pp, g["pp"])
               + ct("all_gather", v["chain_tp_gather_bytes"], tp, g["tp"])
               + ct("all_to_all", v["expert_a2a_bytes"], etp, etp_nodes)
               + ct("all_gather", v["a2a_tp_gather_bytes"], tp, g["tp"])
               + ct("all_to_all", v["pp_a2a_bytes"], pp, g["pp"]))
    lat = lambda op, n, nodes: collective_latency(op, n, nodes, net)
    # path 1 per key: 2 + 2 all-gathers (the object collectives' sizes and bytes) and the
    # broadcast_object_list / spec / tensor broadcasts over PP, then the TP all-gather or the
    # experts' all-to-all; path 2 per slot: the names' all_gather_object (2), the TP all-gather,
    # the PP all-to-all
    per_chain = pp_key_latency(pp, g["pp"], net)
    t_lat = (kc["chain_keys"] * per_chain
             + kc["expert_keys"] * lat("all_to_all", etp, etp_nodes)
             + (kc["chain_keys"] - kc["expert_keys"]) * lat("all_gather", tp, g["tp"])
             + kc["a2a_slots"] * (2 * lat("all_gather", pp, g["pp"]) + lat("all_gather", tp, g["tp"])
                                  + lat("all_to_all", pp, g["pp"])))
    k = constants()["refit"]
    key_s = float(k.get("verl_key_s", 0.0))
    t_host = (kc["chain_keys"] * key_s + kc["a2a_slots"] * key_s / 3.0
              + kc["hf_extra"] * float(k.get("tensor_s", 0.0)))
    out = {"reshard_s": t_bytes + t_lat + t_host, "reshard_bytes_s": t_bytes,
           "reshard_latency_s": t_lat, "reshard_host_s": t_host}
    out.update({f"reshard_{c}": x for c, x in {**v, **kc}.items()})
    return out
