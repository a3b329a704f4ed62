"""A learned residual on top of the calibrated white-box model, kept only where the upward
checks (and grouped cross-validation) show it helps (issues 24, 35).

Why: the terms of sim_core/terms.py are global; what is left (a framework's per-layout quirks,
a cluster's per-layout network behaviour) follows the configuration. An XGBoost regressor (the
project's declared dependency) learns log(measured / calibrated) step time from features that do
not grow with the model (issue 35): the calibrated share of each breakdown group, how many nodes
the TP group spans, whether the pipeline and data-parallel groups cross nodes, the node count,
micro-batches per pipeline stage and the layout's own small integers. So a residual fitted on a
user's 1B and 3B runs acts on their 8B and 80B configurations, where one keyed on model size
never would. Trees do not extrapolate: on a configuration with any feature outside the fitted
runs' range the residual is that of the nearest fitted edge, and the row is flagged
(`residual_extrapolated` in the simulator's output while a residual is installed) and given the
wider interval of the terms alone. Falling back to the terms instead would make exactly those
rows look fastest wherever the residual adds time (the terms' own bias), and a search would
pick them.
"""

from __future__ import annotations

import numpy as np

from .. import terms

PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.1, "subsample": 1.0,
          "min_child_weight": 2, "nthread": 1, "seed": 0}
ROUNDS = 60
MIN_RUNS = 20  # fewer timed runs than this: no residual is tried
# the layout features (log2 of small integers, flags); then one share per breakdown group and
# the host and network-latency shares. Not the node count nor the model size: they grow with
# what the user searches beyond the fitted runs (more GPUs, a larger model), and what they do
# to the step shows in the shares (a larger cluster: more exposed communication per step)
LAYOUT = ("log2_tp_nodes", "span_pp", "span_dp", "log2_tp", "log2_pp", "log2_cp",
          "log2_micro_batch", "log2_microbatches_per_stage", "zero", "log2_seq_len")
SHARE_SLACK = 0.02  # a share this far outside the fitted range still counts as inside


def feature_names() -> list:
    return list(LAYOUT) + [f"share_{k}" for k in terms.GROUPS] + ["share_host", "share_latency"]


def features(cols: dict, parts: np.ndarray, params: dict) -> np.ndarray:
    """Scale-free features (feature_names()): the layout and the calibrated share of each
    breakdown group, host overhead and network latency in the step."""
    f = lambda k: np.asarray(cols[k], float)  # noqa: E731
    lg = lambda x: np.log2(np.maximum(x, 1.0))  # noqa: E731
    gpn = f("gpus_per_node")
    p = {**terms.NEUTRAL, **params}
    scales = np.array([p[k] for k in terms.GROUPS])
    host = p["host_step_s"] + p["host_mb_s"] * f("num_microbatches")
    lat = p["net_latency_s"] * f("net_calls")
    scaled = np.column_stack([parts * scales, host, lat])
    shares = scaled / np.maximum(scaled.sum(axis=1, keepdims=True), 1e-12)
    layout = [lg(np.ceil(f("tp") / np.maximum(gpn, 1))),
              f("span_pp"), f("span_dp"), lg(f("tp")), lg(f("pp")), lg(f("cp")),
              lg(f("micro_batch")), lg(f("num_microbatches") / np.maximum(f("pp"), 1)),
              f("zero"), lg(f("seq_len"))]
    return np.column_stack(layout + [shares])


def range_of(X: np.ndarray) -> dict:
    """The fitted runs' range of every feature."""
    return {"names": feature_names(), "lo": np.min(X, axis=0).tolist(),
            "hi": np.max(X, axis=0).tolist()}


def outside(X: np.ndarray, rng: dict) -> np.ndarray:
    """Configurations with any feature beyond the fitted runs' range (flagged)."""
    lo, hi = np.asarray(rng["lo"], float), np.asarray(rng["hi"], float)
    slack = np.where(np.arange(len(lo)) >= len(LAYOUT), SHARE_SLACK, 1e-9)
    return ((X < lo - slack) | (X > hi + slack)).any(axis=1)


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
    def fn(b, wl, parts, fabric):
        cols = {"num_gpus": b.num_gpus, "gpus_per_node": b.gpus_per_node, "tp": b.tp,
                "pp": b.pp, "cp": b.cp, "micro_batch": b.micro_batch, "zero": b.zero,
                "seq_len": b.seq_len,
                "num_microbatches": wl.num_microbatches, "span_pp": fabric["span_pp"],
                "span_dp": fabric["span_dp"], "net_calls": fabric["net_calls"]}
        X = features(cols, parts, params)
        return predict(booster, X), outside(X, rng)
    return fn
