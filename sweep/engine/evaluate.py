"""Evaluating a frame of configurations: the framework's defaults, the rules, the bounds that
spare simulation (prune.py), then the simulator. What every strategy and `sweep simulate` run,
in Ray tasks or in the driver.

The simulate function (default `sim_core.simulate_frame`) and the rule check (default
`sim_core.check_rules`) are parameters, so tests can inject fakes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim_core.frameworks import resolve_frame

from .prune import objective_bound, simulate_with_memory_bound, worse_than
from .space import normalise, rule_reasons, sim_frame


def default_simulate():
    import sim_core

    return sim_core.simulate_frame


class ProfiledSimulate:
    """`sim_core.simulate_frame` under a calibration profile (`--profile`).

    Picklable for Ray tasks: it carries the packed profile and activates it in whichever
    process evaluates (once per profile version there). `version` enters the resume
    fingerprint, so results computed under different profiles never mix.
    """

    def __init__(self, name_or_path):
        from sim_core import profiles

        self.blob = profiles.pack(name_or_path)
        man = profiles.load_manifest(profiles.profile_dir(name_or_path))
        self.version = man["version"]
        # what the results, the recommendation and the report say about the active profile
        runs = man.get("components", {}).get("runs", {})
        self.info = {"name": man["name"], "version": man["version"],
                     "components": sorted(man.get("components", {})),
                     "cv_step_error": runs.get("cv_step_error"),
                     "accepted": bool(runs.get("accepted") or runs.get("residual"))}

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        import sim_core
        from sim_core import profiles

        profiles.activate_packed(self.blob)
        return sim_core.simulate_frame(frame)


def model_info(simulate) -> dict:
    """Results metadata naming the calibration profile (none for the default model)."""
    info = getattr(simulate, "info", None)
    return {"profile": info} if info else {}


def profile_line(meta: dict) -> str | None:
    """'calibrated with profile NAME version V (...)' from results metadata, or None."""
    p = meta.get("profile") if isinstance(meta, dict) else None
    if not isinstance(p, dict):
        return None
    err = p.get("cv_step_error")
    how = ("accepted at" if p.get("accepted", True) else
           "kept the white-box model (no term helped) at")
    cv = (f"; run calibration {how} grouped-CV median step error {100 * err:.1f}%"
          if isinstance(err, (int, float)) and err == err else "")
    return (f"calibration profile {p.get('name')} version {p.get('version')} active "
            f"({', '.join(p.get('components', []))}){cv}")


def model_key(simulate) -> dict:
    """Fingerprint entry for a calibrated simulator (none for the default model)."""
    version = getattr(simulate, "version", None)
    return {"profile": version} if version else {}


def evaluate(frame: pd.DataFrame, simulate=None, check=None, prune=None) -> pd.DataFrame:
    """Rules, then simulation of the valid rows; one output row per input row.

    Adds the simulator's columns (NaN for invalid rows), `status` (ok | oom | invalid) and
    `invalid_reason` ('' unless invalid). With `prune` (a `Bounds`, default simulator only),
    valid rows that a bound proves out of memory or out of the top K are not simulated: status
    pruned_memory or pruned_time (sweep/engine/prune.py).
    """
    out, cols = _evaluated_columns(frame, simulate, check, prune)
    return _assemble(out, cols)


def evaluate_simulated(frame: pd.DataFrame, simulate=None, check=None, prune=None
                       ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """`evaluate`, keeping only the simulated rows (status ok or oom) as a frame: what a grid
    part stores. Returns (those rows, renumbered from 0: the same frame as
    `evaluate(...)[status in (ok, oom)].reset_index(drop=True)`), the status of every row and
    the invalid_reason of every row, as arrays. The frame of the rows a grid discards (invalid,
    pruned by a bound: most of a large grid's candidates) is never built."""
    out, cols = _evaluated_columns(frame, simulate, check, prune)
    status, reasons = cols["status"], cols["invalid_reason"]
    keep = np.flatnonzero((status == "ok") | (status == "oom"))
    if not len(keep):  # the empty frame's dtypes as the full frame gives them
        df = _assemble(out, cols)
        return df.iloc[:0].reset_index(drop=True), status, reasons
    return _assemble(out, cols, keep).reset_index(drop=True), status, reasons


def evaluate_batch(b, reasons: np.ndarray, columns_of, inputs, prune=None
                   ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """`evaluate_simulated` (default rules and simulator) of candidates given as their Batch
    `b` (sweep/engine/direct.py: what frame_to_batch gives on their resolved frame), with the
    sweep's own rule's `reasons` and `inputs` the resolved frame's columns;
    columns_of(positions) gives that frame's columns ({name: values}) for the rows stored,
    the only rows they are built for."""
    from sim_core.columns import Batch

    n = len(reasons)
    reasons = reasons.copy()
    pruned = np.full(n, "", dtype=object)
    todo = np.flatnonzero(reasons == "")
    pos, pred = None, None
    if len(todo):
        bt = b if len(todo) == n else Batch({k: v[todo] for k, v in b.items()})
        pos, pred = check_and_simulate(bt, todo, reasons, prune, pruned)
    status = _statuses(n, reasons, pos, pred, pruned, inputs)
    keep = np.flatnonzero((status["status"] == "ok") | (status["status"] == "oom"))
    rows = keep if len(keep) else np.arange(n)  # none: the empty frame's dtypes as the full
    cols = _columns(pos, pred, n, inputs, status, keep if len(keep) else None)  # frame's
    # one frame of the inputs then the outputs (what `_assemble` gives, built once)
    got = columns_of(rows)
    df = pd.DataFrame({**{c: v for c, v in got.items() if c not in cols}, **cols})
    return (df if len(keep) else df.iloc[:0]).reset_index(drop=True), status["status"], \
        status["invalid_reason"]


def _assemble(out: pd.DataFrame, cols: dict, rows: np.ndarray | None = None) -> pd.DataFrame:
    """The evaluated frame: `out` (the resolved inputs) beside `cols` (outputs, status), all
    rows or the positions `rows` only."""
    if rows is not None:
        out = out.iloc[rows]
        cols = {c: v[rows] for c, v in cols.items()}
    extra = pd.DataFrame(cols, index=out.index)
    out = out.drop(columns=[c for c in extra.columns if c in out.columns])
    return pd.concat([out, extra], axis=1)


def _evaluated_columns(frame: pd.DataFrame, simulate=None, check=None, prune=None
                       ) -> tuple[pd.DataFrame, dict]:
    """The resolved input frame and the evaluated columns (arrays, one value per row)."""
    # the framework's defaults are resolved here, so that results show the values simulated;
    # no-op settings (sequence parallelism at tp 1, ...) are normalised, not invalid
    out = normalise(resolve_frame(frame.reset_index(drop=True)))
    n = len(out)
    pruned = np.full(n, "", dtype=object)
    pos, pred = None, None
    if is_default(simulate, check):
        reasons, pos, pred = _rules_and_simulation(out, prune, pruned)
    else:
        reasons = rule_reasons(out, check)
        ok = reasons == ""
        if ok.any():
            got = (simulate or default_simulate())(sim_frame(out.loc[ok]))
            pos, pred = got.index.to_numpy(), {c: got[c].to_numpy() for c in got.columns}
    status = _statuses(n, reasons, pos, pred, pruned, out.columns)
    return out, _columns(pos, pred, n, out.columns, status)


def _statuses(n: int, reasons: np.ndarray, pos, pred: dict | None, pruned: np.ndarray,
              inputs) -> dict:
    """valid, fits, invalid_reason and status of every row, from the rules' `reasons`, the
    simulator's outputs `pred` at the rows `pos` (None: nothing simulated) and the bounds'
    `pruned`. `inputs`: the input frame's columns (a simulator output of that name is not
    taken, but for dp)."""
    ok = reasons == ""
    sim = {c: _spread(c, pred[c], n, pos) for c in ("valid", "fits", "invalid_reason")
           if pred is not None and c in pred and c not in inputs}
    valid = ok.copy()
    if "valid" in sim:
        simulated = np.zeros(n, dtype=bool)
        simulated[pos] = True
        valid &= np.where(simulated, sim["valid"].astype(bool), True)
    if "invalid_reason" in sim:
        told = sim["invalid_reason"]
        sim_reason = np.where(told == None, "", told)  # noqa: E711
        reasons = np.where(ok, sim_reason, reasons).astype(object)
    fits = sim["fits"].astype(bool) & valid if "fits" in sim else np.zeros(n, dtype=bool)
    # the strings taken from a 3-entry table by code (not typed row by row)
    status = STATUS.take(np.where(valid, np.where(fits, 1, 2), 0))
    bound = valid & (pruned != "")
    status[bound] = pruned[bound]
    why = np.array(reasons, dtype=object)  # a copy: reasons may be the caller's
    why[why == ""] = "invalid"
    why[valid] = ""
    return {"valid": valid, "fits": fits, "invalid_reason": why, "status": status}


STATUS = np.array(["invalid", "ok", "oom"], dtype=object)


def _columns(pos, pred: dict | None, n: int, inputs, status: dict,
             rows: np.ndarray | None = None) -> dict:
    """The evaluated columns beside the input frame: the simulator's outputs (NaN, False or
    None where not simulated) then `status`'s, for every row or only the positions `rows`
    (all simulated: no full-length array is built)."""
    at = None if rows is None or pred is None else np.searchsorted(pos, rows)
    cols: dict[str, np.ndarray] = {}
    for c in pred or ():
        if c in inputs and c != "dp":
            continue
        cols[c] = _spread(c, pred[c], n, pos) if rows is None else _taken(pred[c], at)
    for c, v in status.items():
        cols[c] = v if rows is None else v[rows]
    return cols


def _spread(c: str, v, n: int, pos) -> np.ndarray:
    """An output over all n rows: `v` at `pos`, elsewhere False (bool), NaN (numbers, as
    float64) or None ('' for invalid_reason)."""
    v = np.asarray(v)
    if v.dtype == bool:
        full = np.zeros(n, dtype=bool)
    elif v.dtype.kind in "iuf":
        full = np.full(n, np.nan)
    else:
        full = np.full(n, "" if c == "invalid_reason" else None, dtype=object)
    full[pos] = v
    return full


def _taken(v, at: np.ndarray) -> np.ndarray:
    """`_spread(c, v, n, pos)[rows]` for rows among the sorted `pos`, at = their places in it."""
    v = np.asarray(v)[at]
    if v.dtype == bool:
        return v
    if v.dtype.kind in "iuf":
        return v.astype(np.float64)
    out = np.empty(len(at), dtype=object)
    out[:] = v
    return out


def is_default(simulate, check) -> bool:
    import sim_core

    return (simulate is None or simulate is sim_core.simulate_frame) and check is None


def _rules_and_simulation(frame: pd.DataFrame, prune=None, pruned=None):
    """The default rules and simulator on one Batch: the frame is turned into arrays once
    (not once for the rules and again for the simulator) and only valid rows are simulated.
    Same numbers as `rule_reasons` + `sim_core.simulate_frame`. With `prune` (a `Bounds`),
    valid rows a bound excludes are not simulated; their status goes into `pruned`.
    Returns (reasons, positions simulated, outputs there); (reasons, None, None) if none."""
    from sim_core.columns import frame_to_batch

    reasons = np.full(len(frame), "", dtype=object)
    if "global_batch_tokens" in frame.columns:
        bad = (frame["global_batch_tokens"] % frame["seq_len"] != 0).to_numpy()
        reasons[bad] = "global_batch_tokens % seq_len != 0"
    todo = np.flatnonzero(reasons == "")
    if not len(todo):
        return reasons, None, None
    b = frame_to_batch(_with_model_shapes(sim_frame(frame.iloc[todo] if len(todo) < len(frame)
                                                    else frame)))
    return (reasons, *check_and_simulate(b, todo, reasons, prune, pruned))


def check_and_simulate(b, todo: np.ndarray, reasons: np.ndarray, prune=None, pruned=None):
    """sim_core's rules on Batch `b` (the rows at positions `todo`; their reasons written into
    `reasons`), then the simulator on the valid ones but those a bound excludes (`pruned`).
    Returns (positions simulated, ascending; the simulator's outputs there) or (None, None)."""
    from sim_core import rules
    from sim_core.columns import Batch
    from sim_core.simulate import simulate as core

    valid, why = rules.check(b)
    reasons[todo] = why
    keep = np.flatnonzero(valid)
    if not len(keep):
        return None, None
    rows = todo[keep]  # positions in the frame of the valid rows

    def valid_batch():
        return b if len(keep) == len(b) else Batch({k: v[keep] for k, v in b.items()})

    if prune is None:
        return rows, core(valid_batch())
    late = prune.time_pruned(valid_batch(), rows) if prune.threshold is not None else \
        np.zeros(len(rows), dtype=bool)
    # each pass takes its rows from `b` (not from a copy of the valid rows first)
    pos, out, heavy = simulate_with_memory_bound(b, prune.group[rows], core, skip=late,
                                                 within=keep)
    pruned[rows[late]] = "pruned_time"
    pruned[rows[heavy]] = "pruned_memory"
    if out is None:
        return None, None
    return rows[pos], out


def _with_model_shapes(frame: pd.DataFrame) -> pd.DataFrame:
    """The model's shape columns filled from the catalog, one array per column (what
    frame_to_batch would do row group by row group, in pandas), so it skips that step."""
    from sim_core import catalog
    from sim_core.specs import MODEL_COLUMNS

    shape_cols = [c for c in MODEL_COLUMNS if c != "model"]
    if "model" not in frame.columns or any(c in frame.columns for c in shape_cols):
        return frame
    inv, uniq = pd.factorize(frame["model"].astype(str), use_na_sentinel=False)  # hashed
    inv = np.asarray(inv)
    specs = [catalog.get_model(m).columns() for m in uniq]
    cols = {}
    for c in shape_cols:
        vals = [sp[c] for sp in specs]
        arr = np.array(vals, dtype=object if isinstance(vals[0], str) else None)
        # strings typed once by pandas, then taken (not converted row by row)
        cols[c] = pd.Series(arr).array.take(inv) if arr.dtype == object else arr[inv]
    return pd.concat([frame, pd.DataFrame(cols, index=frame.index)], axis=1)


@dataclass
class Bounds:
    """What the pruning of one batch needs (sweep/engine/prune.py): each row's sub-space id (rows equal
    but for micro_batch and recompute), and for the time bound the first objective, the K-th
    best value the driver knew when it sent the batch (None: no time bound) and each row's
    price per GPU-hour."""

    group: np.ndarray
    objective: str = "step_time"
    threshold: float | None = None
    price: np.ndarray | None = None
    cost_unit: str = "mtok"

    def time_pruned(self, b, rows: np.ndarray) -> np.ndarray:
        """Valid rows (Batch `b`, at frame positions `rows`) whose bound is worse than the
        K-th best: they cannot enter the top K."""
        if self.threshold is None or not len(rows):
            return np.zeros(len(rows), dtype=bool)
        price = self.price[rows] if self.price is not None else np.full(len(rows), np.nan)
        bound = objective_bound(b, self.objective, price, self.cost_unit)
        return worse_than(bound, self.threshold, self.objective)



