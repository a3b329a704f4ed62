"""A learned residual on top of the calibrated white-box model, kept only where grouped
cross-validation shows it helps (issue 24).

Why: the terms of sim_core/terms.py are global; what is left (a framework's per-layout quirks)
may follow the configuration. An XGBoost regressor (the project's declared dependency) learns
log(measured / calibrated) step time from the configuration and the calibrated breakdown shares.
Trees do not extrapolate: a configuration outside the fitted runs' range (more GPUs, a bigger
model, a longer sequence) gets no residual -- it falls back to the calibrated white-box model and
is flagged (`residual_extrapolated` in the simulator's output while a residual is installed).
"""

from __future__ import annotations

import numpy as np

from .. import terms

PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.1, "subsample": 1.0,
          "min_child_weight": 2, "nthread": 1, "seed": 0}
ROUNDS = 60
MIN_RUNS = 20  # fewer timed runs than this: no residual is tried
RANGE_KEYS = ("num_gpus", "size", "seq_len")


def features(cols: dict, parts: np.ndarray, params: dict) -> np.ndarray:
    """Configuration features (log2 GPUs, nodes, tp, pp, cp, dp, micro-batch, micro-batches,
    model size, sequence) plus the calibrated share of each breakdown group."""
    f = lambda k: np.asarray(cols[k], float)  # noqa: E731
    g = f("num_gpus")
    dp = g / np.maximum(f("tp") * f("pp") * f("cp"), 1)
    scales = np.array([params.get(k, 1.0) for k in terms.GROUPS])
    scaled = parts * scales
    shares = scaled / np.maximum(scaled.sum(axis=1, keepdims=True), 1e-12)
    base = [np.log2(np.maximum(x, 1)) for x in (
        g, terms.nodes_of(g, f("gpus_per_node")), f("tp"), f("pp"), f("cp"), dp,
        f("micro_batch"), f("num_microbatches"), size_of(cols), f("seq_len"))]
    return np.column_stack(base + [shares])


def size_of(cols: dict) -> np.ndarray:
    """Model size proxy: layers x hidden^2 (dense parameter count / 12)."""
    return np.asarray(cols["layers"], float) * np.asarray(cols["hidden"], float) ** 2


def range_of(cols: dict) -> dict:
    return {"num_gpus": float(np.max(cols["num_gpus"])), "size": float(np.max(size_of(cols))),
            "seq_len": float(np.max(cols["seq_len"]))}


def outside(cols: dict, rng: dict) -> np.ndarray:
    """Configurations beyond the fitted runs' range: no residual, flagged."""
    return ((np.asarray(cols["num_gpus"], float) > rng["num_gpus"])
            | (size_of(cols) > rng["size"] * 1.0001)
            | (np.asarray(cols["seq_len"], float) > rng["seq_len"]))


def train(X: np.ndarray, y: np.ndarray):
    import xgboost as xgb

    return xgb.train(PARAMS, xgb.DMatrix(X, label=y), num_boost_round=ROUNDS)


def predict(booster, X: np.ndarray) -> np.ndarray:
    import xgboost as xgb

    return booster.predict(xgb.DMatrix(X))


def save(booster, path) -> None:
    booster.save_model(str(path))


def load(path):
    import xgboost as xgb

    b = xgb.Booster(params={"nthread": 1})
    b.load_model(str(path))
    return b


def hook(booster, rng: dict, params: dict):
    """terms.set_residual callback: (log factor, extrapolated flag) per configuration."""
    def fn(b, wl, parts):
        cols = {"num_gpus": b.num_gpus, "gpus_per_node": b.gpus_per_node, "tp": b.tp,
                "pp": b.pp, "cp": b.cp, "micro_batch": b.micro_batch,
                "num_microbatches": wl.num_microbatches, "layers": b.layers, "hidden": b.hidden,
                "seq_len": b.seq_len}
        out = outside(cols, rng)
        r = predict(booster, features(cols, parts, params))
        return np.where(out, 0.0, r), out
    return fn
