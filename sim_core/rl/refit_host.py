"""The per-tensor side of NeMo RL's colocated refit: what scales with tensors, not bytes.

`weight_sync.py` prices the refit's bytes (the gather in the training layout, the engine's
copy) and `phases.py` the host moves around it. NeMo RL v0.3.0 (NVIDIA-NeMo/RL tag v0.3.0)
moves the weights one tensor at a time, through one Ray controller, and three costs scale with
the number of tensors rather than their bytes:

1. **A collective chain per tensor.** Megatron (`nemo_rl/models/megatron/refit_utils.py
   gather_params`): for every Megatron parameter key, an all-gather over TP (ETP for routed
   experts) when the key is TP-sharded, a broadcast over the PP group (every rank ends with the
   whole tensor), and for routed-expert keys an all-gather over EP. DTensor
   (`dtensor_policy_worker.py get_weights_ipc_handles`): `full_tensor()` per parameter, an
   all-gather over the data-parallel shards and one over TP. Each collective pays the NCCL
   model's latency (`nccl.collective_time` of a one-byte message); the bytes stay priced in
   bulk by `weight_sync.py` (the alpha-beta split: count x alpha + bytes / beta).
2. **Work per IPC handle and per Hugging Face tensor, on every worker in parallel.** An IPC
   handle is opened by the engine (`rebuild_cuda_tensor` -> `_new_shared_cuda` ->
   cudaIpcOpenMemHandle) and closed when its storage is released: DTensor sends one per
   tensor (`reduce_tensor` on each converted parameter), Megatron one per packed buffer.
   Seconds per handle: `catalogs/rl.yaml refit.ipc_handle_s`, the driver calls' measured cost
   (rapidsai/ucx-py issue 334), not fitted. Besides it, Python per HF tensor on two sides:
   the engine's (vLLM's `load_weights`, a `weight_loader` per tensor: name mapping, the TP
   narrow and a copy; fused MoE per expert and shard), `refit.tensor_s`, every path; and, on
   the Megatron path, the trainer's (`gather_params`' loop, `megatron_to_hf_converter.convert`
   splitting fused qkv and gate/up, the copy into the packed buffer), `refit.megatron_tensor_s`.
   Both from NeMo RL's published DeepSeek-V3 refit breakdown (below).
3. **Entries through the single controller.** `grpo.py refit_policy_generation` loops over
   groups of keys; per group `lm_policy.get_weights_ipc_handles` gathers every training
   worker's handles into the driver (Ray deserialises them) and `vllm.py
   update_weights_from_ipc_handles` sends each engine the entries of its own devices (Ray
   serialises them), whose leader forwards each worker its own. An entry is a handle (DTensor:
   one per tensor; Megatron packs a group's tensors into one buffer per dtype once it holds
   >= 32 tensors, `NEMO_RL_MEGATRON_IPC_TENSOR_PACKING_THRESHOLD`) or a packed tensor's
   metadata (name -> offset: `tensor_metadata` of `megatron_policy_worker.py`). Entries on the
   critical path = entries per worker x (2 W + 2 tp) (driver in and out over the W training
   workers, leader in and out over its tp devices). Seconds per handle entry (a pickled
   `reduce_tensor` tuple: the rebuild function, the handle, torch.Size, dtype):
   `refit.controller_entry_s`; per metadata entry (a name and an offset):
   `refit.meta_entry_s`, a few times cheaper (NeMo RL's refit blog, "Part 3": serialising
   the function, torch.Size and dtype is what made the entries costly).
4. **The Ray calls of each group.** The driver issues one `get_weights_ipc_handles` per
   training worker and one `update_weights_from_ipc_handles` per engine
   (`run_all_workers_multiple_data`, TP and PP leaders only); each leader of a multi-GPU
   engine issues one `execute_method.remote` per device (v0.3.0 `vllm.py`, the direct calls
   that replaced `collective_rpc`). Each call at Ray's own measured asynchronous actor-call
   rate (catalogs/rl.yaml `ray_calls.actor_call_async_per_s`, the release microbenchmark);
   the leaders' calls run in parallel across engines.

NeMo RL's refit blog (nvidia-nemo.github.io/blog 2025-08-12 "NeMo-RL: Journey of Optimizing
Weight Transfer in Large MoE Models by 10x", Table 1) times the three steps of DeepSeek-V3's
refit at v0.3 (Megatron EP64 PP8 on 64 x 8 H100, vLLM TP64): gather 12.2 s, IPC handle
transfer 33.5 s, generation parameter update 1.5 s. `python -m sim_core.rl.refit_fit` derives
`tensor_s` (the update step per HF tensor), `megatron_tensor_s` (the gather step less the
bytes and collective latencies priced here) and `meta_entry_s` (the transfer step less the Ray
calls, handles and handle entries priced here) from it, and `controller_entry_s` from PR #449.

Groups: `prepare_weights_for_ipc` sizes a group at a fraction of the GPU's free memory (NVML)
after `offload_before_refit` and the engine's weights woken: 0.2 for Megatron, 0.8 for DTensor
(`NRL_REFIT_BUFFER_MEMORY_RATIO` defaults), in bf16 bytes of the full tensors.

Tensors counted from the Hugging Face layouts vLLM loads (per decoder layer: q, k, v, o or
MLA's seven, two norms; a dense MLP's gate, up, down; an MoE layer's router plus three per
routed expert and three for shared experts; embedding, final norm, LM head unless tied).
Qwen2's three q/k/v biases and Qwen3's two q/k norms are not in the catalog and not counted
(2-3 of ~11 per dense layer). Megatron keys: fused qkv (with its norm) and o, fused gate/up
(with its norm) and down; per MoE layer the norm, the router and 2 keys per local expert.

**From v0.4.0 the colocated refit streams instead** (`grpo.py refit_policy_generation` ->
`lm_policy.stream_weights_via_ipc_zmq` and `vllm_generation.update_weights_via_ipc_zmq`,
`policy/utils.py stream_weights_via_ipc_zmq_impl` and `vllm_backend.py
update_weights_via_ipc_zmq`, v0.4.0 to v0.7.0): one Ray call per training worker and per
engine for the whole refit, then each worker packs its full tensors (Megatron-Bridge's
`export_hf_weights` on the Megatron path) into two ping-pong buffers of half of 0.3 x the free
memory (`NRL_REFIT_BUFFER_MEMORY_RATIO`), sends each filled one to its own device's vLLM
executor over ZMQ (the IPC handle and the list of names), and packs the next while the
executor rebuilds the buffer, slices it by cached shapes and runs `load_weights`. No driver
in the loop: no controller entries, no Ray calls per group. Priced: the collective chain as
before, the slower of the trainer's per-tensor Python and the engine's load (the two buffers
overlap them), an IPC handle per buffer, the names pickled and unpickled once each
(`meta_entry_s`), the Ray calls once. A row's `rl_framework_version` below 0.4 keeps the
controller path; blank is the current release.

The four derived constants come from NeMo RL's own published refit figures (PR #449, the refit
blog), never from the RL steps of `rl_runs.csv`: `python -m sim_core.rl.refit_fit`. Colocated `rl_framework:
nemo_rl` rows only: verl's hybrid engine loads the weights into an in-process vLLM
(`verl/workers/sharding_manager/fsdp_vllm.py update_params`: `model.load_weights` on the
generator of full tensors, v0.4.0), with no IPC handle and no controller, so (3) does not
apply; verl's own per-key walk out of a Megatron layout (its object collectives and host work
per key) is `megatron_gather.py`'s.
"""

from __future__ import annotations

import numpy as np

from .. import nccl
from .inputs import RL_FRAMEWORK, constants

GIB = 2.0 ** 30
# Hugging Face tensors per decoder layer (module docstring)
ATTN_TENSORS = 4            # q_proj, k_proj, v_proj, o_proj
MLA_TENSORS = 7             # q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
                            # kv_a_layernorm, kv_b_proj, o_proj (DeepSeek-V3 HF names)
NORM_TENSORS = 2            # input_layernorm, post_attention_layernorm
GLU_TENSORS = 3             # gate_proj, up_proj, down_proj
# Megatron keys per decoder layer (TE: the norm rides in the fused linear as
# `layer_norm_weight`, a key of its own)
MEG_ATTN_KEYS = 3           # linear_qkv.weight, linear_qkv.layer_norm_weight, linear_proj.weight
MEG_DENSE_MLP_KEYS = 3      # linear_fc1.weight, linear_fc1.layer_norm_weight, linear_fc2.weight
MEG_MOE_KEYS = 2            # pre_mlp_layernorm.weight, router.weight (+ 2 per local expert)


ZMQ_SINCE = 0.4  # the first NeMo RL release that streams its colocated refit (v0.4.0)


def _k() -> dict:
    return constants()["refit"]


def hf_tensors(b) -> np.ndarray:
    """Hugging Face tensors of the model (what vLLM's `load_weights` receives)."""
    attn = np.where(b.mla > 0, MLA_TENSORS, ATTN_TENSORS) + NORM_TENSORS
    dense_layers = b.layers - b.moe_layers
    moe = b.moe_layers * (1 + GLU_TENSORS * b.experts + GLU_TENSORS * (b.shared_experts > 0))
    outside = 2 + (1 - b.tied_embeddings)
    return b.layers * attn + dense_layers * GLU_TENSORS + moe + outside


def megatron_keys(b, ep) -> tuple[np.ndarray, np.ndarray]:
    """Megatron parameter keys one gather_params pass walks: (non-expert keys, routed-expert
    keys of one EP rank). Each expert key is all-gathered over EP into ep tensors."""
    dense_layers = b.layers - b.moe_layers
    non_expert = (b.layers * MEG_ATTN_KEYS + dense_layers * MEG_DENSE_MLP_KEYS
                  + b.moe_layers * (MEG_MOE_KEYS + 2 * (b.shared_experts > 0))
                  + 2 + (1 - b.tied_embeddings))
    expert = b.moe_layers * 2 * b.experts / np.maximum(ep, 1.0)
    return non_expert, expert


def collective_latency(op, group, nodes, net) -> np.ndarray:
    """The latency of one collective (a one-byte message), zero for a group of one: the
    alpha of the alpha-beta split the refit walks price per key (also megatron_gather.py and
    slime_refit.py)."""
    t = nccl.collective_time(op, 1.0, np.maximum(group, 1.0), np.maximum(nodes, 1.0), net)["time_s"]
    return np.where(group > 1, t, 0.0)


def counts(b, dtensor, free_bytes, ep) -> dict:
    """What scales, per refit: HF tensors, buffer groups, IPC handles and controller entries per
    worker, and the entries on the controller's critical path."""
    tensors = hf_tensors(b)
    k = _k()
    ratio = np.where(dtensor, k["dtensor_buffer_ratio"], k["megatron_buffer_ratio"])
    buffer = np.maximum(ratio * free_bytes, 1.0 * GIB)
    groups = np.maximum(np.ceil(b.params * 2.0 / buffer), 1.0)
    packed = ~dtensor & (tensors / groups >= k["pack_threshold"])
    handles = np.where(packed, groups, tensors)
    meta = np.where(packed, tensors, 0.0)  # the packed tensors' metadata
    tp_engine = b.rollout_tp * b.rollout_pp
    passes = 2.0 * b.train_gpus + 2.0 * tp_engine
    # Ray calls per group on the critical path: the driver's (one per training worker, one
    # per engine), then one leader's (one per device of a multi-GPU engine)
    engines = np.maximum(b.train_gpus / tp_engine, 1.0)
    calls = groups * (b.train_gpus + engines + np.where(tp_engine > 1, tp_engine, 0.0))
    return {"refit_tensors": tensors, "refit_groups": groups, "refit_handles": handles,
            "refit_entries": handles + meta, "refit_meta_entries": meta,
            "refit_controller_entries": (handles + meta) * passes,
            "refit_passes": passes, "refit_ray_calls": calls}


def streams(b) -> np.ndarray:
    """NeMo RL rows whose colocated refit streams over ZMQ (release 0.4 or later, or not
    stated: the current release); earlier releases go through the controller."""
    v = b.floats("rl_framework_version")
    return ~(v < ZMQ_SINCE)


def _through_controller(c, trainer, load, k, rate) -> tuple:
    """v0.3 and before, per refit: (Python, controller, Ray calls seconds; groups, handles,
    calls). Python per HF tensor on every worker in parallel (the engine's load, the Megatron
    trainer's gather loop, conversion and packing) and the handles opened; the controller's
    entries, handles and packed metadata at their own costs; the Ray calls of every group."""
    py = load + trainer + c["refit_handles"] * k["ipc_handle_s"]
    ctrl = (c["refit_handles"] * k["controller_entry_s"]
            + c["refit_meta_entries"] * k["meta_entry_s"]) * c["refit_passes"]
    return (py, ctrl, c["refit_ray_calls"] / rate, c["refit_groups"], c["refit_handles"],
            c["refit_ray_calls"])


def _streamed(b, c, trainer, load, free_bytes, k, rate) -> tuple:
    """v0.4 on, the same tuple for the ZMQ stream (module docstring): the two buffers overlap
    the trainer's packing with the engine's load, one handle per buffer, the names pickled
    once each way, one Ray call per worker and engine for the whole refit."""
    buffers = np.maximum(np.ceil(b.params * 2.0 / np.maximum(
        k["zmq_buffer_ratio"] * free_bytes / 2.0, 1.0 * GIB)), 1.0)
    calls = b.train_gpus + np.maximum(b.train_gpus / (b.rollout_tp * b.rollout_pp), 1.0)
    return (np.maximum(trainer, load) + buffers * k["ipc_handle_s"],
            2.0 * c["refit_tensors"] * k["meta_entry_s"], calls / rate, buffers, buffers, calls)


def host_time(b, dtensor, free_bytes, train_tp, train_pp, train_ep, dp_shard, net) -> dict:
    """Seconds of the per-tensor refit work (NeMo RL colocated rows; zero elsewhere)."""
    k = _k()
    ep = np.maximum(np.nan_to_num(train_ep, nan=1.0), 1.0)
    c = counts(b, dtensor, free_bytes, ep)
    zmq = streams(b)
    gpn = b.gpus_per_node
    # (1) the collective chain per tensor: latency only (bytes are weight_sync.py's)
    non_expert, expert = megatron_keys(b, ep)
    tp_a = collective_latency("all_gather", train_tp, np.ceil(train_tp / gpn), net)
    pp_stride = np.maximum(b.train_gpus / np.maximum(train_pp, 1.0), 1.0)
    pp_a = collective_latency("broadcast", train_pp, np.clip(np.ceil(train_pp * pp_stride / gpn), 1.0,
                                                   train_pp), net)
    ep_a = collective_latency("all_gather", ep, np.ceil(ep * train_tp / gpn), net)
    meg = (non_expert * (tp_a + pp_a)
           + expert * (pp_a + ep_a))  # ETP 1: routed experts are not TP-sharded
    dp_nodes = np.ceil(dp_shard * train_tp / gpn)
    dt = c["refit_tensors"] * (tp_a + collective_latency("all_gather", dp_shard, dp_nodes, net))
    chain = np.where(dtensor, dt, meg)
    trainer = np.where(dtensor, 0.0, c["refit_tensors"] * k["megatron_tensor_s"])
    load = c["refit_tensors"] * k["tensor_s"]
    rate = float(constants()["ray_calls"]["actor_call_async_per_s"])
    via_ctrl = _through_controller(c, trainer, load, k, rate)
    via_zmq = _streamed(b, c, trainer, load, free_bytes, k, rate)
    py, ctrl, ray, groups, handles, calls = (np.where(zmq, z, v) for v, z in zip(via_ctrl,
                                                                                via_zmq))
    c = {**c, "refit_groups": groups, "refit_handles": handles, "refit_ray_calls": calls}
    on = ((b.rl_framework == RL_FRAMEWORK.index("nemo_rl")) & (b.placement == 0)).astype(float)
    out = {"refit_host_s": on * (chain + py + ctrl + ray), "refit_chain_s": on * chain,
           "refit_python_s": on * py, "refit_trainer_python_s": on * trainer,
           "refit_load_python_s": on * load,
           "refit_controller_s": on * ctrl, "refit_ray_s": on * ray}
    out.update(c)
    return out
