"""Optuna strategy: nested trials in ask/tell rounds, resumable, at the simulator's speed.

A trial is a layout chosen by the sampler (`nested.Nesting.outer`); its whole sub-grid of cheap
axes is simulated in one vectorized call and the trial is told its best value (for several
objectives, the points of its own front: the first on the trial, the others as extra
finished trials of the same layout). Every row is kept. Rounds of `batch_size` trials are
asked together, evaluated together and told together; the study's journal is appended once
per round (asks before evaluating, tells after).

Where a round is evaluated: as Ray tasks (a cluster address, a Ray already running in this
process, or a budget over IN_PROCESS_ROWS rows), else in the driver itself, where starting
a local Ray would cost more than the second core saves (`SWEEP_RAY=1` forces Ray). A round's
rows are written as one results part (compact schema, checksummed) on a background thread
and recorded in the manifest once written; the parts are then published as the results
dataset by hard links, as the grid's are, with the ranks of the best rows and the Pareto set
in its metadata.

Nothing walks the whole space: the size is the product of the axis lengths, validity is
checked on the rows sampled, and the summary counts those (valid, invalid by reason, oom,
fits). Ranking reads only the objective columns of the parts, so the driver's memory stays
bounded by a round, not by the number of trials.

Resume: trials left RUNNING, and finished trials whose part was lost (corrupt, missing, or
not yet recorded when the run stopped), are evaluated again from their recorded parameters
(not replaced by new trials) and, when already finished, not told twice. A layout asked
again is told its known result without simulating.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..config import OBJECTIVES
from ..errors import Interrupted, SweepError
from ..results import (
    ResultStore, add_costs, counts, pareto_mask, rank,
    write_part_file, write_tables,
)
from .evaluate import evaluate, model_info, model_key
from .nested import Nesting, split_axes
from .runtime import executor, progress_bar
from .samplers import default_sampler, make_sampler, round_proposer
from .strategy import Outcome, SearchJob, config_cols

DEFAULT_TRIALS = 2000  # sampler trials when search.trials is not given
# trials per ask/tell round (batch_size overrides): a 25th of the budget within these bounds.
# benchmarks/search_strategies.py, 12-axis space, 2,000 TPE trials, seeds 0-4, in the driver:
# rounds of 40 / 80 / 128 all found the grid's best (5/5); CPU 14-19 / 10.5-13 / 9-10 s;
# the median trial to come within 1% of it 261 / 407 / 648. 80 is the middle ground.
ROUND_MIN, ROUND_MAX = 8, 128
TASK_ROWS = 50_000  # rows per Ray task, at most (a round is one task below this)
FRONT_ATTR = "front_of"  # user attr of the extra trials that carry a trial's own front


# ---------------------------------------------------------------------------------------------
# Journal: Optuna's file format, appended once per round
# ---------------------------------------------------------------------------------------------
def journal_backend(path: Path):
    """A JournalStorage backend holding the log in memory and appending it to `path` on
    `flush()` (one write per round instead of one per trial parameter).

    The file is Optuna's journal format (optuna.storages.journal.JournalFileBackend reads it).
    A last line cut by a killed write is dropped on load: its round is re-run.
    """
    from optuna.storages.journal import BaseJournalBackend

    class RoundJournal(BaseJournalBackend):
        def __init__(self, file: Path):
            self.path = Path(file)
            self.logs: list[dict] = []
            self.flushed = 0
            if self.path.exists():
                data = self.path.read_bytes()
                end = data.rfind(b"\n") + 1
                if end < len(data):  # a torn last line
                    with open(self.path, "r+b") as f:
                        f.truncate(end)
                for line in data[:end].splitlines():
                    try:
                        self.logs.append(json.loads(line))
                    except ValueError:
                        raise SweepError(f"{self.path}: corrupt line {len(self.logs) + 1}; "
                                         "re-run with --fresh to start the study over") from None
                self.flushed = len(self.logs)

        def read_logs(self, log_number_from: int):
            return self.logs[log_number_from:]

        def append_logs(self, logs):
            self.logs.extend(logs)

        def flush(self, sync: bool = True) -> None:
            """Append the new lines; `sync=False` leaves them to the OS (they survive the
            process, not a crash of the machine: for asks, which a resume may ask again)."""
            if self.flushed == len(self.logs):
                return
            data = "".join(json.dumps(log, separators=(",", ":")) + "\n"
                           for log in self.logs[self.flushed:])
            with open(self.path, "ab") as f:
                f.write(data.encode("utf-8"))
                f.flush()
                if sync:
                    os.fsync(f.fileno())
            self.flushed = len(self.logs)

    return RoundJournal(path)


def storage(path: Path):
    """(JournalStorage, its backend) for the study journal at `path`."""
    from optuna.storages import JournalStorage

    backend = journal_backend(path)
    return JournalStorage(backend), backend


# ---------------------------------------------------------------------------------------------
# What was sampled, and when to stop
# ---------------------------------------------------------------------------------------------
@dataclass
class Tally:
    """Statuses of the rows sampled so far (the space is never counted as a whole)."""

    rows: int = 0
    ok: int = 0
    oom: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, df: pd.DataFrame) -> None:
        st = df["status"].to_numpy()
        self.rows += len(df)
        self.ok += int((st == "ok").sum())
        self.oom += int((st == "oom").sum())
        bad = st == "invalid"
        if bad.any():
            self.reasons.update(df.loc[bad, "invalid_reason"].astype(str).tolist())

    def lines(self) -> list[str]:
        invalid = sum(self.reasons.values())
        out = [f"sampled: {self.rows:,} configurations: {self.rows - invalid:,} valid "
               f"({self.ok:,} fit, {self.oom:,} out of memory), {invalid:,} invalid"]
        for reason, n in self.reasons.most_common(5):
            out.append(f"  {n:>10,}  invalid: {reason}")
        return out


class Patience:
    """Stop after `trials` trials that did not improve the best by more than `fraction`."""

    def __init__(self, trials: int | None, fraction: float, maximize: bool):
        self.trials, self.fraction, self.sign = trials, fraction, -1.0 if maximize else 1.0
        self.best = math.inf
        self.since = 0

    def update(self, value: float | None) -> None:
        v = math.inf if value is None or not math.isfinite(value) else self.sign * value
        if v < self.best - self.fraction * abs(self.best) or (
                math.isinf(self.best) and math.isfinite(v)):
            self.best, self.since = v, 0
        else:
            self.since += 1

    @property
    def exhausted(self) -> bool:
        return self.trials is not None and self.since >= self.trials


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def run_optuna(job: SearchJob) -> Outcome:
    """The Optuna strategy (strategy.py's interface)."""
    return _run_optuna(job.cfg, job.space, job.out, job.workers, job.address, job.simulate,
                       job.check, job.progress, job.fresh, job.on_batch, job.chosen)


def _run_optuna(cfg, space, out, workers, address, simulate, check, progress, fresh, on_batch,
                chosen: str = ""):
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    s = cfg.search
    if not space.axes:
        raise SweepError("space: strategy optuna needs at least one field in `space:`")
    nest = split_axes(space, s.inner, s.inner_max)
    outer_size = math.prod(len(dict(space.axes)[a]) for a in nest.outer)
    budget = s.trials or DEFAULT_TRIALS
    sampler_name = s.sampler or default_sampler(s.objectives)
    fp = space.fingerprint(strategy="optuna", objectives=s.objectives, sampler=s.sampler,
                           seed=s.seed, inner=list(nest.inner), **model_key(simulate))
    store = ResultStore(out, fp, {"space": space.name, "strategy": "optuna",
                                  **model_info(simulate)}).open(fresh)
    st, journal = storage(store.dir / "optuna.journal")
    directions = [OBJECTIVES[o][1] for o in s.objectives]
    obj_cols = [OBJECTIVES[o][0] for o in s.objectives]
    signs = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    batch = s.batch_size or min(ROUND_MAX, max(ROUND_MIN, budget // 25))
    sampler = make_sampler(s.sampler, s.objectives, s.seed, batch)
    propose = round_proposer(sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature warnings
        study = optuna.create_study(study_name=space.name, storage=st, directions=directions,
                                    load_if_exists=True, sampler=sampler)
    journal.flush()
    values_of = dict(space.axes)
    dists = {a: CategoricalDistribution(values_of[a]) for a in nest.outer}
    prices = space.prices()

    # What earlier runs left: each layout's result (from the parts) and the recorded trials.
    known, tally = _known_layouts(store, nest, obj_cols, signs)
    recorded = {int(n) for e in store.batches.values() for n in e.get("trials", [])}
    trials = [t for t in study.get_trials(deepcopy=False) if FRONT_ATTR not in t.user_attrs]
    n_asked = len(trials)
    stale = [t for t in trials if t.state == TrialState.RUNNING
             or (t.state.is_finished() and t.number not in recorded)]
    told = {t.number for t in stale if t.state.is_finished()}
    patience = Patience(s.patience, s.improvement, directions[0] == "maximize")
    for t in sorted(trials, key=lambda t: t.number):
        if t.state.is_finished() and t.number in recorded:
            patience.update(t.values[0] if t.state == TrialState.COMPLETE else None)

    evaluated = 0
    stop = ""
    if stale or n_asked < budget:
        with executor(workers, address, budget * nest.rows_per_trial) as ex:
            cap = ex.cap
            if not s.batch_size:
                batch = max(batch, 2 * cap)
            space_ref = ex.put((space, nest.offsets))
            writer = PartWriter(store)
            tell = _tell_fn()
            bar = progress_bar(budget, min(n_asked, budget), "trial", progress)
            in_flight: set[int] = set()

            def next_round():
                """Ask the next round (stale trials first) and start its evaluation."""
                nonlocal stale, n_asked, stop
                if stale:
                    asked, stale = stale[:batch], stale[batch:]
                else:
                    if n_asked >= budget:
                        stop = f"the trial budget of {budget:,} was reached"
                    elif patience.exhausted:
                        stop = (f"no trial improved the best {s.objectives[0]} by more than "
                                f"{s.improvement:.2%} in the last {s.patience:,} trials "
                                "(search.patience)")
                    elif len(known) + len(in_flight) >= outer_size:
                        stop = (f"every one of the {outer_size:,} layouts was sampled "
                                "(the whole space is evaluated)")
                    if stop:
                        return None
                    k = min(batch, budget - n_asked)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        if propose is not None:  # the round at once, recorded as RUNNING
                            study.add_trials([create_trial(state=TrialState.RUNNING, params=p,
                                                           distributions=dists)
                                              for p in propose(study, dists, k)])
                            asked = study.get_trials(deepcopy=False)[-k:]
                        else:
                            asked = [study.ask(dists) for _ in range(k)]
                    n_asked += len(asked)
                    # the asks survive an interruption (resumed, not lost); not synced: after
                    # a crash of the machine they are asked again (no part names them yet,
                    # parts are recorded after the synced tells)
                    journal.flush(sync=False)
                bases = [nest.base(space, t.params) for t in asked]
                first: dict[int, int] = {}
                for t, b in zip(asked, bases):
                    if b not in known and b not in in_flight:
                        first.setdefault(b, t.number)
                in_flight.update(first)
                # one task per round (a simulate call costs ~0.1 s before its first row), split
                # only when the round is large
                new = np.asarray(list(first), dtype=np.int64)
                pieces = max(1, -(-len(new) * nest.rows_per_trial // TASK_ROWS))
                refs = [ex.submit(_eval_layouts, space_ref, c, simulate, check, prices,
                                  s.cost_unit)
                        for c in np.array_split(new, pieces) if len(c)]
                return asked, bases, first, refs

            try:
                # `cap` rounds in flight, one per worker: the driver asks the next round while
                # the workers simulate (the sampler sees results up to cap-1 rounds late)
                pending: list = []
                while True:
                    while len(pending) < max(1, cap) and not stop:
                        nxt = next_round()
                        if nxt is None:
                            break
                        pending.append(nxt)
                    if not pending:
                        break
                    asked, bases, first, refs = pending.pop(0)
                    parts = [ex.get(r) for r in refs]
                    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
                    if len(rows):
                        rows.insert(0, "trial", np.repeat(list(first.values()),
                                                          nest.rows_per_trial))
                        known.update(_layout_results(rows, list(first), nest, obj_cols, signs))
                        tally.add(rows)
                        evaluated += len(rows)
                    in_flight.difference_update(first)
                    # written beside the driver's work; recorded in the manifest when written
                    # (a trial told before its part is recorded is evaluated again on resume)
                    writer.submit(f"o{asked[0].number:07d}", rows,
                                  [t.number for t in asked])
                    for t, b in zip(asked, bases):
                        front = known[b]
                        if t.number not in told:
                            _tell(study, t, front, TrialState, create_trial, dists, tell)
                            patience.update(front[0][0] if front else None)
                    journal.flush()  # synced (the asks before it too): then parts are recorded
                    writer.record_finished()
                    bar.update(len(asked))
                    if on_batch is not None:
                        on_batch(asked[0].number, len(store.done) + writer.pending)
                writer.close()
            except KeyboardInterrupt:
                bar.close()
                journal.flush()
                writer.close(interrupted=True)
                raise Interrupted(len(store.done), -(-budget // batch), str(store.dir)) from None
            except BaseException:
                writer.close(interrupted=True)
                raise
            bar.close()
    else:
        stop = f"the trial budget of {budget:,} was reached (an earlier run)"
    outcome = _assemble(store, cfg, space, t0, evaluated)
    outcome.tally = tally
    outcome.note = "\n".join(
        ([chosen] if chosen else [])
        + [f"optuna {sampler_name}: {n_asked:,} trials, {len(known):,} distinct layouts of "
           f"{outer_size:,}; {nest.describe()}"]
        + tally.lines()
        + [f"stopped: {stop}" if stop else "stopped: resumed trials finished"])
    return outcome


# ---------------------------------------------------------------------------------------------
# Result parts, written beside the driver's work
# ---------------------------------------------------------------------------------------------
class PartWriter:
    """Writes each round's rows as a part (compact schema, atomic, checksummed) on one
    background thread, so that parquet encoding (which releases the GIL) overlaps the
    sampler and the simulation; the driver records finished parts in the manifest, in order.

    Until its part is recorded, a round's trials count as unrecorded: a resume evaluates
    them again from their parameters, so nothing told is lost and nothing is counted twice."""

    def __init__(self, store: ResultStore):
        from concurrent.futures import ThreadPoolExecutor

        self.store = store
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweep-parts")
        self.queue: list = []  # (batch id, trials, rows, future), in submission order

    @property
    def pending(self) -> int:
        return len(self.queue)

    def submit(self, batch_id: str, rows: pd.DataFrame, trials: list[int]) -> None:
        if not len(rows):  # nothing new simulated (every layout known): the trials only
            self.queue.append((batch_id, trials, 0, None))
            return
        meta = {**self.store.part_meta(batch_id), "trials": trials}
        fut = self.pool.submit(write_part_file, self.store.part_path(batch_id), rows, meta)
        self.queue.append((batch_id, trials, len(rows), fut))

    def record_finished(self, wait: bool = False) -> None:
        """Record the parts written so far, in order (all of them when `wait`)."""
        while self.queue:
            batch_id, trials, n, fut = self.queue[0]
            if fut is not None and not (wait or fut.done()):
                return
            self.queue.pop(0)
            if fut is None:
                entry = {"file": "", "rows": 0, "sha256": "", "counts": {}, "trials": trials}
            else:
                try:
                    digest = fut.result()
                except OSError as exc:  # full disk, ...: one line, the rest is kept
                    self._drop_queue()
                    raise self.store._write_error(self.store.part_path(batch_id), exc) \
                        from None
                entry = {"file": f"{batch_id}.parquet", "rows": n, "sha256": digest,
                         "trials": trials}
            self.store.record_part(batch_id, entry)

    def _drop_queue(self) -> None:
        for _, _, _, fut in self.queue:
            if fut is not None:
                fut.cancel()
        self.queue.clear()
        self.pool.shutdown(wait=True)

    def close(self, interrupted: bool = False) -> None:
        """Wait for the writes in flight and record them (after an interruption too: they
        are complete files, and recording them saves their re-evaluation)."""
        try:
            self.record_finished(wait=True)
            self.store.flush()  # the manifest is rewritten at intervals: save the rest
        except SweepError:
            if not interrupted:
                raise
        finally:
            self.pool.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------
# Where a round is evaluated: Ray tasks, or this process when Ray would cost more than it gives
# ---------------------------------------------------------------------------------------------
# Below this many rows (trial budget x rows per trial) a local run evaluates in the driver:
# starting and stopping a local Ray costs 5-7 s, more than a second core saves on the
# simulation of so few rows (benchmarks/search_strategies.py: 2,000 trials x 288 rows of the
# 12-axis space simulate in about 4 s of one CPU).








def _tell_fn():
    """Optuna's tell without the deep copy of the trial that `Study.tell` returns (a third of
    the cost of 2,000 tells); `Study.tell` where Optuna's internals differ."""
    try:
        from optuna.study._tell import _tell_with_warning
    except ImportError:  # pragma: no cover - another Optuna
        return lambda study, number, values=None, state=None: study.tell(number, values, state)
    return lambda study, number, values=None, state=None: _tell_with_warning(
        study, number, values, state)


def _tell(study, trial, front, TrialState, create_trial, dists, tell=None) -> None:
    """Tell a trial its layout's best (several objectives: its front; extra points as trials)."""
    tell = tell or _tell_fn()
    if not front:
        tell(study, trial.number, state=TrialState.PRUNED)
        return
    tell(study, trial.number, list(front[0]))
    for values in front[1:]:
        study.add_trial(create_trial(params=trial.params, distributions=dists,
                                     values=list(values), user_attrs={FRONT_ATTR: trial.number}))


def _eval_layouts(space_offsets, bases, simulate, check, prices, cost_unit) -> pd.DataFrame:
    """Ray task: all rows of the sub-grids at `bases`, in order (rows_per_trial each)."""
    space, offsets = space_offsets
    ids = (np.asarray(bases, dtype=np.int64)[:, None] + offsets[None, :]).ravel()
    return add_costs(evaluate(space.frame_of_ids(ids), simulate, check), prices, cost_unit)


def _layout_results(rows: pd.DataFrame, bases, nest: Nesting, obj_cols, signs) -> dict:
    """{base: front} where front is a list of objective tuples (best first); [] = none fits."""
    n = nest.rows_per_trial
    vals = rows.reindex(columns=obj_cols).to_numpy(dtype=float)  # absent: nothing simulated
    ok = (rows["status"] == "ok").to_numpy() & np.isfinite(vals).all(axis=1)
    out = {}
    for i, b in enumerate(bases):
        sl = slice(i * n, (i + 1) * n)
        out[b] = _front(vals[sl][ok[sl]], signs)
    return out


def _front(vals: np.ndarray, signs: np.ndarray) -> list:
    if not len(vals):
        return []
    if len(signs) == 1:
        v = vals[np.argmin(vals[:, 0] * signs[0])]
        return [(float(v[0]),)]
    keyed = vals * signs
    pts = np.unique(keyed[pareto_mask(keyed)], axis=0)
    pts = pts[np.argsort(pts[:, 0], kind="stable")] * signs
    return [tuple(float(x) for x in p) for p in pts]


def _known_layouts(store: ResultStore, nest: Nesting, obj_cols, signs):
    """Layouts evaluated by earlier runs (from the parts) and the tally of their rows."""
    known, tally = {}, Tally()
    cols = ["config_id", "status", "invalid_reason"] + obj_cols
    for bid in sorted(store.batches):
        if not store.batches[bid].get("file"):  # a round of layouts already known
            continue
        path = store.parts_dir / store.batches[bid]["file"]
        if not pq.read_metadata(path).num_rows:
            continue
        df = _read_columns(path, cols)
        tally.add(df)
        n = nest.rows_per_trial
        bases = (df["config_id"].to_numpy()[::n] - nest.offsets[0]).tolist()
        known.update(_layout_results(df, bases, nest, obj_cols, signs))
    return known, tally


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary-encoded (compact) string columns as plain strings."""
    return pa.Table.from_arrays(
        [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
         for c in table.columns], names=table.column_names)


def _read_columns(path: Path, cols: list[str]) -> pd.DataFrame:
    """These columns of a part (NaN where a part has none: no row of it was simulated)."""
    have = set(pq.read_schema(path).names)
    df = pq.read_table(path, columns=[c for c in cols if c in have]).to_pandas()
    for c in cols:
        if c not in df.columns:
            df[c] = np.nan
    return df[cols]


# ---------------------------------------------------------------------------------------------
# Assembly by streaming the parts
# ---------------------------------------------------------------------------------------------
def _assemble(store: ResultStore, cfg, space, t0: float, evaluated: int):
    """Publish the parts as the results dataset, as the grid does: each part hard-linked
    into results.parquet/ (one whose columns differ, e.g. a round with no valid row, is
    rewritten with the missing columns as nulls), the ranks of the best rows and the Pareto
    set in its metadata. Ranking reads only the objective columns of the parts; the rows the
    driver keeps (top N and Pareto set) are read back by config_id."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    s = cfg.search
    obj_cols = [OBJECTIVES[o][0] for o in s.objectives]
    bids = [b for b in sorted(store.batches) if store.batches[b].get("file")]
    paths = [store.parts_dir / store.batches[b]["file"] for b in bids]
    proj_cols = ["config_id", "status"] + obj_cols
    schemas = [pq.read_schema(p) for p in paths]
    schema = pa.unify_schemas(schemas, promote_options="permissive").remove_metadata() \
        if schemas else pa.schema([])
    if paths:  # one scan of the projection (a part without a column reads it as nulls)
        scan = pads.dataset([str(p) for p in paths], format="parquet", schema=schema)
        have = [c for c in proj_cols if c in schema.names]
        proj = _plain(scan.to_table(columns=have)).to_pandas()
        for c in proj_cols:
            if c not in proj.columns:
                proj[c] = np.nan
        part_of = np.repeat(np.arange(len(paths)),
                            [pq.read_metadata(p).num_rows for p in paths])
    else:
        proj = pd.DataFrame({c: pd.Series(dtype=float) for c in proj_cols})
        part_of = np.zeros(0, dtype=np.int64)
    proj = rank(proj[proj_cols], s.objectives)
    keep_mask = (proj["rank"].notna() & (proj["rank"].fillna(0) <= max(s.top, 10))).to_numpy() \
        | proj["pareto"].to_numpy()
    kept = proj[keep_mask]
    items = []
    for p, sch in zip(paths, schemas):
        if sch.remove_metadata().equals(schema):
            items.append(("file", p))
            continue
        table = pq.read_table(p)
        for f in schema:
            if f.name not in table.column_names:
                table = table.append_column(f.name, pa.nulls(len(table), f.type))
        items.append(("table", table.select(schema.names).cast(schema)))
    top = pd.DataFrame({"rank": pd.Series(dtype="Int64"), "pareto": pd.Series(dtype=bool),
                        "status": pd.Series(dtype=object)})
    if len(kept):  # the kept rows, from the parts that hold them only
        ids = pa.array(kept["config_id"].to_numpy())
        table = pads.dataset([str(paths[i]) for i in np.unique(part_of[keep_mask])],
                             format="parquet", schema=schema) \
            .to_table(filter=pc.field("config_id").isin(ids))
        top = _plain(table).to_pandas()
        marks = kept.set_index("config_id")
        top["rank"] = pd.array(marks.loc[top["config_id"], "rank"].to_numpy(), dtype="Int64")
        top["pareto"] = marks.loc[top["config_id"], "pareto"].to_numpy(dtype=bool)
        top = top.sort_values(["rank", "config_id"], kind="stable", na_position="last") \
            .reset_index(drop=True)
    ranks = [[int(c), int(r)] for c, r in zip(kept["config_id"], kept["rank"]) if pd.notna(r)]
    store._publish(items, int(len(proj)), {
        "space": space.name, "strategy": "optuna", "objectives": s.objectives,
        "axes": space.axis_names, "columns": list(schema.names) + ["rank", "pareto"],
        "constants": {}, "counts": counts(proj), "ranks": ranks,
        "pareto": [int(c) for c in kept.loc[kept["pareto"], "config_id"]]})
    write_tables(top, store.dir, s.objectives, s.top)
    pareto = top[top["pareto"]].sort_values("rank") if len(s.objectives) > 1 \
        else pd.DataFrame()
    return Outcome(out_dir=store.dir, seconds=time.perf_counter() - t0, evaluated=evaluated,
                   objectives=s.objectives, config_cols=config_cols(space), strategy="optuna",
                   top=top, pareto=pareto, counts=counts(proj))
