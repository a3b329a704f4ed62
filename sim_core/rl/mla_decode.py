"""The MLA decode attention as FlashMLA runs it: bound by the cache read or by padded tiles.

Why: vLLM's MLA backend on Hopper is FlashMLA (vLLM >= 0.8 `platforms/cuda.py`: FlashMLA when
supported, forcing the KV block size to 64; deepseek-ai/FlashMLA). Its kernel processes the
query rows of the (single) latent KV head, s_q x heads per GPU of them, in tiles of 64 rows
(`Flash_fwd_kernel_traits_mla<576, 64, 64, 8, T, 512>`), every tile reading the whole cache: a
GPU holding 4 of DeepSeek-V3's 128 heads (TP 32) does the work of 64. That padded work is
64 x (576 + 512) x 2 FLOPs per 1,152 cached bytes, 121 FLOP/B: below an H800's or H200's ridge
(the read binds, as generation.py has always priced it) and far above an H20's (148 TFLOP/s
dense over 4.0 TB/s, 37 FLOP/B), where the kernel is compute-bound. Published on one H20
(FlashMLA issue 30): 120-130 TFLOP/s at full tiles, 0.86 of its peak, the cache read at
139-370 GB/s. The compute level per GPU is data (data/kernels/published/mla_decode_levels.csv);
Hopper parts without their own row take the H800's published 580 TFLOP/s (the same SMs and
clocks as H100 SXM and H200). Only MLA models on vLLM on NVIDIA Hopper are affected.
"""

from __future__ import annotations

import functools
import io
from importlib import resources

import numpy as np
import pandas as pd

LEVELS_FILE = "data/kernels/published/mla_decode_levels.csv"
TILE_ROWS = 64   # FlashMLA's kBlockM (query rows per tile) at the first release
HOPPER = 90
DEFAULT_GPU = "h800"  # the Hopper level for parts without a published row of their own


def table() -> pd.DataFrame:
    text = resources.files("sim_core").joinpath(LEVELS_FILE).read_text()
    return pd.read_csv(io.StringIO(text), comment="#")


@functools.lru_cache(maxsize=1)
def levels() -> dict:
    """{gpu: the compute-bound fraction of its dense bf16 peak}: the median of its `level`
    rows' published TFLOP/s over the catalog peak."""
    from .. import catalog

    t = table()
    t = t[t["use"] == "level"]
    out = {}
    for gpu, g in t.groupby("gpu"):
        peak = catalog.peak_tflops(catalog.get_gpu(gpu), "bf16")
        out[catalog.get_gpu(gpu).name] = float(np.median(g.tflops.to_numpy(float)) / peak)
    return out


def level_of(names) -> np.ndarray:
    """Per catalog GPU name: its own level, the H800's for another NVIDIA Hopper part, 0 for
    the rest (FlashMLA is a Hopper kernel; elsewhere the decode stays priced by its read)."""
    from .. import catalog

    lv = levels()
    out = []
    for n in names:
        g = catalog.get_gpu(n)
        hopper = g.vendor == "nvidia" and int(g.sm_arch) == HOPPER
        out.append(lv.get(g.name, lv[DEFAULT_GPU]) if hopper else 0.0)
    return np.array(out, dtype=np.float64)


def padded_flops(seqs, ctx, heads_per_gpu, s_q, layers, d, dv) -> np.ndarray:
    """FLOPs FlashMLA runs for `seqs` sequences of `ctx` cached tokens over `layers` layers: the
    query rows of each sequence rounded up to whole 64-row tiles, each tile (QK over d, PV over
    dv) over every cached token."""
    rows = np.ceil(np.asarray(heads_per_gpu, float) * s_q / TILE_ROWS) * TILE_ROWS
    return 2.0 * seqs * ctx * layers * rows * (d + dv)


def compute_time(b, seqs, ctx, spec_k, c, vllm) -> np.ndarray:
    """Seconds of FlashMLA's tensor-core work per decode step on each GPU of the engine (0 where
    it does not run: not MLA, not vLLM, not Hopper). `c` lifts per-row arrays to the shape of
    `seqs` (generation.step_time's convention); spec_k: drafted tokens verified per step;
    vllm: whether each row's engine is vLLM (already lifted)."""
    if "mla_decode_level" not in b or "kv_lora_rank" not in b:
        return np.zeros(np.shape(seqs))
    on = (c(b.mla) > 0) & vllm & (c(b.mla_decode_level) > 0)
    heads = c(b.heads) / c(b.rollout_tp)
    flops = padded_flops(seqs, ctx, heads, 1.0 + spec_k, c(b.layers) / c(b.rollout_pp),
                         c(b.kv_elems), c(b.kv_lora_rank))
    rate = c(b.peak_bf16) * 1e12 * np.maximum(c(b.mla_decode_level), 1e-9)
    return np.where(on, flops / rate, 0.0)
