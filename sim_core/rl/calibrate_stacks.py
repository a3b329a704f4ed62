"""Fit each accelerator/engine stack's fixed decode-step time on its published TPOT rows.

    python -m sim_core.rl.calibrate_stacks     # fit, in-sample and left-out errors per stack

A stack row of catalogs/rl.yaml `decode_stacks` (rl/decode_stacks.py) declares its bandwidth
fraction (a vendor's own figure, or the global fit's where the vendor gives none) and takes
its per-step time from this fit: the value on OVH_GRID that minimises the mean squared log
error of the predicted decode step against the published time per output token of the
stack's declared rows (single-request or small-batch serving runs, one file per stack under
data/rl/; the RL validation rows are never fitted on). The step is linear in the overhead, so
each row's step is computed once without it. Left out: each row (one source) or each source
(several) predicted from the fit on the others alone. The joint fit of both constants is
printed too, to show whether the rows can separate bandwidth from overhead.
"""

from __future__ import annotations

import argparse
import io
import sys
from importlib import resources

import numpy as np
import pandas as pd

from .. import catalog
from . import calibrate, decode_stacks, generation, inputs

OVH_GRID = np.round(np.arange(0.0, 0.0600001, 0.0001), 6)  # s per decode step
EFF_GRID = np.round(np.arange(0.30, 0.9501, 0.01), 4)

# the declared rows of each stack: (vendor, engine) -> file under sim_core/data/rl/
FILES = {("huawei", "vllm"): "decode_ascend_tpot.csv",
         ("amd", "vllm"): "decode_rocm_tpot.csv"}


def load(name: str) -> pd.DataFrame:
    text = resources.files("sim_core").joinpath(f"data/rl/{name}").read_text()
    return pd.read_csv(io.StringIO(text), comment="#")


def step_ms(t: pd.DataFrame, k: dict) -> np.ndarray:
    """Predicted decode step (ms) of each row at its concurrency and context."""
    b = inputs.to_batch(calibrate.tpot_frame(t, t.context_tokens))
    return generation.step_time(b, t.concurrency.to_numpy(float),
                                t.context_tokens.to_numpy(float), k) * 1e3


def _overhead_loss(t: pd.DataFrame, eff: float) -> np.ndarray:
    """Mean squared log error of `t`'s rows at each per-step time of OVH_GRID, the bandwidth
    fraction held at `eff`."""
    base = step_ms(t, {**generation.decode_constants(), "stacks": [],
                       "hbm_efficiency": eff, "step_overhead_s": 0.0})
    pred = base[None, :] + OVH_GRID[:, None] * 1e3
    return (np.log(pred / t.tpot_ms.to_numpy(float)[None, :]) ** 2).mean(axis=1)


def fit_overhead(t: pd.DataFrame, eff: float) -> float:
    """The per-step time on OVH_GRID minimising the mean squared log error of `t`'s rows,
    the bandwidth fraction held at `eff`."""
    return float(OVH_GRID[int(np.argmin(_overhead_loss(t, eff)))])


def fit_joint(t: pd.DataFrame) -> tuple[float, float, float]:
    """Both constants on EFF_GRID x OVH_GRID: (eff, ovh, median |error| in sample)."""
    meas = t.tpot_ms.to_numpy(float)
    best = (np.inf, 0.0, 0.0)
    for e in EFF_GRID:
        loss = _overhead_loss(t, e)
        j = int(np.argmin(loss))
        if loss[j] < best[0]:
            best = (loss[j], float(e), float(OVH_GRID[j]))
    _, e, o = best
    err = step_ms(t, {**generation.decode_constants(), "stacks": [], "hbm_efficiency": e,
                      "step_overhead_s": o}) / meas - 1
    return e, o, float(np.median(np.abs(err)))


def _stack_row(vendor: str, engine: str) -> dict | None:
    for r in decode_stacks.table(generation.decode_constants()):
        if r["vendor"] == vendor and r["engine"] == engine:
            return r
    return None


def report(vendor: str, engine: str, t: pd.DataFrame | None = None) -> dict:
    """The fit of one stack: the declared bandwidth fraction (the stack row's, else the
    global one), the fitted overhead, the stored one, in-sample and left-out errors."""
    t = load(FILES[(vendor, engine)]) if t is None else t
    k = generation.decode_constants()
    row = _stack_row(vendor, engine)
    eff = row["hbm_efficiency"] if row else float(k["hbm_efficiency"])
    ovh = fit_overhead(t, eff)
    meas = t.tpot_ms.to_numpy(float)
    at = {**k, "stacks": [], "hbm_efficiency": eff}
    ins = step_ms(t, {**at, "step_overhead_s": ovh}) / meas - 1
    # left out: each source when there are several, else each row
    groups = t.url.to_numpy() if t.url.nunique() > 1 else np.arange(len(t))
    held = np.empty(len(t))
    held_fit = np.empty(len(t))
    for g in pd.unique(groups):
        m = groups == g
        o = fit_overhead(t[~m], eff)
        held_fit[m] = o
        held[m] = step_ms(t[m], {**at, "step_overhead_s": o}) / meas[m] - 1
    glob = step_ms(t, {**k, "stacks": []}) / meas - 1
    stored = step_ms(t, k) / meas - 1
    return {"vendor": vendor, "engine": engine, "rows": len(t), "hbm_efficiency": eff,
            "step_overhead_s": ovh, "stored_overhead_s": row["step_overhead_s"] if row else None,
            "in_sample": ins, "held_out": held, "held_fit_s": held_fit, "global": glob,
            "stored": stored, "left_out_by": "source" if t.url.nunique() > 1 else "row",
            "table": t}


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    for (vendor, engine) in FILES:
        r = report(vendor, engine)
        t = r["table"]
        stored = ("not in catalogs/rl.yaml decode_stacks (global constants)"
                  if r["stored_overhead_s"] is None
                  else f"catalogs/rl.yaml: {r['stored_overhead_s'] * 1e3:.1f} ms")
        held = "the stack row's" if r["stored_overhead_s"] is not None else "the global fit's"
        print(f"stack {vendor}/{engine}: {r['rows']} published TPOT rows; hbm_efficiency "
              f"{r['hbm_efficiency']:.2f} (held: {held}), step_overhead fitted "
              f"{r['step_overhead_s'] * 1e3:.1f} ms ({stored})")
        print(f"  median |TPOT error|: global constants {np.median(np.abs(r['global'])):.1%}, "
              f"in-sample {np.median(np.abs(r['in_sample'])):.1%}, leave-one-"
              f"{r['left_out_by']}-out {np.median(np.abs(r['held_out'])):.1%}")
        for i, row in t.reset_index(drop=True).iterrows():
            print(f"    {row.model:14s} {row.gpu:10s} tp{row.tp} batch {row.concurrency:>3} "
                  f"ctx {row.context_tokens:>6}: {row.tpot_ms:6.2f} ms measured; global "
                  f"{r['global'][i]:+.0%}, fit {r['in_sample'][i]:+.0%}, left out "
                  f"{r['held_out'][i]:+.0%} (fit on the others {r['held_fit_s'][i] * 1e3:.1f} ms)")
        e, o, med = fit_joint(t)
        print(f"  both constants fitted (for comparison): hbm_efficiency {e:.2f}, "
              f"{o * 1e3:.1f} ms, in-sample {med:.1%}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except catalog.CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
