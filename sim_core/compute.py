"""Compute time of the workload's ops: a roofline with size-dependent efficiency curves.

GEMMs run at `peak * gemm_max * wave_efficiency * K/(K + k_half)` unless their bytes make them
memory-bound; attention at `peak * attn_eff * s/(s + s_half) * tiles/(tiles + tiles_half)`, tiles
being the 128-query blocks of one micro-batch on one GPU (too few leave SMs idle); elementwise
ops at a fraction of HBM bandwidth. On Hopper the curves' shapes (k_half, attention's
halves and maxima) come from kernels measured on H100 and H200 (data/kernels, `python -m
sim_core.accuracy.fit --kernels`). The constants live in catalogs/efficiency.yaml with their sources. A learned
per-op model (sweep calibrate) can replace `gemm_efficiency` through `set_gemm_model` and the
attention efficiency through `set_attention_model`; where a learned model returns NaN (a GPU it
was not trained for) the roofline curve is used.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

from . import catalog_yaml, distinct, fp4, frameworks, moe, recompute, workload
from .arrays import where
from .columns import Batch
from .specs import ATTENTION_KERNEL
from .workload import ACT_BYTES, Workload

TILE_M, TILE_N = 128, 128  # output tile of a tensor-core GEMM kernel (cuBLAS/CUTLASS default)

_gemm_model = None  # optional learned model: f(batch, m, n, k, is_fp8) -> efficiency array
_attention_model = None  # optional learned model: f(batch, backward: bool) -> efficiency array
_efficiency_scale = None  # optional run calibration: f(batch) -> (gemm scale, attention scale)


def set_gemm_model(model) -> None:
    """Install a learned GEMM-efficiency model (None restores the roofline curve)."""
    global _gemm_model
    _gemm_model = model


def set_attention_model(model) -> None:
    """Install a learned attention-efficiency model f(batch, backward) -> fraction of the bf16
    dense peak per configuration, NaN where it has no opinion (None restores the curve)."""
    global _attention_model
    _attention_model = model


def set_efficiency_scale(fn) -> None:
    """Install a per-configuration scale of GEMM and attention efficiency, f(batch) -> (gemm,
    attention) arrays, 1 where it has no opinion (sim_core.calibration.runs fits it to a user's
    runs); None removes it."""
    global _efficiency_scale
    _efficiency_scale = fn


def _scale(b: Batch, which: int):
    if _efficiency_scale is None:
        return 1.0
    return np.asarray(_efficiency_scale(b)[which], dtype=np.float64)


@functools.lru_cache(maxsize=1)
def efficiency_table() -> dict:
    text = resources.files("sim_core").joinpath("catalogs/efficiency.yaml").read_text()
    return catalog_yaml.read(text)["arch"]


def _by_arch(arch: np.ndarray, key: str, sub: str | None = None) -> np.ndarray:
    """A constant of efficiency.yaml per configuration, by its GPU architecture; an unknown
    architecture uses the nearest listed one at or below it (sm_120 -> Blackwell's 100, a
    future CDNA -> 950), the oldest for anything older: the keys span three vendors' numbering
    (NVIDIA 80-100, AMD 910-950, Ascend 2201), so "the newest listed" would hand a GPU another
    vendor's kernels. A kernel family an architecture has no entry for
    is NaN: flex off Hopper (never measured; rules.attention_rules refuses it) and unfused
    everywhere (priced from its passes, unfused_attention_times). Reads the table on every call
    (the accuracy fit edits it in place)."""
    table = efficiency_table()
    archs = np.array(sorted(table), dtype=np.float64)
    vals = np.array([table[a][key].get(sub, np.nan) if sub else table[a][key]
                     for a in sorted(table)], dtype=np.float64)
    arch = np.asarray(arch, dtype=np.float64)
    idx = np.clip(np.searchsorted(archs, arch, side="right") - 1, 0, len(archs) - 1)
    return vals[idx]


def gemm_efficiency(b: Batch, m, n, k, fp8: np.ndarray, split_k: bool = True) -> np.ndarray:
    """Fraction of dense peak a GEMM of shape (m, n, k) achieves on each configuration's GPU;
    split_k False for kernels that cannot split K (grouped GEMMs, see gemm_curve)."""
    if _gemm_model is not None:
        learned = np.asarray(_gemm_model(b, m, n, k, fp8), dtype=np.float64)
        miss = np.isnan(learned)
        eff = learned if not miss.any() else np.where(
            miss, roofline_gemm_efficiency(b, m, n, k, fp8, split_k), learned)
    else:
        eff = roofline_gemm_efficiency(b, m, n, k, fp8, split_k)
    if _efficiency_scale is None:
        return eff
    return np.minimum(eff * _scale(b, 0), 1.0)


def roofline_gemm_efficiency(b: Batch, m, n, k, fp8: np.ndarray,
                              split_k: bool = True) -> np.ndarray:
    """The default curve: gemm_max x wave quantization x K/(K + k_half). gemm_max is the
    architecture's (efficiency.yaml) unless the GPU has a published ceiling of its own
    (gemm_max_bf16 / gemm_max_fp8 > 0, data/kernels/published: MI300X and MI325X share CDNA3
    but reach different clocks under load)."""
    arch = b.sm_arch
    emax = np.where(fp8, _by_arch(arch, "gemm_max", "fp8"), _by_arch(arch, "gemm_max", "bf16"))
    if "gemm_max_bf16" in b:
        own = np.where(fp8, b.gemm_max_fp8, b.gemm_max_bf16)
        emax = np.where(own > 0, own, emax)
    # FP8 kernels take K in 128-wide tiles (bf16: 64), so a short K costs them more
    k_half = np.where(fp8, _by_arch(arch, "gemm_k_half", "fp8"),
                      _by_arch(arch, "gemm_k_half", "bf16"))
    return gemm_curve(m, n, k, emax, k_half, b.sm_count, split_k)


# Split factors of the K loop a GEMM library may run: cuBLAS's split-K kernels and CUTLASS's
# stream-K scheduler (Osama et al. 2023, "Stream-K: Work-centric Parallel Decomposition for Dense
# Matrix-Matrix Multiplication on the GPU", arXiv:2301.03598; CUTLASS 3.x
# `KernelTmaWarpSpecializedCooperative` with `StreamKScheduler`) hand the K loop of few output
# tiles to otherwise idle SMs. Each split keeps at least SPLIT_K_MIN of K.
SPLIT_K = (1, 2, 3, 4, 6, 8, 12, 16)
SPLIT_K_MIN = 128


def gemm_curve(m, n, k, emax, k_half, sm_count, split_k: bool = True):
    """The GEMM curve's form (also what `python -m sim_core.accuracy.fit --kernels` fits): emax x
    the best, over K-split factors s, of wave quantization of tiles x s work units (128x128
    output tiles) over the SMs x (K/s)/(K/s + k_half). s = 1 is the plain tiled kernel; a
    shape of few output tiles and a long K (a small model's weight gradient, a high-TP
    projection, an LM head's input gradient) runs near full speed split, not at tiles/SMs.
    The split's partial-sum reduction is not charged: fitted on the measured H100/H200 tables
    its cost came out at 0.1% (data/kernels, `fit --kernels`).

    split_k False: one split only, for MoE expert GEMMs. A grouped GEMM cannot split K: CUTLASS's
    SM90 ptr-array / grouped cooperative kernel, which torch._grouped_mm runs
    (aten/src/ATen/native/cuda/GroupMM.cu, KernelPtrArrayTmaWarpSpecializedCooperative), only
    takes its group tile scheduler (include/cutlass/gemm/kernel/
    sm90_gemm_array_tma_warpspecialized_cooperative.hpp: "only supports the default
    scheduler"). They stay priced at one expert's tiles, as before (docs/accuracy-edges.md
    says what pooling the local experts' tiles would do)."""
    tiles = np.ceil(np.asarray(m, dtype=np.float64) / TILE_M) * np.ceil(
        np.asarray(n, dtype=np.float64) / TILE_N)
    tiles, k, sm, kh = np.broadcast_arrays(tiles, np.asarray(k, dtype=np.float64),
                                           np.asarray(sm_count, dtype=np.float64),
                                           np.asarray(k_half, dtype=np.float64))
    waves = tiles / sm
    best = waves / np.ceil(waves) * k / (k + kh)
    if split_k:
        # only where a split can win: no split s >= 2 beats (K/2)/(K/2 + k_half), a full
        # last wave at half the K (exact pruning, the result is that of trying every s)
        idx = np.flatnonzero((best < k / (k + 2 * kh)) & (k >= 2 * SPLIT_K_MIN))
        if idx.size:
            t, kk, ss, hh = (a.ravel()[idx] for a in (tiles, k, sm, kh))
            sub = best.ravel()[idx]
            for s in SPLIT_K[1:]:
                ks = kk / s
                w = t * s / ss
                sub = np.maximum(sub, np.where(ks >= SPLIT_K_MIN,
                                               w / np.ceil(w) * ks / (ks + hh), 0.0))
            best = best.copy()
            best.ravel()[idx] = sub
    return emax * best


ATTN_TILE = 128  # query rows per FlashAttention / cuDNN attention thread block


def attention_curve(tiles, seq, emax, seq_half, tiles_half):
    """The attention curve's form (also what `python -m sim_core.accuracy.fit --kernels` fits): emax x
    s/(s + seq_half) x tiles/(tiles + tiles_half), tiles = query blocks of ATTN_TILE rows."""
    return emax * seq / (seq + seq_half) * tiles / (tiles + tiles_half)


def head_dim_factor(head_dim, hd_half):
    """Attention efficiency at head dimension d relative to d = 128 (where the kernels' maxima
    were measured): d/(d + hd_half) / (128/(128 + hd_half)); a narrow head does less matmul
    work per loaded K/V tile. hd_half from the FlashAttention-2/3 papers' tables
    (data/kernels/published, `python -m sim_core.accuracy.fit --kernels`); 0 turns it off."""
    d = np.maximum(np.asarray(head_dim, dtype=np.float64), 1.0)
    return d / (d + hd_half) * (128.0 + hd_half) / 128.0


def attention_head_dim(b: Batch) -> np.ndarray:
    """The head dimension the attention kernel runs: q.k width (MLA: nope + rope), else the
    model's head_dim or hidden / heads; 128 where a batch carries no model shape (kernel
    tables, learned models)."""
    if "hidden" not in b:
        return np.full(np.shape(b.sm_arch), 128.0)
    hd = np.where(b.head_dim > 0, b.head_dim, b.hidden / np.maximum(b.heads, 1))
    if "kv_lora_rank" in b:
        hd = np.where(b.kv_lora_rank > 0, b.qk_nope_head_dim + b.qk_rope_head_dim, hd)
    return hd


def attention_efficiency(b: Batch, direction: str, keys=None) -> np.ndarray:
    """Fraction of the bf16 peak causal flash attention reaches, forward or backward: the
    kernel family's maximum x s/(s + seq_half) (short rows do little work per loaded tile) x
    tiles/(tiles + tiles_half) (a micro-batch of few heads per GPU and short local sequences
    has too few query blocks to fill the SMs; tiles_half 0 turns the term off).

    `keys` (a sliding window's width) replaces s in the first term; the query blocks, hence
    the tiles term, stay those of the whole local sequence. Why the window is the right
    length: FlashAttention and cuDNN compute every 128x128 block the mask touches, masked
    entries included. A causal row of s keys computes (s + 128)/s times its useful pairs (the
    diagonal blocks); a window of w keys spans w/128 + 1 key blocks per query block for w
    useful keys: (w + 128)/w, the same waste as a causal row of s = w. Its per-query-block
    costs (load Q, write O and the log-sum-exp) are spread over w/128 + 1 key blocks, where a
    causal row of w averages half that, so the curve at s = w errs slow; the kernel tables
    (data/kernels) start at s = 1024 and the papers' (published/attention-papers.csv) at 512,
    so no measured row settles it."""
    arch = b.sm_arch
    code = np.asarray(b.attention_kernel, dtype=np.int64)
    present = np.unique(code)

    def pick(key):  # each configuration's kernel family's constant (specs.ATTENTION_KERNEL codes)
        if present.size == 1:  # the usual batch: one family, one lookup
            return _by_arch(arch, key, ATTENTION_KERNEL[present[0]])
        out = np.empty(np.shape(code), dtype=np.float64)
        for c in present:
            mine = code == c
            out[mine] = _by_arch(np.broadcast_to(arch, code.shape)[mine], key,
                                 ATTENTION_KERNEL[c])
        return out

    tiles = (b.micro_batch * np.maximum(b.heads / b.tp, 1.0)
             * np.ceil(np.maximum(b.seq_len / b.cp, 1.0) / ATTN_TILE))
    seq = b.seq_len if keys is None else keys
    eff = attention_curve(tiles, seq, pick(f"attn_{direction}"),
                          pick(f"attn_seq_half_{direction}"),
                          pick(f"attn_tiles_half_{direction}")) * head_dim_factor(
                              attention_head_dim(b), pick("attn_head_dim_half"))
    return _gpu_attention_scale(b, code, eff)


def _gpu_attention_scale(b: Batch, code: np.ndarray, eff: np.ndarray) -> np.ndarray:
    """The curve scaled by the GPU's published attention level where it has one
    (attn_scale_fa2 / attn_scale_fa3, catalog.attention_scales: H20), at most the peak; the
    curves themselves were measured on H100/H200. Other families and GPUs: unchanged."""
    s2, s3 = b.get("attn_scale_fa2"), b.get("attn_scale_fa3")
    if s2 is None or s3 is None:
        return eff
    s = np.where(code == ATTENTION_KERNEL.index("fa2"), s2,
                 np.where(code == ATTENTION_KERNEL.index("fa3"), s3, 1.0))
    if np.all(s == 1.0):
        return eff
    return np.minimum(eff * s, 1.0)


# Memory passes over the s x s scores of the unfused attention, beyond its two batched GEMMs
# (Megatron-Core core_v0.15.3 megatron/core/transformer/dot_product_attention.py, the same path
# as Megatron-LM v2.5 megatron/model/transformer.py ParallelAttention): the fused scale-mask-
# softmax reads the scores and writes the probabilities (2), its backward reads the gradient
# and the probabilities and writes the score gradient (3); dropout, when on, reads and writes
# the probabilities and writes a 1-byte mask (2.5), its backward reads gradient and mask and
# writes (2.5). The GEMMs' own score traffic (baddbmm's write, bmm's read of the
# probabilities; in backward the four GEMMs' reads/writes) bounds each GEMM from below.
UNFUSED_SOFTMAX_PASSES = (2.0, 3.0)  # forward, backward
UNFUSED_DROPOUT_PASSES = (2.5, 2.5)


def unfused_attention_times(b: Batch, dims: dict, peak_bf16, hbm) -> tuple[np.ndarray,
                                                                           np.ndarray]:
    """Seconds of one layer's unfused attention per micro-batch on one GPU, forward and
    backward: scores = Q K^T (a batched GEMM over all s x s pairs; the causal mask is applied
    by the softmax, not skipped), softmax, dropout, probabilities x V; backward the four GEMMs
    (dP, dV, dQ, dK) and the softmax/dropout backward. Each GEMM is the slower of its FLOPs at
    the GEMM curve (batched over micro-batch x heads) and its score traffic; the softmax and
    dropout passes are memory-bound (2 bytes per score element, 1 for the dropout mask)."""
    heads = dims["a"] / b.tp
    s = b.seq_len
    n_scores = b.micro_batch * heads * s * s
    rows = b.micro_batch * heads * s
    bf16 = np.zeros(np.shape(s), dtype=bool)
    score_s = 2.0 * n_scores / hbm  # one pass over the bf16 scores

    def gemm(n, k, width):
        flops = 2.0 * n_scores * width
        rate = peak_bf16 * gemm_efficiency(b, rows, n, k, bf16)
        return np.maximum(flops / rate, score_s)

    qk = gemm(s, dims["dqk"], dims["dqk"])  # [rows x dqk] x [dqk x s] -> scores
    pv = gemm(dims["dv"], s, dims["dv"])  # [rows x s] x [s x dv] -> context
    drop = np.asarray(b.get("attention_dropout", 0.0 * s)) > 0
    mem_f = UNFUSED_SOFTMAX_PASSES[0] + np.where(drop, UNFUSED_DROPOUT_PASSES[0], 0.0)
    mem_b = UNFUSED_SOFTMAX_PASSES[1] + np.where(drop, UNFUSED_DROPOUT_PASSES[1], 0.0)
    fwd = qk + pv + mem_f * score_s
    bwd = 2.0 * (qk + pv) + mem_b * score_s  # dQ, dK like QK^T; dP, dV like PV
    return fwd, bwd


@functools.lru_cache(maxsize=1)
def fp8_recipe_table() -> dict:
    """catalogs/efficiency.yaml `fp8_recipes`: per recipe, the quantisation bytes beyond
    delayed scaling's cast, whether wgrad runs in FP8, and which amax all-reduce it issues."""
    text = resources.files("sim_core").joinpath("catalogs/efficiency.yaml").read_text()
    return catalog_yaml.read(text)["fp8_recipes"]


def fp8_recipe_arrays(b: Batch) -> dict:
    """The recipe table's fields per configuration (delayed where a batch has no fp8_recipe)."""
    from .specs import FP8_RECIPE

    table = fp8_recipe_table()
    code = np.asarray(b.get("fp8_recipe", np.zeros(np.shape(b.sm_arch))), dtype=np.int64)
    pick = lambda key, typ: np.array([typ(table[r][key]) for r in FP8_RECIPE])[code]  # noqa: E731
    return {"extra_cast_bytes": pick("extra_cast_bytes", float),
            "amax_in_norm": pick("amax_in_norm", bool),
            "wgrad_fp8": pick("wgrad_fp8", bool), "amax_reduce": pick("amax_reduce", str),
            "gemm_time": pick("gemm_time", float)}


# GEMMs whose forward input a fused norm writes (Megatron-Core's TE spec, gpt_layer_specs.py:
# linear_qkv and the dense linear_fc1 are TELayerNormColumnParallelLinear); every other GEMM
# input, and every output gradient, is a plain bf16 tensor the quantizer reads by itself
NORM_FED_GEMMS = frozenset({"qkv_proj", "fc1"})


def _allreduce_latency_s(b: Batch, group) -> np.ndarray:
    """A one-float all-reduce is latency-bound: ~2 log2(n) steps (NCCL's tree / LL) of the
    intra-node latency, the inter-node one where the group spans nodes."""
    group = np.maximum(np.asarray(group, dtype=np.float64), 1.0)
    intra = np.asarray(b.get("intra_latency_us", 2.0), dtype=np.float64)
    inter = np.asarray(b.get("inter_latency_us", 5.0), dtype=np.float64)
    lat = np.where(group > b.get("gpus_per_node", 8), inter, intra) * 1e-6
    return np.where(group > 1, 2.0 * np.ceil(np.log2(group)) * lat, 0.0)


def fp8_scale_sync_s(b: Batch, recipe: dict, fp8, layers) -> np.ndarray:
    """Seconds per micro-batch (forward; the same again in backward) of the amax all-reduces an
    FP8 recipe issues on a stage of `layers` layers. `step`: delayed scaling's one all-reduce of
    every amax of the autocast region per forward and per backward, over tp x dp x cp
    (TE quantization.py reduce_and_update_fp8_tensors; Megatron-Core's amax reduction group).
    `tp_tensor`: current scaling's per-tensor all-reduce of the input of each column-parallel
    Linear and the output gradient of each row-parallel Linear under sequence parallelism
    (TE module/linear.py with_amax_reduction): 2 per layer per pass over tp. `none`: local
    scales (rowwise, blockwise, mxfp8)."""
    dp = np.where(b.dp > 0, b.dp, b.num_gpus / np.maximum(b.tp * b.pp * b.cp, 1))
    step = _allreduce_latency_s(b, b.tp * dp * b.cp)
    tp_tensor = 2.0 * layers * _allreduce_latency_s(b, b.tp) * (b.tp > 1) * b.sequence_parallel
    kind = recipe["amax_reduce"]
    return np.where(fp8, np.where(kind == "step", step,
                                  np.where(kind == "tp_tensor", tp_tensor, 0.0)), 0.0)


def power_clock_scale(b: Batch) -> np.ndarray:
    """Sustained tensor-core clock under a board power limit, relative to the GPU's rated power
    (1 where no limit is set or the limit is at or above the rating: no gain is assumed).

    No published table of H100 GEMM throughput against nvidia-smi power limit was found, so
    this is the physical model, stated: dynamic power P ~ C f V^2 with the voltage following
    the clock along the DVFS curve (V ~ f) gives P ~ f^3, i.e. f = f_rated (P / P_rated)^(1/3).
    It is checked against NVIDIA's own spec clocks of one die at two power ratings (dense BF16
    / (132 SMs x 4096 FLOP/clk)): H100 SXM 700 W 1.83 GHz -> at 400 W the model gives
    1.52 GHz, the H100 NVL datasheet's 400 W part runs 1.545 GHz (835.5 TFLOP/s): the model is
    1.7% conservative. Memory bandwidth and launch gaps are not scaled (HBM keeps its clock).
    Where the catalog's peak is already the power-limited part's (h100-96gb at 500 W) a limit
    equal to its tdp_w changes nothing."""
    cap = b.get("power_limit_w")
    tdp = b.get("tdp_w")
    if cap is None or tdp is None:
        return np.ones(np.shape(b.sm_arch))
    rated = np.maximum(np.asarray(tdp, dtype=np.float64), 1.0)
    ratio = np.where(cap > 0, np.minimum(np.asarray(cap, dtype=np.float64) / rated, 1.0), 1.0)
    return np.cbrt(np.maximum(ratio, 1e-3))


def _attention_rates(b: Batch, peak_bf16, keys=None) -> tuple[np.ndarray, np.ndarray]:
    """FLOP/s of attention forward and backward: the curve, a learned model where it has an
    opinion, a run calibration's scale. With `keys` (a sliding window) the learned model, which
    knows causal kernels of (batch x heads, local sequence), is asked for causal rows of the
    window's length, as many as keep the query blocks: (s/cp)/w rows per sequence."""
    attn_f = peak_bf16 * attention_efficiency(b, "fwd", keys)
    attn_b = peak_bf16 * attention_efficiency(b, "bwd", keys)
    if _attention_model is not None:
        bm = b
        if keys is not None:
            win = keys < b.seq_len
            bm = Batch(b)
            bm["seq_len"] = np.where(win, keys * b.cp, b.seq_len)
            bm["micro_batch"] = np.where(win, b.micro_batch * b.seq_len / (b.cp * keys),
                                         b.micro_batch)
        for bwd in (False, True):
            eff = np.asarray(_attention_model(bm, bwd), dtype=np.float64)
            learned = np.where(np.isnan(eff), np.nan, peak_bf16 * eff)
            if bwd:
                attn_b = np.where(np.isnan(learned), attn_b, learned)
            else:
                attn_f = np.where(np.isnan(learned), attn_f, learned)
    if _efficiency_scale is not None:
        attn_f = np.minimum(attn_f * _scale(b, 1), peak_bf16)
        attn_b = np.minimum(attn_b * _scale(b, 1), peak_bf16)
    return attn_f, attn_b


def stage_times(b: Batch, wl: Workload) -> dict:
    """Seconds per micro-batch on one GPU: forward, backward, recompute, by stage part.

    Returns arrays for the transformer layers of a stage (`layer_*`), and for the extra work of
    the first stage (embedding) and of the last stage (LM head + loss).

    A workload built without ops (workload.build(b, ops=False)) is priced once per distinct
    input of the compute model (sim_core.distinct: the GEMMs, attention and elementwise ops do
    not depend on dp, ZeRO or the overlap switches) and broadcast back; only the FP8 scale sync,
    which depends on the data-parallel size, is added on every row. The result is the same, bit
    for bit, as pricing every row (tests/test_distinct.py).
    """
    fp8 = (b.precision == 1) & (b.has_fp8 > 0)
    fp4_rows = fp4.active(b)  # NVFP4 / MXFP4 layers: their own amax reduction (sim_core/fp4.py)
    if wl.ops is None:
        if _gemm_model is None and _attention_model is None and _efficiency_scale is None:
            core = distinct.on_distinct("compute.stage_times", b,
                                        lambda sb: _stage_core(sb, workload.op_workload(sb)),
                                        seed=STAGE_INPUTS)
        else:  # a learned model may read any column: price every row
            core = _stage_core(b, workload.op_workload(b))
    else:
        core = _stage_core(b, wl)
    out = {k: v for k, v in core.items() if not k.startswith("_")}
    # the FP8 recipe's amax all-reduces span tp x dp x cp: once per distinct input of their
    # own (the stage's layer count riding along as a column), added on every row
    aug = Batch(b)
    aug["_layers_per_stage"] = np.broadcast_to(wl.layers_per_stage, b.tp.shape)
    sync = distinct.on_distinct("compute.fp8_scale_sync", aug, lambda sb: {
        "sync": fp8_scale_sync_s(sb, fp4.apply_to_recipe(fp8_recipe_arrays(sb), sb,
                                                         fp4.active(sb)),
                                 ((sb.precision == 1) & (sb.has_fp8 > 0)) | fp4.active(sb),
                                 sb["_layers_per_stage"])})["sync"]
    lay_fwd = out["layer_fwd"] + sync
    out["layer_fwd"] = lay_fwd
    out["layer_bwd"] = out["layer_bwd"] + sync
    rc = b.recompute
    # recompute: full replays the layer forward; selective (op-level SAC) replays every other
    # GEMM and the memory-bound ops whose outputs it did not keep; plus the MoE modules'
    out["layer_recompute"] = where(rc == 2, lay_fwd, where(
        rc == 1, where(recompute.column(b) > 0, core["_modules"], core["_selective"]),
        0.0)) + core["_moe_recompute"]
    return {k: np.broadcast_to(np.asarray(v, dtype=np.float64), b.tp.shape)
            for k, v in out.items()}


# The Batch columns the compute model is known to read (the key it is first grouped by;
# sim_core.distinct adds any other column it sees read)
STAGE_INPUTS = (
    "precision", "has_fp8", "power_limit_w", "tdp_w", "peak_bf16", "peak_fp8", "hbm_bw_gbs",
    "sm_arch", "sm_count", "gemm_max_bf16", "gemm_max_fp8", "fused_elementwise",
    "attention_kernel", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab",
    "experts", "expert_ffn", "top_k", "shared_experts", "first_dense_layers", "kv_lora_rank",
    "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "activation",
    "tied_embeddings", "tp", "pp", "cp", "vpp", "ep", "etp", "micro_batch", "seq_len",
    "sequence_parallel", "recompute", "moe_recompute", "recompute_modules", "fp8_recipe",
    "framework", "loss_impl",
    "sliding_window", "window_attn_skip_freq", "attention_dropout", "moe_dispatcher",
    "peak_nvfp4", "peak_mxfp4", "fp8_weight_cache", "fp8_param_gather",
    "attn_scale_fa2", "attn_scale_fa3",
)


def _stage_core(b: Batch, wl: Workload) -> dict:
    """stage_times but the FP8 scale sync and the recompute choice: what depends only on the
    ops (`_selective` and `_moe_recompute` are the recompute's parts)."""
    fp8 = (b.precision == 1) & (b.has_fp8 > 0)
    clock = power_clock_scale(b)  # a board power limit lowers the tensor clock
    peak_bf16 = b.peak_bf16 * 1e12 * clock
    peak_gemm = np.where(fp8, b.peak_fp8, b.peak_bf16) * 1e12 * clock
    # FP4 (nvfp4 / mxfp4, sim_core/fp4.py): the layer GEMMs at the format's dense peak, with
    # the FP8 GEMM ceiling (an assumption: no FP4 GEMM measured); below, FP4 rows take the FP8
    # path ("is_fp8" = low precision) with their recipe's quantisation traffic
    fp4_rows = fp4.active(b)
    if fp4_rows.any():
        peak_gemm = np.where(fp4_rows, fp4.peak(b) * 1e12 * clock, peak_gemm)
        fp8 = fp8 | fp4_rows
    hbm = b.hbm_bw_gbs * 1e9 * _by_arch(b.sm_arch, "elementwise")
    # eager (unfused) elementwise ops move more bytes per useful byte
    hbm_elem = hbm / np.where(b.fused_elementwise, 1.0, _by_arch(b.sm_arch, "unfused_elementwise"))
    attn_f, attn_b = _attention_rates(b, peak_bf16)
    # the unfused kernel has no flash curve (its constants are NaN): priced from its passes
    unfused = np.asarray(b.attention_kernel) == ATTENTION_KERNEL.index("unfused")
    unf_f = unf_b = 0.0
    if unfused.any():
        unf_f, unf_b = unfused_attention_times(b, wl.dims, peak_bf16, hbm)
    moe_frac = wl.moe_stage_share  # share of the busiest rank's layers
    # launch gaps of a layer's kernels; a MoE layer adds its router, permutation, dispatcher
    # and per-expert GEMM launches and one host sync (moe.launch_overhead_s)
    moe_launch = moe.launch_overhead_s(b)
    overhead = _by_arch(b.sm_arch, "layer_overhead_us") * 1e-6 * wl.layers_per_stage
    moe_fwd_over = moe_frac * moe_launch["fwd"] * wl.layers_per_stage
    moe_bwd_over = moe_frac * moe_launch["bwd"] * wl.layers_per_stage

    # per-architecture constants of the GEMM loop, looked up once; the FP8 recipe adds its
    # own quantisation traffic and decides whether the weight-gradient GEMM runs in FP8
    recipe = fp4.apply_to_recipe(fp8_recipe_arrays(b), b, fp4_rows)
    cast_bytes = _by_arch(b.sm_arch, "fp8_cast_bytes") + recipe["extra_cast_bytes"]
    # current scaling's amax pass rides in the norm kernel where the framework fuses the norm
    # into the FP8 Linear (TE LayerNormLinear: frameworks.yaml fp8_norm_amax): the forward
    # input of qkv_proj / dense fc1 then costs delayed scaling's cast; gradients never do
    fw = frameworks.column(b, "framework").astype(np.int64)
    te_norm = frameworks._support_table()["fp8_norm_amax"][fw] & (b.fused_elementwise > 0)
    norm_cast_bytes = cast_bytes - np.where(recipe["amax_in_norm"] & te_norm,
                                            recipe["extra_cast_bytes"], 0.0)
    wgrad_hp = fp8 & ~recipe["wgrad_fp8"]
    # weights quantised in every micro-batch's forward (and its replay under recompute): the
    # FP8 weight cache is off (Megatron-Core disable_parameter_transpose_cache) and the primary
    # weights are bf16 (with fp8_param_gather they are FP8 already). With the cache on, one
    # cast per step is left unpriced (1 / micro-batches of this term).
    recast = (fp8 & ~np.asarray(b.get("fp8_weight_cache", True), dtype=bool)
              & ~np.asarray(b.fp8_param_gather, dtype=bool))
    grouped = {True: _by_arch(b.sm_arch, "grouped_gemm", "fp8"),
               False: _by_arch(b.sm_arch, "grouped_gemm", "bf16")}
    parts = {w: {"fwd": 0.0, "bwd": 0.0, "gemm_fwd": 0.0, "attn_fwd": 0.0,
                 "elem_fwd": 0.0, "moe_mlp_fwd": 0.0, "moe_mlp_bwd": 0.0,
                 "moe_mlp_wgrad": 0.0, "shared_fwd": 0.0, "shared_bwd": 0.0}
             for w in ("layer", "first_stage", "last_stage")}
    op_fwd = {}  # forward seconds of each layer op (the recompute modules replay some)
    for op in wl.ops:
        if op.op_class == "gemm":
            # LM head stays bf16 (TE recipes); so do LoRA adapters (plain Megatron linears)
            # and the MoE router (router_gating_linear: a bf16 te_general_gemm with an fp32 or
            # bf16 output, outside the FP8 autocast; moe/moe_utils.py L958-964, core_v0.15.3)
            is_fp8 = fp8 & (op.where == "layer") & (not op.name.startswith("lora_")) & (
                op.name != "router")
            # an op absent from a configuration (e.g. expert GEMMs of a dense model) has zero
            # FLOPs; clamp its dims so that its efficiency stays finite
            m, n, k = (np.maximum(x, 1.0) for x in (op.gemm_m, op.gemm_n, op.gemm_k))
            expert = op.name.startswith("expert_")
            eff = gemm_efficiency(b, m, n, k, is_fp8, split_k=not expert)
            if expert:
                eff = eff * np.where(is_fp8, grouped[True], grouped[False])
            # an FP8 GEMM with finer scales (rowwise, blockwise) runs slower than per-tensor
            rate = np.where(is_fp8, peak_gemm / recipe["gemm_time"], peak_bf16) * eff
            # memory-bound floor: bytes moved per FLOP of the representative GEMM
            bytes_per_flop = (m * k + k * n + m * n) / (m * n * k)  # 2 bytes / 2 flops
            sec_per_flop = np.maximum(1.0 / rate, bytes_per_flop / hbm)
            fwd = op.fwd_flops * sec_per_flop
            bwd = op.bwd_flops * sec_per_flop
            # FP8: each GEMM input is cast (input rows x k elements per 2*m*n*k FLOPs); backward
            # casts the output gradient too
            cast = np.where(is_fp8, cast_bytes / (2 * n) / hbm, 0.0)
            cast_in = (np.where(is_fp8, norm_cast_bytes / (2 * n) / hbm, 0.0)
                       if op.name in NORM_FED_GEMMS else cast)
            fwd = fwd + op.fwd_flops * cast_in
            if recast.any():
                # the weight (n x k per 2 m n k FLOPs) quantised again in this forward
                fwd = fwd + op.fwd_flops * np.where(is_fp8 & recast,
                                                    cast_bytes / (2 * m) / hbm, 0.0)
            hp = is_fp8 & wgrad_hp
            if hp.any():  # rowwise_with_gw_hp: the weight gradient in bf16, uncast
                wfrac = op.bwd_wgrad_flops / np.maximum(op.bwd_flops, 1e-30)
                eff_hp = gemm_efficiency(b, m, n, k, np.zeros_like(is_fp8), split_k=not expert)
                if expert:
                    eff_hp = eff_hp * grouped[False]
                sec_hp = np.maximum(1.0 / (peak_bf16 * eff_hp), bytes_per_flop / hbm)
                bwd = np.where(hp, op.bwd_flops * ((1 - wfrac) * (sec_per_flop + cast)
                                                   + wfrac * sec_hp), bwd + op.bwd_flops * cast)
            else:
                bwd = bwd + op.bwd_flops * cast
            parts[op.where]["gemm_fwd"] = parts[op.where]["gemm_fwd"] + fwd
        elif op.op_class == "attention":
            if op.attn_keys is None:
                fwd = op.fwd_flops / attn_f
                bwd = op.bwd_flops / attn_b
                if unfused.any():  # every layer computes all s x s scores, windowed or not
                    fwd = np.where(unfused, unf_f * wl.layers_per_stage, fwd)
                    bwd = np.where(unfused, unf_b * wl.layers_per_stage, bwd)
            elif not np.any(op.fwd_flops > 0):
                continue  # no sliding-window layer in this batch
            else:
                win_f, win_b = _attention_rates(b, peak_bf16, op.attn_keys)
                fwd = np.where(unfused, 0.0, op.fwd_flops / win_f)
                bwd = np.where(unfused, 0.0, op.bwd_flops / win_b)
            parts[op.where]["attn_fwd"] = parts[op.where]["attn_fwd"] + fwd
        else:
            fwd = op.fwd_bytes / hbm_elem
            bwd = op.bwd_bytes / hbm_elem
            parts[op.where]["elem_fwd"] = parts[op.where]["elem_fwd"] + fwd
        parts[op.where]["fwd"] = parts[op.where]["fwd"] + fwd
        parts[op.where]["bwd"] = parts[op.where]["bwd"] + bwd
        if op.where == "layer":
            op_fwd[op.name] = op_fwd.get(op.name, 0.0) + fwd
        if op.name in moe.MLP_OPS:  # what the EP overlap schedules against (moe.exposed)
            p = parts[op.where]
            p["moe_mlp_fwd"] = p["moe_mlp_fwd"] + fwd
            p["moe_mlp_bwd"] = p["moe_mlp_bwd"] + bwd
            p["moe_mlp_wgrad"] = p["moe_mlp_wgrad"] + bwd * op.bwd_wgrad_flops / np.maximum(
                op.bwd_flops, 1e-30)
            if op.name in moe.SHARED_OPS:
                p["shared_fwd"] = p["shared_fwd"] + fwd
                p["shared_bwd"] = p["shared_bwd"] + bwd
    lay = parts["layer"]
    # (stage_times adds the FP8 scale sync to forward and backward)
    lay["fwd"] = lay["fwd"] + overhead + moe_fwd_over
    lay["bwd"] = lay["bwd"] + 2 * overhead + moe_bwd_over
    lay["moe_mlp_fwd"] = lay["moe_mlp_fwd"] + moe_fwd_over
    lay["moe_mlp_bwd"] = lay["moe_mlp_bwd"] + moe_bwd_over
    rc = b.recompute
    selective = 0.5 * lay["gemm_fwd"] + lay["elem_fwd"]
    # Megatron's recompute modules in effect (sim_core/recompute.py: the listed ones under
    # selective, moe_recompute's under none): each replays its own forward; "moe" the MoE
    # layer's, "moe_act" the routed experts' activation function (reads FC1's output, writes
    # its own)
    bits = recompute.effective(b)
    act_bytes = (ACT_BYTES * np.where(b.activation == 1, 3.0, 2.0) * wl.tokens / b.tp * b.top_k
                 * wl.moe_load * b.expert_ffn * moe_frac * wl.layers_per_stage)
    rep = np.where(b.sequence_parallel & (b.tp > 1), b.tp, 1.0)
    modules_rc = recompute.replay_seconds(
        b, bits, op_fwd, lay["attn_fwd"], wl.tokens, b.tp, rep, wl.dims, moe_frac,
        wl.layers_per_stage, lay["moe_mlp_fwd"], hbm_elem, act_bytes)
    # under recompute none only the MoE modules apply (the rules refuse the others there)
    moe_recompute = np.where(rc == 0, modules_rc, 0.0)
    listed = np.where((rc == 1) & (bits > 0), modules_rc, 0.0)
    out = {"_selective": selective, "_moe_recompute": moe_recompute, "_modules": listed}
    for w, d in parts.items():
        for k, val in d.items():
            out[f"{w}_{k}"] = np.broadcast_to(np.asarray(val, dtype=np.float64), b.tp.shape)
    return out


def optimizer_time(b: Batch, params_opt: np.ndarray) -> np.ndarray:
    """Adam step over the parameters this GPU updates: ~32 bytes of HBM traffic each
    (read fp32 grad, master, m, v; write master, m, v; write bf16 weight)."""
    hbm = b.hbm_bw_gbs * 1e9 * _by_arch(b.sm_arch, "elementwise")
    return 32.0 * params_opt / hbm
