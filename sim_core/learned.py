"""Learned models for `sweep calibrate`: per-(GPU, op class) kernel-efficiency regressors, the
Echo overlap-slowdown regressor, and the per-cluster scales of the NCCL model.

All three are OPTIONAL: the simulator's defaults (roofline curves in compute.py, the explained
slowdown prior in overlap.py, the white-box NCCL model) are untouched until a calibration
profile is activated (sim_core.profiles.activate). Nothing here is fitted per configuration.

Kernel table (the documented input of `sweep calibrate compute`, one row per measured kernel):

    gpu        catalog id (h100-sxm, a100-80gb, ...); may come from --gpu instead
    op_class   gemm | attention  (elementwise/communication rows are kept by the loaders but
               not trained on: the simulator models them by bytes / bandwidth)
    dtype      bf16 | fp16 | fp8 | fp32 | tf32
    m, n, k    GEMM shape (C[m,n] = A[m,k] B[k,n]); batch = number of GEMMs in a batched GEMM
    batch, heads, seq, head_dim, causal, direction
               attention shape: batch x heads queries of length seq (= key length), direction
               fwd | bwd, causal 0/1
    time_us    kernel time (mean over repetitions), microseconds
    source     optional: where the row came from (file, sweep, machine); used for
               leave-one-source-out cross-validation

Target: log of the achieved efficiency flops / (time * peak), peak from the GPU catalog for the
dtype (bf16/fp16 dense, fp8 dense, tf32 for fp32). Regressor: XGBoost (gradient-boosted trees,
as TorchSim uses tree ensembles per operator and GPU, seed 003), one per (gpu, op_class).

Overlap table (`sweep calibrate overlap`): one row per compute kernel measured alone and while a
collective runs on another stream (Echo, seed 000 sec. 6):

    gpu or sm_arch, kernel_class (gemm | attention | elementwise), collective (all_reduce, ...),
    nbytes (collective message size, optional), group (ranks, optional),
    time_alone_us, time_overlap_us, source (optional)

Target: slowdown = time_overlap_us / time_alone_us. Model: Echo Table 5 settings
(XGBRegressor(objective='reg:squarederror', max_depth=12, random_state=42) = xgboost.train with
those parameters and the XGBRegressor defaults eta 0.3, 100 rounds), 80/20 split + 5-fold CV.

Synthetic examples (no GPU was available to measure real ones): `python -m sim_core.learned
make-examples [DIR]` writes them from the known ground truth in this module.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import catalog, nccl
from .nccl_tests import _op_from_text, parse_output

EXAMPLES_DIR = Path(__file__).parent / "data" / "calibration_examples"
NTHREAD = 1  # xgboost threads spin-wait: on a busy 2-core box 2 threads are 40x slower
OP_CLASSES = ("gemm", "attention")
KERNEL_CLASSES = ("gemm", "attention", "elementwise")
KERNEL_COLUMNS = ("gpu", "op_class", "dtype", "m", "n", "k", "batch", "heads", "seq", "head_dim",
                  "causal", "direction", "time_us", "source")
OVERLAP_COLUMNS = ("sm_arch", "kernel_class", "collective", "nbytes", "group", "time_alone_us",
                   "time_overlap_us", "source")
TILE = 128  # output tile of tensor-core GEMMs (compute.TILE_M/N)


def _xgb():
    import xgboost

    return xgboost


# =============================================================================================
# Kernel tables: loaders
# =============================================================================================
_GEMM_RE = re.compile(r"gemm|xmma|cutlass|cublas|nvjet|\bsm\d+_.*(?:tn|nt|nn|tt)\b|matmul|"
                      r"wgmma|s\d+gemm|h\d+gemm", re.IGNORECASE)
_ATTN_RE = re.compile(r"flash|fmha|attn|attention|sdpa|mha_", re.IGNORECASE)
_COMM_RE = re.compile(r"nccl", re.IGNORECASE)


def classify_kernel(name: str) -> str:
    """Op class from a CUDA kernel name (heuristic): communication (nccl*), attention (flash,
    fmha, attn, sdpa), gemm (gemm, xmma, cutlass, cublas, nvjet, wgmma), else elementwise."""
    if _COMM_RE.search(name):
        return "communication"
    if _ATTN_RE.search(name):
        return "attention"
    if _GEMM_RE.search(name):
        return "gemm"
    return "elementwise"


def _empty_kernels(n: int) -> dict:
    return {"gpu": [None] * n, "op_class": [None] * n, "dtype": ["bf16"] * n,
            **{c: [np.nan] * n for c in ("m", "n", "k", "batch", "heads", "seq", "head_dim")},
            "causal": [1] * n, "direction": ["fwd"] * n, "time_us": [np.nan] * n,
            "source": [""] * n}


def load_nsys_csv(path) -> pd.DataFrame:
    """`nsys stats --report cuda_gpu_kern_sum --format csv` (one row per kernel NAME).

    Extracted: name, op class (name heuristic), instances, time_us = Avg (ns) / 1000. Shapes are
    NOT in this report (only tile names such as 128x256x64 in CUTLASS kernel names, which are the
    tile, not the problem), so m/n/k and the attention dims stay NaN: such rows cannot train the
    shape-dependent models, and `train_kernel_models` drops them with a count.
    """
    text = Path(path).read_text()
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "Avg (ns)" in ln or "Avg(ns)" in ln), None)
    if start is None:
        raise ValueError(f"{path}: not an nsys cuda_gpu_kern_sum CSV (no 'Avg (ns)' column)")
    from io import StringIO

    df = pd.read_csv(StringIO("\n".join(lines[start:])))
    df.columns = [c.strip() for c in df.columns]
    avg = next(c for c in df.columns if c.replace(" ", "") == "Avg(ns)")
    out = pd.DataFrame(_empty_kernels(len(df)))
    out["name"] = df["Name"].astype(str).to_numpy()
    out["op_class"] = [classify_kernel(n) for n in out["name"]]
    out["instances"] = pd.to_numeric(df.get("Instances", 1), errors="coerce").to_numpy()
    out["time_us"] = pd.to_numeric(df[avg], errors="coerce").to_numpy() / 1e3
    out["dtype"] = ["fp8" if re.search(r"e4m3|e5m2|fp8", n, re.I) else "bf16" for n in out["name"]]
    out["source"] = Path(path).name
    return out


_TORCH_GEMM = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1),
               "aten::baddbmm": (1, 2), "aten::_scaled_mm": (0, 1)}
# attention ops and the layout of their first tensor: bshd = (batch, seq, heads, dim)
_TORCH_ATTN = {
    "aten::_flash_attention_forward": ("fwd", "bshd"),
    "aten::_flash_attention_backward": ("bwd", "bshd"),
    "aten::_efficient_attention_forward": ("fwd", "bshd"),
    "aten::_efficient_attention_backward": ("bwd", "bshd"),
    "aten::_scaled_dot_product_flash_attention": ("fwd", "bhsd"),
    "aten::_scaled_dot_product_flash_attention_backward": ("bwd", "bhsd"),
    "aten::_scaled_dot_product_efficient_attention": ("fwd", "bhsd"),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bwd", "bhsd"),
    "aten::_scaled_dot_product_cudnn_attention": ("fwd", "bhsd"),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bwd", "bhsd"),
}


def _torch_dtype(types) -> str:
    t = " ".join(str(x) for x in (types or [])).lower()
    if "float8" in t:
        return "fp8"
    if "bfloat16" in t:
        return "bf16"
    if "half" in t:
        return "fp16"
    return "fp32" if "float" in t else "bf16"


def load_torch_trace(path) -> pd.DataFrame:
    """PyTorch profiler chrome trace (export_chrome_trace / tensorboard trace handler, .json or
    .json.gz), recorded with record_shapes=True.

    Extracted: every aten GEMM op (mm, addmm, bmm, baddbmm, _scaled_mm) and attention op
    (_flash_attention_*, _efficient_attention_*, _scaled_dot_product_*) with its "Input Dims"
    and "Input type"; its time is the sum of the GPU kernels it launched (runtime launch events
    inside the op's CPU interval on the same thread, matched to kernels by "correlation"; nested
    recognised ops get their launches, the innermost wins). Ops without GPU kernels (CPU-only
    traces) are dropped: CPU op durations are not kernel times. Attention is assumed causal
    unless the trace's "Concrete Inputs" say otherwise (positional is_causal is not reliable).
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    events = data["traceEvents"] if isinstance(data, dict) else data
    ops, launches, kernels = [], [], {}
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat, name, args = ev.get("cat", ""), ev.get("name", ""), ev.get("args", {}) or {}
        if cat in ("cpu_op", "Operator") and (name in _TORCH_GEMM or name in _TORCH_ATTN):
            ops.append(ev)
        elif cat in ("cuda_runtime", "cuda_driver") and "aunch" in name:
            launches.append(ev)
        elif cat == "kernel" and "correlation" in args:
            kernels[args["correlation"]] = kernels.get(args["correlation"], 0.0) + float(ev["dur"])
    t_op = {id(o): 0.0 for o in ops}
    hit = {id(o): 0 for o in ops}
    for la in launches:
        corr = (la.get("args") or {}).get("correlation")
        if corr not in kernels:
            continue
        inside = [o for o in ops if o.get("pid") == la.get("pid") and o.get("tid") == la.get("tid")
                  and o["ts"] <= la["ts"] <= o["ts"] + o["dur"]]
        if inside:
            o = min(inside, key=lambda e: e["dur"])
            t_op[id(o)] += kernels[corr]
            hit[id(o)] += 1
    rows = []
    for o in ops:
        if not hit[id(o)]:
            continue
        args = o.get("args", {})
        dims = args.get("Input Dims") or []
        r = {k: v[0] for k, v in _empty_kernels(1).items()}
        r.update(name=o["name"], dtype=_torch_dtype(args.get("Input type")), time_us=t_op[id(o)],
                 source=Path(path).name)
        if o["name"] in _TORCH_GEMM:
            ia, ib = _TORCH_GEMM[o["name"]]
            if len(dims) <= ib or len(dims[ia]) < 2 or len(dims[ib]) < 2:
                continue
            a, bm = dims[ia], dims[ib]
            r.update(op_class="gemm", m=a[-2], k=a[-1], n=bm[-1],
                     batch=a[0] if len(a) == 3 else 1)
        else:
            direction, layout = _TORCH_ATTN[o["name"]]
            q = dims[0] if dims else []
            if len(q) != 4:
                continue
            bsz, s, h, d = (q if layout == "bshd" else (q[0], q[2], q[1], q[3]))
            conc = " ".join(str(x) for x in (args.get("Concrete Inputs") or []))
            r.update(op_class="attention", batch=bsz, seq=s, heads=h, head_dim=d,
                     direction=direction, causal=0 if re.search(r"\bFalse\b", conc) else 1)
        rows.append(r)
    return pd.DataFrame(rows, columns=list(_empty_kernels(0)) + ["name"])


def load_kernels(path, fmt: str = "auto", gpu: str | None = None) -> pd.DataFrame:
    """A kernel table from our CSV, an nsys kern-sum CSV or a PyTorch chrome trace.

    `gpu` fills the gpu column where the file has none (profiler exports never name it)."""
    path = Path(path)
    if fmt == "auto":
        head = path.read_bytes()[:4096]
        if path.suffix in (".json", ".gz") or head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
            fmt = "torch"
        elif b"Avg (ns)" in head or b"Avg(ns)" in head:
            fmt = "nsys"
        else:
            fmt = "csv"
    if fmt == "torch":
        df = load_torch_trace(path)
    elif fmt == "nsys":
        df = load_nsys_csv(path)
    elif fmt == "csv":
        df = pd.read_csv(path, comment="#")
        missing = {"op_class", "time_us"} - set(df.columns)
        if missing:
            raise ValueError(f"{path}: kernel table lacks columns {sorted(missing)}")
        base = pd.DataFrame(_empty_kernels(len(df)))
        for c in df.columns:
            base[c] = df[c].to_numpy()
        df = base
        df["source"] = df["source"].fillna("").astype(str).replace("", path.name)
    else:
        raise ValueError(f"unknown kernel table format {fmt!r} (auto, csv, nsys, torch)")
    if gpu:
        df["gpu"] = df["gpu"].where(df["gpu"].notna() & (df["gpu"].astype(str) != ""), gpu)
    return df


# =============================================================================================
# Kernel features and targets
# =============================================================================================
def _gpu_row(gpu: str) -> dict:
    spec = catalog.get_gpu(gpu)
    return catalog.gpu_table().loc[spec.name].to_dict()


def fingerprint(gpu: str) -> dict:
    """How the compute hook recognises the GPU in a Batch (no string ids survive there)."""
    r = _gpu_row(gpu)
    return {"sm_arch": float(r["sm_arch"]), "sm_count": float(r["sm_count"]),
            "peak_bf16": float(r["peak_bf16"])}


def peak_tflops(gpu: str, dtype) -> np.ndarray:
    r = _gpu_row(gpu)
    dtype = np.asarray(dtype).astype(str)
    return np.where(dtype == "fp8", r["peak_fp8"],
                    np.where(np.isin(dtype, ["fp32", "tf32"]), r["peak_tf32"], r["peak_bf16"]))


def kernel_flops(df: pd.DataFrame) -> np.ndarray:
    """FLOPs per kernel (multiply-add = 2): GEMM 2 b m n k; attention forward 4 b h s^2 d
    (halved when causal), backward 2.5x forward (as in workload.py)."""
    b = df["batch"].fillna(1).to_numpy(float)
    gemm = 2.0 * b * df["m"].to_numpy(float) * df["n"].to_numpy(float) * df["k"].to_numpy(float)
    s = df["seq"].to_numpy(float)
    attn = 4.0 * b * df["heads"].to_numpy(float) * s * s * df["head_dim"].to_numpy(float)
    attn = attn * np.where(df["causal"].fillna(1).to_numpy(float) > 0, 0.5, 1.0)
    attn = attn * np.where(df["direction"].astype(str).to_numpy() == "bwd", 2.5, 1.0)
    return np.where(df["op_class"].to_numpy() == "gemm", gemm, attn)


def _wave_eff(m, n, sm_count):
    tiles = np.ceil(m / TILE) * np.ceil(n / TILE)
    waves = tiles / sm_count
    return waves / np.ceil(np.maximum(waves, 1e-9))


def gemm_features(m, n, k, fp8, batch=1.0, sm_count=132.0) -> np.ndarray:
    """log2 m, n, k, batch; fp8; log2 flops, bytes, arithmetic intensity; wave efficiency."""
    m, n, k, batch = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
    m, n, k, batch, fp8 = np.broadcast_arrays(m, n, k, batch, np.asarray(fp8, dtype=float))
    esize = np.where(fp8 > 0, 1.0, 2.0)
    flops = 2.0 * batch * m * n * k
    byts = batch * esize * (m * k + k * n) + batch * 2.0 * m * n
    return np.column_stack([np.log2(m), np.log2(n), np.log2(k), np.log2(batch), fp8,
                            np.log2(flops), np.log2(byts), np.log2(flops / byts),
                            _wave_eff(m, n, sm_count)])


GEMM_FEATURES = ("log2_m", "log2_n", "log2_k", "log2_batch", "fp8", "log2_flops", "log2_bytes",
                 "log2_intensity", "wave_eff")


def attention_features(batch_heads, seq, head_dim, causal, backward) -> np.ndarray:
    """log2 batch*heads, seq, head_dim; causal; backward; log2 flops."""
    bh, s, d, c, bw = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in
                                            (batch_heads, seq, head_dim, causal, backward)))
    flops = 4.0 * bh * s * s * d * np.where(c > 0, 0.5, 1.0) * np.where(bw > 0, 2.5, 1.0)
    return np.column_stack([np.log2(bh), np.log2(s), np.log2(d), c, bw, np.log2(flops)])


ATTENTION_FEATURES = ("log2_batch_heads", "log2_seq", "log2_head_dim", "causal", "backward",
                      "log2_flops")


def kernel_xy(df: pd.DataFrame, gpu: str, op_class: str):
    """Feature matrix and target (log efficiency) for one (gpu, op class) slice of a table."""
    fp = fingerprint(gpu)
    flops = kernel_flops(df)
    peak = peak_tflops(gpu, df["dtype"].astype(str).to_numpy()) * 1e12
    eff = flops / (df["time_us"].to_numpy(float) * 1e-6 * peak)
    if op_class == "gemm":
        X = gemm_features(df["m"], df["n"], df["k"], df["dtype"].astype(str) == "fp8",
                          df["batch"].fillna(1), fp["sm_count"])
    else:
        X = attention_features(df["batch"].fillna(1).to_numpy(float) * df["heads"].to_numpy(float),
                               df["seq"], df["head_dim"], df["causal"].fillna(1),
                               df["direction"].astype(str) == "bwd")
    return X, np.log(eff)


def _shaped(df: pd.DataFrame, op_class: str) -> np.ndarray:
    cols = ["m", "n", "k"] if op_class == "gemm" else ["heads", "seq", "head_dim"]
    ok = np.ones(len(df), dtype=bool)
    for c in cols + ["time_us"]:
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        ok &= np.isfinite(v) & (v > 0)
    return ok


# =============================================================================================
# Regressors
# =============================================================================================
KERNEL_PARAMS = {"objective": "reg:squarederror", "max_depth": 6, "eta": 0.1,
                 "subsample": 1.0, "min_child_weight": 1.0, "seed": 0}
KERNEL_ROUNDS = 300
# Echo Table 5: XGBRegressor(objective='reg:squarederror', max_depth=12, random_state=42) with
# the XGBRegressor defaults (learning rate 0.3, 100 trees)
ECHO_PARAMS = {"objective": "reg:squarederror", "max_depth": 12, "eta": 0.3, "seed": 42}
ECHO_ROUNDS = 100


def _train(X, y, params, rounds):
    xgb = _xgb()
    p = {**params, "nthread": NTHREAD, "tree_method": "hist"}
    return xgb.train(p, xgb.DMatrix(X, label=y, missing=np.nan), rounds)


def _predict(booster, X) -> np.ndarray:
    return np.asarray(booster.inplace_predict(np.ascontiguousarray(X, dtype=np.float32),
                                              missing=np.nan), dtype=np.float64)


def _load_booster(path):
    xgb = _xgb()
    b = xgb.Booster()
    b.load_model(str(path))
    b.set_param({"nthread": NTHREAD})
    return b


def _ratio_metrics(pred_ratio: np.ndarray) -> dict:
    """Metrics of predicted / measured ratios (time for kernels, slowdown for overlap)."""
    e = np.abs(np.asarray(pred_ratio) - 1.0)
    if not e.size:
        return {"n": 0}
    return {"n": int(e.size), "median_abs_err": float(np.median(e)),
            "p90_abs_err": float(np.quantile(e, 0.9)), "max_abs_err": float(e.max()),
            "within_5pct": float(np.mean(e <= 0.05)), "within_10pct": float(np.mean(e <= 0.10)),
            "within_15pct": float(np.mean(e <= 0.15))}


def kfold(n: int, folds: int = 5, seed: int = 0):
    idx = np.random.default_rng(seed).permutation(n)
    for f in range(folds):
        test = idx[f::folds]
        yield np.setdiff1d(idx, test), test


def cross_validate(X, y, fit, predict, ratio, folds=5, groups=None) -> dict:
    """k-fold and, when `groups` has >= 2 values, leave-one-source-out metrics.

    `ratio(pred, idx)` turns predictions on rows idx into predicted/measured ratios."""
    out = {}
    n = len(y)
    if n >= folds * 2:
        ratios = np.empty(n)
        for tr, te in kfold(n, folds):
            ratios[te] = ratio(predict(fit(X[tr], y[tr]), X[te]), te)
        out[f"kfold{folds}"] = _ratio_metrics(ratios)
    if groups is not None:
        groups = np.asarray(groups).astype(str)
        uniq = np.unique(groups)
        if len(uniq) >= 2:
            loso = {}
            for g in uniq:
                te, tr = np.flatnonzero(groups == g), np.flatnonzero(groups != g)
                loso[g] = _ratio_metrics(ratio(predict(fit(X[tr], y[tr]), X[te]), te))
            out["leave_one_source_out"] = loso
    return out


class KernelModel:
    """Efficiency regressor of one (gpu, op class): features -> log efficiency."""

    def __init__(self, gpu: str, op_class: str, booster, meta: dict | None = None):
        self.gpu, self.op_class, self.booster = gpu, op_class, booster
        self.meta = meta or {}
        self.fp = fingerprint(gpu)

    def efficiency(self, X) -> np.ndarray:
        return np.clip(np.exp(_predict(self.booster, X)), 1e-3, 1.0)

    def save(self, path) -> None:
        self.booster.save_model(str(path))

    @classmethod
    def load(cls, path, gpu: str, op_class: str, meta: dict | None = None) -> "KernelModel":
        return cls(gpu, op_class, _load_booster(path), meta)


def train_kernel_models(df: pd.DataFrame, folds: int = 5, rounds: int = KERNEL_ROUNDS,
                        log=print) -> dict:
    """{(gpu, op_class): KernelModel} with CV metrics in .meta; rows without shapes dropped."""
    models = {}
    if df["gpu"].isna().any():
        raise ValueError(f"{int(df['gpu'].isna().sum())} kernel rows have no gpu "
                         "(give --gpu for profiler exports)")
    for (gpu, oc), part in df.groupby([df["gpu"].astype(str), df["op_class"].astype(str)]):
        if oc not in OP_CLASSES:
            log(f"  {gpu} {oc}: {len(part)} rows skipped (the simulator models {oc} by bytes)")
            continue
        ok = _shaped(part, oc)
        if not ok.all():
            log(f"  {gpu} {oc}: {int((~ok).sum())} rows without shapes dropped "
                "(profiler summaries carry no shapes)")
        part = part[ok]
        if len(part) < 10:
            log(f"  {gpu} {oc}: only {len(part)} shaped rows, no model")
            continue
        X, y = kernel_xy(part, gpu, oc)

        def fit(Xa, ya):
            return _train(Xa, ya, KERNEL_PARAMS, rounds)

        def ratio(pred, idx, y=y):  # predicted time / measured time = eff_meas / eff_pred
            return np.exp(y[idx] - pred)

        cv = cross_validate(X, y, fit, _predict, ratio, folds, part["source"].to_numpy())
        booster = fit(X, y)
        train_err = _ratio_metrics(ratio(_predict(booster, X), np.arange(len(y))))
        meta = {"rows": int(len(part)), "features": list(GEMM_FEATURES if oc == "gemm"
                                                           else ATTENTION_FEATURES),
                "target": "log(flops / (time * peak))", "params": KERNEL_PARAMS,
                "rounds": rounds, "train": train_err, "cv": cv}
        models[(gpu, oc)] = KernelModel(gpu, oc, booster, meta)
    return models


# ---- hooks for compute.py ------------------------------------------------------------------
def _match(b, fp: dict) -> np.ndarray:
    return ((b.sm_arch == fp["sm_arch"]) & (b.sm_count == fp["sm_count"])
            & np.isclose(b.peak_bf16, fp["peak_bf16"]))


def _predict_unique(model: KernelModel, X: np.ndarray) -> np.ndarray:
    """Predict once per distinct feature row (configurations share shapes heavily)."""
    if len(X) > 64:
        u, inv = np.unique(X, axis=0, return_inverse=True)
        return model.efficiency(u)[inv.ravel()]
    return model.efficiency(X)


def gemm_hook(models: list[KernelModel]):
    """compute.set_gemm_model callable: learned efficiency on the GPUs the models know, NaN
    (= roofline) elsewhere."""
    def hook(b, m, n, k, fp8):
        shape = np.broadcast_shapes(np.shape(b.sm_arch), np.shape(m), np.shape(n),
                                    np.shape(k), np.shape(fp8))
        out = np.full(shape, np.nan)
        m, n, k, fp8 = (np.broadcast_to(np.asarray(x, dtype=float), shape) for x in (m, n, k, fp8))
        for mod in models:
            sel = np.broadcast_to(_match(b, mod.fp), shape)
            if sel.any():
                X = gemm_features(m[sel], n[sel], k[sel], fp8[sel], 1.0, mod.fp["sm_count"])
                out[sel] = _predict_unique(mod, X)
        return out
    return hook


def attention_hook(models: list[KernelModel]):
    """compute.set_attention_model callable: per-rank attention of a micro-batch (batch x
    heads/tp queries of seq/cp, causal), NaN on GPUs the models do not know."""
    def hook(b, backward: bool):
        out = np.full(np.shape(b.sm_arch), np.nan)
        hd = np.where(b.head_dim > 0, b.head_dim, b.hidden / b.heads)
        bh = b.micro_batch * np.maximum(b.heads / b.tp, 1.0)
        seq = np.maximum(b.seq_len / b.cp, 1.0)
        for mod in models:
            sel = _match(b, mod.fp)
            if sel.any():
                X = attention_features(bh[sel], seq[sel], hd[sel], 1.0, float(backward))
                out[sel] = _predict_unique(mod, X)
        return out
    return hook


# =============================================================================================
# Overlap slowdown (Echo)
# =============================================================================================
OVERLAP_FEATURES = ("sm_arch", "kernel_class", "collective", "log2_nbytes", "group")


def _overlap_X(sm_arch, kernel_class, collective, nbytes, group) -> np.ndarray:
    n = max(np.size(sm_arch), np.size(kernel_class), np.size(collective), np.size(nbytes),
            np.size(group))

    def arr(x, dtype=float):
        return np.broadcast_to(np.asarray(x, dtype=dtype), (n,))

    kc = arr(kernel_class, object)
    co = arr(collective, object)
    kcode = np.array([KERNEL_CLASSES.index(x) if x in KERNEL_CLASSES else np.nan for x in kc],
                     dtype=float)
    ccode = np.array([nccl.COLLECTIVES.index(x) if x in nccl.COLLECTIVES else np.nan for x in co],
                     dtype=float)
    nb = arr(nbytes)
    g = arr(group)
    # 0 / missing -> NaN: XGBoost's missing-value branch (trained on masked copies)
    with np.errstate(divide="ignore", invalid="ignore"):
        lnb = np.where(nb > 0, np.log2(np.where(nb > 0, nb, 1.0)), np.nan)
    return np.column_stack([arr(sm_arch), kcode, ccode, lnb, np.where(g > 0, g, np.nan)])


def load_overlap_table(path) -> pd.DataFrame:
    df = pd.read_csv(path, comment="#")
    if "sm_arch" not in df.columns:
        if "gpu" not in df.columns:
            raise ValueError(f"{path}: overlap table needs a gpu or sm_arch column")
        df["sm_arch"] = [float(_gpu_row(g)["sm_arch"]) for g in df["gpu"].astype(str)]
    need = {"kernel_class", "collective", "time_alone_us", "time_overlap_us"} - set(df.columns)
    if need:
        raise ValueError(f"{path}: overlap table lacks columns {sorted(need)}")
    for c in ("nbytes", "group"):
        if c not in df.columns:
            df[c] = np.nan
    if "source" not in df.columns:
        df["source"] = Path(path).name
    df["source"] = df["source"].fillna(Path(path).name).astype(str)
    return df


class SlowdownModel:
    def __init__(self, booster, meta: dict | None = None):
        self.booster = booster
        self.meta = meta or {}
        self.known = {(float(a), c) for a, c in self.meta.get("covered", [])}

    def predict(self, sm_arch, kernel_class, collective, nbytes=0.0, group=0.0) -> np.ndarray:
        return np.maximum(_predict(self.booster, _overlap_X(sm_arch, kernel_class, collective,
                                                             nbytes, group)), 1.0)

    def save(self, path) -> None:
        self.booster.save_model(str(path))

    @classmethod
    def load(cls, path, meta: dict | None = None) -> "SlowdownModel":
        return cls(_load_booster(path), meta)


def _augment(X, y):
    """Training copies with nbytes and group masked, so the model answers sensibly when the
    simulator does not pass them (the missing-value branch learns the average over sizes)."""
    Xm = X.copy()
    Xm[:, 3:5] = np.nan
    return np.vstack([X, Xm]), np.concatenate([y, y])


def train_overlap_model(df: pd.DataFrame, rounds: int = ECHO_ROUNDS, folds: int = 5,
                        seed: int = 42) -> SlowdownModel:
    """Echo's regressor on slowdown = time_overlap / time_alone; metrics in .meta:
    80/20 hold-out (Echo), 5-fold CV, leave-one-source-out when there are sources."""
    X = _overlap_X(df["sm_arch"].to_numpy(float), df["kernel_class"].astype(str).to_numpy(),
                   df["collective"].astype(str).to_numpy(), df["nbytes"].to_numpy(float),
                   df["group"].to_numpy(float))
    y = df["time_overlap_us"].to_numpy(float) / df["time_alone_us"].to_numpy(float)
    ok = np.isfinite(y) & (y > 0) & np.isfinite(X[:, 0]) & np.isfinite(X[:, 1]) & np.isfinite(X[:, 2])
    X, y, src = X[ok], y[ok], df["source"].to_numpy()[ok]

    def fit(Xa, ya):
        return _train(*_augment(Xa, ya), ECHO_PARAMS, rounds)

    def predict(bst, Xa):
        return np.maximum(_predict(bst, Xa), 1.0)

    def ratio(pred, idx):
        return pred / y[idx]

    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    cut = int(round(0.8 * len(y)))
    tr, te = perm[:cut], perm[cut:]
    holdout = _ratio_metrics(ratio(predict(fit(X[tr], y[tr]), X[te]), te))
    rmse = float(np.sqrt(np.mean((predict(fit(X[tr], y[tr]), X[te]) - y[te]) ** 2)))
    holdout["rmse"] = rmse
    cv = cross_validate(X, y, fit, predict, ratio, folds, src)
    booster = fit(X, y)
    covered = sorted({(float(a), KERNEL_CLASSES[int(c)]) for a, c in X[:, :2]})
    prior = _prior(X[:, 0], [KERNEL_CLASSES[int(c)] for c in X[:, 1]])
    meta = {"rows": int(len(y)), "features": list(OVERLAP_FEATURES), "target": "slowdown factor",
            "params": ECHO_PARAMS, "rounds": rounds, "holdout_80_20": holdout, "cv": cv,
            "prior_on_data": _ratio_metrics(prior / y), "covered": covered}
    return SlowdownModel(booster, meta)


def _prior(sm_arch, kernel_class) -> np.ndarray:
    from . import overlap

    out = np.empty(len(sm_arch))
    for i, (a, c) in enumerate(zip(sm_arch, kernel_class)):
        out[i] = overlap.slowdown(np.array([a]), c)[0]
    return out


def overlap_hook(model: SlowdownModel):
    """overlap.set_model callable: learned factor where the model saw the (arch, kernel class),
    the explained prior elsewhere."""
    from . import overlap

    def hook(features: dict) -> np.ndarray:
        arch = np.asarray(features["sm_arch"], dtype=float)
        kc = features["kernel_class"]
        prior = overlap.slowdown(arch, kc)  # features=None -> the prior
        covered = np.array([(float(a), kc) in model.known for a in np.unique(arch)])
        if not covered.any():
            return prior
        ua, inv = np.unique(arch, return_inverse=True)
        nb = np.broadcast_to(np.asarray(features.get("nbytes", 0.0), dtype=float), arch.shape)
        g = np.broadcast_to(np.asarray(features.get("group", 0.0), dtype=float), arch.shape)
        X = _overlap_X(arch.ravel(), kc, features["collective"], nb.ravel(), g.ravel())
        u, uinv = np.unique(np.nan_to_num(X, nan=-1.0), axis=0, return_inverse=True)
        u = np.where(u == -1.0, np.nan, u)
        pred = np.maximum(_predict(model.booster, u), 1.0)[uinv.ravel()].reshape(arch.shape)
        use = covered[inv].reshape(arch.shape)
        return np.where(use, pred, prior)
    return hook


# =============================================================================================
# NCCL: per-cluster scales of the white-box model, fitted to nccl-tests output
# =============================================================================================
SCALES = ("nvlink_bw", "nic_bw", "intra_latency", "inter_latency")
_NET_KEY = nccl.CALIBRATION_KEYS
_GPU_HINTS = (("gb200", "gb200"), ("b200", "b200"), ("h200", "h200"), ("h800", "h800"),
              ("h100", "h100-sxm"), ("a100-sxm4-40gb", "a100-40gb"), ("a100", "a100-80gb"))


def guess_gpu(text: str) -> str | None:
    """Catalog GPU from the device names in an nccl-tests header ("NVIDIA H100 80GB HBM3")."""
    names = " ".join(re.findall(r"device\s+\d+\s+\[[^\]]*\]\s+(.+)$", text, re.M)).lower()
    names = names.replace(" ", "-")
    for hint, gpu in _GPU_HINTS:
        if hint in names:
            return gpu
    return None


def base_network(gpu: str, cluster: str | None = None) -> dict:
    """The NCCL model's network dict for a GPU's default cluster (or a named cluster)."""
    r = _gpu_row(gpu)
    cl = catalog.get_cluster(cluster) if cluster else None

    def field(name):
        return float(getattr(cl, name)) if cl is not None else float(r[name])

    gpn = field("gpus_per_node")
    return {"sm_arch": float(r["sm_arch"]), "nvlink_bw_gbs": float(r["nvlink_bw_gbs"]),
            "nvls": bool(r["nvls"]),
            "nic_bw_gbs": field("nic_bw_gbs") * field("nics_per_node") / gpn,
            "intra_latency_us": field("intra_latency_us"),
            "inter_latency_us": field("inter_latency_us")}


def scale_net(net: dict | None, scales: dict) -> dict:
    return nccl.scale_net(net, scales)


def gpu_from_names(names) -> str | None:
    """Catalog GPU id for the device names of an nccl-tests header, or None."""
    joined = " ".join(names).lower().replace(" ", "-")
    for hint, gpu in _GPU_HINTS:
        if hint in joined:
            return gpu
    return None


DEFAULT_NCCL_GPU = "h100-sxm"


def nccl_gpu(paths, given: str | None = None, notes: dict | None = None) -> str:
    """The catalog GPU of the logs: --gpu, else the device lines. A GPU named but outside the
    catalog is a one-line error naming --gpu; a log that names none (a pasted table) is
    fitted against h100-sxm's catalog network, said in `notes` (the fitted scales absorb the
    difference; --gpu fits against another)."""
    from .nccl_tests import read_log

    if given:
        catalog.get_gpu(given)
        return given
    names = []
    for p in paths:
        names += read_log(Path(p).read_text(errors="replace")).gpu_names
    gpu = gpu_from_names(names)
    if gpu:
        return gpu
    known = ", ".join(catalog.gpu_table().index)
    if names:
        raise ValueError(f"GPU '{names[0]}' (the log's device lines) is not in the catalog; "
                         f"give --gpu with the nearest catalog GPU ({known})")
    if notes is not None:
        notes.setdefault("*", []).append(
            f"GPU: the logs name none; fitted against {DEFAULT_NCCL_GPU}'s catalog network "
            f"(give --gpu for another: {known})")
    return DEFAULT_NCCL_GPU


def _infer_nodes(log, gpu: str) -> tuple[int, str]:
    """Nodes of a log that does not list its hosts: ranks packed gpus_per_node to a node,
    unless the packing puts them on one node and the measured busbw is far below NVLink's
    (then the ring crossed the network: one rank per node)."""
    r = _gpu_row(gpu)
    gpn = int(r["gpus_per_node"])
    peak = max((x["oop_busbw"] for x in log.rows if np.isfinite(x["oop_busbw"])), default=0.0)
    packed = -(-log.group // gpn)
    if packed == 1 and log.group > 1 and peak < 0.4 * float(r["nvlink_bw_gbs"]):
        return log.group, (f"peak busbw {peak:.0f} GB/s is far below {gpu}'s NVLink "
                           f"{r['nvlink_bw_gbs']:.0f} GB/s: one rank per node")
    return packed, f"{log.group} ranks packed {gpn} to a node"


def nccl_rows(paths, op: str | None = None, ranks: int | None = None,
              nodes: int | None = None, notes: dict | None = None,
              gpu: str | None = None) -> pd.DataFrame:
    """All rows of nccl-tests logs (out-of-place time), with the file as source. What a log
    does not state is inferred (nccl_tests.read_log; nodes from the GPU's node size) and the
    inferences go to `notes` ({file: [lines]}); what cannot be told is a one-line ValueError
    naming the option to pass."""
    from .nccl_tests import read_log

    frames = []
    for p in paths:
        text = Path(p).read_text(errors="replace")
        log = read_log(text, op=op or _op_from_text(Path(p).name), ranks=ranks, nodes=nodes)
        if not log.rows:
            raise ValueError(f"{p}: no nccl-tests result rows in the file")
        if log.op is None:
            raise ValueError(f"{p}: cannot tell the collective; pass --op")
        if log.group is None:
            why = next((n for n in log.notes if n.startswith("ranks:")), "")
            raise ValueError(f"{p}: cannot tell the number of ranks ({why.removeprefix('ranks: ')}"
                             f"); pass --ranks".replace(" ()", ""))
        if log.nodes is None:
            if gpu is None:
                raise ValueError(f"{p}: the log does not say how many nodes ran it; pass --nodes")
            log.nodes, why = _infer_nodes(log, gpu)
            log.notes.append(f"{log.nodes} node(s): not in the log; {why} (pass --nodes if not)")
        if notes is not None:
            notes[str(p)] = log.notes
        df = pd.DataFrame(log.rows).assign(op=log.op, group=log.group, nodes=log.nodes,
                                           source=Path(p).name,
                                           gpu_names="; ".join(log.gpu_names))
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    df = df[(df["size"] > 0) & (df["oop_time_us"] > 0)].reset_index(drop=True)
    return df


def nccl_file_fits(df: pd.DataFrame, net: dict, min_bytes: float = 2**20) -> pd.DataFrame:
    """Each log fitted on its own: median |model/measured - 1| over its sizes >= min_bytes,
    with the catalog values and with the scales fitted to that log alone."""
    out = []
    for src, g in df.groupby("source", sort=False):
        big = g["size"] >= min_bytes
        if not big.any():
            big = g["size"] == g["size"].max()
        sc = fit_nccl_scales(g[big], net)
        meas = g["oop_time_us"].to_numpy(float)[big.to_numpy()]
        e0 = nccl_model_us(g[big], net) / meas - 1
        e1 = nccl_model_us(g[big], net, sc) / meas - 1
        out.append({"source": src, "rows": len(g), "rows_fitted_error": int(big.sum()),
                    "median_abs_err_default": float(np.median(np.abs(e0))),
                    "median_abs_err_fitted": float(np.median(np.abs(e1)))})
    return pd.DataFrame(out)


def nccl_model_us(df: pd.DataFrame, net: dict, scales: dict | None = None) -> np.ndarray:
    code = np.array([nccl.COLLECTIVES.index(o) for o in df["op"]])
    res = nccl.collective_time(code, df["size"].to_numpy(float), df["group"].to_numpy(float),
                               df["nodes"].to_numpy(float), scale_net(net, scales or {}))
    return res["time_s"] * 1e6


def _identifiable(df: pd.DataFrame) -> list[str]:
    multi = (df["nodes"] > 1).any()
    single = ((df["nodes"] == 1) & (df["group"] > 1)).any()
    out = []
    if single or ((df["group"] / df["nodes"]) > 1).any():
        out += ["nvlink_bw", "intra_latency"]
    if multi:
        out += ["nic_bw", "inter_latency"]
    return out


def fit_nccl_scales(df: pd.DataFrame, net: dict, prior_weight: float = 0.02,
                    robust_scale: float = 0.05) -> dict:
    """Scales minimising the log-time error over all rows (plus a weak pull to 1, so that
    scales the data cannot see stay 1). The loss is Cauchy beyond `robust_scale` (5% in log
    time): real curves carry protocol-switch dips and noisy points that a squared loss would
    chase at the expense of the rest. Multi-start: NCCL's algorithm choice makes the error
    piecewise smooth."""
    from scipy.optimize import least_squares

    free = _identifiable(df)
    if not free:
        return {s: 1.0 for s in SCALES}
    meas = np.log(df["oop_time_us"].to_numpy(float))
    prior = prior_weight * math.sqrt(len(meas))

    def resid(x):
        sc = dict(zip(free, np.exp(x)))
        r = np.log(nccl_model_us(df, net, sc)) - meas
        return np.concatenate([r, prior * x])

    best = None
    starts = [np.zeros(len(free))] + [np.full(len(free), v) for v in (-1.5, -0.5, 0.5, 1.5)]
    for x0 in starts:
        res = least_squares(resid, x0, bounds=(-3.0, 3.0), diff_step=1e-3, x_scale=0.3,
                            loss="cauchy", f_scale=robust_scale)
        if best is None or res.cost < best.cost:
            best = res
    out = {s: 1.0 for s in SCALES}
    out.update({s: float(np.exp(v)) for s, v in zip(free, best.x)})
    return out


def _size_bucket(s):
    return np.where(s < 64 * 1024, "<64KiB", np.where(s < 16 * 2**20, "64KiB-16MiB", ">=16MiB"))


def nccl_fit_report(df: pd.DataFrame, net: dict, scales: dict) -> pd.DataFrame:
    """Per row: measured, default-model and fitted-model times and relative errors."""
    out = df[["source", "op", "group", "nodes", "size", "oop_time_us"]].copy()
    out = out.rename(columns={"oop_time_us": "measured_us"})
    out["default_us"] = nccl_model_us(df, net)
    out["fitted_us"] = nccl_model_us(df, net, scales)
    out["err_default"] = out["default_us"] / out["measured_us"] - 1
    out["err_fitted"] = out["fitted_us"] / out["measured_us"] - 1
    out["size_bucket"] = _size_bucket(out["size"].to_numpy())
    return out


def nccl_loso(df: pd.DataFrame, net: dict) -> pd.DataFrame:
    """Leave one nccl-tests file out: fit the scales on the others, error on it."""
    rows = []
    srcs = sorted(df["source"].unique())
    if len(srcs) < 2:
        return pd.DataFrame()
    for s in srcs:
        tr, te = df[df["source"] != s], df[df["source"] == s]
        sc = fit_nccl_scales(tr, net)
        e = nccl_model_us(te, net, sc) / te["oop_time_us"].to_numpy() - 1
        seen = set(_identifiable(tr))
        rows.append({"held_out": s, "rows": len(te), "median_abs_err": float(np.median(np.abs(e))),
                     "max_abs_err": float(np.max(np.abs(e))),
                     "unseen_scales": ",".join(x for x in _identifiable(te) if x not in seen)})
    return pd.DataFrame(rows)


# =============================================================================================
# Synthetic examples (known ground truth; no GPU was available to measure real kernels)
# =============================================================================================
SYNTH_GPU = "h100-sxm"
# ground-truth efficiency surface of the synthetic GEMMs (not the simulator's curve on purpose)
SYNTH_GEMM = {"emax_bf16": 0.80, "emax_fp8": 0.66, "k_half": 320.0, "mn_half": 96.0}
SYNTH_ATTN = {"fwd": 0.62, "bwd": 0.48, "seq_half": 768.0, "d_half": 24.0}
# ground-truth slowdowns: base by (arch, class), collective multiplier, size saturation
SYNTH_SLOW_BASE = {(80, "gemm"): 0.26, (80, "attention"): 0.20, (80, "elementwise"): 0.40,
                   (90, "gemm"): 0.15, (90, "attention"): 0.12, (90, "elementwise"): 0.28}
SYNTH_SLOW_COLL = {"all_reduce": 1.0, "all_gather": 0.8, "reduce_scatter": 0.9,
                   "all_to_all": 1.2, "send_recv": 0.5}
SYNTH_SLOW_HALF = 8 * 2**20  # bytes at which half the base slowdown is reached
# perturbed cluster used for the synthetic nccl-tests outputs (the fit should recover these)
SYNTH_NCCL_SCALES = {"nvlink_bw": 0.88, "nic_bw": 0.80, "intra_latency": 1.6,
                     "inter_latency": 1.3}


def synth_gemm_eff(m, n, k, fp8):
    g = SYNTH_GEMM
    emax = np.where(fp8, g["emax_fp8"], g["emax_bf16"])
    mn = np.minimum(m, n)
    return emax * _wave_eff(m, n, 132) ** 0.7 * k / (k + g["k_half"]) * mn / (mn + g["mn_half"])


def synth_attn_eff(seq, head_dim, backward):
    a = SYNTH_ATTN
    base = np.where(backward, a["bwd"], a["fwd"])
    return base * seq / (seq + a["seq_half"]) * head_dim / (head_dim + a["d_half"])


def synth_slowdown(sm_arch, kernel_class, collective, nbytes, group):
    base = np.array([SYNTH_SLOW_BASE[(int(a), c)] for a, c in zip(sm_arch, kernel_class)])
    coll = np.array([SYNTH_SLOW_COLL[c] for c in collective])
    size = nbytes / (nbytes + SYNTH_SLOW_HALF)
    return 1.0 + base * coll * size * (1.0 + 0.03 * np.log2(group))


def make_kernel_table(seed: int = 0, noise: float = 0.02, scale: float = 1.0) -> pd.DataFrame:
    """Synthetic H100 GEMM + attention kernel times from the known surfaces above (efficiency
    multiplied by `scale`: tests use a deliberately slow GPU)."""
    rng = np.random.default_rng(seed)
    r = _gpu_row(SYNTH_GPU)
    rows = []
    dims = [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 28672]
    for _ in range(700):
        m, n, k = (float(rng.choice(dims)) for _ in range(3))
        fp8 = bool(rng.random() < 0.25)
        eff = synth_gemm_eff(m, n, k, fp8) * scale
        peak = (r["peak_fp8"] if fp8 else r["peak_bf16"]) * 1e12
        t = 2 * m * n * k / (eff * peak) * rng.lognormal(0, noise)
        rows.append({"gpu": SYNTH_GPU, "op_class": "gemm", "dtype": "fp8" if fp8 else "bf16",
                     "m": m, "n": n, "k": k, "batch": 1, "time_us": t * 1e6,
                     "source": f"sweep{rng.integers(3)}"})
    for bsz in (1, 2, 4):
        for heads in (8, 16, 32, 64):
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                for d in (64, 128):
                    for bwd in (False, True):
                        flops = 4.0 * bsz * heads * s * s * d * 0.5 * (2.5 if bwd else 1.0)
                        eff = synth_attn_eff(s, d, bwd) * scale
                        t = flops / (eff * r["peak_bf16"] * 1e12) * rng.lognormal(0, noise)
                        rows.append({"gpu": SYNTH_GPU, "op_class": "attention", "dtype": "bf16",
                                     "batch": bsz, "heads": heads, "seq": s, "head_dim": d,
                                     "causal": 1, "direction": "bwd" if bwd else "fwd",
                                     "time_us": t * 1e6, "source": f"sweep{rng.integers(3)}"})
    df = pd.DataFrame(rows)
    for c in KERNEL_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    df["time_us"] = df["time_us"].round(3)
    return df[list(KERNEL_COLUMNS)]


def make_overlap_table(n: int = 1200, seed: int = 0, noise: float = 0.005,
                       scale: float = 1.0) -> pd.DataFrame:
    """Synthetic kernel times alone and overlapped, from SYNTH_SLOW_* (Ampere and Hopper);
    `scale` multiplies the slowdown above 1 (tests)."""
    rng = np.random.default_rng(seed)
    gpus = {80: "a100-80gb", 90: "h100-sxm"}
    arch = rng.choice([80, 90], n)
    kc = rng.choice(list(KERNEL_CLASSES), n)
    co = rng.choice(list(SYNTH_SLOW_COLL), n)
    nbytes = 2.0 ** rng.integers(16, 31, n)
    group = 2.0 ** rng.integers(1, 5, n)
    alone = np.exp(rng.uniform(np.log(5), np.log(5000), n))
    f = 1.0 + scale * (synth_slowdown(arch, kc, co, nbytes, group) - 1.0)
    over = alone * f * rng.lognormal(0, noise, n)
    return pd.DataFrame({"gpu": [gpus[a] for a in arch], "sm_arch": arch, "kernel_class": kc,
                         "collective": co, "nbytes": nbytes.astype(np.int64),
                         "group": group.astype(np.int64), "time_alone_us": alone.round(3),
                         "time_overlap_us": over.round(3),
                         "source": [f"run{i % 4}" for i in range(n)]})


_NCCL_TESTS = (("all_reduce", 8, 1), ("all_reduce", 16, 2), ("all_gather", 16, 2),
               ("reduce_scatter", 8, 1))


def nccl_tests_text(op: str, group: int, nodes: int, net: dict, scales: dict, seed: int = 0,
                    noise: float = 0.01, device: str = "NVIDIA H100 80GB HBM3") -> str:
    """nccl-tests stdout (2.13+ format, with the root column) generated from the model."""
    rng = np.random.default_rng(seed)
    binary = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
              "reduce_scatter": "reduce_scatter_perf"}[op]
    ppn = group // nodes
    lines = [f"# SYNTHETIC: generated by `python -m sim_core.learned make-examples` from the NCCL "
             f"model with scales {json.dumps(scales)} and {noise:.0%} noise; not a measurement.",
             f"# command: {binary} -b 8 -e 8G -f 2 -g 1 (one process per GPU, {group} ranks)",
             f"# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
             f"iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    for rk in range(group):
        host = f"node{rk // ppn + 1:02d}"
        lines.append(f"#  Rank {rk:2d} Group  0 Pid {4000 + rk:6d} on {host:>8} device "
                     f"{rk % ppn:2d} [0x{(rk % ppn) * 16 + 0x18:02x}] {device}")
    lines += ["#", "#                                                              out-of-place "
              "                      in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
              "          (us)  (GB/s)  (GB/s)       "]
    sizes = [2 ** i for i in range(3, 34)]
    code = np.full(len(sizes), nccl.COLLECTIVES.index(op))
    t = nccl.collective_time(code, np.array(sizes, float), group, nodes,
                             scale_net(net, scales))["time_s"] * 1e6
    fb = float(nccl.bus_factor(np.array([code[0]]), np.array([group]))[0])
    for s, tt in zip(sizes, t):
        row = [f"{s:12d}", f"{s // 4:12d}", "   float", "    sum" if op != "all_gather" else "   none",
               "     -1"]
        for _ in range(2):  # out-of-place, in-place (independent noise)
            ti = tt * rng.lognormal(0, noise)
            alg = s / (ti * 1e-6) / 1e9
            row += [f"{ti:8.2f}", f"{alg:7.2f}", f"{alg * fb:7.2f}", "     0"]
        lines.append(" ".join(row))
    avg = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : (see rows)\n#"
    return "\n".join(lines) + "\n" + avg + "\n"


def _nsys_example() -> str:
    return "\n".join([
        '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
        '"StdDev (ns)","Name"',
        '41.2,824000000,2000,412000.0,411000.0,405000,430000,3000.1,'
        '"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"',
        '22.5,450000000,1000,450000.0,449000.0,440000,470000,4000.2,'
        '"void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, true>(flash::Flash_fwd_params)"',
        '15.1,302000000,500,604000.0,600000.0,590000,650000,9000.5,'
        '"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"',
        '8.0,160000000,4000,40000.0,39800.0,39000,42000,500.0,'
        '"void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, '
        'at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"',
    ]) + "\n"


def _torch_trace_example() -> dict:
    """A minimal chrome trace in the PyTorch profiler's layout (synthetic times)."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 100,
           "dur": 60, "args": {"External id": 1, "Input Dims": [[8192, 4096], [11008, 4096], []],
                               "Input type": ["c10::BFloat16", "c10::BFloat16", ""]}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 110,
           "dur": 40, "args": {"External id": 2, "Input Dims": [[8192, 4096], [4096, 11008]],
                               "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
           "ts": 120, "dur": 5, "args": {"correlation": 11}},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
           "pid": 0, "tid": 7, "ts": 130, "dur": 1010.5, "args": {"correlation": 11,
                                                                  "External id": 2}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention",
           "pid": 1, "tid": 1, "ts": 300, "dur": 50,
           "args": {"External id": 3, "Input Dims": [[2, 32, 4096, 128], [2, 32, 4096, 128],
                                                      [2, 32, 4096, 128], [], []],
                    "Input type": ["c10::BFloat16"] * 3}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::_flash_attention_forward", "pid": 1,
           "tid": 1, "ts": 305, "dur": 40,
           "args": {"External id": 4, "Input Dims": [[2, 4096, 32, 128], [2, 4096, 32, 128],
                                                      [2, 4096, 32, 128]],
                    "Input type": ["c10::BFloat16"] * 3}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
           "ts": 310, "dur": 5, "args": {"correlation": 12}},
          {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "pid": 0, "tid": 7,
           "ts": 1200, "dur": 980.0, "args": {"correlation": 12, "External id": 4}}]
    return {"schemaVersion": 1, "traceEvents": ev,
            "note": "SYNTHETIC example in the PyTorch profiler chrome-trace layout"}


SYNTH_HEADER = ("# SYNTHETIC data generated by `python -m sim_core.learned make-examples` from the "
                "known ground truth in sim_core/learned.py ({what}); NOT a measurement.\n")


def make_examples(out: Path = EXAMPLES_DIR) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def write(name, text):
        p = out / name
        p.write_text(text)
        written.append(p)

    write("kernels_h100_synthetic.csv",
          SYNTH_HEADER.format(what=f"SYNTH_GEMM={SYNTH_GEMM}, SYNTH_ATTN={SYNTH_ATTN}, 2% "
                                   "lognormal noise") + make_kernel_table().to_csv(index=False))
    write("overlap_synthetic.csv",
          SYNTH_HEADER.format(what="synth_slowdown(): SYNTH_SLOW_BASE x SYNTH_SLOW_COLL x "
                                   "size saturation x group term, 0.5% noise")
          + make_overlap_table().to_csv(index=False))
    net = base_network(SYNTH_GPU)
    for i, (op, g, nn) in enumerate(_NCCL_TESTS):
        write(f"{op}_perf_{g}gpu_{nn}node_synthetic.txt",
              nccl_tests_text(op, g, nn, net, SYNTH_NCCL_SCALES, seed=i))
    write("nsys_kern_sum_synthetic.csv", _nsys_example())
    write("torch_trace_synthetic.json", json.dumps(_torch_trace_example(), indent=1) + "\n")
    return written


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "make-examples":
        print("usage: python -m sim_core.learned make-examples [DIR]")
        return 2
    for p in make_examples(Path(argv[1]) if len(argv) > 1 else EXAMPLES_DIR):
        print(f"wrote {p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
