"""A user's own training runs -> the terms the step time is built from, fitted with priors and
kept only where they help one step up: on larger models and more GPUs than the runs fitted.

Why terms and not kernel efficiencies: on a cluster and framework the white-box model has not
seen, what differs is whole parts of the step (exposed communication, the bubble, host overhead
per micro-batch, a slowdown that grows with the node count), and one GEMM efficiency or one link
bandwidth cannot express them (issue 24). The parameters (PARAMS):

* a scale per breakdown group of sim_core/terms.py, communication by fabric tier (a group
  inside a node, one that spans nodes: issue 35): compute (+ recompute), exposed TP/CP/EP,
  pipeline transfers + bubble, exposed DP/FSDP, optimizer, overlap slowdown (log, prior 1);
* `net_bw`: the network's bandwidth, re-priced by the simulator at NET_GRID and interpolated;
  `net_latency_s`: seconds per collective call that crosses nodes;
* host overhead per step and per micro-batch, in seconds (prior 0: the default model's);
* `node_c`: step * (1 + c log2(nodes)), the form of comm_scaling in docs/calibration.md;
* memory: one factor on all the allocator holds, a fixed GiB, corrections per part (states,
  activations, loss buffers; with two model sizes or more) and, where the runs hold several
  frameworks with memory, a fixed GiB per framework (its buffers).

Every parameter has a Gaussian prior around the default model's value and physical bounds. The
simulator runs once per table and network bandwidth (the breakdown is linear in the other
terms, the peak in the memory parts), so fitting and cross-validation re-use those arrays.
Residuals: log(predicted / measured) step time and peak memory over NOISE; an OOM run bounds the
predicted device peak from below, a run that ran from above. The loss is robust (soft L1); runs
no term explains are listed as outliers after the fit, twins that disagree with every time.

Model selection: forward selection on the upward folds (fit on the smaller model sizes, predict
the largest; fit on the smaller GPU counts, predict the larger), joined by grouped CV where an
upward fold is small; a term is freed only when it lowers that error, otherwise it stays at its
prior mean, and the calibration is kept only when no deciding fold gets worse (with no term
freed it IS the white-box). With three model sizes or more its step error extrapolated one size
up (`size_extrapolation`) must also be no worse than the white-box model's. A learned residual
on scale-free features (residual.py) is judged the same way; `interval` gives the spread every
calibrated prediction carries.

Input: the published-runs CSV format (sim_core/data/published_runs.csv, its README) with an
optional `status` column: ok | oom | failed. `failed` is an unknown cause and is left out unless
the user says (`failed_as="oom"`) that their failures were memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import catalog, frameworks, memory, nccl, risk, specs, terms
from ..simulate import simulate_frame

STATUS = ("ok", "oom", "failed")
# data residuals' scale in log units: run-to-run noise plus what a few global terms cannot
# express (the white-box model's per-run scatter on published runs is 5-10%)
NOISE = 0.10
# kind, prior mean (the default model's value), prior sigma, bounds. Sigmas say how far a
# cluster usually sits from the default, not tuned to any run: compute within ~15% (the
# efficiency curves' leave-one-source-out error), communication terms within a factor ~1.6,
# host overhead per step ~50 ms and per micro-batch ~5 ms (docs/calibration.md: 10-100 ms per
# step; 300-1000 kernels x 3-18 us per micro-batch), node_c 0.015 per doubling (0.4-2.5%
# measured), memory 2 GiB and 15%.
# Network tiers get a wider prior than NVLink: a cluster's network is where it departs from
# the datasheet most (EFA and RoCE set-ups measured 2-50x below nominal on small messages;
# nccl-tests logs in docs/calibration.md), and per-call latency up to tens of ms under
# congestion; 1 ms per call is the prior's sigma.
_LOG_COMM = ("log", 0.5, (-1.6, 1.6))
_LOG_NET = ("log", 1.0, (-1.6, 4.0))
# Bounds are physics: compute within x0.70-x1.43 (the efficiency curves' leave-one-source-out
# error is 5-15%; a table that wants more says the kernels are wrong, which `sweep calibrate
# compute` fixes from kernel timings, and a run table's terms would only trade it against host
# time); host time per micro-batch at most 20 ms (300-1000 kernel launches x 3-18 us).
PARAMS = {
    "compute": ("log", 0.15, (-0.36, 0.36)),
    "tp_cp_ep": _LOG_COMM,
    "tp_cp_ep_net": _LOG_NET,
    "pipeline": ("log", 0.3, (-1.2, 1.2)),
    "pipeline_net": _LOG_NET,
    "dp": _LOG_COMM,
    "dp_net": _LOG_NET,
    "optimizer": _LOG_COMM,
    "slowdown": _LOG_COMM,
    "host_step_s": ("lin", 0.05, (0.0, 5.0)),
    "host_mb_s": ("lin", 0.005, (0.0, 0.02)),
    "node_c": ("lin", 0.015, (0.0, 0.05)),
    "net_latency_s": ("lin", 0.001, (0.0, 0.05)),
    # the network's bandwidth relative to the catalog's (nccl.set_calibration nic_bw): the
    # simulator re-prices every inter-node collective and its overlap at each NET_GRID point,
    # so what a slower network exposes grows with the model as the simulator says, not as a
    # fixed multiple of what the small models exposed
    "net_bw": ("log", 1.0, (float(np.log(1 / 32)), 0.0)),
    "mem_fixed_gib": ("lin", 2.0, (-8.0, 16.0)),
    # one factor on everything the allocator holds: what a table's "GPU memory" counts against
    # the simulator's reserved peak (reserved or allocated, GB or GiB, the logging rank) differs
    # by table, and it is the same factor for every model size of that table
    "mem_scale": ("log", 0.3, (-0.7, 0.7)),
    # the parts' own scales are corrections on top of mem_scale, held close to 1: a scale of the
    # part that dominates the small models' memory (the logits at a 131k vocabulary) would
    # otherwise absorb what mem_scale says and carry it to models where that part is small
    "mem_state_scale": ("log", 0.1, (-0.3, 0.3)),
    "mem_act_scale": ("log", 0.1, (-0.3, 0.3)),
    "mem_logit_scale": ("log", 0.1, (-0.3, 0.3)),
}
FW_PREFIX = "mem_fw:"  # per-framework fixed memory: "mem_fw:<framework>"
TIME_TERMS = tuple(terms.NEUTRAL) + ("net_bw",)
NET_GRID = np.log(np.array([1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32]))  # log nic_bw scales
MEM_TERMS = ("mem_scale", "mem_fixed_gib", "mem_state_scale", "mem_act_scale",
             "mem_logit_scale")
# the memory parts a calibration scales, from the simulator's categories at the peak (their sum
# is the peak reserved): what memory.set_overhead scales in turn
MEM_PARTS = {"mem_state_scale": ("mem_weights", "mem_grads", "mem_optimizer",
                                 "mem_optimizer_temp"),
             "mem_act_scale": ("mem_activations", "mem_working"),
             "mem_logit_scale": ("mem_logits",),
             "": ("mem_buffers", "mem_dispatcher")}
MIN_GAIN = 0.002  # a term must lower the CV error by 0.2 percentage points to be freed


class CalibrationError(ValueError):
    """A calibration that cannot be done, in one line."""


def spec(name: str) -> tuple:
    return PARAMS["mem_fixed_gib"] if name.startswith(FW_PREFIX) else PARAMS[name]


def prior_mean(name: str) -> float:
    """The default model's value, in fit units (log for scales)."""
    kind = spec(name)[0]
    if name in terms.DEFAULT:
        v = terms.DEFAULT[name]
        return float(np.log(v)) if kind == "log" else float(v)
    return 0.0


# ---- applying fitted terms ------------------------------------------------------------------
def install(params: dict, spread: dict | None = None, memory_spread: bool = False) -> None:
    """Make every later simulation use the fitted terms (terms, network bandwidth and memory
    hooks), and, with `spread` (interval()), the step-time interval and, with memory_spread,
    the OOM risk's calibrated memory sigma. The network scale multiplies an NCCL calibration
    already installed."""
    spread = spread or {}
    terms.set_interval(spread.get("step_sigma_log"), spread.get("step_sigma_log_terms"))
    risk.set_calibrated_sigma(spread.get("mem_sigma_log") if memory_spread else None)
    t = {k: float(v) for k, v in params.items() if k in terms.NEUTRAL}
    terms.set_params(t or None)
    bw = float(params.get("net_bw", 1.0))
    if bw != 1.0:
        cur = nccl.calibration()
        scales = dict(cur["scales"])
        scales["nic_bw"] = scales.get("nic_bw", 1.0) * bw
        nccl.set_calibration(scales, cur["profile"])
    fixed = float(params.get("mem_fixed_gib", 0.0))
    g = float(params.get("mem_scale", 1.0))
    scales = {"states": g * float(params.get("mem_state_scale", 1.0)),
              "activations": g * float(params.get("mem_act_scale", 1.0)),
              "logits": g * float(params.get("mem_logit_scale", 1.0))}
    per_fw = np.zeros(len(specs.FRAMEWORK))
    for k, v in params.items():
        if k.startswith(FW_PREFIX) and k[len(FW_PREFIX):] in specs.FRAMEWORK:
            per_fw[specs.FRAMEWORK.index(k[len(FW_PREFIX):])] = float(v)
    if fixed != 0.0 or any(v != 1.0 for v in scales.values()) or per_fw.any():
        def overhead(b):
            code = frameworks.column(b, "framework").astype(np.int64)
            return {"fixed_gib": fixed + per_fw[np.clip(code, 0, len(per_fw) - 1)], **scales}
        memory.set_overhead(overhead)
    else:
        memory.set_overhead(None)


def uninstall() -> None:
    terms.set_params(None)
    terms.set_interval(None)
    risk.set_calibrated_sigma(None)
    memory.set_overhead(None)
    nccl.set_calibration(None)


# ---- the runs --------------------------------------------------------------------------------
def load_runs(path, failed_as: str | None = None) -> pd.DataFrame:
    """Runs of a published-format CSV with their `status`, ready to simulate; every row that
    cannot be used is kept with its reason in `skip`. failed_as="oom": failed runs are OOM
    bounds (their `failed_as_oom` is True)."""
    from ..accuracy import validation

    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    raw.columns = [str(c).strip() for c in raw.columns]
    status = (raw["status"].str.strip().str.lower().replace("", "ok") if "status" in raw
              else pd.Series("ok", index=raw.index))
    bad = sorted(set(status) - set(STATUS))
    if bad:
        raise ValueError(f"status: {bad[0]!r} is not one of {', '.join(STATUS)}")
    if failed_as not in (None, "unknown", "oom"):
        raise ValueError(f"failed_as: {failed_as!r} is not one of unknown, oom")
    runs = validation.load_published(path)
    # the model size as published (for --fit "params_b < 10"); NaN where not stated
    runs["params_b"] = (pd.to_numeric(raw["params_b"], errors="coerce").to_numpy()
                        if "params_b" in raw else np.nan)
    runs["failed_as_oom"] = (status.to_numpy() == "failed") & (failed_as == "oom")
    runs["status"] = np.where(runs["failed_as_oom"], "oom", status.to_numpy())
    oom_only = (runs["status"] == "oom") & runs["skip"].str.startswith("nothing measured")
    runs.loc[oom_only, "skip"] = ""
    runs.loc[runs["status"] == "failed", "skip"] = ("status failed: unknown cause (--failed-as "
                                                    "oom makes it an OOM bound)")
    use = runs[runs["skip"] == ""].copy()
    if len(use):
        try:
            use = validation._impute(use)
        except Exception:  # noqa: BLE001 - one bad row must not stop the table: impute by row
            parts = []
            for i in range(len(use)):
                one = use.iloc[[i]]
                try:
                    parts.append(validation._impute(one))
                except Exception as exc:  # noqa: BLE001
                    parts.append(one.assign(skip=f"cannot impute micro-batch/recompute: "
                                                 f"{type(exc).__name__}"))
            use = pd.concat(parts)
    return pd.concat([use, runs[runs["skip"] != ""]], ignore_index=True)


def skip_counts(runs: pd.DataFrame) -> Counter:
    return Counter(runs.loc[runs["skip"] != "", "skip"])


@dataclass
class RunData:
    """The usable runs and the white-box arrays every fit re-uses."""

    runs: pd.DataFrame
    parts: np.ndarray        # n x len(terms.GROUPS) x len(NET_GRID): raw breakdown group sums,
    #                          seconds, at each network bandwidth scale
    m: np.ndarray            # micro-batches per step
    nodes: np.ndarray
    net_calls: np.ndarray    # collective calls per step that cross nodes
    span_pp: np.ndarray      # 1 where pipeline neighbours sit on different nodes
    span_dp: np.ndarray      # 1 where the data-parallel group spans nodes
    mem_parts: np.ndarray    # n x len(MEM_PARTS): GiB of each scaled memory part at the peak
    runtime: np.ndarray      # GiB outside the allocator (device peak = reserved + runtime)
    cap: np.ndarray
    t_meas: np.ndarray
    m_meas: np.ndarray
    ok: np.ndarray
    oom: np.ndarray
    framework: np.ndarray
    model: np.ndarray
    cluster: np.ndarray
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __len__(self) -> int:
        return len(self.runs)

    def subset(self, idx) -> "RunData":
        idx = np.asarray(idx)
        return RunData(self.runs.iloc[idx], self.parts[idx], self.m[idx], self.nodes[idx],
                       self.net_calls[idx], self.span_pp[idx], self.span_dp[idx],
                       self.mem_parts[idx], self.runtime[idx],
                       self.cap[idx], self.t_meas[idx],
                       self.m_meas[idx], self.ok[idx], self.oom[idx], self.framework[idx],
                       self.model[idx], self.cluster[idx])


def _simulate_neutral(runs: pd.DataFrame, net_bw: float = 1.0) -> pd.DataFrame:
    """The white-box model with neutral terms (what the fit multiplies), with the fabric
    columns, its network bandwidth scaled by net_bw. The caller makes sure no profile is active
    (sweep calibrate runs in a process that activates none)."""
    saved = terms._params
    try:
        terms.set_params(terms.NEUTRAL)
        memory.set_overhead(None)
        nccl.set_calibration({"nic_bw": net_bw} if net_bw != 1.0 else None)
        return simulate_frame(runs.reset_index(drop=True), with_fabric=True)
    finally:
        terms._params = saved
        nccl.set_calibration(None)


def _parts(sim: pd.DataFrame) -> np.ndarray:
    fab = {k: sim[f"fabric_{k}"].to_numpy(float) for k in terms.FABRIC_KEYS}
    return terms.raw_parts({c: sim[c].to_numpy(float) for c in sim.columns
                            if c.startswith("time_")}, fab)


def prepare(runs: pd.DataFrame) -> RunData:
    """Simulate the usable runs once; a run the simulator rejects (or cannot price) is moved to
    the skipped rows with the simulator's reason, never stopping the fit."""
    skipped = runs[runs["skip"] != ""]
    use = runs[runs["skip"] == ""].reset_index(drop=True)
    if len(use) == 0:
        return _empty(skipped)
    try:
        base = _simulate_neutral(use)
    except Exception as exc:  # noqa: BLE001 - find the rows by simulating them one by one
        ok_rows = []
        for i in range(len(use)):
            try:
                _simulate_neutral(use.iloc[[i]])
                ok_rows.append(i)
            except Exception as e:  # noqa: BLE001
                use.loc[i, "skip"] = f"simulator error: {type(e).__name__}: {str(e)[:80]}"
        if not ok_rows:
            raise CalibrationError(f"the simulator failed on every run ({exc})") from None
        skipped = pd.concat([skipped, use[use["skip"] != ""]])
        use = use[use["skip"] == ""].reset_index(drop=True)
        base = _simulate_neutral(use)
    reason = np.where(~base["valid"].to_numpy(bool),
                      "simulator rejects the layout: " + base["invalid_reason"].astype(str), "")
    finite = np.isfinite(base["step_time_s"].to_numpy(float)) & np.isfinite(
        base["peak_memory_gib"].to_numpy(float))
    reason = np.where((reason == "") & ~finite, "simulator gives no finite prediction", reason)
    use["skip"] = reason
    keep = reason == ""
    skipped = pd.concat([skipped, use[~keep]], ignore_index=True)
    use = use[keep].reset_index(drop=True)
    if len(use) == 0:
        return _empty(skipped)
    base = base[keep].reset_index(drop=True)
    first = _parts(base)
    if (base["fabric_net_calls"].to_numpy(float) > 0).any():
        parts = np.stack([first] + [_parts(_simulate_neutral(use, float(np.exp(g))))
                                    for g in NET_GRID[1:]], axis=2)
    else:  # no collective crosses nodes: the network's bandwidth changes nothing
        parts = np.repeat(first[:, :, None], len(NET_GRID), axis=2)
    mem = np.column_stack([sum(base[c].to_numpy(float) for c in cols)
                           for cols in MEM_PARTS.values()])
    runtime = (base["peak_memory_gib"] - base["peak_reserved_gib"]).to_numpy(float)
    cap = use["gpu"].map(lambda g: catalog.get_gpu(g).hbm_gib).to_numpy(float)
    status = use["status"].to_numpy()
    t = use["measured_step_s"].to_numpy(float)
    return RunData(use, parts, base["num_microbatches"].to_numpy(float),
                   terms.nodes_of(use["num_gpus"], use["gpus_per_node"]),
                   base["fabric_net_calls"].to_numpy(float),
                   base["fabric_span_pp"].to_numpy(float), base["fabric_span_dp"].to_numpy(float),
                   mem, runtime, cap,
                   np.where(status == "ok", t, np.nan),
                   use["measured_mem_gib"].to_numpy(float), status == "ok", status == "oom",
                   use["framework"].astype(str).to_numpy(), use["label"].astype(str).to_numpy(),
                   use["num_gpus"].to_numpy(float), skipped)


def _empty(skipped) -> RunData:
    z = np.zeros(0)
    return RunData(skipped.iloc[0:0], np.zeros((0, len(terms.GROUPS), len(NET_GRID))), z, z, z,
                   z, z,
                   np.zeros((0, len(MEM_PARTS))), z, z, z, z,
                   z.astype(bool), z.astype(bool), z.astype(str), z.astype(str), z, skipped)


# ---- predicting from the arrays --------------------------------------------------------------
def values(x: dict) -> dict:
    """Fit units (log for scales) -> the values the model uses."""
    return {k: (float(np.exp(v)) if spec(k)[0] == "log" else float(v)) for k, v in x.items()}


def parts_at(d: RunData, net_bw: float) -> np.ndarray:
    """The raw group sums at a network bandwidth scale: linear in log scale between the
    NET_GRID points the runs were simulated at."""
    g = np.clip(np.log(net_bw), NET_GRID[-1], NET_GRID[0])
    j = np.interp(-g, -NET_GRID, np.arange(len(NET_GRID)))
    lo = int(min(np.floor(j), len(NET_GRID) - 2))
    w = j - lo
    return d.parts[:, :, lo] * (1 - w) + d.parts[:, :, lo + 1] * w


def predict_arrays(d: RunData, params: dict) -> dict:
    """Step time, peak reserved memory and device peak under `params` (model values)."""
    step = terms.step_time(parts_at(d, params.get("net_bw", 1.0)), d.m, d.nodes,
                           {k: v for k, v in params.items() if k in terms.NEUTRAL}, d.net_calls)
    names, code = np.unique(d.framework, return_inverse=True)
    extra = params.get("mem_fixed_gib", 0.0) + np.array(
        [params.get(FW_PREFIX + f, 0.0) for f in names])[code] if len(d) else 0.0
    # the peak's categories scale linearly (the phase that holds the peak is the white-box
    # one's: a close approximation while the scales stay near 1)
    g = params.get("mem_scale", 1.0)
    scales = np.array([g * params.get(k, 1.0) if k else 1.0 for k in MEM_PARTS])
    res = d.mem_parts @ scales + extra
    dev = res + d.runtime
    return {"step_s": step, "mem_gib": res, "device_gib": dev, "fits": dev <= d.cap}


def _data_residuals(d: RunData, p: dict) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r_t = np.where(d.ok & np.isfinite(d.t_meas), np.log(p["step_s"] / d.t_meas), 0.0)
        r_m = np.where(np.isfinite(d.m_meas), np.log(p["mem_gib"] / d.m_meas), 0.0)
        dev = p["device_gib"]
        r_b = np.where(d.oom, np.maximum(np.log(d.cap / dev), 0.0),
                       np.where(d.ok, np.maximum(np.log(dev / d.cap), 0.0), 0.0))
    return np.concatenate([r_t, r_m, r_b]) / NOISE


@dataclass
class Fit:
    free: list
    x: dict                  # fit units, free and fixed
    sd: dict                 # standard deviation of each free parameter, fit units
    cost: float = 0.0

    @property
    def params(self) -> dict:
        return values(self.x)


def white_box(extra_names=()) -> Fit:
    names = list(TIME_TERMS) + list(MEM_TERMS) + list(extra_names)
    return Fit([], {k: prior_mean(k) for k in names}, {})


def fit(d: RunData, free, max_nfev: int = 200) -> Fit:
    """Maximum a posteriori values of the free parameters (the others at their prior mean):
    robust (soft L1) least squares on the data residuals plus the Gaussian priors; the
    uncertainty from the Jacobian at the optimum."""
    from scipy.optimize import least_squares

    free = list(free)
    x = white_box([n for n in free if n.startswith(FW_PREFIX)]).x
    if not free or len(d) == 0:
        return Fit(free, x, {})
    mu = np.array([prior_mean(n) for n in free])
    sig = np.array([spec(n)[1] for n in free])
    lo = np.array([spec(n)[2][0] for n in free])
    hi = np.array([spec(n)[2][1] for n in free])

    def resid(v):
        xx = {**x, **dict(zip(free, v))}
        return np.concatenate([_data_residuals(d, predict_arrays(d, values(xx))),
                               (v - mu) / sig])

    x0 = np.clip(mu, lo + 1e-9, hi - 1e-9)
    r0 = resid(x0)
    if not np.all(np.isfinite(r0)):
        n = len(d)
        bad = np.flatnonzero(~np.isfinite(r0[: 3 * n])) % n
        ids = ", ".join(sorted({str(d.runs["id"].iat[i]) for i in bad})[:5])
        raise CalibrationError(f"residuals not finite at the default model for run(s) {ids} "
                               "(a measured value of 0 or a negative one?)")
    try:
        res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=1.0,
                            x_scale=sig, diff_step=1e-4, max_nfev=max_nfev)
    except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:
        raise CalibrationError(f"the fit failed: {str(exc).splitlines()[0]}") from None
    if not np.all(np.isfinite(res.x)):
        raise CalibrationError("the fit failed: parameters not finite")
    J = res.jac
    try:
        cov = np.linalg.pinv(J.T @ J)
        sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    except np.linalg.LinAlgError:
        sd = np.full(len(free), np.nan)
    return Fit(free, {**x, **dict(zip(free, res.x))}, dict(zip(free, sd)), float(res.cost))


# ---- candidates and grouped cross-validation -------------------------------------------------
def candidates(d: RunData) -> tuple[list, list]:
    """(time terms, memory terms) these runs can see."""
    timed = d.ok & np.isfinite(d.t_meas)
    tt = []
    if timed.any():
        P = d.parts[timed]
        for j, name in enumerate(terms.GROUPS):
            if (P[:, j, 0] > 0).any():
                tt.append(name)
        tt.append("host_step_s")
        if len(np.unique(d.m[timed])) > 1:
            tt.append("host_mb_s")
        if len(np.unique(d.nodes[timed])) > 1:
            tt.append("node_c")
        if (d.net_calls[timed] > 0).any():  # a collective crosses nodes
            tt += ["net_bw", "net_latency_s"]
    mm = []
    memrows = np.isfinite(d.m_meas) | d.oom
    if memrows.any():
        j = {k: i for i, k in enumerate(MEM_PARTS)}
        # the parts' own scales tell parts apart that grow differently with the model: only a
        # table of several model sizes can show them (on one size they fit that size's mix)
        sizes = len(np.unique(model_size(d.runs[memrows])))
        mm = [k for k in MEM_TERMS if k not in j
              or (sizes > 1 and (d.mem_parts[memrows, j[k]] > 0).any())]
        fws = sorted(set(d.framework[np.isfinite(d.m_meas)]))
        if len(fws) > 1:
            mm += [FW_PREFIX + f for f in fws]
    return tt, mm


def groupings(d: RunData) -> dict:
    """Grouped folds: leave one model out, leave one cluster size out (each where the runs hold
    at least two groups); 5-fold by run where they hold neither."""
    out = {}
    if len(np.unique(d.model)) > 1:
        out["model"] = d.model
    if len(np.unique(d.cluster)) > 1:
        out["cluster size"] = d.cluster.astype(int).astype(str)
    if not out and len(d) >= 3:
        out["5-fold"] = (np.arange(len(d)) % min(5, len(d))).astype(str)
    return out


def upward(d: RunData) -> dict:
    """Folds that look upward, name -> test mask (fit on the rest): fit on the smaller model
    sizes and predict the largest fitted size; fit on the smaller half of the GPU counts and
    predict the larger half. What a user needs is the step up, and grouped CV also scores steps
    down (fit on 3B, predict 1B) that flatter a correction which does not carry upward."""
    out = {}
    size = model_size(d.runs)
    timed = np.isfinite(d.t_meas)
    sized = timed & np.isfinite(size)
    if len(np.unique(size[sized])) > 1:
        out["model size"] = np.isfinite(size) & (size >= size[sized].max())
    counts = np.unique(d.cluster[timed])
    if len(counts) > 1:
        cut = counts[(len(counts) - 1) // 2]
        out["GPU count"] = d.cluster > cut
    # a fold must predict timed runs from timed runs
    return {k: v for k, v in out.items() if (v & timed).any() and (~v & timed).any()}


def upward_cannot_show(d: RunData) -> str:
    """What the upward folds cannot check on this table, in words ('' when both exist)."""
    up = upward(d)
    miss = [w for k, w in (("model size", "a larger model (the runs hold one model size)"),
                           ("GPU count", "more GPUs (the runs hold one GPU count)")) if k not in up]
    return "; ".join(miss)


def cv_predict(d: RunData, free, groups: np.ndarray, max_nfev: int = 60) -> dict:
    """Out-of-fold predictions: each group predicted by a fit on the others."""
    n = len(d)
    out = {"step_s": np.full(n, np.nan), "mem_gib": np.full(n, np.nan),
           "device_gib": np.full(n, np.nan), "fits": np.zeros(n, bool)}
    groups = np.asarray(groups)
    if not free:
        p = predict_arrays(d, white_box().params)
        if groups.dtype == bool:  # an upward fold scores its test runs only
            p["step_s"] = np.where(groups, p["step_s"], np.nan)
            p["mem_gib"] = np.where(groups, p["mem_gib"], np.nan)
        return p
    tests = [groups] if groups.dtype == bool else [groups == g for g in np.unique(groups)]
    for test in tests:
        f = fit(d.subset(np.flatnonzero(~test)), free, max_nfev=max_nfev)
        p = predict_arrays(d.subset(np.flatnonzero(test)), f.params)
        for k in out:
            out[k][test] = p[k]
    return out


def outliers(d: RunData, pred: dict) -> np.ndarray:
    """Runs no term explains: log step error more than 3 robust sigmas (and 25%) from the
    median of the fitted runs."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(pred["step_s"] / d.t_meas)
    ok = np.isfinite(r)
    if ok.sum() < 5:
        return np.zeros(len(d), bool)
    med = np.median(r[ok])
    mad = 1.4826 * np.median(np.abs(r[ok] - med))
    return ok & (np.abs(r - med) > max(3 * mad, np.log(1.25)))


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


def metrics(d: RunData, pred: dict, out_mask=None) -> dict:
    """Error figures of predictions: step time (outliers apart), memory, OOM verdicts, rank
    correlation within each (model, cluster size) group, step error by cluster size."""
    out_mask = np.zeros(len(d), bool) if out_mask is None else out_mask
    with np.errstate(divide="ignore", invalid="ignore"):
        e = pred["step_s"] / d.t_meas - 1
        em = pred["mem_gib"] / d.m_meas - 1
    timed = np.isfinite(e)
    inl = timed & ~out_mask

    def med(x):
        x = x[np.isfinite(x)]
        return float(np.median(np.abs(x))) if len(x) else float("nan")

    verdict = d.ok | d.oom
    acc = (float(np.mean(pred["fits"][verdict] == d.ok[verdict])) if verdict.any()
           else float("nan"))
    tps_p = throughput_per_gpu(d.runs, pred["step_s"])
    tps_m = throughput_per_gpu(d.runs, d.t_meas)
    rhos = []
    for _, idx in pd.Series(np.arange(len(d))).groupby([d.model, d.cluster]):
        i = idx.to_numpy()
        i = i[inl[i]]
        if len(i) >= 3:
            rhos.append(spearman(tps_p[i], tps_m[i]))
    by_cluster = {}
    for c in np.unique(d.cluster[inl]):
        by_cluster[int(c)] = med(e[inl & (d.cluster == c)])
    return {"step": med(e[inl]), "step_with_outliers": med(e[timed]),
            "timed": int(timed.sum()), "outliers": int((timed & out_mask).sum()),
            "bias": float(np.median(e[inl])) if inl.any() else float("nan"),
            "mem": med(em), "mem_runs": int(np.isfinite(em).sum()),
            "oom_accuracy": acc, "verdicts": int(verdict.sum()),
            "spearman": float(np.nanmedian(rhos)) if rhos and np.isfinite(rhos).any()
            else float("nan"), "spearman_groups": len(rhos), "by_cluster": by_cluster}


def fold_metrics(d: RunData, free, groups, out_mask=None, pred=None) -> dict:
    """metrics() of out-of-fold predictions (`pred`: cv_predict's, when already made); an
    upward fold (a boolean test mask) is scored on its test runs alone."""
    p = cv_predict(d, free, groups) if pred is None else pred
    groups = np.asarray(groups)
    if groups.dtype != bool:
        return metrics(d, p, out_mask)
    idx = np.flatnonzero(groups)
    return metrics(d.subset(idx), {k: v[idx] for k, v in p.items()},
                   None if out_mask is None else out_mask[idx])


def _score(d: RunData, free, folds: dict, kind: str, cache: dict) -> float:
    key = (tuple(sorted(free)), kind)
    if key in cache:
        return cache[key]
    vals = []
    for groups in folds.values():
        m = fold_metrics(d, free, groups)
        if kind == "time":
            vals.append(m["step"])
        else:
            v = m["mem"] if m["mem_runs"] else 0.0
            vals.append(v + (1 - m["oom_accuracy"] if m["verdicts"] and d.oom.any() else 0.0))
    s = float(np.nanmean(vals)) if vals and np.isfinite(vals).any() else float("inf")
    cache[key] = s
    return s


MIN_UP_RUNS = 20  # an upward fold that predicts fewer timed runs is too noisy to select on alone


def upward_decides(d: RunData) -> bool:
    """Whether the upward folds alone judge: each predicts MIN_UP_RUNS timed runs or more."""
    up = upward(d)
    timed = np.isfinite(d.t_meas)
    return bool(up) and all(int((v & timed).sum()) >= MIN_UP_RUNS for v in up.values())


def selection_folds(d: RunData) -> dict:
    """The folds terms are chosen on: the upward ones (a term must help one step up); where an
    upward fold predicts fewer than MIN_UP_RUNS timed runs (a published table of a dozen runs),
    the grouped-CV folds too, the error averaged over them."""
    up = upward(d)
    if upward_decides(d):
        return up
    return {**{UP + k: v for k, v in up.items()}, **groupings(d)}


def select(d: RunData, folds: dict, log=None) -> tuple[list, dict]:
    """Forward selection of free terms on `folds` (selection_folds), time and memory terms
    apart (their residuals do not share parameters): a term is freed only when it lowers the
    error by
    MIN_GAIN. Returns (free terms, the trail of scores)."""
    tt, mm = candidates(d)
    cache: dict = {}
    trail = {}
    chosen: list = []
    for kind, cands in (("time", tt), ("memory", mm)):
        base = [c for c in chosen]
        best = _score(d, base if kind == "time" else [], folds, kind, cache)
        trail[f"{kind}: white-box"] = best
        mine: list = []
        # the whole-allocator factor first: a part's own scale is a correction on top of it,
        # freed only when it helps beyond it (a part that dominates the fitted models' memory
        # would otherwise take the common factor and carry it to models where it is small)
        if kind == "memory" and "mem_scale" in cands:
            s = _score(d, ["mem_scale"], folds, kind, cache)
            if log:
                log(f"  memory: whole-allocator scale mem_scale: CV {100 * s:.2f}% "
                    f"(now {100 * best:.2f}%)")
            if s < best - MIN_GAIN:
                mine, best = ["mem_scale"], s
                trail["memory: + mem_scale"] = s
        while True:
            trials = [(_score(d, mine + [c], folds, kind, cache), c) for c in cands
                      if c not in mine]
            if not trials:
                break
            s, c = min(trials)
            if log:
                log(f"  {kind}: best next term {c}: CV {100 * s:.2f}% (now {100 * best:.2f}%)")
            if s < best - MIN_GAIN:
                mine.append(c)
                best = s
                trail[f"{kind}: + {c}"] = s
            else:
                break
        chosen += mine
    return chosen, trail


# ---- extrapolation to a larger model ---------------------------------------------------------
TREND_SIZES = 3  # the largest fitted model sizes whose error trend is extrapolated one step up


def model_size(runs: pd.DataFrame) -> np.ndarray:
    """log2(layers x hidden^2): the dense size that the white-box model's error drifts with.
    Rows that name a catalog model instead of giving its shape take the catalog's."""
    if "layers" in runs and "hidden" in runs and not runs[["layers", "hidden"]].isna().any().any():
        layers, hidden = runs["layers"].to_numpy(float), runs["hidden"].to_numpy(float)
    else:
        shape = [catalog.get_model(m).columns() if isinstance(m, str) and m else {}
                 for m in runs.get("model", pd.Series([""] * len(runs), index=runs.index))]
        given = lambda c: (runs[c] if c in runs else pd.Series(np.nan, index=runs.index))  # noqa: E731
        layers = given("layers").fillna(pd.Series([s.get("layers", np.nan) for s in shape],
                                                  index=runs.index)).to_numpy(float)
        hidden = given("hidden").fillna(pd.Series([s.get("hidden", np.nan) for s in shape],
                                                  index=runs.index)).to_numpy(float)
    return np.log2(layers * hidden ** 2)


def size_extrapolation(d: RunData, pred: dict, mask=None) -> dict | None:
    """The step error one model-size step above the largest fitted model, extrapolated from the
    trend of log(predicted / measured) over the TREND_SIZES largest fitted sizes.

    Why: grouped CV over the fitted models cannot see what happens above them, and a term learned
    where the white-box error drifts with size (small models slower than predicted, a larger one
    not: Megatron 2020 1-4B vs 8B) carries the small models' correction upwards. The trend is
    taken over the largest sizes only because the drift is not linear over a wide range (Jan-2021
    Megatron: -26% at 1.7B, flat -5% from 18B up). None with fewer than TREND_SIZES sizes: no
    trend to check."""
    x = model_size(d.runs)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(pred["step_s"] / d.t_meas)
    ok = np.isfinite(r) & (np.ones(len(d), bool) if mask is None else ~mask)
    sizes = np.unique(x[ok])
    if len(sizes) < TREND_SIZES:
        return None
    top = sizes[-TREND_SIZES:]
    m = ok & np.isin(x, top)
    slope, icpt = np.polyfit(x[m], r[m], 1)
    step = float(np.median(np.diff(top)))
    return {"error": float(np.expm1(icpt + slope * (top[-1] + step))),
            "per_doubling": float(slope), "size": float(2 ** (top[-1] + step))}


@dataclass
class Calibration:
    data: RunData
    free: list
    fit: Fit
    folds: dict
    trail: dict
    cv_before: dict
    cv_after: dict
    outlier_mask: np.ndarray
    accepted: bool
    # the step error extrapolated one model size up: {"white_box": .., "calibrated": ..}
    extrapolation: dict | None = None
    rejected_by: str = ""    # why a selected calibration was not kept ("" when kept or none)
    selected: list = field(default_factory=list)  # the terms selection freed, kept or not
    up_folds: dict = field(default_factory=dict)  # upward folds: name -> test mask
    up_before: dict = field(default_factory=dict)
    up_after: dict = field(default_factory=dict)
    # out-of-fold predictions of the kept model on the folds interval() reads (upward ones
    # where there are, grouped CV otherwise): what calibrate fitted already
    oof: dict = field(default_factory=dict)


def calibrate(d: RunData, free=None, log=None) -> Calibration:
    """Select terms on the upward folds (grouped CV where the runs have none; unless `free` is
    given), fit them on every run, and report the upward and grouped-CV metrics of the
    white-box model and of the calibrated one. Kept only when no upward fold and no grouping
    gets worse."""
    if len(d) == 0:
        raise CalibrationError("no usable run")
    folds = groupings(d)
    up = upward(d)
    trail = {}
    if free is None:
        sel = selection_folds(d)
        free, trail = select(d, sel, log) if sel else ([], {})
    f = fit(d, free)
    out = outliers(d, predict_arrays(d, f.params))
    before, after, up_before, up_after = {}, {}, {}, {}
    oof_cv, oof_up = {}, {}
    for name, groups in folds.items():
        oof_cv[name] = cv_predict(d, free, groups)
        before[name] = fold_metrics(d, [], groups, out)
        after[name] = fold_metrics(d, free, groups, out, oof_cv[name])
    for name, test in up.items():
        oof_up[name] = cv_predict(d, free, test)
        up_before[name] = fold_metrics(d, [], test, out)
        up_after[name] = fold_metrics(d, free, test, out, oof_up[name])
    worse_up = any(up_after[k]["step"] > up_before[k]["step"] + 1e-9 for k in up
                   if np.isfinite(up_after[k]["step"]))
    # where the upward folds are large enough to select on alone, they alone decide: grouped
    # CV also scores steps down (fit on 3B, predict 1B) that a user never takes
    worse = any(after[k]["step"] > before[k]["step"] + 1e-9 for k in folds
                if np.isfinite(after[k]["step"])) and not upward_decides(d)
    rejected_by = ("the upward check" if free and worse_up else
                   "grouped CV" if free and worse else "")
    # extrapolating to a larger model: the calibrated model must not be worse than the
    # white-box one size step above the fitted runs (the guard the residual has by falling back)
    ext = None
    if free:
        e0 = size_extrapolation(d, predict_arrays(d, white_box().params), out)
        e1 = size_extrapolation(d, predict_arrays(d, f.params), out)
        if e0 is not None and e1 is not None:
            ext = {"white_box": e0["error"], "calibrated": e1["error"], "size": e0["size"],
                   "trend_white_box": e0["per_doubling"], "trend_calibrated": e1["per_doubling"]}
            if not rejected_by and abs(e1["error"]) > abs(e0["error"]) + 1e-9:
                rejected_by = "extrapolation to a larger model"
    accepted = bool(free) and not rejected_by
    if not accepted:
        f = Fit([], white_box().x, {})
        after, up_after = before, up_before
    return Calibration(d, free if accepted else [], f, folds, trail, before, after, out,
                       accepted, ext, rejected_by, list(free), up, up_before, up_after,
                       (oof_up or oof_cv) if accepted else {})


def learning_curve(d: RunData, sizes, repeats: int = 5, seed: int = 0) -> pd.DataFrame:
    """Error on the runs not fitted against the number of calibration runs: random subsets of
    each size, terms selected by 5-fold CV inside the subset, error on the rest (median over
    repeats)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        if n >= len(d):
            continue
        errs, wb = [], []
        for _ in range(repeats):
            idx = rng.permutation(len(d))
            tr, te = idx[:n], idx[n:]
            sub = d.subset(tr)
            folds = {"5-fold": (np.arange(n) % min(5, n)).astype(str)} if n >= 3 else {}
            free = select(sub, folds)[0] if folds else []
            f = fit(sub, free)
            test = d.subset(te)
            errs.append(metrics(test, predict_arrays(test, f.params))["step"])
            wb.append(metrics(test, predict_arrays(test, white_box().params))["step"])
        rows.append({"runs": n, "calibrated": float(np.median(errs)),
                     "white_box": float(np.median(wb))})
    return pd.DataFrame(rows)


# ---- learned residual (XGBoost), only where grouped CV shows it helps ---------------------------
def _cols(d: RunData) -> dict:
    r = d.runs
    col = lambda k: r[k].to_numpy(float)  # noqa: E731
    return {"num_gpus": col("num_gpus"), "gpus_per_node": col("gpus_per_node"),
            "tp": col("tp"), "pp": col("pp"), "cp": col("cp"), "micro_batch": col("micro_batch"),
            "zero": col("zero"), "seq_len": col("seq_len"), "num_microbatches": d.m,
            "span_pp": d.span_pp,
            "span_dp": d.span_dp, "net_calls": d.net_calls}


def _features(d: RunData, params: dict) -> np.ndarray:
    from . import residual

    return residual.features(_cols(d), parts_at(d, params.get("net_bw", 1.0)), params)


def _train_residual(d: RunData, params: dict):
    """Booster on log(measured / calibrated) of the timed runs, and their features' range."""
    from . import residual

    timed = np.isfinite(d.t_meas)
    y = np.log(d.t_meas / predict_arrays(d, params)["step_s"])
    X = _features(d, params)
    return residual.train(X[timed], y[timed]), residual.range_of(X[timed])


def _apply_residual(d: RunData, params: dict, booster, rng) -> tuple[np.ndarray, np.ndarray]:
    from . import residual

    base = predict_arrays(d, params)["step_s"]
    X = _features(d, params)
    return base * np.exp(residual.predict(booster, X)), residual.outside(X, rng)


UP = "upward: "  # residual_cv's names of the upward folds
TWIN_SPREAD = 1.25  # twins measured further apart than this are listed


def twins(d: RunData) -> pd.DataFrame:
    """Configurations run more than once whose measured step times disagree by more than
    TWIN_SPREAD: listed with every time, never set apart (the table's own noise)."""
    timed = np.isfinite(d.t_meas)
    if not timed.any():
        return pd.DataFrame()
    r = d.runs.reset_index(drop=True)[timed]
    t = d.t_meas[timed]
    key = [c for c in ("label", "framework", "gpu", "num_gpus", "tp", "pp", "cp", "ep", "vpp",
                       "micro_batch", "zero", "recompute", "sequence_parallel", "seq_len",
                       "global_batch", "precision",
                       # a fine-tuning run of the same layout is another job (sim_core/tasks.py)
                       "task", "lora_rank", "lora_targets") if c in r.columns]
    g = r.assign(_t=t).groupby(key, dropna=False)
    rows = []
    for k, grp in g:
        if len(grp) > 1 and grp["_t"].max() > TWIN_SPREAD * grp["_t"].min():
            kk = dict(zip(key, k))
            rows.append({"ids": ", ".join(grp["id"].astype(str)), "label": kk["label"],
                         "num_gpus": int(kk["num_gpus"]), "tp": int(kk["tp"]),
                         "pp": int(kk["pp"]), "spread": grp["_t"].max() / grp["_t"].min(),
                         "times": " / ".join(f"{x:.3f} s" for x in grp["_t"])})
    return pd.DataFrame(rows).sort_values("spread", ascending=False) if rows else pd.DataFrame()


def interval(cal: Calibration, rcv: dict | None = None) -> dict:
    """The spread of a calibrated prediction, log units: the out-of-fold residuals' robust
    sigma (upward folds where the runs have them, grouped CV otherwise; the worst fold), the
    residual's own gain applied when it is kept, plus the fitted terms' uncertainty (their
    Jacobian covariance carried to each run's prediction, the median run's). Intervals are
    prediction x exp(+-terms.Z90 sigma)."""
    d = cal.data
    folds = cal.up_folds or cal.folds
    sig_t, sig_m = [], []
    for name, groups in folds.items():
        p = cal.oof[name] if name in cal.oof else cv_predict(d, cal.free, groups)
        with np.errstate(divide="ignore", invalid="ignore"):
            rt = np.log(p["step_s"] / d.t_meas)
            rm = np.log(p["mem_gib"] / d.m_meas)
        for r, out in ((rt, sig_t), (rm, sig_m)):
            r = r[np.isfinite(r)]
            if len(r) >= 5:
                out.append(1.4826 * float(np.median(np.abs(r - np.median(r)))))
    st = max(sig_t) if sig_t else float("nan")
    st0 = st  # the terms alone: what a row outside the residual's range gets
    sm = max(sig_m) if sig_m else float("nan")
    if rcv:
        gains = [v["with"] / v["without"] for v in rcv.values() if v["without"] > 0]
        if gains and np.isfinite(st):
            st *= float(np.clip(np.max(gains), 0.0, 1.0))
    # the terms' uncertainty: each free parameter moved by one sd, its effect on log step time
    var_t = np.zeros(len(d))
    var_m = np.zeros(len(d))
    base = predict_arrays(d, cal.fit.params)
    for k, sd in cal.fit.sd.items():
        if not np.isfinite(sd) or sd <= 0:
            continue
        moved = predict_arrays(d, values({**cal.fit.x, k: cal.fit.x[k] + sd}))
        with np.errstate(divide="ignore", invalid="ignore"):
            var_t += np.nan_to_num(np.log(moved["step_s"] / base["step_s"])) ** 2
            var_m += np.nan_to_num(np.log(moved["mem_gib"] / base["mem_gib"])) ** 2
    pt = float(np.sqrt(np.median(var_t))) if len(d) else 0.0
    pm = float(np.sqrt(np.median(var_m))) if len(d) else 0.0
    terms_only = float(np.hypot(st0, pt)) if np.isfinite(st0) else None
    return {"step_sigma_log": float(np.hypot(st, pt)) if np.isfinite(st) else None,
            "step_sigma_log_terms": terms_only,
            "mem_sigma_log": float(np.hypot(sm, pm)) if np.isfinite(sm) else None,
            "from": "upward folds" if cal.up_folds else "grouped CV", "quantiles": [0.1, 0.9]}


def residual_cv(cal: Calibration) -> dict | None:
    """Step error of the calibrated model with and without the learned residual (trained on
    each fold's training runs, on their residual after that fold's term fit), on the upward
    folds (named UP + fold) and the grouped-CV ones; None where there are too few timed runs
    to try."""
    from . import residual

    d = cal.data
    if int(np.isfinite(d.t_meas).sum()) < residual.MIN_RUNS or not (cal.folds or cal.up_folds):
        return None
    out = {}
    folds = {**{UP + k: v for k, v in cal.up_folds.items()}, **cal.folds}
    for name, groups in folds.items():
        without = np.full(len(d), np.nan)
        with_r = np.full(len(d), np.nan)
        flagged = 0
        groups = np.asarray(groups)
        tests = [groups] if groups.dtype == bool else [groups == g for g in np.unique(groups)]
        for test in tests:
            tr, te = d.subset(np.flatnonzero(~test)), d.subset(np.flatnonzero(test))
            if int(np.isfinite(tr.t_meas).sum()) < residual.MIN_RUNS // 2:
                continue
            p = fit(tr, cal.free, max_nfev=60).params
            booster, rng = _train_residual(tr, p)
            without[test] = predict_arrays(te, p)["step_s"]
            with_r[test], fl = _apply_residual(te, p, booster, rng)
            flagged += int(fl.sum())
        # every timed run counts: the runs the terms leave as outliers are what a residual
        # is there to learn (a TP group across nodes on a slow network), not noise to set apart
        e0 = metrics(d, {**predict_arrays(d, cal.fit.params), "step_s": without}
                     )["step_with_outliers"]
        e1 = metrics(d, {**predict_arrays(d, cal.fit.params), "step_s": with_r}
                     )["step_with_outliers"]
        predicted = np.isfinite(without)
        out[name] = {"without": e0, "with": e1, "flagged": flagged,
                     "timed": int((predicted & np.isfinite(d.t_meas)).sum()),
                     "all_flagged": flagged > 0 and flagged >= int(predicted.sum())}
    return out


def residual_helps(cv: dict | None) -> bool:
    """Kept only when it lowers the error on every upward fold by MIN_GAIN and makes no
    grouping worse; with no upward fold, when it lowers every grouping's error by MIN_GAIN."""
    if not cv:
        return False
    up = {k: v for k, v in cv.items() if k.startswith(UP)}
    rest = {k: v for k, v in cv.items() if not k.startswith(UP)}
    ok = lambda v, gain: np.isfinite(v["with"]) and v["with"] < v["without"] - gain  # noqa: E731
    # an upward fold of a few runs is noise: it gates only with MIN_UP_RUNS timed runs
    up = {k: v for k, v in up.items() if np.isfinite(v["without"]) and v["timed"] >= MIN_UP_RUNS}
    if up and len(up) == sum(k.startswith(UP) for k in cv):
        # every upward fold is large enough: they alone decide (grouped CV scores steps down)
        return all(ok(v, MIN_GAIN) for v in up.values())
    if up:
        return all(ok(v, MIN_GAIN) for v in up.values()) and all(ok(v, -1e-9)
                                                                   for v in rest.values())
    return bool(rest) and all(ok(v, MIN_GAIN) for v in rest.values())
