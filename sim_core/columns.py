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
    "nvlink_bw_gbs", "mesh_links", "rocm", "gemm_max_bf16", "gemm_max_fp8",
    "nvls", "price_per_hour", "tdp_w",
    "peak_nvfp4", "peak_mxfp4",  # FP4 training (sim_core/fp4.py)
    "attn_scale_fa2", "attn_scale_fa3",  # published attention levels (catalog.attention_scales)
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

    def floats(self, key: str, default: float = np.nan) -> np.ndarray:
        """An optional column as floats: its values (blank cells stay NaN) where the batch has
        it, else `default` for every configuration. Run tables and spaces only carry the
        columns they state, so the modules that read an optional setting read it here."""
        if key in self:
            return np.asarray(self[key], dtype=float)
        return np.full(len(self), default, dtype=float)


def _expand_models(df: pd.DataFrame) -> pd.DataFrame:
    """Fill model shape columns from catalog ids where the shape is not given inline."""
    if "model" not in df.columns:
        missing = [c for c in ("layers", "hidden", "heads", "ffn", "vocab") if c not in df.columns]
        if missing:
            raise catalog.CatalogError(f"model: give a catalog id or the fields {missing}")
        return df
    needs = df["layers"].isna() if "layers" in df.columns else pd.Series(True, index=df.index)
    if not needs.any():
        return df  # every shape given (the search fills them as typed columns): nothing to copy
    df = df.copy()
    shape_cols = [c for c in MODEL_COLUMNS if c != "model"]
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
    uniq, inv = _factorize(gpu)
    # distinct ids once lowered (np.unique over the few distinct values, not over the rows)
    names, back = np.unique([str(u).lower() for u in uniq], return_inverse=True)
    inv = back.ravel()[inv]
    rows = [table.loc[catalog.get_gpu(u).name] for u in names]
    out = {}
    for f in GPU_FIELDS + NET_DEFAULTS:
        vals = np.array([float(r[f]) for r in rows], dtype=np.float64)
        out[f] = vals[inv]
    out["gpu_code"] = inv.astype(np.int64)
    return out


def _factorize(values) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, index of each element's value): each distinct id is resolved once.
    `values` may be a Series: Arrow-backed strings are then encoded by Arrow, not turned into
    Python objects first."""
    codes, uniq = pd.factorize(values, use_na_sentinel=False)
    return np.asarray(uniq, dtype=object), np.asarray(codes).astype(np.int64)


def _categorical_codes(name: str, values, default=None) -> np.ndarray:
    """Positions of lower-cased values in CATEGORICAL[name] (a one-line error for another);
    missing values take `default` where one is given."""
    allowed = CATEGORICAL[name]
    uniq, inv = _factorize(values)
    if default is not None:
        uniq = np.array([default if u is None or (not isinstance(u, str) and pd.isna(u))
                         else u for u in uniq], dtype=object)
    lookup = {v: i for i, v in enumerate(allowed)}
    table = np.array([lookup.get(str(u).lower(), -1) for u in uniq], dtype=np.int64)
    codes = table[inv]
    if (codes < 0).any():
        bad = str(uniq[inv[codes < 0][0]]).lower()
        raise catalog.CatalogError(
            f"{name}: unknown value '{bad}'; allowed: {', '.join(allowed)}")
    return codes


def _column(df: pd.DataFrame, name: str, default, n: int) -> np.ndarray:
    """One Batch array: the column with missing values set to the default, as codes (enums),
    bools or float64. numpy on whole arrays (Arrow for string columns); pandas' own
    conversions only for a column with missing values or of an unusual type."""
    if name not in df.columns:
        if default is None:
            raise catalog.CatalogError(f"{name}: required field is missing")
        if name in CATEGORICAL:
            return np.full(n, _categorical_codes(name, np.array([default], dtype=object))[0])
        if isinstance(default, bool):
            return np.full(n, bool(default))
        return np.full(n, float(default), dtype=np.float64)
    col = df[name]
    if name in CATEGORICAL and default is not None:
        # missing values become the default among the distinct values, not row by row
        return _categorical_codes(name, col, default)
    numeric = isinstance(col.dtype, np.dtype) and col.dtype.kind in "biuf"
    if default is not None and not (numeric and col.dtype.kind in "biu") and col.isna().any():
        col = col.where(col.notna(), default)
        numeric = isinstance(col.dtype, np.dtype) and col.dtype.kind in "biuf"
    if name in CATEGORICAL:
        return _categorical_codes(name, col)
    if isinstance(default, bool):
        return col.to_numpy().astype(bool) if isinstance(col.dtype, np.dtype) \
            else col.astype(bool).to_numpy()
    if numeric:
        return col.to_numpy().astype(np.float64)
    return pd.to_numeric(col).to_numpy(dtype=np.float64)


def frame_to_batch(df: pd.DataFrame) -> Batch:
    """Resolve a run frame (see specs.ALL_COLUMNS) into a Batch of numeric arrays."""
    df = frameworks.resolve_frame(_expand_models(df))
    if "lora_targets" in df.columns and df["lora_targets"].dtype.kind not in "biuf":
        df = _lora_targets(df)
    if "recompute_modules" in df.columns and df["recompute_modules"].dtype.kind not in "biuf":
        df = _recompute_modules(df)
    n = len(df)
    b = Batch()
    for name, default in ALL_COLUMNS.items():
        if name in ("model", "gpu"):
            continue
        b[name] = _column(df, name, default, n)
    if "gpu" not in df.columns:
        raise catalog.CatalogError("gpu: required field is missing")
    hw = _gpu_arrays(df["gpu"])
    for f in NET_DEFAULTS:
        user = b.get(f)
        b[f] = np.where((user is not None) & (user > 0), user, hw[f]) if user is not None else hw[f]
    for f in GPU_FIELDS + ("gpu_code",):
        b[f] = hw[f]
    return b


def _mask_column(df: pd.DataFrame, col: str, values, to_mask, missing, error) -> pd.DataFrame:
    """A column of names (`values`, the column as given or pre-joined) as the bit mask the core
    reads: each distinct value converted once by `to_mask`, a missing one to `missing`; the
    converter's `error` becomes the catalog's one-line CatalogError."""
    uniq, inv = _factorize(values)
    try:
        masks = [missing if u is None or (not isinstance(u, (str, list, tuple)) and pd.isna(u))
                 else to_mask(u) for u in uniq]
    except error as exc:
        raise catalog.CatalogError(str(exc)) from None
    df = df.copy()
    df[col] = np.asarray(masks, dtype=np.float64)[inv]
    return df


def _lora_targets(df: pd.DataFrame) -> pd.DataFrame:
    """LoRA target names ('qkv,proj', 'all_linear', a list) as the bit mask the core reads
    (sim_core/tasks.py); a missing value is the default."""
    from .tasks import FINETUNE_COLUMNS, TaskError, targets_mask

    return _mask_column(df, "lora_targets", df["lora_targets"],
                        lambda u: targets_mask(u, "lora_targets"),
                        FINETUNE_COLUMNS["lora_targets"], TaskError)


def _recompute_modules(df: pd.DataFrame) -> pd.DataFrame:
    """Megatron recompute module names (a list, or 'moe_act,layernorm') as the bit mask the
    core reads (sim_core/recompute.py); a missing value is none."""
    from .recompute import RecomputeModulesError, mask

    joined = df["recompute_modules"].map(
        lambda v: ",".join(map(str, v)) if isinstance(v, (list, tuple, np.ndarray)) else v)
    return _mask_column(df, "recompute_modules", joined, mask, 0, RecomputeModulesError)


def batch_from_arrays(arrays: dict, n: int | None = None) -> Batch:
    """Build a Batch from already-numeric arrays (benchmarks, property tests): scalars broadcast."""
    if n is None:
        n = max(np.size(v) for v in arrays.values())
    b = Batch()
    for k, v in arrays.items():
        a = np.asarray(v)
        b[k] = np.broadcast_to(a, (n,)).copy() if a.ndim == 0 or a.size == 1 else a
    return b
