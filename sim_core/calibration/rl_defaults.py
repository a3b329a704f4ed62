"""Fit the shipped RL phase scales (catalogs/rl.yaml `nemo_rl_logprob_scale`,
`nemo_rl_update_scale`) and say how well they transfer.

Why a fit at all: NeMo RL's log-prob passes and update run slower than the white-box model
prices them on every NeMo RL source found, in one direction and by a similar factor, and what
NeMo RL's code shows is already priced (docs/rl.md). The declared subset: the rows of the RL
run table whose `rl_framework` is nemo_rl and that state the phase (the same median-of-log-
ratios scale as `sweep calibrate rl-runs`, sim_core/calibration/rl_phases.py). Only those
two phases, only NeMo RL: scales fitted on the other frameworks' rows raise their
leave-one-source-out step error (`sweep calibrate rl-runs ... --rows "rl_framework !=
'nemo_rl'"` prints it), NeMo RL's generation scale is within 3% of 1 and its weight-sync scale
raises the left-out refit error, so none is shipped for them.

Leave one source out: each NeMo RL source's rows are priced with the scales refitted on the
other NeMo RL sources; every other row keeps the white-box model. The pooled figure is the
median over all timed rows, in-sample and left out.

    python -m sim_core.calibration.rl_defaults [--write]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from ..accuracy import rl
from ..rl import inputs
from . import rl_phases

FRAMEWORK = "nemo_rl"
PHASES = {"log-probs": "nemo_rl_logprob_scale", "update": "nemo_rl_update_scale"}


def _scales(d: rl_phases.RLPhaseData, mask: np.ndarray) -> dict:
    s, _ = rl_phases.fit_scales(d, mask)
    return {p: s[p] for p in PHASES}


def _rows(d: rl_phases.RLPhaseData) -> np.ndarray:
    return (d.framework == FRAMEWORK) & d.priced


def fit(t: pd.DataFrame | None = None) -> dict:
    """The scales fitted on the declared subset, and the step error of every timed row with
    them in-sample and leaving each NeMo RL source out (white-box elsewhere)."""
    d = rl_phases.prepare(rl.load() if t is None else t)
    on = _rows(d)
    if not on.any():
        raise rl_phases.RLCalibrationError(f"no {FRAMEWORK} row to fit the shipped scales on")
    if not (np.isfinite(d.step) & on).any():
        raise rl_phases.RLCalibrationError(f"no {FRAMEWORK} row states a step time")
    white = rl_phases.step_with(d, {})
    scales = _scales(d, on)
    inside = np.where(on, rl_phases.step_with(d, scales), white)
    left_out = white.copy()
    folds = {}
    for g in np.unique(d.group[on]):
        fold = _scales(d, on & (d.group != g))
        folds[g] = fold
        sel = on & (d.group == g)
        left_out[sel] = rl_phases.step_with(d, fold)[sel]

    def err(step):
        return np.abs(step / d.step - 1.0)

    timed = np.isfinite(d.step) & d.priced
    # the generation share of the synchronous rows that measured it: generation is not scaled,
    # so the left-out share is the white-box share x white-box step / left-out step
    meas_share = d.cmp["gen_share"].to_numpy(dtype=float)
    white_share = d.cmp["pred_gen_share"].to_numpy(dtype=float)
    share_pts = np.abs(white_share * white / left_out - meas_share) * 100
    share_ok = np.isfinite(share_pts)
    by_source = {}
    for g in np.unique(d.group[on & timed]):
        sel = on & timed & (d.group == g)
        by_source[g] = tuple(float(np.median(err(s)[sel])) for s in (white, inside, left_out))
    return {"scales": scales, "folds": folds, "rows": int((on & timed).sum()),
            "phase_rows": {p: int(len(rl_phases.log_ratios(d, p, on))) for p in PHASES},
            "white": float(np.median(err(white)[timed])),
            "in_sample": float(np.median(err(inside)[timed])),
            "left_out": float(np.median(err(left_out)[timed])),
            "left_out_errors": np.where(timed, err(left_out), np.nan),
            "by_source": by_source, "timed": int(timed.sum()),
            "gen_share_left_out_pts": float(np.median(share_pts[share_ok]))
            if share_ok.any() else None, "gen_share_rows": int(share_ok.sum())}


def stored() -> dict:
    """The scales catalogs/rl.yaml ships."""
    k = inputs.constants()
    return {p: float(k[key]) for p, key in PHASES.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="store the scales in catalogs/rl.yaml")
    args = ap.parse_args(argv)
    r = fit()
    for p, v in r["scales"].items():
        lo = min(f[p] for f in r["folds"].values())
        hi = max(f[p] for f in r["folds"].values())
        print(f"{FRAMEWORK} {p}: x{v:.3f} over {r['phase_rows'][p]} rows (folds x{lo:.3f}-"
              f"x{hi:.3f}; catalogs/rl.yaml x{stored()[p]:.3f})")
    print(f"median |step error| over {r['timed']} timed rows (white-box -> in-sample -> leave "
          f"one {FRAMEWORK} source out): {r['white']:.1%} -> {r['in_sample']:.1%} -> "
          f"{r['left_out']:.1%}")
    if r["gen_share_left_out_pts"] is not None:
        print(f"generation share, leaving each {FRAMEWORK} source out: median |error| "
              f"{r['gen_share_left_out_pts']:.1f} points over {r['gen_share_rows']} sync rows")
    for g, (w, i, o) in r["by_source"].items():
        print(f"  {g}: {w:.1%} -> {i:.1%} -> {o:.1%}")
    if args.write:
        inputs.store_constants({key: f"{r['scales'][p]:.3g}" for p, key in PHASES.items()})
        print("stored in catalogs/rl.yaml")


if __name__ == "__main__":
    main()
