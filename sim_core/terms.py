"""Step-level terms on top of the composed breakdown: a scale per breakdown term, host overhead
and the slowdown that grows with the number of nodes.

Why a separate layer: what differs between clusters and frameworks at scale (issue 24) is not
one kernel's efficiency but whole terms of the step -- exposed communication, the pipeline
bubble, a Python/launch overhead per micro-batch, stragglers and per-hop latency that grow with
the node count. `step.compose` builds the breakdown; `apply` rescales it with

    t_k'        = scale_k * t_k                          for each breakdown group below
    time_host   = host_step_s + host_mb_s * num_microbatches
    time_latency = net_latency_s * (collective calls per step that cross nodes)
    time_nodes  = node_c * log2(nodes) * (sum of the above)

so the step stays exactly the sum of its parts. The node form, step * (1 + c log2(nodes)), is
the one every public end-to-end scaling table supports (0.4-2.5% per doubling of nodes; NCCL
tree/NVLSTree latency is logarithmic in nodes -- NVIDIA/nccl issue #757, maintainer): see
docs/calibration.md, "Terms of a run calibration", for the sources.

DEFAULT holds what the default model uses (no profile active); a run calibration
(sim_core.calibration.runs) installs fitted values with `set_params`, `set_params(None)`
restores DEFAULT exactly.
"""

from __future__ import annotations

import numpy as np

# breakdown groups: the name of the fitted scale -> the step.compose columns it multiplies.
# Communication is split by fabric tier (issue 35): a group whose ranks sit in one node talks
# over NVLink / xGMI, one that spans nodes over the network, and a cluster can be slow on one
# and not the other (the nanotron playbook's EFA cluster: TP groups across nodes 4-250x slower
# than predicted, NVLink on time). `_net` scales apply to a row whose group spans nodes
# (`fabric`, below), the plain ones to the rest.
GROUPS = {
    "compute": ("time_compute", "time_recompute"),
    "tp_cp_ep": ("time_tp", "time_cp", "time_ep"),
    "tp_cp_ep_net": ("time_tp", "time_cp", "time_ep"),
    "pipeline": ("time_pp", "time_bubble"),
    "pipeline_net": ("time_pp",),
    "dp": ("time_dp",),
    "dp_net": ("time_dp",),
    "optimizer": ("time_optimizer",),
    "slowdown": ("time_slowdown",),
}
# which fabric flag puts a column's time in the `_net` group instead of the plain one
_TIER = {"tp_cp_ep": "span_tp_cp_ep", "pipeline": "span_pp", "dp": "span_dp"}
NEUTRAL = {**{k: 1.0 for k in GROUPS}, "host_step_s": 0.0, "host_mb_s": 0.0, "node_c": 0.0,
           "net_latency_s": 0.0}
# The default model's values. Kept neutral: measured with `sweep validate` and
# `python -m sim_core.accuracy.fit` (docs/calibration.md, "Default model"), cited non-zero
# host and node terms made at least one family's error worse, so the default stays at zero and
# only a calibration moves them.
DEFAULT = dict(NEUTRAL)
FABRIC_KEYS = ("span_tp_cp_ep", "span_pp", "span_dp", "net_calls", "bubble_comm")

_params: dict | None = None
_residual = None  # optional learned residual: f(batch, workload, raw group sums) -> (log, flag)


_interval: tuple | None = None  # a run calibration's step sigmas (log units), or None
Z90 = 1.2815515655446004  # 10%-90% intervals


def set_interval(sigma_log: float | None, sigma_log_flagged: float | None = None) -> None:
    """Install the spread of calibrated step times (sim_core.calibration.runs.interval): the
    simulator then adds step_time_lo_s / step_time_hi_s, its 10% and 90% quantiles; rows
    outside the learned residual's range take sigma_log_flagged (the terms' own spread)."""
    global _interval
    if sigma_log is None:
        _interval = None
        return
    s = float(sigma_log)
    _interval = (s, s if sigma_log_flagged is None else max(float(sigma_log_flagged), s))


def interval() -> tuple | None:
    """(sigma, sigma of a row outside the residual's range), log units; None when none."""
    return _interval


def set_residual(fn) -> None:
    """Install a learned residual (sim_core.calibration.residual.hook); None removes it."""
    global _residual
    _residual = fn


def residual():
    return _residual


def set_params(params: dict | None) -> None:
    """Install fitted terms (missing keys take DEFAULT); None restores DEFAULT."""
    global _params
    if params is None:
        _params = None
        return
    unknown = set(params) - set(NEUTRAL)
    if unknown:
        raise ValueError(f"terms: unknown {sorted(unknown)}; allowed: {sorted(NEUTRAL)}")
    _params = {**DEFAULT, **{k: float(v) for k, v in params.items()}}


def active() -> bool:
    """Whether fitted terms are installed (the default model's are neutral)."""
    return _params is not None and _params != NEUTRAL


def current() -> dict:
    return dict(_params) if _params is not None else dict(DEFAULT)


def nodes_of(num_gpus, gpus_per_node) -> np.ndarray:
    return np.ceil(np.asarray(num_gpus, float) / np.maximum(np.asarray(gpus_per_node, float), 1))


def no_fabric(n) -> dict:
    """Every group inside a node, no network call: what a caller without fabric flags gets."""
    z = np.zeros(np.shape(n))
    return {k: z for k in FABRIC_KEYS}


def _split(breakdown: dict, fabric: dict) -> dict:
    """Seconds per group (before scales), tiers apart. The bubble's share of exposed TP/CP/EP
    communication (`bubble_comm`, seconds inside time_bubble) moves with the communication's
    scale, not the pipeline's: a slow network lengthens the warm-up and cool-down too."""
    col = lambda c: np.asarray(breakdown[c], float)  # noqa: E731
    bc = np.asarray(fabric["bubble_comm"], float)
    on = {base: np.asarray(fabric[flag], bool) for base, flag in _TIER.items()}
    comm = col("time_tp") + col("time_cp") + col("time_ep") + bc
    return {
        "compute": col("time_compute") + col("time_recompute"),
        "tp_cp_ep": np.where(on["tp_cp_ep"], 0.0, comm),
        "tp_cp_ep_net": np.where(on["tp_cp_ep"], comm, 0.0),
        "pipeline": col("time_bubble") - bc + np.where(on["pipeline"], 0.0, col("time_pp")),
        "pipeline_net": np.where(on["pipeline"], col("time_pp"), 0.0),
        "dp": np.where(on["dp"], 0.0, col("time_dp")),
        "dp_net": np.where(on["dp"], col("time_dp"), 0.0),
        "optimizer": col("time_optimizer"),
        "slowdown": col("time_slowdown"),
    }


def apply(breakdown: dict, num_microbatches, nodes, params: dict | None = None,
          fabric: dict | None = None) -> dict:
    """The breakdown with the terms applied (adds time_host, time_latency and time_nodes);
    arrays in, arrays out, no per-configuration branching."""
    p = current() if params is None else {**NEUTRAL, **params}
    out = dict(breakdown)
    m = np.asarray(num_microbatches, float)
    fabric = no_fabric(m) if fabric is None else fabric
    if any(p[name] != 1.0 for name in GROUPS):
        def tiered(base):
            return np.where(np.asarray(fabric[_TIER[base]], bool), p[base + "_net"], p[base])
        s_comm, s_dp, s_pp = tiered("tp_cp_ep"), tiered("dp"), tiered("pipeline")
        bc = np.asarray(fabric["bubble_comm"], float)
        for c, s in (("time_compute", p["compute"]), ("time_recompute", p["compute"]),
                     ("time_optimizer", p["optimizer"]), ("time_slowdown", p["slowdown"]),
                     ("time_tp", s_comm), ("time_cp", s_comm), ("time_ep", s_comm),
                     ("time_dp", s_dp), ("time_pp", s_pp)):
            out[c] = breakdown[c] * s
        out["time_bubble"] = (breakdown["time_bubble"] - bc) * p["pipeline"] + bc * s_comm
    out["time_host"] = p["host_step_s"] + p["host_mb_s"] * m
    out["time_latency"] = p["net_latency_s"] * np.asarray(fabric["net_calls"], float)
    base = sum(out[c] for c in _COLUMNS) + out["time_host"] + out["time_latency"]
    out["time_nodes"] = p["node_c"] * np.log2(np.maximum(np.asarray(nodes, float), 1.0)) * base
    return out


_COLUMNS = tuple(dict.fromkeys(c for cols in GROUPS.values() for c in cols))


def raw_parts(breakdown: dict, fabric: dict | None = None) -> np.ndarray:
    """n x len(GROUPS) seconds of each group before any scale, tiers apart (columns in GROUPS
    order): what the calibration multiplies."""
    fabric = no_fabric(np.asarray(breakdown["time_compute"])) if fabric is None else fabric
    g = _split(breakdown, fabric)
    return np.column_stack([np.asarray(g[k], float) for k in GROUPS])


def step_time(parts: np.ndarray, num_microbatches, nodes, x: dict, net_calls=0.0) -> np.ndarray:
    """Step time from the raw group sums (n x len(GROUPS), columns in GROUPS order) and the
    network calls per step: what the calibration evaluates thousands of times without
    re-simulating."""
    p = {**NEUTRAL, **x}
    scales = np.array([p[k] for k in GROUPS])
    t = (parts @ scales + p["host_step_s"] + p["host_mb_s"] * np.asarray(num_microbatches, float)
         + p["net_latency_s"] * np.asarray(net_calls, float))
    return t * (1.0 + p["node_c"] * np.log2(np.maximum(np.asarray(nodes, float), 1.0)))
