"""Grid strategy: every candidate of the space, in vectorized batches, resumable.

The product of the space is cut into batches of `batch_size` consecutive config ids. Each batch
is one Ray task that builds its configurations, prunes them with the rules (vectorized), skips
those a bound rules out (`search.prune`, prune.py: out of memory, or out of the top K given
the K-th best the driver sends with the batch), simulates the survivors and writes them as its
part; the driver records each part in the manifest (with its counters) and a re-run skips
recorded batches. Tasks are retried when their worker dies (`max_retries`); the driver only
ever records a batch id once, so nothing is lost or counted twice. A grid evaluated in the
driver hands each part to a writer thread (`GridWriter`) and records it once written.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim_core.frameworks import resolve_frame

from ..errors import Interrupted, SweepError
from ..results import (
    Leaderboard, ResultStore, add_costs, constant_columns, objective_columns, row_prices,
    write_part_file, write_ranked_tables,
)
from .direct import DirectBatch
from .evaluate import (
    Bounds, evaluate_batch, evaluate_simulated, is_default, model_info, model_key,
)
from .runtime import DriverExecutor, executor, progress_bar
from .space import Census, Space, normalise, require_valid
from .strategy import Outcome, SearchJob, config_cols

DEFAULT_GRID_BATCH = 20_000


MAX_GRID_BATCH = 200_000


# a grid runs in the driver (no --address, no Ray running) when the driver would finish it
# before a local Ray pays off: starting and stopping one costs about RAY_START_S, so with c CPUs
# for Ray it saves time only when T > RAY_START_S + T / c, i.e. T > RAY_START_S * c / (c - 1),
# T being the driver's own time. T is estimated per space, before any batch runs: every
# candidate costs CANDIDATE_S (ids, digits, the structural rules' table, counters), and each one
# that passes the structural rules and is not a no-op repeat (`Space.framed_fraction`) costs
# FRAMED_S more (its Batch, the rules, the bounds, the simulation, its part). Both fitted on the
# two grids of benchmarks/search_scale.py in the driver (issue 37, 2026-11-27, the Batch and
# the per-candidate work from the ids' digits, load 1.1-1.4): 3.3M candidates, 1.22M framed,
# 3.9 s; 29.5M candidates, 1.19M framed, 5.7 s. So the
# 29.5M grid (96% invalid or repeats) runs in the driver and the 10^9 one on Ray. Below
# IN_PROCESS_CANDIDATES the driver is taken whatever the CPUs.
RAY_START_S = 6.0
CANDIDATE_S = 7e-8
FRAMED_S = 3.0e-6
IN_PROCESS_CANDIDATES = 250_000


def driver_seconds(space: Space) -> float:
    """Seconds of one CPU the driver would spend on the whole grid (see above)."""
    return space.size * (CANDIDATE_S + space.framed_fraction() * FRAMED_S)


def runs_in_driver(space: Space, cpus: int) -> bool:
    """Whether the driver evaluates the grid itself rather than a local Ray with `cpus` CPUs."""
    if cpus <= 1 or space.size <= IN_PROCESS_CANDIDATES:
        return True  # one CPU: a local Ray only adds its start
    return driver_seconds(space) <= RAY_START_S * cpus / (cpus - 1)


def grid_batch_size(size: int, in_driver: bool = False) -> int:
    """Candidates per batch: at least 32 batches for the workers of a cluster; in the driver,
    where nothing runs beside them, about 16, larger (each batch pays the simulator's fixed
    cost per call, three times with the memory bound's passes: 3.3M candidates in 3.1 s
    instead of 3.8 s). The batches are what the memory bound prunes within, so other
    boundaries prune other out-of-memory rows: the rows that fit, their predictions and
    ranks do not change, the count of out-of-memory rows simulated rather than pruned does
    (3.3M grid: 283,702 instead of 283,260 of 893,608)."""
    if in_driver:
        return int(min(MAX_GRID_BATCH, max(DEFAULT_GRID_BATCH, size // 16)))
    return int(min(MAX_GRID_BATCH, max(DEFAULT_GRID_BATCH, size // 32)))




@dataclass
class GridJob:
    """What every grid task needs besides its range: where and how to write its part, and what
    to send back (counters, local top K, local Pareto set)."""

    parts_dir: str
    fingerprint: str
    prices: dict
    cost_unit: str
    objectives: list
    keep: int
    constants: dict
    prune: bool = True  # pruning by bounds (search.prune); the time bound: one objective only
    # in the driver: the part is not written by the task but handed back (entry["write"]) for
    # the driver's writer thread (GridWriter), so that its encoding overlaps the next batch
    write_behind: bool = False


def part_counts(status: np.ndarray, duplicate: int = 0, invalid: int = 0) -> dict:
    """A batch's counters from the status of its evaluated rows; `invalid`: rows ruled out
    before evaluation (not in `status`), `duplicate`: no-op repeats skipped."""
    seen = pd.Series(status, dtype=object).value_counts()  # one hashed pass, not 4 compares
    ok, oom = int(seen.get("ok", 0)), int(seen.get("oom", 0))
    memory, late = int(seen.get("pruned_memory", 0)), int(seen.get("pruned_time", 0))
    n = len(status) + invalid
    return {"total": n + duplicate, "invalid": n - ok - oom - memory - late, "oom": oom,
            "simulated": ok + oom, "ok": ok, "duplicate": duplicate, "pruned": memory + late,
            "pruned_memory": memory, "pruned_time": late}


def count_reasons(late: np.ndarray, early: np.ndarray | None = None,
                  codes: np.ndarray | None = None, table: np.ndarray | None = None) -> pd.Series:
    """Invalid rows by reason, as `pd.Series(concat(late, early)).value_counts()` gives them
    (count descending, first seen first among equal counts). `late`: the reasons of the rows
    the rules judged; `early`: those of the rows the structural rules ruled out, or instead
    their combination indexes `codes` into the reasons `table` (`Space.structural_codes`):
    counted by combination, not hashed string by string (most of a large grid's rows)."""
    if codes is None:
        early = np.zeros(0, dtype=object) if early is None else early
        # counted as Python objects: typing 10^5 strings as a str column first cost more
        return pd.Series(np.concatenate([late, early]), dtype=object).value_counts()
    total: dict = {}
    first: dict = {}
    if len(late):
        seen = pd.Series(late, dtype=object).value_counts(sort=False)  # first-seen order
        for pos, (text, k) in enumerate(seen.items()):
            total[text], first[text] = int(k), pos
    if len(codes):
        per = np.bincount(codes)
        used = np.flatnonzero(per)
        head = np.full(len(per), len(codes), dtype=np.int64)  # first row of each combination
        head[codes[::-1]] = np.arange(len(codes) - 1, -1, -1, dtype=np.int64)  # first wins
        for c in used[np.argsort(head[used], kind="stable")]:
            text = table[c]
            total[text] = total.get(text, 0) + int(per[c])
            first.setdefault(text, len(late) + int(head[c]))
    keys = sorted(total, key=first.__getitem__)  # first-seen order, as value_counts finds it
    out = pd.Series([total[t] for t in keys], index=pd.Index(keys, dtype=object),
                    dtype=np.int64, name="count")
    return out.sort_values(ascending=False, kind="stable")


def _evaluate_kept(space: Space, ids, keep, kept, simulate, check, job: GridJob, threshold):
    """(stored rows, status, invalid_reason) of a batch's candidates that pass the structural
    rules and are not no-op repeats (`keep`, their digits `kept`)."""
    # the default model on a space whose Batch can be had from the digits (direct.py): no
    # frame but for the rows stored
    direct = DirectBatch.of(space) if is_default(simulate, check) else None
    frame = None if direct is not None else space.frame_of_ids(ids[keep], kept)
    bounds = None
    if job.prune and is_default(simulate, check):
        single = len(job.objectives) == 1
        if direct is not None:
            price = direct.prices(kept, job.prices) if direct.has_gpu else None
        else:
            price = row_prices(frame, job.prices).to_numpy(dtype=np.float64) \
                if "gpu" in frame.columns else None
        bounds = Bounds(space.subspace_ids(ids[keep], kept), job.objectives[0],
                        threshold if single else None, price, job.cost_unit)
    # only the simulated rows become a frame; the others are counted from their status
    if direct is not None:
        sim, status, why = evaluate_batch(
            direct.batch(kept), direct.reasons(kept),
            lambda rows: direct.frame_columns(ids[keep][rows], [d[rows] for d in kept], kept),
            direct.inputs, bounds)
    else:
        sim, status, why = evaluate_simulated(frame, simulate, check, bounds)
    return sim, status, why


def _empty_part(space: Space, simulate, check, job: GridJob):
    """(stored rows, local top K, local Pareto set) of a batch with no candidate left after the
    structural rules: empty frames whose columns are the space's, the same for every such
    batch, so evaluated once per space and job (most batches of a grid that is mostly invalid)."""
    memo = space.__dict__.setdefault("_empty_parts", {})
    key = (id(simulate), id(check), tuple(job.objectives), job.keep, job.cost_unit, job.prune)
    if key not in memo:
        none = np.zeros(0, dtype=np.int64)
        sim, _, _ = evaluate_simulated(space.frame_of_ids(none, [none] * len(space.axes)),
                                       simulate, check, None)
        sim = add_costs(sim, job.prices, job.cost_unit)
        memo[key] = (sim, *Leaderboard(job.objectives, job.keep).local(sim))
    return memo[key]


def _eval_part(space: Space, bid: int, start: int, stop: int, simulate, check, job: GridJob,
               threshold: float | None = None):
    """One grid batch inside a Ray worker: evaluate, write the simulated rows as a part of the
    results folder (a path every node sees), return only counters and local top K / Pareto.
    threshold: the K-th best value of the (only) objective known when the batch was sent, for
    the time bound."""
    ids = np.arange(start, stop, dtype=np.int64)
    digits = space.range_digits(start, stop)  # once per batch: every step below reads them
    # the structural rules' reasons by combination of the axes they read, and the no-op
    # repeats, from the digits alone where the space allows (no column per candidate)
    coded = space.structural_codes(digits) if is_default(simulate, check) else None
    dup = space.noop_repeats(digits) if coded is not None else None
    pre = code = None  # reasons of the structural rules, checked before any frame is built
    if coded is not None and dup is not None:
        code, table = coded
        passed = (table == "")[code]
    else:
        cols = space.structural_columns(ids, digits)
        if cols is not None:
            dup = space.duplicates(cols, digits)
            if is_default(simulate, check):  # divisibility decided before any frame is built
                pre = space.structural_reasons(digits)  # once per combination of the axes
                if pre is None:
                    pre = space.precheck(cols)
        else:
            dup = space.duplicates(space.frame_of_ids(ids, digits), digits)
    if code is None:
        passed = np.ones(len(ids), dtype=bool) if pre is None else pre == ""
    keep = ~dup & passed
    kept = [d[keep] for d in digits]
    if keep.any():
        sim, status, why = _evaluate_kept(space, ids, keep, kept, simulate, check, job,
                                          threshold)
        sim = add_costs(sim, job.prices, job.cost_unit)
        top, pareto = Leaderboard(job.objectives, job.keep).local(sim)
    else:  # nothing reaches the rules: the empty part of this space, evaluated once
        sim, top, pareto = _empty_part(space, simulate, check, job)
        status = why = np.zeros(0, dtype=object)
    bad = status == "invalid"
    early_rows = ~dup & ~passed
    early_n = int(early_rows.sum()) if pre is not None or code is not None else 0
    if code is not None:
        reasons = count_reasons(why[bad], codes=code[early_rows], table=table)
    else:
        reasons = count_reasons(why[bad], None if pre is None else pre[early_rows])
    name = f"g{bid:06d}"
    info = {"start": start, "stop": stop,
            "counts": part_counts(status, int(dup.sum()), early_n),
            "reasons": {str(k): int(v) for k, v in reasons.items()}}
    path = Path(job.parts_dir) / f"{name}.parquet"
    if not len(sim):  # nothing simulated: only the counters are recorded, no part file
        return {"file": "", "rows": 0, "sha256": "", **info}, top.iloc[:0], pareto.iloc[:0]
    meta = {"batch_id": name, "fingerprint": job.fingerprint, "columns": list(sim.columns),
            **info}
    if job.write_behind:
        return {"file": f"{name}.parquet", "rows": int(len(sim)), "sha256": "", **info,
                "write": (path, sim, meta, job.constants)}, top, pareto
    try:
        digest = write_part_file(path, sim, meta, job.constants)
    except OSError as exc:  # full disk, ...: the driver stops with one line, keeping the rest
        return {"error": str(path), "errno": exc.errno, "strerror": exc.strerror or str(exc)}, \
            None, None
    entry = {"file": f"{name}.parquet", "rows": int(len(sim)), "sha256": digest, **info}
    return entry, top, pareto




def grid_constants(space: Space) -> dict:
    """Columns with one value across the whole space: stored once in the results metadata.

    Input columns only (the simulator's outputs are never assumed constant): those of a probe
    frame that varies every axis through all its values, one axis at a time, after the
    framework defaults are resolved and no-op settings normalised. A grid part keeps only simulated rows, so `valid` and
    `invalid_reason` are constant too. A worker checks every row against these."""
    probe = [0]
    for k, (_, values) in enumerate(space.axes):
        stride = int(np.prod([len(v) for _, v in space.axes[k + 1:]], dtype=np.int64))
        probe += [j * stride for j in range(1, len(values))]
    frame = normalise(resolve_frame(space.frame_of_ids(sorted(set(probe)))))
    axes = set(space.axis_names)
    # a column derived from axes may look constant along each axis alone and still vary
    # jointly (vpp normalised at pp 1, a framework default set only at tp > 1): never constant
    from sim_core.frameworks import profile_fields

    from .space import NOOPS

    depends = {"num_gpus": {"nodes", "gpus_per_node", "instance"},
               "global_batch": {"global_batch_tokens", "seq_len"},
               **{f: {"framework", "tp"} for f in profile_fields()}}
    for setting, size, _ in NOOPS:
        depends[setting] = depends.get(setting, set()) | {size, setting}
    consts = {c: v for c, v in constant_columns(frame, exclude=("config_id",)).items()
              if c not in axes and not depends.get(c, set()) & axes}
    return {**consts, "valid": True, "invalid_reason": ""}


def run_grid(job: SearchJob) -> Outcome:
    """The grid strategy (strategy.py's interface)."""
    outcome = _run_grid(job.cfg, job.space, job.out, job.workers, job.address, job.simulate,
                        job.check, job.progress, job.fresh, job.on_batch)
    outcome.note = "\n".join(x for x in (job.chosen, outcome.note) if x)
    return outcome


def _run_grid(cfg, space, out, workers, address, simulate, check, progress, fresh, on_batch):
    t0 = time.perf_counter()
    s = cfg.search
    # in the driver or on Ray (decided once: it also sizes the batches)
    small = runs_in_driver(space, workers or os.cpu_count() or 1) and not address
    bs = s.batch_size or grid_batch_size(space.size, in_driver=small)
    prune = bool(s.prune) and is_default(simulate, check)
    # pruned rows are not stored, and the time bound depends on the objective and K
    pruning = {"prune": [s.objectives[0] if len(s.objectives) == 1 else None,
                         max(s.top, TOP_KEPT)]} if prune else {}
    fp = space.fingerprint(strategy="grid", batch_size=bs, **model_key(simulate), **pruning)
    store = ResultStore(out, fp, {"space": space.name, "strategy": "grid",
                                  "batch_size": bs, **model_info(simulate)}).open(fresh)
    batches = space.batches(bs)
    keep = max(s.top, TOP_KEPT)
    board = Leaderboard(s.objectives, keep)
    constants = grid_constants(space)
    prices = space.prices()
    job = GridJob(str(store.parts_dir), fp, prices, s.cost_unit, s.objectives, keep, constants,
                  prune)
    # finished batches of an earlier run: their counters are in the manifest, their top K and
    # Pareto set are read back from their part (one part at a time: bounded memory)
    for bid, entry in sorted(store.batches.items()):
        if "counts" not in entry:
            continue
        if not entry.get("file"):
            board.add(pd.DataFrame(), pd.DataFrame(), entry["counts"], entry.get("reasons"))
            continue
        top, par = board.local(_read_part(store, bid, constants))
        board.add(top, par, entry["counts"], entry.get("reasons"))
    done = {b for b, e in store.batches.items() if "counts" in e}
    todo = [b for b in batches if f"g{b[0]:06d}" not in done]
    done_rows = sum(stop - start for i, start, stop in batches if f"g{i:06d}" in done)
    evaluated = 0
    columns = _part_columns(store, done)
    if todo:
        with executor(workers, address, space.size, space.size if small else 0) as ex:
            if is_default(simulate, check):
                DirectBatch.of(space)  # its tables built once, and shipped with the space
            writer = GridWriter(store) if isinstance(ex, DriverExecutor) else None
            space_ref = ex.put(space)
            job_ref = ex.put(replace(job, write_behind=True) if writer else job)
            bar = progress_bar(space.size, done_rows, "cfg", progress)
            pending: dict = {}
            queue = list(todo)
            try:
                while queue or pending:
                    # one task more than workers: the next starts while the driver merges
                    while queue and len(pending) < ex.cap + 1:
                        bid, start, stop = queue.pop(0)
                        ref = ex.submit(_eval_part, space_ref, bid, start, stop, simulate, check,
                                        job_ref, _kth_best(board, prune))
                        pending[ref] = (bid, start, stop)
                    for ref in ex.wait(pending):
                        bid, start, stop = pending.pop(ref)
                        entry, top, par = ex.get(ref)
                        if "error" in entry:
                            _drain(ex, pending, store, board)
                            raise store._write_error(
                                Path(entry["error"]), OSError(entry["errno"], entry["strerror"]))
                        if writer is not None:  # recorded once written, in order
                            writer.submit(f"g{bid:06d}", entry)
                            writer.record_finished()
                        else:
                            store.record_part(f"g{bid:06d}", entry)
                        board.add(top, par, entry["counts"], entry["reasons"])
                        if columns is None and len(top.columns):
                            columns = list(top.columns)
                        evaluated += stop - start
                        bar.update(stop - start)
                        if on_batch is not None:
                            on_batch(bid, len(store.done) + (writer.pending if writer else 0))
                if writer is not None:
                    writer.close()
            except KeyboardInterrupt:
                # no ray.cancel: force-cancelling a task that is completing can crash Ray's
                # core worker ("Tried to complete task that was not pending"); a local Ray's
                # shutdown stops the tasks, and on a cluster a task in flight only finishes
                # its batch and writes its part atomically (a re-run records or redoes it)
                bar.close()
                if writer is not None:
                    writer.close(interrupted=True)  # the parts being written are recorded
                store.flush()  # every batch recorded so far is kept
                raise Interrupted(len(store.done), len(batches), str(store.dir)) from None
            except SweepError:
                # the driver cannot record (full disk for the manifest): let the tasks in
                # flight finish their atomic writes, so that no temp file is left behind
                if writer is not None:
                    writer.close(interrupted=True)
                _drain(ex, pending, store, board, record=False)
                bar.close()
                raise
            except BaseException:
                if writer is not None:
                    writer.close(interrupted=True)
                raise
            bar.close()
            store.flush()
    if board.counts["simulated"] == 0:
        c = board.counts
        require_valid(Census(c["total"], 0, Counter(board.reasons)), space.name)
    return _finish_grid(store, cfg, space, board, constants, columns, t0, evaluated)


class GridWriter:
    """Writes the parts of the batches the driver evaluates itself on one background thread,
    so that their encoding (pyarrow releases the GIL) overlaps the next batch; records each
    in the manifest once written, in batch order (optuna_strategy.PartWriter's way). A batch
    counts as done only once recorded: a re-run redoes one whose write did not finish."""

    def __init__(self, store: ResultStore):
        from concurrent.futures import ThreadPoolExecutor

        self.store = store
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweep-grid-parts")
        self.queue: list = []  # (batch id, entry, future or None), in submission order

    @property
    def pending(self) -> int:
        return len(self.queue)

    def submit(self, batch_id: str, entry: dict) -> None:
        """A batch's entry; its part (entry["write"]: path, rows, metadata, constants) is
        written in the background."""
        write = entry.pop("write", None)
        fut = self.pool.submit(write_part_file, *write) if write is not None else None
        self.queue.append((batch_id, entry, fut))

    def record_finished(self, wait: bool = False) -> None:
        """Record the parts written so far, in order (all of them when `wait`)."""
        while self.queue:
            batch_id, entry, fut = self.queue[0]
            if fut is not None and not (wait or fut.done()):
                return
            self.queue.pop(0)
            if fut is not None:
                try:
                    entry["sha256"] = fut.result()
                except OSError as exc:  # full disk, ...: one line, the rest is kept
                    self._drop_queue()
                    raise self.store._write_error(self.store.part_path(batch_id), exc) \
                        from None
            self.store.record_part(batch_id, entry)

    def _drop_queue(self) -> None:
        for _, _, fut in self.queue:
            if fut is not None:
                fut.cancel()
        self.queue.clear()
        self.pool.shutdown(wait=True)

    def close(self, interrupted: bool = False) -> None:
        """Wait for the writes in flight and record them (after an interruption too: they
        are complete files)."""
        try:
            self.record_finished(wait=True)
        except SweepError:
            if not interrupted:
                raise
        finally:
            self.pool.shutdown(wait=True)


def _kth_best(board: Leaderboard, prune: bool) -> float | None:
    """The K-th best value of the only objective so far (the time bound's threshold); None
    with several objectives, without pruning, or before K rows fit."""
    if not prune or len(board.objectives) != 1 or len(board.top) < board.keep:
        return None
    col = objective_columns(board.objectives)[0][0]
    return float(board.top[col].iloc[board.keep - 1])


def _drain(ex, pending: dict, store: ResultStore, board, record: bool = True) -> None:
    """Let the tasks in flight finish after one failed to write its part, and record those
    that wrote theirs (results arrive in any order: a batch finished before the failing one
    must not be redone on resume). What cannot be recorded is redone by a re-run."""
    for ref, (entry, top, par) in ex.finished(pending):
        bid = pending[ref][0]
        if "error" in entry or not record:
            continue
        try:
            store.record_part(f"g{bid:06d}", entry)
        except (OSError, SweepError):  # the manifest cannot be written either
            break
        board.add(top, par, entry["counts"], entry["reasons"])
    pending.clear()
    if record:
        try:
            store.flush()
        except SweepError:
            pass


TOP_KEPT = 100  # ranked rows the driver keeps (at least search.top)


def _read_part(store: ResultStore, bid: str, constants: dict) -> pd.DataFrame:
    df = pd.read_parquet(store.parts_dir / store.batches[bid]["file"])
    for c, v in constants.items():
        if c not in df.columns:
            df[c] = v
    for c in df.columns:
        if isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype(str)
    return df


def _part_columns(store: ResultStore, done) -> list | None:
    """Column order of the parts (kept in each part's metadata), from a finished one."""
    from ..results import read_metadata

    for bid in sorted(done):
        if not store.batches[bid].get("file"):
            continue
        cols = read_metadata(store.parts_dir / store.batches[bid]["file"]).get("columns")
        if cols:
            return list(cols)
    return None


def _finish_grid(store, cfg, space, board, constants, columns, t0, evaluated) -> Outcome:
    import pyarrow.dataset as pads

    s = cfg.search
    files = [str(store.parts_dir / store.batches[b]["file"]) for b in sorted(store.batches)
             if store.batches[b].get("file")]
    obj = [c for c, _ in objective_columns(s.objectives)]

    def scan():
        dataset = pads.dataset(files, format="parquet")
        for batch in dataset.to_batches(columns=obj + ["config_id", "status"],
                                        batch_size=1 << 20):
            yield batch.to_pandas()

    top, pareto = board.ranked(scan)
    ranks = [[int(c), int(r)] for c, r in zip(top["config_id"], top["rank"])]
    ranks += [[int(c), int(r)] for c, r in zip(pareto["config_id"], pareto["rank"])
              if int(c) not in set(top["config_id"].astype(int))] if len(pareto) else []
    columns = columns or list(top.columns)
    columns = [c for c in columns if c not in ("rank", "pareto")]
    store.finalize_parts({"space": space.name, "strategy": "grid", "objectives": s.objectives,
                          "axes": space.axis_names, "columns": columns,
                          "constants": constants, "counts": board.counts,
                          "invalid_reasons": dict(sorted(board.reasons.items(),
                                                         key=lambda kv: -kv[1])),
                          "ranks": ranks,
                          "pareto": [int(c) for c in pareto["config_id"]] if len(pareto) else []})
    write_ranked_tables(top, pareto, store.dir, s.objectives, s.top)
    return Outcome(store.dir, time.perf_counter() - t0, evaluated, s.objectives,
                   config_cols(space), "grid", top=top,
                   pareto=pareto if len(s.objectives) > 1 else pd.DataFrame(),
                   counts=dict(board.counts), reasons=dict(board.reasons))

