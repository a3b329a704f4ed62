"""Step-level terms on top of the composed breakdown: a scale per breakdown term, host overhead
and the slowdown that grows with the number of nodes.

Why a separate layer: what differs between clusters and frameworks at scale (issue 24) is not
one kernel's efficiency but whole terms of the step -- exposed communication, the pipeline
bubble, a Python/launch overhead per micro-batch, stragglers and per-hop latency that grow with
the node count. `step.compose` builds the breakdown; `apply` rescales it with

    t_k'        = scale_k * t_k                          for each breakdown group below
    time_host   = host_step_s + host_mb_s * num_microbatches
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

# breakdown groups: the name of the fitted scale -> the step.compose columns it multiplies
GROUPS = {
    "compute": ("time_compute", "time_recompute"),
    "tp_cp_ep": ("time_tp", "time_cp", "time_ep"),
    "pipeline": ("time_pp", "time_bubble"),
    "dp": ("time_dp",),
    "optimizer": ("time_optimizer",),
    "slowdown": ("time_slowdown",),
}
NEUTRAL = {**{k: 1.0 for k in GROUPS}, "host_step_s": 0.0, "host_mb_s": 0.0, "node_c": 0.0}
# The default model's values. Kept neutral: measured with `sweep validate` and
# `python -m sim_core.accuracy.fit` (docs/calibration.md, "Default model"), cited non-zero
# host and node terms made at least one family's error worse, so the default stays at zero and
# only a calibration moves them.
DEFAULT = dict(NEUTRAL)

_params: dict | None = None
_residual = None  # optional learned residual: f(batch, workload, raw group sums) -> (log, flag)


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


def current() -> dict:
    return dict(_params) if _params is not None else dict(DEFAULT)


def nodes_of(num_gpus, gpus_per_node) -> np.ndarray:
    return np.ceil(np.asarray(num_gpus, float) / np.maximum(np.asarray(gpus_per_node, float), 1))


def apply(breakdown: dict, num_microbatches, nodes, params: dict | None = None) -> dict:
    """The breakdown with the terms applied (adds time_host and time_nodes); arrays in, arrays
    out, no per-configuration branching."""
    p = current() if params is None else {**NEUTRAL, **params}
    out = dict(breakdown)
    for name, cols in GROUPS.items():
        if p[name] != 1.0:
            for c in cols:
                out[c] = breakdown[c] * p[name]
    m = np.asarray(num_microbatches, float)
    out["time_host"] = p["host_step_s"] + p["host_mb_s"] * m
    base = sum(out[c] for cols in GROUPS.values() for c in cols) + out["time_host"]
    out["time_nodes"] = p["node_c"] * np.log2(np.maximum(np.asarray(nodes, float), 1.0)) * base
    return out


def raw_parts(breakdown: dict) -> np.ndarray:
    """n x len(GROUPS) sums of the breakdown groups (before any scale)."""
    return np.column_stack([np.asarray(sum(breakdown[c] for c in cols), float)
                            for cols in GROUPS.values()])


def step_time(parts: np.ndarray, num_microbatches, nodes, x: dict) -> np.ndarray:
    """Step time from the raw group sums (n x len(GROUPS), columns in GROUPS order): what the
    calibration evaluates thousands of times without re-simulating."""
    p = {**NEUTRAL, **x}
    scales = np.array([p[k] for k in GROUPS])
    t = parts @ scales + p["host_step_s"] + p["host_mb_s"] * np.asarray(num_microbatches, float)
    return t * (1.0 + p["node_c"] * np.log2(np.maximum(np.asarray(nodes, float), 1.0)))
