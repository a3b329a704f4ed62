"""Kernel tables for `sweep calibrate compute`: loaders (Nsight Systems `nsys stats`
CSV, PyTorch profiler traces, plain tables), features, the per-(GPU, op class) efficiency
regressor and the hooks that compute.py calls.

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
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .training import (
    _load_booster,
    _predict,
    _ratio_metrics,
    _train,
    cross_validate,
    fingerprint,
    peak_tflops,
)

OP_CLASSES = ("gemm", "attention")
KERNEL_CLASSES = ("gemm", "attention", "elementwise")
KERNEL_COLUMNS = ("gpu", "op_class", "dtype", "m", "n", "k", "batch", "heads", "seq", "head_dim",
                  "causal", "direction", "time_us", "source")
TILE = 128  # output tile of tensor-core GEMMs (compute.TILE_M/N)


# =============================================================================================
# Kernel tables: loaders
# =============================================================================================
_GEMM_RE = re.compile(r"gemm|xmma|cutlass|cublas|nvjet|\bsm\d+_.*(?:tn|nt|nn|tt)\b|matmul|"
                      r"wgmma|s\d+gemm|h\d+gemm|matrix_?mul", re.IGNORECASE)
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


_NSYS_SECTION_RE = re.compile(r"Executing '(cuda_gpu_kern_sum|gpukernsum)'")
_NSYS_OTHER_RE = re.compile(r"Executing '|^\s*\[\d+/\d+\]")


def _nsys_console_tables(lines: list[str]) -> list[pd.DataFrame]:
    """The kernel-summary tables of `nsys profile --stats=true` / `nsys stats` console output:
    fixed-width columns under a dashed rule, thousands separators, names cut with an
    ellipsis. One table per 'cuda_gpu_kern_sum' (older: 'gpukernsum') section."""
    tables = []
    i = 0
    while i < len(lines):
        if not _NSYS_SECTION_RE.search(lines[i]):
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*-{3,}(\s+-{3,})+\s*$", lines[j]):
            if _NSYS_OTHER_RE.search(lines[j]) or lines[j].startswith("SKIPPED"):
                break
            j += 1
        if j >= len(lines) or not lines[j].strip().startswith("-"):
            i = j
            continue
        header, rule = lines[j - 1], lines[j]
        spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
        # the last column (Name) runs to the end of the line
        spans[-1] = (spans[-1][0], None)
        cols = [header[a:b].strip() if b else header[a:].strip() for a, b in spans]
        rows = []
        k = j + 1
        while k < len(lines) and lines[k].strip():
            ln = lines[k]
            rows.append([ln[a:b].strip() if b else ln[a:].strip() for a, b in spans])
            k += 1
        tables.append(pd.DataFrame(rows, columns=cols))
        i = k
    return tables


def load_nsys_stats(path) -> pd.DataFrame:
    """Nsight Systems kernel summaries: `nsys stats --report cuda_gpu_kern_sum --format csv`
    (with whatever the tool printed before the header) or the console tables of
    `nsys profile --stats=true` / `nsys stats` (every kernel-summary section in the file;
    the `section` column numbers them). One row per kernel NAME.

    Extracted: name, op class (name heuristic), instances, time_us = Avg (ns) / 1000. Shapes are
    NOT in this report (only tile names such as 128x256x64 in CUTLASS kernel names, which are the
    tile, not the problem), so m/n/k and the attention dims stay NaN: such rows cannot train the
    shape-dependent models, and `train_kernel_models` drops them with a count.
    """
    text = Path(path).read_text(errors="replace")
    lines = text.splitlines()
    if any(_NSYS_SECTION_RE.search(ln) for ln in lines):
        tables = _nsys_console_tables(lines)
        if not tables:
            raise ValueError(f"{path}: its kernel-summary sections hold no table (SKIPPED: "
                             "the report had no CUDA kernel data)")
        df = pd.concat([t.assign(section=n) for n, t in enumerate(tables)], ignore_index=True)
    else:
        start = next((i for i, ln in enumerate(lines)
                      if ("Avg (ns)" in ln or "Avg(ns)" in ln) and "Name" in ln), None)
        if start is None:
            raise ValueError(f"{path}: not an nsys kernel summary (no 'Avg (ns)' column and no "
                             "'cuda_gpu_kern_sum' section)")
        from io import StringIO

        df = pd.read_csv(StringIO("\n".join(lines[start:])), thousands=",")
        df["section"] = 0
    df.columns = [c.strip() for c in df.columns]
    avg = next(c for c in df.columns if c.replace(" ", "") == "Avg(ns)")

    def num(col):
        return pd.to_numeric(df[col].astype(str).str.replace(",", ""), errors="coerce").to_numpy()

    out = pd.DataFrame(_empty_kernels(len(df)))
    out["name"] = df["Name"].astype(str).to_numpy()
    out["op_class"] = [classify_kernel(n) for n in out["name"]]
    out["instances"] = num("Instances") if "Instances" in df else 1.0
    out["time_us"] = num(avg) / 1e3
    out["dtype"] = [_kernel_dtype(n) for n in out["name"]]
    out["section"] = df["section"].to_numpy()
    out["source"] = Path(path).name
    return out


def _kernel_dtype(name: str) -> str:
    """The dtype a kernel name says (cuBLAS/CUTLASS spell it), bf16 when it says none."""
    n = name.lower()
    if re.search(r"e4m3|e5m2|fp8", n):
        return "fp8"
    if re.search(r"bf16|bfloat16", n):
        return "bf16"
    if re.search(r"fp16|f16|half|h\d+gemm", n):
        return "fp16"
    if re.search(r"sgemm|fp32|f32|float|tf32", n):
        return "fp32"
    return "bf16"


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


def gpu_from_device(name: str, total_mem_bytes: float | None = None) -> str | None:
    """Catalog GPU for a CUDA device name (and its memory, which tells A100 40 GB from 80 GB):
    the catalog GPUs whose family ("a100", "h100", ...) the name contains, nearest in memory.
    None for a GPU outside the catalog."""
    from .. import catalog

    tab = catalog.gpu_table()
    low = name.lower().replace(" ", "-")
    fams = {g: g.split("-")[0] for g in tab.index}
    cands = [g for g, f in fams.items() if re.search(rf"(?<![a-z]){re.escape(f)}", low)]
    if not cands:
        return None
    if total_mem_bytes:
        gib = float(total_mem_bytes) / 2**30
        return min(cands, key=lambda g: abs(float(tab.loc[g, "hbm_gib"]) - gib))
    return cands[0]


def load_torch_trace(path) -> pd.DataFrame:
    """PyTorch profiler (Kineto) chrome trace (export_chrome_trace / tensorboard trace handler,
    .json or .json.gz).

    Shaped rows (recorded with record_shapes=True): every aten GEMM op (mm, addmm, bmm,
    baddbmm, _scaled_mm) and attention op (_flash_attention_*, _efficient_attention_*,
    _scaled_dot_product_*) with its "Input Dims" and "Input type"; its time is the sum of the
    GPU kernels it launched (runtime launch events inside the op's CPU interval on the same
    thread, matched to kernels by "correlation"; nested recognised ops get their launches, the
    innermost wins). Attention is assumed causal unless "Concrete Inputs" say otherwise.
    Every other GPU kernel (and every kernel of a trace without shapes) is a row of its own,
    classed by its name, with no shape: it tells what the GPU spent its time on but cannot
    train the shape-dependent models. CPU-only traces give no rows: CPU op durations are not
    kernel times. The GPU comes from the trace's deviceProperties (name and memory) when it
    is in the catalog. `load_torch_trace.notes` says what was found.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    events = data["traceEvents"] if isinstance(data, dict) else data
    devices = (data.get("deviceProperties") or []) if isinstance(data, dict) else []
    gpu = None
    if devices:
        gpu = gpu_from_device(str(devices[0].get("name", "")), devices[0].get("totalGlobalMem"))
    ops, launches, kernels, knames = [], [], {}, {}
    n_kernel_events = 0
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat, name, args = ev.get("cat", ""), ev.get("name", ""), ev.get("args", {}) or {}
        if cat in ("cpu_op", "Operator") and (name in _TORCH_GEMM or name in _TORCH_ATTN):
            ops.append(ev)
        elif cat in ("cuda_runtime", "cuda_driver") and "aunch" in name:
            launches.append(ev)
        elif cat == "kernel":
            n_kernel_events += 1
            corr = args.get("correlation", f"nocorr{n_kernel_events}")
            kernels[corr] = kernels.get(corr, 0.0) + float(ev.get("dur", 0.0))
            knames[corr] = name
    shapes = {id(o): _torch_shape(o) for o in ops}
    shaped_ops = [o for o in ops if shapes[id(o)] is not None]
    t_op = {id(o): 0.0 for o in shaped_ops}
    hit = {id(o): 0 for o in shaped_ops}
    used = set()
    for la in launches:
        corr = (la.get("args") or {}).get("correlation")
        if corr not in kernels:
            continue
        inside = [o for o in shaped_ops if o.get("pid") == la.get("pid")
                  and o.get("tid") == la.get("tid") and o["ts"] <= la["ts"] <= o["ts"] + o["dur"]]
        if inside:
            o = min(inside, key=lambda e: e["dur"])
            t_op[id(o)] += kernels[corr]
            hit[id(o)] += 1
            used.add(corr)
    rows = []
    for o in shaped_ops:
        if not hit[id(o)]:
            continue
        args = o.get("args", {})
        r = {k: v[0] for k, v in _empty_kernels(1).items()}
        r.update(name=o["name"], dtype=_torch_dtype(args.get("Input type")), time_us=t_op[id(o)],
                 source=Path(path).name, **shapes[id(o)])
        rows.append(r)
    for corr, t in kernels.items():
        if corr in used:
            continue
        r = {k: v[0] for k, v in _empty_kernels(1).items()}
        r.update(name=knames[corr], op_class=classify_kernel(knames[corr]),
                 dtype=_kernel_dtype(knames[corr]), time_us=t, source=Path(path).name)
        rows.append(r)
    df = pd.DataFrame(rows, columns=list(_empty_kernels(0)) + ["name"])
    if gpu:
        df["gpu"] = gpu
    notes = []
    if devices:
        notes.append(f"device {devices[0].get('name')!r}: "
                     + (f"catalog GPU {gpu}" if gpu else "not in the catalog (give --gpu)"))
    else:
        notes.append("the trace names no device (give --gpu)")
    if not n_kernel_events:
        notes.append("no GPU kernel events: a CPU-only trace or one recorded without CUDA "
                     "activity (ProfilerActivity.CUDA); CPU op durations are not kernel times")
    elif not any(o.get("args", {}).get("Input Dims") for o in ops):
        notes.append("no input shapes (record_shapes=False): kernels are classed by name only")
    df.attrs["notes"] = notes
    return df


def _torch_shape(o) -> dict | None:
    """The op class and problem shape of a recognised aten op, or None without usable dims."""
    args = o.get("args", {}) or {}
    dims = args.get("Input Dims") or []
    if o["name"] in _TORCH_GEMM:
        ia, ib = _TORCH_GEMM[o["name"]]
        if len(dims) <= ib or len(dims[ia]) < 2 or len(dims[ib]) < 2:
            return None
        a, bm = dims[ia], dims[ib]
        return dict(op_class="gemm", m=a[-2], k=a[-1], n=bm[-1], batch=a[0] if len(a) == 3 else 1)
    direction, layout = _TORCH_ATTN[o["name"]]
    q = dims[0] if dims else []
    if len(q) != 4:
        return None
    bsz, sq, h, d = (q if layout == "bshd" else (q[0], q[2], q[1], q[3]))
    conc = " ".join(str(x) for x in (args.get("Concrete Inputs") or []))
    return dict(op_class="attention", batch=bsz, seq=sq, heads=h, head_dim=d, direction=direction,
                causal=0 if re.search(r"\bFalse\b", conc) else 1)


def load_kernels(path, fmt: str = "auto", gpu: str | None = None) -> pd.DataFrame:
    """A kernel table from our CSV, an nsys kern-sum CSV or a PyTorch chrome trace.

    `gpu` fills the gpu column where the file has none (profiler exports never name it)."""
    path = Path(path)
    if fmt == "auto":
        head = path.read_bytes()[:262144]
        if path.suffix in (".json", ".gz") or head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
            fmt = "torch"
        elif (b"Avg (ns)" in head or b"Avg(ns)" in head or b"cuda_gpu_kern_sum" in head
              or b"gpukernsum" in head):
            fmt = "nsys"
        else:
            fmt = "csv"
    if fmt == "torch":
        df = load_torch_trace(path)
    elif fmt == "nsys":
        df = load_nsys_stats(path)
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


