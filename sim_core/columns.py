"""Turn a table of configurations into the numeric arrays the core computes with.

This is the only place where strings (model ids, GPU ids, enum values) are resolved; everything
after it works on float/int numpy arrays of equal length, one element per configuration.
Resolution is vectorized: each distinct id is looked up once and broadcast with `np.unique`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import catalog, frameworks
from .specs import ALL_COLUMNS, CATEGORICAL, MODEL_COLUMNS

# Hardware columns copied from the GPU catalog table into every row.
GPU_FIELDS = (
    "peak_bf16", "peak_fp8", "has_fp8", "hbm_gib", "hbm_bw_gbs", "sm_count", "sm_arch",
    "nvlink_bw_gbs",
    "nvls", "price_per_hour",
)
# Network defaults that a row may override (0 = use the GPU's default cluster).
NET_DEFAULTS = ("nics_per_node", "nic_bw_gbs", "intra_latency_us", "inter_latency_us")


class Batch(dict):
    """A dict of equal-length arrays with attribute access (b.tp, b.hidden, ...)."""

    __slots__ = ()

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(key) from exc

    def __len__(self) -> int:  # number of configurations, not of fields
        return len(next(iter(self.values()))) if dict.__len__(self) else 0


def _expand_models(df: pd.DataFrame) -> pd.DataFrame:
    """Fill model shape columns from catalog ids where the shape is not given inline."""
    if "model" not in df.columns:
        missing = [c for c in ("layers", "hidden", "heads", "ffn", "vocab") if c not in df.columns]
        if missing:
            raise catalog.CatalogError(f"model: give a catalog id or the fields {missing}")
        return df
    df = df.copy()
    shape_cols = [c for c in MODEL_COLUMNS if c != "model"]
    needs = df["layers"].isna() if "layers" in df.columns else pd.Series(True, index=df.index)
    if not needs.any():
        return df
    ids = df.loc[needs, "model"].astype(str)
    for mid in ids.unique():
        spec = catalog.get_model(mid).columns()
        rows = needs & (df["model"].astype(str) == mid)
        for c in shape_cols:
            if c not in df.columns:
                df[c] = pd.Series([pd.NA] * len(df), index=df.index, dtype="object")
            df.loc[rows, c] = spec[c]
    return df


def _gpu_arrays(gpu: pd.Series) -> dict[str, np.ndarray]:
    table = catalog.gpu_table()
    names = gpu.astype(str).str.lower().to_numpy()
    uniq, inv = np.unique(names, return_inverse=True)
    rows = [table.loc[catalog.get_gpu(u).name] for u in uniq]
    out = {}
    for f in GPU_FIELDS + NET_DEFAULTS:
        vals = np.array([float(r[f]) for r in rows], dtype=np.float64)
        out[f] = vals[inv]
    out["gpu_code"] = inv.astype(np.int64)
    return out


def frame_to_batch(df: pd.DataFrame) -> Batch:
    """Resolve a run frame (see specs.ALL_COLUMNS) into a Batch of numeric arrays."""
    df = frameworks.resolve_frame(_expand_models(df))
    n = len(df)
    b = Batch()
    for name, default in ALL_COLUMNS.items():
        if name in ("model", "gpu"):
            continue
        if name in df.columns:
            col = df[name]
            if default is not None:
                col = col.where(col.notna(), default)
        elif default is None:
            raise catalog.CatalogError(f"{name}: required field is missing")
        else:
            col = pd.Series([default] * n, index=df.index)
        if name in CATEGORICAL:
            allowed = CATEGORICAL[name]
            vals = col.astype(str).str.lower().to_numpy()
            codes = np.full(n, -1, dtype=np.int64)
            for i, v in enumerate(allowed):
                codes[vals == v] = i
            if (codes < 0).any():
                bad = vals[codes < 0][0]
                raise catalog.CatalogError(
                    f"{name}: unknown value '{bad}'; allowed: {', '.join(allowed)}")
            b[name] = codes
        elif isinstance(default, bool):
            b[name] = col.astype(bool).to_numpy()
        else:
            b[name] = pd.to_numeric(col).to_numpy(dtype=np.float64)
    if "gpu" not in df.columns:
        raise catalog.CatalogError("gpu: required field is missing")
    hw = _gpu_arrays(df["gpu"])
    for f in NET_DEFAULTS:
        user = b.get(f)
        b[f] = np.where((user is not None) & (user > 0), user, hw[f]) if user is not None else hw[f]
    for f in GPU_FIELDS + ("gpu_code",):
        b[f] = hw[f]
    return b


def batch_from_arrays(arrays: dict, n: int | None = None) -> Batch:
    """Build a Batch from already-numeric arrays (benchmarks, property tests): scalars broadcast."""
    if n is None:
        n = max(np.size(v) for v in arrays.values())
    b = Batch()
    for k, v in arrays.items():
        a = np.asarray(v)
        b[k] = np.broadcast_to(a, (n,)).copy() if a.ndim == 0 or a.size == 1 else a
    return b
