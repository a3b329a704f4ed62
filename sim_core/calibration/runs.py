"""A user's own training runs -> a handful of interpretable scales of the white-box model.

The most common thing a user has is a few runs on their cluster and framework: step time,
peak memory, and which ones ran out of memory. From them this module fits

* `gemm[gpu]`, `attention[gpu]`: the achieved fraction of the GPU's tensor-core peak, as a
  scale of the simulator's efficiency curves, per GPU and op class;
* `nvlink_bw`, `nic_bw`: the bandwidth of each network tier (NVLink inside a node, NICs across
  nodes), as scales of the NCCL model's catalog figures; this is what moves exposed
  communication;
* `mem_fixed_gib`, `mem_act_scale`: memory the framework holds beyond the model (GiB, added to
  the peak) and a scale of the per-token activation bytes.

Each is a multiplicative (log) or additive deviation from the white-box model with a Gaussian
prior (PRIOR_SIGMA), so a fit on 3-5 runs cannot move far from it: a scale moves as far as the
runs pull it against its prior. A scale the runs cannot see (no multi-node run: `nic_bw`; no
memory measured and no OOM: memory) is not fitted. Residuals: log(predicted / measured) step
time and peak memory over NOISE; a run that ran out of memory bounds the predicted peak from
below (it must not fit), a run that ran bounds it from above (it must fit).

The input is the published-runs CSV format (sim_core/data/published_runs.csv, its README) with
an optional `status` column: ok | oom | failed (failed runs say nothing and are left out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import catalog, compute, memory, nccl
from ..simulate import simulate_frame
from .training import fingerprint

# prior standard deviations of the log scales (and of the fixed memory in GiB): how far a
# cluster usually sits from the catalog, not tuned to any run
PRIOR_SIGMA = {"gemm": 0.15, "attention": 0.20, "nvlink_bw": 0.30, "nic_bw": 0.30,
               "mem_act_scale": 0.15, "mem_fixed_gib": 2.0}
# the data residuals' scale, in log units: run-to-run noise plus what a few global scales cannot
# express (the white-box model's per-run scatter on published runs is 5-10%); with the priors
# it sets how far one run can pull a scale (a single run moves it about 2/3 of the way)
NOISE = 0.10
STATUS = ("ok", "oom", "failed")


@dataclass
class RunScales:
    """The fitted scales (1 / 0 = the white-box model)."""

    gemm: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    nvlink_bw: float = 1.0
    nic_bw: float = 1.0
    mem_fixed_gib: float = 0.0
    mem_act_scale: float = 1.0

    def to_dict(self) -> dict:
        return {"gemm": dict(self.gemm), "attention": dict(self.attention),
                "nvlink_bw": self.nvlink_bw, "nic_bw": self.nic_bw,
                "mem_fixed_gib": self.mem_fixed_gib, "mem_act_scale": self.mem_act_scale}

    @classmethod
    def from_dict(cls, d: dict) -> "RunScales":
        return cls(**{k: (dict(v) if isinstance(v, dict) else float(v)) for k, v in d.items()})


# ---- applying scales ---------------------------------------------------------------------------
def _gpu_mask(b, gpu: str) -> np.ndarray:
    """The configurations on this catalog GPU (the memory size tells A100 40 GB from 80 GB,
    which share the chip: a run calibration is about the cluster, not the chip)."""
    fp = fingerprint(gpu)
    return ((b.sm_arch == fp["sm_arch"]) & (b.sm_count == fp["sm_count"])
            & np.isclose(b.peak_bf16, fp["peak_bf16"])
            & np.isclose(b.hbm_gib, catalog.get_gpu(gpu).hbm_gib))


def install(s: RunScales, nccl_scales: dict | None = None) -> None:
    """Make every later simulation use the scales (compute, NCCL, memory hooks). NCCL scales
    of an nccl-tests calibration, if given, are multiplied in."""
    def eff(b):
        g = np.ones(np.shape(b.sm_arch))
        a = np.ones(np.shape(b.sm_arch))
        for gpu, v in s.gemm.items():
            g = np.where(_gpu_mask(b, gpu), v, g)
        for gpu, v in s.attention.items():
            a = np.where(_gpu_mask(b, gpu), v, a)
        return g, a

    compute.set_efficiency_scale(eff if (s.gemm or s.attention) else None)
    net = dict(nccl_scales or {})
    net["nvlink_bw"] = net.get("nvlink_bw", 1.0) * s.nvlink_bw
    net["nic_bw"] = net.get("nic_bw", 1.0) * s.nic_bw
    prof = nccl.calibration().get("profile")
    nccl.set_calibration(net, prof)
    if s.mem_fixed_gib != 0.0 or s.mem_act_scale != 1.0:
        memory.set_overhead(lambda b: (s.mem_fixed_gib, s.mem_act_scale))
    else:
        memory.set_overhead(None)


def uninstall() -> None:
    compute.set_efficiency_scale(None)
    memory.set_overhead(None)
    nccl.set_calibration(None)


# ---- the runs --------------------------------------------------------------------------------
def load_runs(path) -> pd.DataFrame:
    """Runs of a published-format CSV with their `status`, ready to simulate: unstated
    micro-batch/recompute imputed as `sweep validate` does, failed runs and runs that measured
    nothing (and did not run out of memory) left out with their reason in `skip`."""
    from ..accuracy import validation

    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    raw.columns = [str(c).strip() for c in raw.columns]
    status = (raw["status"].str.strip().str.lower().replace("", "ok") if "status" in raw
              else pd.Series("ok", index=raw.index))
    bad = sorted(set(status) - set(STATUS))
    if bad:
        raise ValueError(f"status: {bad[0]!r} is not one of {', '.join(STATUS)}")
    runs = validation.load_published(path)
    runs["status"] = status.to_numpy()
    oom_only = (runs["status"] == "oom") & runs["skip"].str.startswith("nothing measured")
    runs.loc[oom_only, "skip"] = ""
    runs.loc[runs["status"] == "failed", "skip"] = "status failed: says nothing about the model"
    use = runs[runs["skip"] == ""].copy()
    if len(use):
        use = validation._impute(use)
    return pd.concat([use, runs[runs["skip"] != ""]], ignore_index=True)


def predict(runs: pd.DataFrame, s: RunScales | None = None) -> pd.DataFrame:
    """Predicted step time, peak reserved memory (what logs report) and device peak (what decides
    OOM) of the white-box model, with the scales installed for this call only (fitting starts
    from the default models: no profile active)."""
    try:
        if s is not None:
            install(s)
        p = simulate_frame(runs.reset_index(drop=True))
    finally:
        uninstall()
    return pd.DataFrame({"step_s": p["step_time_s"].to_numpy(),
                         "mem_gib": p["peak_reserved_gib"].to_numpy(),
                         "device_gib": p["peak_memory_gib"].to_numpy(),
                         "fits": p["fits"].to_numpy()}, index=runs.index)


# ---- fitting ---------------------------------------------------------------------------------
def free_parameters(runs: pd.DataFrame) -> list[tuple[str, str | None]]:
    """The scales these runs can see: compute per GPU of runs with a step time (attention too
    unless every such run is short-sequence), network tiers the runs span, memory where memory
    was measured or a run ran out of it."""
    timed = runs[runs["measured_step_s"].notna() & (runs["status"] == "ok")]
    free = [("gemm", g) for g in sorted(timed["gpu"].unique())]
    free += [("attention", g) for g in sorted(timed.loc[timed["seq_len"] >= 2048, "gpu"].unique())]
    if len(timed):
        gpn = np.array([catalog.gpu_table().loc[catalog.get_gpu(g).name, "gpus_per_node"]
                        for g in timed["gpu"]])
        multi = timed["num_gpus"].to_numpy() > gpn
        if (timed["tp"].to_numpy() > 1).any() or (~multi & (timed["num_gpus"] > 1)).any():
            free.append(("nvlink_bw", None))
        if multi.any():
            free.append(("nic_bw", None))
    memrows = runs["measured_mem_gib"].notna() | (runs["status"] == "oom")
    if memrows.any():
        free += [("mem_fixed_gib", None), ("mem_act_scale", None)]
    return free


def _scales_of(x: np.ndarray, free) -> RunScales:
    s = RunScales()
    for v, (name, gpu) in zip(x, free):
        if name in ("gemm", "attention"):
            getattr(s, name)[gpu] = float(np.exp(v))
        elif name == "mem_fixed_gib":
            s.mem_fixed_gib = float(v)
        else:
            setattr(s, name, float(np.exp(v)))
    return s


def _residuals(runs: pd.DataFrame, pred: pd.DataFrame) -> np.ndarray:
    ok = (runs["status"] == "ok").to_numpy()
    t = runs["measured_step_s"].to_numpy(float)
    m = runs["measured_mem_gib"].to_numpy(float)
    cap = runs["gpu"].map(lambda g: catalog.get_gpu(g).hbm_gib).to_numpy(float)
    r_t = np.where(ok & np.isfinite(t), np.log(pred["step_s"].to_numpy() / t), 0.0)
    r_m = np.where(np.isfinite(m), np.log(pred["mem_gib"].to_numpy() / m), 0.0)
    dev = pred["device_gib"].to_numpy()
    oom = (runs["status"] == "oom").to_numpy()
    # an OOM run must not fit (predicted device peak above the capacity); a run that ran, fit
    r_b = np.where(oom, np.maximum(np.log(cap / dev), 0.0),
                   np.where(ok, np.maximum(np.log(dev / cap), 0.0), 0.0))
    return np.concatenate([r_t, r_m, r_b]) / NOISE


def fit(runs: pd.DataFrame, free=None, x0=None, max_nfev: int | None = None) -> RunScales:
    """Maximum a posteriori scales: data residuals over NOISE plus the Gaussian priors."""
    from scipy.optimize import least_squares

    runs = runs[runs["skip"] == ""] if "skip" in runs else runs
    free = free_parameters(runs) if free is None else free
    if not free:
        return RunScales()
    sig = np.array([PRIOR_SIGMA[n] for n, _ in free])

    def resid(x):
        pred = predict(runs, _scales_of(x, free))
        return np.concatenate([_residuals(runs, pred), x / sig])

    x0 = np.zeros(len(free)) if x0 is None else x0
    # hard bounds: a scale within x0.5-x2, the fixed memory within -8..+16 GiB
    lo = np.array([-8.0 if n == "mem_fixed_gib" else -0.7 for n, _ in free])
    hi = np.array([16.0 if n == "mem_fixed_gib" else 0.7 for n, _ in free])
    res = least_squares(resid, np.clip(x0, lo, hi), bounds=(lo, hi), diff_step=1e-3,
                        x_scale=np.maximum(sig, 0.05), max_nfev=max_nfev)
    return _scales_of(res.x, free)


def _x_of(s: RunScales, free) -> np.ndarray:
    out = []
    for name, gpu in free:
        if name in ("gemm", "attention"):
            out.append(np.log(getattr(s, name).get(gpu, 1.0)))
        elif name == "mem_fixed_gib":
            out.append(s.mem_fixed_gib)
        else:
            out.append(np.log(getattr(s, name)))
    return np.array(out)


def errors(runs: pd.DataFrame, pred: pd.DataFrame) -> pd.DataFrame:
    """Per run: step-time and memory error (predicted / measured - 1) and the OOM verdict."""
    cap = runs["gpu"].map(lambda g: catalog.get_gpu(g).hbm_gib).to_numpy(float)
    return pd.DataFrame({
        "step_error": pred["step_s"].to_numpy() / runs["measured_step_s"].to_numpy(float) - 1,
        "mem_error": pred["mem_gib"].to_numpy() / runs["measured_mem_gib"].to_numpy(float) - 1,
        "predicted_fits": pred["device_gib"].to_numpy() <= cap,
    }, index=runs.index)


def leave_one_run_out(runs: pd.DataFrame, full: RunScales, max_nfev: int = 25) -> pd.DataFrame:
    """Each run predicted by scales fitted on the others (warm-started from the full fit), next
    to the white-box model's prediction."""
    runs = runs[runs["skip"] == ""]
    base = errors(runs, predict(runs))
    rows = []
    for i in range(len(runs)):
        rest = runs.drop(index=runs.index[i])
        free = free_parameters(rest)
        s = fit(rest, free, x0=_x_of(full, free), max_nfev=max_nfev)
        one = runs.iloc[[i]]
        e = errors(one, predict(one, s)).iloc[0]
        rows.append({"id": one["id"].iat[0], "label": one["label"].iat[0],
                     "status": one["status"].iat[0],
                     "step_error_before": base["step_error"].iat[i],
                     "step_error_after": e["step_error"],
                     "mem_error_before": base["mem_error"].iat[i], "mem_error_after": e["mem_error"],
                     "fits_before": bool(base["predicted_fits"].iat[i]),
                     "fits_after": bool(e["predicted_fits"])})
    return pd.DataFrame(rows)


def spearman(a, b) -> float:
    """Rank correlation (ties averaged); NaN with fewer than 3 pairs."""
    a, b = pd.Series(np.asarray(a, float)), pd.Series(np.asarray(b, float))
    ok = a.notna() & b.notna()
    if ok.sum() < 3:
        return float("nan")
    return float(a[ok].rank().corr(b[ok].rank()))


def throughput_per_gpu(runs: pd.DataFrame, step_s) -> np.ndarray:
    """Tokens per second per GPU: what ranks runs of different sizes and batches."""
    tokens = runs["global_batch"].to_numpy(float) * runs["seq_len"].to_numpy(float)
    return tokens / np.asarray(step_s, float) / runs["num_gpus"].to_numpy(float)
