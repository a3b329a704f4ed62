"""RL memory verdicts against published out-of-memory reports (`sweep validate --rl-memory`).

`rl_runs.csv` holds only runs that ran, so nothing there can show a false "fits": a
configuration the simulator says fits but that crashed a user's run, the costly error of a
search engine (its pick would fail on the cluster). `data/rl/rl_memory.csv` holds published RL
runs whose memory outcome is stated (an OOM, or a run that fitted, often after one stated change
to an OOM setup), with the columns of `rl_runs.csv` plus `outcome` (`oom` / `fits`) and
`oom_phase` (`rollout` / `training` / `refit`, blank when the report does not say).

Each row is priced exactly as `sweep validate --rl` prices a run (accuracy/rl.py `compare`: the
same imputation of blank cells, the same memory model of rl/phases.py), and its verdict (`fits`,
`oom_reason`) is set against the stated outcome. Nothing is fitted on these rows.
"""

from __future__ import annotations

import io
from importlib import resources

import numpy as np
import pandas as pd

from . import rl

OUTCOMES = ("oom", "fits")
PHASES = ("rollout", "training", "refit")


def load(path=None) -> pd.DataFrame:
    """The memory table (default the shipped one), with `outcome` and `oom_phase` checked."""
    path = path or resources.files("sim_core").joinpath("data/rl/rl_memory.csv")
    try:
        raw = pd.read_csv(path, dtype=str, skipinitialspace=True)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the RL memory table ({str(e).splitlines()[0]})")
    if "step_time_s" not in [str(c).strip().lower().replace(" ", "_") for c in raw.columns]:
        # a memory table needs no step time: read as the run table with the column blank
        raw["step_time_s"] = np.nan
    t = rl.load(io.StringIO(raw.to_csv(index=False)))
    if "outcome" not in t.columns:
        raise ValueError(f"{path}: outcome: required column is missing (allowed values: "
                         f"{', '.join(OUTCOMES)})")
    out = t["outcome"].fillna("").astype(str).str.strip().str.lower()
    for i, v in enumerate(out):
        if v not in OUTCOMES:
            raise ValueError(f"{path}: row {i + 1}: outcome {t['outcome'].iloc[i]!r} is not one "
                             f"of {', '.join(OUTCOMES)}")
    t["outcome"] = out
    ph = (t["oom_phase"] if "oom_phase" in t.columns else pd.Series("", index=t.index))
    ph = ph.fillna("").astype(str).str.strip().str.lower()
    for i, v in enumerate(ph):
        if v and v not in PHASES:
            raise ValueError(f"{path}: row {i + 1}: oom_phase {v!r} is not one of "
                             f"{', '.join(PHASES)} (or blank: not stated)")
        if v and out.iloc[i] != "oom":
            raise ValueError(f"{path}: row {i + 1}: oom_phase {v!r} given for an outcome "
                             f"{out.iloc[i]!r} (only an oom row has a phase)")
    t["oom_phase"] = ph
    return t


def compare(t: pd.DataFrame) -> pd.DataFrame:
    """Per row: the stated outcome against the predicted verdict. `verdict`: `right`,
    `false fit` (an OOM predicted to fit: the dangerous kind), `false oom`, or `not predicted`
    (the catalog cannot price it, or the configuration is invalid; `why` says which).
    `pred_phase`: the phase of the predicted OOM (the head of rl/phases.py's oom_reason), and
    `phase_agrees` where both it and the stated phase are known."""
    t = t.reset_index(drop=True)
    cmp = rl.compare(t.drop(columns=["outcome", "oom_phase"]))
    skipped = cmp["skipped"].astype(str).to_numpy()
    invalid = cmp["invalid_reason"].astype(str).to_numpy()
    priced = (skipped == "") & (invalid == "")
    fits = cmp["fits"].to_numpy()
    pred = np.where(~priced, "-", np.where(fits == True, "fits", "oom"))  # noqa: E712
    reason = cmp["oom_reason"].astype(str).to_numpy()
    pred_phase = np.array([r.split(":", 1)[0] if r else "" for r in reason], dtype=object)
    outcome = t["outcome"].to_numpy()
    verdict = np.select(
        [~priced, pred == outcome, (outcome == "oom") & (pred == "fits")],
        ["not predicted", "right", "false fit"], "false oom")
    stated = t["oom_phase"].to_numpy()
    both = (stated != "") & (pred_phase != "")
    why = np.where(skipped != "", skipped, np.where(invalid != "", "invalid: " + invalid, ""))
    # the predicted peaks behind each verdict (GiB per GPU) and the GPU's memory, from the same
    # pricing: the margin a verdict had says how near it was
    peaks = {c: cmp[c] for c in ("pred_rollout_peak_gib", "pred_train_peak_gib", "hbm_gib")}
    return pd.DataFrame({
        "model": cmp["model"], "gpu": cmp["gpu"], "num_gpus": cmp["num_gpus"],
        "source": cmp["source"], "outcome": outcome, "predicted": pred,
        "verdict": verdict, "oom_phase": stated, "pred_phase": pred_phase,
        "phase_agrees": np.where(both, stated == pred_phase, None),
        "oom_reason": reason, "why": why, **peaks, "imputed": cmp["imputed"]})


def summary(cmp: pd.DataFrame) -> dict:
    """Counts over the rows: how many, priced, verdicts right, false fits, false OOMs, and the
    stated phases the predicted OOM's phase agrees with."""
    v = cmp["verdict"]
    ph = cmp["phase_agrees"].dropna()
    return {"rows": int(len(cmp)), "predicted": int((v != "not predicted").sum()),
            "right": int((v == "right").sum()), "false_fits": int((v == "false fit").sum()),
            "false_ooms": int((v == "false oom").sum()),
            "not_predicted": int((v == "not predicted").sum()),
            "oom_rows": int((cmp["outcome"] == "oom").sum()),
            "fits_rows": int((cmp["outcome"] == "fits").sum()),
            "phase_compared": int(len(ph)), "phase_agrees": int(ph.astype(bool).sum())}
