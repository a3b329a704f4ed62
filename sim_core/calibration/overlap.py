"""Overlap tables for `sweep calibrate overlap`: the Echo slowdown regressor of compute
kernels that run beside a collective, and the hook overlap.py calls.


Overlap table (`sweep calibrate overlap`): one row per compute kernel measured alone and while a
collective runs on another stream (Echo, seed 000 sec. 6):

    gpu or sm_arch, kernel_class (gemm | attention | elementwise), collective (all_reduce, ...),
    nbytes (collective message size, optional), group (ranks, optional),
    time_alone_us, time_overlap_us, source (optional)

Target: slowdown = time_overlap_us / time_alone_us. Model: Echo Table 5 settings
(XGBRegressor(objective='reg:squarederror', max_depth=12, random_state=42) = xgboost.train with
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import nccl
from .kernels import KERNEL_CLASSES
from .training import (
    _gpu_row,
    _load_booster,
    _predict,
    _ratio_metrics,
    _train,
    cross_validate,
)

OVERLAP_COLUMNS = ("sm_arch", "kernel_class", "collective", "nbytes", "group", "time_alone_us",
                   "time_overlap_us", "source")
# Echo Table 5: XGBRegressor(objective='reg:squarederror', max_depth=12, random_state=42) with
# the XGBRegressor defaults (learning rate 0.3, 100 trees)
ECHO_PARAMS = {"objective": "reg:squarederror", "max_depth": 12, "eta": 0.3, "seed": 42}
ECHO_ROUNDS = 100


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
    from .. import overlap

    out = np.empty(len(sm_arch))
    for i, (a, c) in enumerate(zip(sm_arch, kernel_class)):
        out[i] = overlap.slowdown(np.array([a]), c)[0]
    return out


def overlap_hook(model: SlowdownModel):
    """overlap.set_model callable: learned factor where the model saw the (arch, kernel class),
    the explained prior elsewhere."""
    from .. import overlap

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
