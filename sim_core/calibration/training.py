"""What the learned calibration models share: the xgboost training and loading calls,
the GPU fingerprint a hook matches on, and k-fold / leave-one-source-out validation."""

from __future__ import annotations

import numpy as np

from .. import catalog

NTHREAD = 1  # xgboost threads spin-wait: on a busy 2-core box 2 threads are 40x slower


def _xgb():
    import xgboost

    return xgboost



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

