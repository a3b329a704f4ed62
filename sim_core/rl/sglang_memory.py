"""SGLang's rollout memory: what `mem_fraction_static` budgets and what comes on top of it.

Why a separate rule from vLLM's: vLLM's `gpu_memory_utilization` is a share of the device's
total that caps weights + activations + KV cache (generation.rollout_memory). SGLang's
`mem_fraction_static` is a share of the memory *free when the engine starts* and caps only the
weights and the KV pool (sgl-project/sglang python/sglang/srt/model_executor/model_runner.py
`profile_max_num_token`: rest_memory = available_after_load - total_gpu_memory x (1 -
mem_fraction_static), total_gpu_memory being the free memory measured by
`init_torch_distributed`). The prefill activations, CUDA graph buffers and attention metadata
come on top, sized by SGLang's own reserve heuristic (server_args.py
`_handle_gpu_memory_settings`, sglang PR 10975). Every figure and its source sits in
catalogs/rl.yaml `sglang_memory`.

The free memory at the engine's start excludes what the colocated trainer keeps on the GPU
during generation (the states it does not offload): those are on the device while the engine
generates, and the engine finds them there when it is built after the trainer (verl's hybrid
engine, NeMo RL). slime / miles build the engines first (miles 500d9e99 train.py:
create_rollout_manager before create_training_models), with every state offloaded in their
colocated recipes, so their resident share is ~0 either way. The trainer process's CUDA
context stays through torch_memory_saver's pause and is added to the generation peak.
"""

from __future__ import annotations

import numpy as np

from ..columns import Batch
from .inputs import constants

GIB = 2.0 ** 30
MIB = 2.0 ** 20


def _defaults_by_memory(hbm_gib: np.ndarray, tp: np.ndarray):
    """SGLang's chunked_prefill_size and cuda_graph_max_bs by GPU memory (server_args.py
    `_handle_gpu_memory_settings` buckets; catalogs/rl.yaml sglang_memory comment)."""
    small_tp = tp < 4
    chunk = np.select([hbm_gib < 35, hbm_gib < 60, hbm_gib < 160], [2048.0, 4096.0, 8192.0],
                      16384.0)
    graph_bs = np.select([hbm_gib < 35, hbm_gib < 60, hbm_gib < 160],
                         [np.where(small_tp, 8.0, 80.0), np.where(small_tp, 32.0, 160.0),
                          np.where(small_tp, 256.0, 512.0)], 512.0)
    return chunk, graph_bs


def reserve_bytes(b: Batch, dp_attention: np.ndarray, spec: np.ndarray) -> np.ndarray:
    """Per GPU: what SGLang reserves beside the static budget for activations, CUDA graphs and
    metadata (bytes). dp_attention: the DP-attention size (1 without); spec: a draft model."""
    k = constants()["sglang_memory"]
    tp, pp = b.rollout_tp, b.rollout_pp
    chunk, graph_bs = _defaults_by_memory(b.hbm_gib, tp)
    mib = (k["reserve_base_mib"] + k["reserve_per_prefill_token_mib"] * np.maximum(chunk, 2048)
           + k["reserve_per_graph_bs_mib"] * graph_bs + k["reserve_per_parallel_mib"] * tp * pp)
    dpa = dp_attention > 1
    mib = mib + np.where(dpa, k["reserve_dp_attention_per_bs_mib"] * graph_bs * dp_attention, 0.0)
    mib = mib + np.where(dpa & (graph_bs > 300), 1.5 * graph_bs * dp_attention, 0.0)
    mib = np.where(b.hbm_gib > 60, np.maximum(mib, k["reserve_floor_large_gpu_mib"]), mib)
    mib = mib + np.where(spec, k["reserve_spec_mib"], 0.0)
    return mib * MIB


def memory(b: Batch, weights: np.ndarray, resident_gib: np.ndarray,
           dp_attention: np.ndarray, spec: np.ndarray) -> dict:
    """Per GPU (bytes): the static budget, the KV pool inside it, the reserve and the engine's
    start-up usage. weights: the engine's weights per GPU (bytes); resident_gib: what the
    colocated trainer keeps on the GPU while the engine generates (0 when split)."""
    k = constants()["sglang_memory"]
    g = b.rollout_tp * b.rollout_pp
    init = np.where(g > 1, k["engine_init_gib_tp"], k["engine_init_gib_single"]) * GIB
    free_at_start = b.hbm_gib * GIB - resident_gib * GIB - init
    static = b.gpu_memory_utilization * np.maximum(free_at_start, 0.0)
    kv = static - weights
    reserve = reserve_bytes(b, dp_attention, spec)
    # the colocated trainer's CUDA context outlives its torch_memory_saver pause
    trainer_ctx = np.where(b.placement == 0, k["trainer_context_gib"] * GIB, 0.0)
    return {"static": static, "kv": kv, "reserve": reserve, "init": init,
            "trainer_context": trainer_ctx,
            # the engine's share of the generation peak (the trainer's resident states are
            # added by phases.py, as for vLLM)
            "peak": init + static + reserve + trainer_ctx}
