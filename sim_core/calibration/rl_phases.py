"""Calibrate the RL step model on a user's own RL run table (`sweep calibrate rl-runs`).

The RL model (sim_core/rl/) is white-box but for two shipped scales of NeMo RL's training
passes (catalogs/rl.yaml, fitted by rl_defaults.py). A fit here starts from the white-box model
(`phase_scales={}`) and, once its profile is active, replaces the shipped scales. A user whose
cluster and framework run the phases slower or faster than it prices (verl's
`timing_s/gen`, `timing_s/old_log_prob` + `timing_s/ref`, `timing_s/update_actor`,
`timing_s/update_weights`; NeMo RL's timers) can fit one multiplicative scale per phase:

    generation   measured gen_time_s on synchronous rows (on an asynchronous row the column is
                 the wait for the rollout, not the rollout: sim_core/accuracy/rl.py PHASES)
    log-probs    old_log_prob_time_s + ref_time_s, rows without a critic, against the predicted
                 passes the row's timer holds (accuracy/rl_logprob_timer.py: the policy's
                 alone where a row's `log_prob_timer` or its framework's timer says so)
    update       update_actor_time_s, rows without a critic
    weight sync  weight_sync_time_s (a NeMo RL refit timer less what else it holds,
                 rl/refit_timer.py)

Each scale is exp(median(log(measured / predicted))) over the rows that state the phase: the
median of log ratios is symmetric in over- and under-prediction and robust to the few rows
whose phase boundary differs from the model's (a source that lumps a pass into another), which
a least-squares fit in log space (the mean) lets pull the scale; a phase that fewer than
`min_rows` rows state keeps 1.0. The scales multiply the phase seconds inside
`simulate_rl` before the step is composed (sim_core/rl/phases.py compose_step), so a sync
step still adds its phases and an asynchronous step still overlaps generation with training.

Grouped cross-validation (leave one group out: the table's `source`, or any column) refits the
scales without the group and predicts its steps: the figure that says whether a fit transfers
to a run the calibration did not see. It costs one simulation: the step is linear in each
phase, so every fold recomposes the unscaled phase seconds with its own scales
(compose_step), exactly what simulate_rl computes under those scales.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..accuracy import rl, rl_logprob_timer, rl_table
from ..rl import inputs
from ..rl.phases import PHASE_SCALES, compose_step, simulate_rl

MIN_ROWS = 3  # rows that state a phase before its scale is fitted (fewer: 1.0)

# predicted column of simulate_rl for each phase (measured: _measured)
PRED = {"generation": "gen_time_s", "log-probs": "log_prob_time_s",
        "update": "update_time_s", "weight sync": "weight_sync_time_s"}


class RLCalibrationError(ValueError):
    pass


@dataclass
class RLPhaseData:
    """The priced rows of a run table: measured step and phases, the unscaled predicted
    phases, the composition mode and the CV group of each row."""
    table: pd.DataFrame            # the rows as given (for rl.compare / rankings)
    cmp: pd.DataFrame              # rl.compare of the rows, white-box model
    group: np.ndarray              # CV group per row
    step: np.ndarray               # measured step (NaN: not stated)
    meas: dict                     # phase -> measured seconds (NaN: not stated)
    pred: dict                     # phase -> predicted seconds, white-box
    gen_tail: np.ndarray
    offload: np.ndarray
    fixed_serial: np.ndarray       # step_fixed.py's colocated serial work (never scaled)
    # step_fixed.py's training-side cleaning + verl's driver (never scaled)
    prep: np.ndarray
    asynchrony: np.ndarray         # 0 sync, 1 one step off, 2 async
    framework: np.ndarray          # rl_framework as the reader resolves it ("" where unstated)
    priced: np.ndarray             # bool: the model prices the row
    # validation and checkpoints per step (rl/periodic.py): the validation's generation (the
    # generation scale acts on it), its weight push (the weight-sync scale), the rest (never
    # scaled: the engine's cycle and the checkpoint)
    periodic_gen: np.ndarray | None = None
    periodic_sync: np.ndarray | None = None
    periodic_fixed: np.ndarray | None = None
    # the predicted log-prob passes the row's timer holds (rl.compare's pred_log_prob_time_s),
    # what the log-prob scale is fitted against; pred["log-probs"] (every pass) is what the
    # scale multiplies in the step
    pred_lp_timer: np.ndarray | None = None


@dataclass
class RLCalibration:
    data: RLPhaseData
    scales: dict                   # phase -> fitted scale (1.0: not enough rows)
    rows: dict                     # phase -> rows that state it
    fold_scales: dict = field(default_factory=dict)   # group -> its fold's scales
    pred_in: np.ndarray | None = None                 # step, all rows' scales
    pred_cv: np.ndarray | None = None                 # step, the fold's scales

    def errors(self, which: str) -> np.ndarray:
        p = {"before": self.data.cmp.pred_step_s.to_numpy(dtype=float),
             "in_sample": self.pred_in, "cv": self.pred_cv}[which]
        return p / self.data.step - 1

    def median_abs(self, which: str, mask=None) -> float:
        e = self.errors(which)
        ok = np.isfinite(e) if mask is None else np.isfinite(e) & mask
        return float(np.median(np.abs(e[ok]))) if ok.any() else float("nan")

    def by_group(self) -> pd.DataFrame:
        """Per CV group: rows with a measured step, median |step error| white-box and with the
        scales fitted without the group."""
        out = []
        for g in sorted(set(self.data.group[np.isfinite(self.errors("before"))])):
            m = self.data.group == g
            out.append({"group": g, "rows": int((m & np.isfinite(self.errors("before"))).sum()),
                        "before": self.median_abs("before", m),
                        "cv_after": self.median_abs("cv", m)})
        return pd.DataFrame(out)

    def phase_errors(self) -> dict:
        """Per phase, over the rows that state it: median |predicted / measured - 1| white-box,
        with the scale fitted on all rows, and with the scale of the fold leaving the row's
        group out."""
        out = {}
        for ph in PHASE_SCALES:
            m, p = self.data.meas[ph], _paired(self.data, ph)
            ok = np.isfinite(m) & np.isfinite(p) & (m > 0) & (p > 0)
            if not ok.any():
                continue
            fold = np.array([self.fold_scales[g][ph] for g in self.data.group[ok]])
            r = p[ok] / m[ok]
            out[ph] = {"rows": int(ok.sum()),
                       "before": float(np.median(np.abs(r - 1))),
                       "in_sample": float(np.median(np.abs(r * self.scales[ph] - 1))),
                       "cv": float(np.median(np.abs(r * fold - 1)))}
        return out

    def compare_with(self, which: str) -> pd.DataFrame:
        """rl.compare's frame with the step predicted in-sample or in CV (for the rankings)."""
        c = self.data.cmp.copy()
        p = self.pred_in if which == "in_sample" else self.pred_cv
        c["pred_step_s"] = p
        c["step_err"] = c.pred_step_s / c.step_time_s - 1
        return c

    def component(self, group_col: str) -> dict:
        """What a profile stores (sim_core/profiles.py `rl_phases`)."""
        by = self.by_group()
        return {"scales": {k: float(v) for k, v in self.scales.items()},
                "rows": self.rows, "min_rows": MIN_ROWS, "group": group_col,
                "table_rows": int(len(self.data.step)),
                "timed_rows": int(np.isfinite(self.errors("before")).sum()),
                "groups": int(len(by)),
                "median_abs_step_err": {"before": self.median_abs("before"),
                                        "in_sample": self.median_abs("in_sample"),
                                        "cv": self.median_abs("cv")},
                # the step's grouped-CV error falls: the scales transfer to unseen groups
                "cv_improves_step": bool(self.median_abs("cv") < self.median_abs("before")),
                "phase_errors": self.phase_errors(),
                "by_group": by.to_dict(orient="records")}


def _measured(cmp: pd.DataFrame) -> dict:
    """Measured phase seconds, as `sweep validate --rl` compares them (rl._phase_pairs; a
    table's refit column is its weight-sync figure)."""
    return {"generation": cmp["meas_gen_time_s"].to_numpy(dtype=float),
            "log-probs": cmp["meas_log_prob_time_s"].to_numpy(dtype=float),
            "update": cmp["meas_update_time_s"].to_numpy(dtype=float),
            "weight sync": cmp["meas_refit_timer_s"].to_numpy(dtype=float)}


def prepare(t: pd.DataFrame, group: str | None = None) -> RLPhaseData:
    """Price every row once with the white-box model (neither an installed profile's scales
    nor the shipped NeMo RL ones: a fit starts from the physics alone)."""
    t = t.reset_index(drop=True)
    gcol = group or "source"
    if group is not None and group not in t.columns:
        raise RLCalibrationError(f"--group: no column {group!r} in the run table (columns: "
                                 f"{', '.join(t.columns)})")
    grp = (t[gcol].astype(object).where(t[gcol].notna(), "(none)").astype(str).to_numpy()
           if gcol in t.columns else np.full(len(t), "(no source)", dtype=object))
    df, _, reason = rl.to_frame(t)
    ok = reason == ""
    norm, _, _ = rl_table.normalize(t)
    try:
        cmp = rl.compare(t, phase_scales={})
    except rl_logprob_timer.LogProbTimerError as exc:
        raise RLCalibrationError(str(exc)) from exc
    n = len(t)
    pred = {k: np.full(n, np.nan) for k in PRED}
    tail, off, asy = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n)
    fixed, prep, timer_extra = np.zeros(n), np.zeros(n), np.zeros(n)
    per_gen, per_sync, per_fixed = np.zeros(n), np.zeros(n), np.zeros(n)
    if ok.any():
        p = simulate_rl(df[ok].reset_index(drop=True), phase_scales={})
        i = np.flatnonzero(ok)
        for k, c in PRED.items():
            pred[k][i] = p[c].to_numpy(dtype=float)
        tail[i] = p["gen_tail_time_s"].to_numpy(dtype=float)
        off[i] = p["offload_time_s"].to_numpy(dtype=float)
        # the same sums phases.simulate_rl composes with (bit for bit): the colocated serial
        # work and the training pipeline's (cleaning + verl's driver)
        prep[i] = (p["phase_cleanup_time_s"] + p["verl_driver_time_s"]).to_numpy(dtype=float)
        fixed[i] = (p["engine_sleep_wake_fixed_s"]
                    + p["refit_cleanup_time_s"]).to_numpy(dtype=float)
        asy[i] = [inputs.ASYNC.index(a) for a in df.asynchrony[ok]]
        timer_extra[i] = (p["refit_timer_s"] - p["weight_sync_time_s"]).to_numpy(dtype=float)
        per_gen[i] = p["validation_gen_s"].to_numpy(dtype=float)
        per_sync[i] = p["validation_sync_s"].to_numpy(dtype=float)
        per_fixed[i] = (p["validation_fixed_s"] + p["checkpoint_time_s"]).to_numpy(dtype=float)
    meas = _measured(cmp)
    # a refit column is the framework's timer (rl/refit_timer.py: NeMo RL's also holds the
    # engine's wake, the trainer's offload out and the cleaning, which the weight-sync scale does
    # not multiply): the sync it measured is what is left once those are taken out; rows left
    # with nothing count as not stating it
    ws = meas["weight sync"] - timer_extra
    meas["weight sync"] = np.where(ws > 0, ws, np.nan)
    return RLPhaseData(table=t, cmp=cmp, group=grp,
                       step=pd.to_numeric(norm.step_time_s, errors="coerce").to_numpy(float),
                       meas=meas, pred=pred, gen_tail=tail, offload=off,
                       fixed_serial=fixed, prep=prep,
                       asynchrony=asy, priced=ok,
                       framework=(df["rl_framework"].astype(str).to_numpy()
                                  if "rl_framework" in df.columns else np.full(len(df), "")),
                       periodic_gen=per_gen, periodic_sync=per_sync, periodic_fixed=per_fixed,
                       pred_lp_timer=cmp["pred_log_prob_time_s"].to_numpy(dtype=float))


def _paired(d: RLPhaseData, phase: str) -> np.ndarray:
    """The predicted seconds a phase's measurement is compared with: for the log-probs, the
    passes the row's timer holds."""
    if phase == "log-probs" and d.pred_lp_timer is not None:
        return d.pred_lp_timer
    return d.pred[phase]


def log_ratios(d: RLPhaseData, phase: str, mask=None) -> np.ndarray:
    """log(measured / predicted) of the rows (of mask) that state the phase."""
    m, p = d.meas[phase], _paired(d, phase)
    ok = np.isfinite(m) & np.isfinite(p) & (m > 0) & (p > 0)
    if mask is not None:
        ok &= mask
    return np.log(m[ok] / p[ok])


def fit_scales(d: RLPhaseData, mask=None, min_rows: int = MIN_ROWS) -> tuple[dict, dict]:
    """Per phase the median-log-ratio scale (1.0 under min_rows rows) and its row count."""
    scales, rows = {}, {}
    for ph in PHASE_SCALES:
        r = log_ratios(d, ph, mask)
        rows[ph] = int(len(r))
        scales[ph] = float(np.exp(np.median(r))) if len(r) >= min_rows else 1.0
    return scales, rows


def step_with(d: RLPhaseData, scales: dict) -> np.ndarray:
    """The step of every row under `scales`: the unscaled phases recomposed (compose_step),
    what simulate_rl(df, phase_scales=scales) gives."""
    s = {k: float(scales.get(k, 1.0)) for k in PHASE_SCALES}
    g = s["generation"]
    step = compose_step(d.asynchrony, d.gen_tail * g, d.pred["generation"] * g,
                        d.pred["log-probs"] * s["log-probs"], d.pred["update"] * s["update"],
                        d.pred["weight sync"] * s["weight sync"], d.offload, d.fixed_serial,
                        d.prep)
    if d.periodic_gen is None:
        return step
    # validation and checkpoints (rl/periodic.py), added after the composition as in
    # simulate_rl: NaN on unpriced rows stays with the step's own NaN
    return (step + np.nan_to_num(d.periodic_gen) * g
            + np.nan_to_num(d.periodic_sync) * s["weight sync"] + np.nan_to_num(d.periodic_fixed))


def calibrate(d: RLPhaseData, min_rows: int = MIN_ROWS) -> RLCalibration:
    if not d.priced.any():
        raise RLCalibrationError("no row of the run table can be priced (unknown model or GPU, "
                                 "no GPU count): nothing to calibrate")
    scales, rows = fit_scales(d, min_rows=min_rows)
    if not any(rows[k] for k in rows):
        raise RLCalibrationError("no row states a phase time (gen_time_s, old_log_prob_time_s, "
                                 "update_actor_time_s or weight_sync_time_s): nothing to fit")
    if all(v < min_rows for v in rows.values()):
        raise RLCalibrationError(f"no phase is stated by {min_rows} rows (rows per phase: "
                                 + ", ".join(f"{k} {v}" for k, v in rows.items()) + ")")
    cal = RLCalibration(d, scales, rows)
    cal.pred_in = step_with(d, scales)
    cv = np.full(len(d.step), np.nan)
    for g in sorted(set(d.group)):
        held = d.group == g
        sc, _ = fit_scales(d, ~held, min_rows)
        cal.fold_scales[g] = sc
        cv[held] = step_with(d, sc)[held]
    cal.pred_cv = cv
    return cal
