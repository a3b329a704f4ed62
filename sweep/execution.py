"""Running a sweep on Ray: grid batches or an Optuna study, resumable, with progress.

Grid: the product of the space is cut into batches of `batch_size` consecutive config ids.
Each batch is one Ray task that builds its configurations, prunes them with the rules
(vectorized), skips those a bound rules out (`search.prune`, sweep/prune.py: out of memory, or
out of the top K given the K-th best the driver sends with the batch), simulates the survivors
and writes them as its part; the driver records each part in the manifest (with its
counters) and a re-run skips recorded batches. Tasks are retried when their worker dies
(`max_retries`); the driver only ever records a batch id once, so nothing is lost or counted
twice.

Optuna: see `sweep.optuna_search` (nested trials in ask/tell rounds). `strategy: auto` picks
one of the two by the size of the space and the CPUs at hand (`choose_strategy`).

The simulate function (default `sim_core.simulate_frame`) and the rule check (default
`sim_core.check_rules`) are parameters, so tests can inject fakes.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim_core.frameworks import resolve_frame

from .config import SpaceConfig
from .errors import Interrupted, SweepError
from .results import (
    Leaderboard, ResultStore, add_costs, best, constant_columns, counts, gpu_prices, objective_columns, rank,
    read_results, summary_text, write_part_file, write_ranked_tables, write_tables,
)
from .prune import objective_bound, simulate_with_memory_bound, worse_than
from .space import (
    Census, Space, census, normalise, require_valid, rule_reasons, sim_frame,
)

# candidate configurations per Ray task: a 32nd of the space, within these bounds. Larger tasks
# amortise the per-task cost (frames, rules, simulator calls, a part file, a merge in the
# driver): on the 3.3M-candidate space of benchmarks/search_scale.py, 2 cores, tasks of 51,840
# took 24-25 s end to end, of 103,680 18-21 s, of 207,360 18.5-20 s; a worker peaks near
# 360 MiB at 200k. At least 32 tasks keep a small cluster busy; the size does not depend on
# the worker count, so that a run resumes on another cluster (it is in the fingerprint).
DEFAULT_GRID_BATCH = 20_000
MAX_GRID_BATCH = 200_000


def grid_batch_size(size: int) -> int:
    return int(min(MAX_GRID_BATCH, max(DEFAULT_GRID_BATCH, size // 32)))


# strategy auto: the grid's rate per CPU (benchmarks/search_strategies.py, 3.3M space on two
# cores: about 20,000 configurations/s per CPU) and how long a grid may take before Optuna wins
GRID_RATE_PER_CPU = 20_000
GRID_AUTO_SECONDS = 10
TASK_RETRIES = 3


# ---------------------------------------------------------------------------------------------
# Evaluation of one frame (runs inside Ray tasks, and directly for `sweep simulate`)
# ---------------------------------------------------------------------------------------------
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
        self.version = profiles.load_manifest(profiles.profile_dir(name_or_path))["version"]

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        import sim_core
        from sim_core import profiles

        profiles.activate_packed(self.blob)
        return sim_core.simulate_frame(frame)


def _model_key(simulate) -> dict:
    """Fingerprint entry for a calibrated simulator (none for the default model)."""
    version = getattr(simulate, "version", None)
    return {"profile": version} if version else {}


def evaluate(frame: pd.DataFrame, simulate=None, check=None, prune=None) -> pd.DataFrame:
    """Rules, then simulation of the valid rows; one output row per input row.

    Adds the simulator's columns (NaN for invalid rows), `status` (ok | oom | invalid) and
    `invalid_reason` ('' unless invalid). With `prune` (a `Bounds`, default simulator only),
    valid rows that a bound proves out of memory or out of the top K are not simulated: status
    pruned_memory or pruned_time (sweep/prune.py).
    """
    # the framework's defaults are resolved here, so that results show the values simulated;
    # no-op settings (sequence parallelism at tp 1, ...) are normalised, not invalid
    out = normalise(resolve_frame(frame.reset_index(drop=True)))
    n = len(out)
    pruned = np.full(n, "", dtype=object)
    if _is_default(simulate, check):
        reasons, pred = _rules_and_simulation(out, prune, pruned)
    else:
        reasons = rule_reasons(out, check)
        pred = None
    ok = reasons == ""
    cols: dict[str, np.ndarray] = {}
    if ok.any():
        if pred is None and not _is_default(simulate, check):
            sim = simulate or default_simulate()
            pred = sim(sim_frame(out.loc[ok]))
        if pred is None:  # every valid row pruned by a bound: nothing simulated
            pred = pd.DataFrame(index=pd.RangeIndex(0))
        pos = pred.index.to_numpy()  # the rows simulated (all valid ones unless pruned)
        for c in pred.columns:
            if c in out.columns and c != "dp":
                continue
            v = pred[c].to_numpy()
            if v.dtype == bool:
                full = np.zeros(n, dtype=bool)
            elif v.dtype.kind in "iuf":
                full = np.full(n, np.nan)
            else:
                full = np.full(n, "" if c == "invalid_reason" else None, dtype=object)
            full[pos] = v
            cols[c] = full
    valid = ok.copy()
    if "valid" in cols:
        simulated = np.zeros(n, dtype=bool)
        simulated[pred.index.to_numpy()] = True
        valid &= np.where(simulated, cols["valid"].astype(bool), True)
    if "invalid_reason" in cols:
        sim_reason = np.where(cols["invalid_reason"] == None, "", cols["invalid_reason"])  # noqa: E711
        reasons = np.where(ok, sim_reason, reasons).astype(object)
    cols["valid"] = valid
    fits = cols["fits"].astype(bool) & valid if "fits" in cols else np.zeros(n, dtype=bool)
    cols["fits"] = fits
    cols["invalid_reason"] = np.where(valid, "", np.where(reasons == "", "invalid", reasons))
    cols["status"] = np.where(~valid, "invalid", np.where(fits, "ok", "oom")).astype(object)
    bound = valid & (pruned != "")
    cols["status"][bound] = pruned[bound]
    extra = pd.DataFrame(cols, index=out.index)
    out = out.drop(columns=[c for c in extra.columns if c in out.columns])
    return pd.concat([out, extra], axis=1)


def _is_default(simulate, check) -> bool:
    import sim_core

    return (simulate is None or simulate is sim_core.simulate_frame) and check is None


def _rules_and_simulation(frame: pd.DataFrame, prune=None, pruned=None
                          ) -> tuple[np.ndarray, pd.DataFrame]:
    """The default rules and simulator on one Batch: the frame is turned into arrays once
    (not once for the rules and again for the simulator) and only valid rows are simulated.
    Same numbers as `rule_reasons` + `sim_core.simulate_frame`. With `prune` (a `Bounds`),
    valid rows a bound excludes are not simulated; their status goes into `pruned`."""
    from sim_core import rules
    from sim_core.columns import Batch, frame_to_batch
    from sim_core.simulate import simulate as core

    reasons = np.full(len(frame), "", dtype=object)
    if "global_batch_tokens" in frame.columns:
        bad = (frame["global_batch_tokens"] % frame["seq_len"] != 0).to_numpy()
        reasons[bad] = "global_batch_tokens % seq_len != 0"
    todo = np.flatnonzero(reasons == "")
    if not len(todo):
        return reasons, None
    sub = _with_model_shapes(sim_frame(frame.iloc[todo] if len(todo) < len(frame) else frame))
    b = frame_to_batch(sub)
    valid, why = rules.check(b)
    reasons[todo] = why
    keep = np.flatnonzero(valid)
    if not len(keep):
        return reasons, None
    vb = b if len(keep) == len(b) else Batch({k: v[keep] for k, v in b.items()})
    if prune is None:
        return reasons, pd.DataFrame(core(vb), index=sub.index[keep])
    rows = todo[keep]  # positions in the frame of the valid rows
    late = prune.time_pruned(vb, rows)
    pos, out, heavy = simulate_with_memory_bound(vb, prune.group[rows], core, skip=late)
    pruned[rows[late]] = "pruned_time"
    pruned[rows[heavy]] = "pruned_memory"
    if out is None:
        return reasons, None
    return reasons, pd.DataFrame(out, index=sub.index[keep][pos])


def _with_model_shapes(frame: pd.DataFrame) -> pd.DataFrame:
    """The model's shape columns filled from the catalog, one array per column (what
    frame_to_batch would do row group by row group, in pandas), so it skips that step."""
    from sim_core import catalog
    from sim_core.specs import MODEL_COLUMNS

    shape_cols = [c for c in MODEL_COLUMNS if c != "model"]
    if "model" not in frame.columns or any(c in frame.columns for c in shape_cols):
        return frame
    models = frame["model"].astype(str).to_numpy()
    uniq, inv = np.unique(models, return_inverse=True)
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
    """What the pruning of one batch needs (sweep/prune.py): each row's sub-space id (rows equal
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


def _eval_range(space: Space, start: int, stop: int, simulate, check) -> pd.DataFrame:
    return evaluate(space.frame(start, stop), simulate, check)


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


def part_counts(status: np.ndarray, duplicate: int = 0) -> dict:
    ok, oom = int((status == "ok").sum()), int((status == "oom").sum())
    memory, late = int((status == "pruned_memory").sum()), int((status == "pruned_time").sum())
    n = len(status)
    return {"total": n + duplicate, "invalid": n - ok - oom - memory - late, "oom": oom,
            "simulated": ok + oom, "ok": ok, "duplicate": duplicate, "pruned": memory + late,
            "pruned_memory": memory, "pruned_time": late}


def _eval_part(space: Space, bid: int, start: int, stop: int, simulate, check, job: GridJob,
               threshold: float | None = None):
    """One grid batch inside a Ray worker: evaluate, write the simulated rows as a part of the
    results folder (a path every node sees), return only counters and local top K / Pareto.
    threshold: the K-th best value of the (only) objective known when the batch was sent, for
    the time bound."""
    ids = np.arange(start, stop, dtype=np.int64)
    cols = space.structural_columns(ids)
    pre = np.full(len(ids), "", dtype=object)
    if cols is not None:
        dup = space.duplicates(cols)
        if _is_default(simulate, check):  # divisibility decided before any frame is built
            pre = space.precheck(cols)
    else:
        dup = space.duplicates(space.frame_of_ids(ids))
    keep = ~dup & (pre == "")
    frame = space.frame_of_ids(ids[keep])
    bounds = None
    if job.prune and _is_default(simulate, check):
        single = len(job.objectives) == 1
        bounds = Bounds(space.subspace_ids(ids[keep]), job.objectives[0],
                        threshold if single else None,
                        frame["gpu"].map(job.prices).to_numpy(dtype=np.float64)
                        if "gpu" in frame.columns else None, job.cost_unit)
    df = evaluate(frame, simulate, check, bounds)
    status = df["status"].to_numpy()
    bad = status == "invalid"
    early = pre[~dup & (pre != "")]
    status = np.concatenate([status, np.full(len(early), "invalid", dtype=object)])
    reasons = pd.Series(np.concatenate([df["invalid_reason"].to_numpy()[bad], early])) \
        .value_counts()
    sim = df[df["status"].isin(("ok", "oom")).to_numpy()].reset_index(drop=True)
    sim = add_costs(sim, job.prices, job.cost_unit)
    top, pareto = Leaderboard(job.objectives, job.keep).local(sim)
    name = f"g{bid:06d}"
    info = {"start": start, "stop": stop, "counts": part_counts(status, int(dup.sum())),
            "reasons": {str(k): int(v) for k, v in reasons.items()}}
    path = Path(job.parts_dir) / f"{name}.parquet"
    if not len(sim):  # nothing simulated: only the counters are recorded, no part file
        return {"file": "", "rows": 0, "sha256": "", **info}, top.iloc[:0], pareto.iloc[:0]
    try:
        digest = write_part_file(path, sim, {"batch_id": name, "fingerprint": job.fingerprint,
                                             "columns": list(sim.columns), **info}, job.constants)
    except OSError as exc:  # full disk, ...: the driver stops with one line, keeping the rest
        return {"error": str(path), "errno": exc.errno, "strerror": exc.strerror or str(exc)}, \
            None, None
    entry = {"file": f"{name}.parquet", "rows": int(len(sim)), "sha256": digest, **info}
    return entry, top, pareto


def _eval_frame(frame: pd.DataFrame, simulate, check) -> pd.DataFrame:
    return evaluate(frame, simulate, check)


def _remote(fn):
    """The Ray remote version of a task function (made per run: a RemoteFunction kept across
    ray.shutdown()/ray.init() can point at objects of the old session)."""
    import ray

    return ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(fn)


# ---------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------
@contextmanager
def ray_session(workers: int | None = None, address: str | None = None):
    """Use the running Ray, connect to `address`, or start a local one for the duration.

    Yields the number of tasks to keep in flight (--workers, else the cluster's CPUs).
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import ray

    started = False
    if not ray.is_initialized():
        quiet = dict(log_to_driver=False, logging_level=logging.ERROR)
        try:
            if address:
                ray.init(address=address, **quiet)
            else:
                # "local": always a fresh instance, never a stale /tmp/ray/ray_current_cluster
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1,
                         include_dashboard=False, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"--address {address}" if address else "local Ray"
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SweepError(f"{where}: cannot start or connect to Ray ({msg})") from None
        started = True
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        yield max(1, min(workers, cpus) if workers else cpus)
    finally:
        if started:
            ray.shutdown()


def _progress(total: int, initial: int, unit: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit=unit, unit_scale=True, disable=not enabled,
                file=sys.stderr, dynamic_ncols=True, smoothing=0.3, leave=False)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a search returns. `top` and `pareto` are the ranked rows the driver kept; the
    results themselves stay on disk (`results` reads them back, whole: for small runs)."""

    out_dir: Path
    seconds: float
    evaluated: int  # configurations evaluated by this run (not resumed ones)
    objectives: list
    config_cols: list
    strategy: str
    top: pd.DataFrame
    pareto: pd.DataFrame = field(default_factory=pd.DataFrame)
    counts: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    note: str = ""

    @property
    def results(self) -> pd.DataFrame:
        return read_results(self.out_dir)[0]

    @property
    def best(self) -> pd.DataFrame:
        return best(self.top, 1)

    def summary(self) -> str:
        text = summary_text(self.top, self.counts, self.config_cols, self.seconds,
                            self.objectives, self.out_dir, self.evaluated)
        if len(self.objectives) > 1:
            text += f"\npareto set: {len(self.pareto)} configurations (pareto.csv)"
        if self.note:
            text += "\n" + self.note
        return text


def run_search(cfg: SpaceConfig, out_dir: str | Path | None = None, *, workers: int | None = None,
               address: str | None = None, simulate=None, check=None, progress: bool = False,
               fresh: bool = False, on_batch=None) -> Outcome:
    """Run the sweep a space file describes; returns the assembled results.

    on_batch(batch_id, batches_done) is called after each batch is stored (tests use it to
    interrupt a sweep).
    """
    out = Path(out_dir) if out_dir else Path("results") / cfg.name
    space = Space.from_config(cfg)
    strategy, why = cfg.search.strategy, ""
    if strategy == "auto":
        with ray_session(workers, address) as cap:
            strategy, why = choose_strategy(space, cap)
            return _run(strategy, why, cfg, space, out, workers, address, simulate, check,
                        progress, fresh, on_batch)
    return _run(strategy, why, cfg, space, out, workers, address, simulate, check, progress,
                fresh, on_batch)


def _run(strategy, why, cfg, space, out, workers, address, simulate, check, progress, fresh,
         on_batch) -> Outcome:
    if strategy == "grid":
        outcome = _run_grid(cfg, space, out, workers, address, simulate, check, progress, fresh,
                            on_batch)
        outcome.note = "\n".join(x for x in (why, outcome.note) if x)
        return outcome
    from .optuna_search import run_optuna

    return run_optuna(cfg, space, out, workers, address, simulate, check, progress, fresh,
                      on_batch, chosen=why)


def choose_strategy(space: Space, cpus: int) -> tuple[str, str]:
    """`strategy: auto`: the grid when it finishes within GRID_AUTO_SECONDS on `cpus` CPUs
    at the measured grid rate (benchmarks/search_strategies.py), Optuna otherwise."""
    limit = GRID_RATE_PER_CPU * GRID_AUTO_SECONDS * cpus
    est = space.size / (GRID_RATE_PER_CPU * cpus)
    if space.size <= limit:
        return "grid", (f"strategy auto: grid, since the {space.size:,} candidates take about "
                        f"{est:,.0f} s on {cpus} CPUs (grid up to {limit:,.0f})")
    return "optuna", (f"strategy auto: optuna, since a grid of the {space.size:,} candidates "
                      f"would take about {est:,.0f} s on {cpus} CPUs (grid up to {limit:,.0f})")


def _config_cols(space: Space) -> list[str]:
    return space.axis_names or ["tp", "pp", "micro_batch"]


def _assemble(store: ResultStore, cfg: SpaceConfig, space: Space, t0: float, evaluated: int,
              strategy: str) -> Outcome:
    """The whole frame of the parts (the Optuna path: at most its trial budget of rows)."""
    df = store.load_parts()
    if len(df):
        sort = ["config_id", "trial"] if "trial" in df.columns else ["config_id"]
        df = df.sort_values(sort, kind="stable").drop_duplicates("config_id")
        df = df.reset_index(drop=True)
    prices = gpu_prices(df["gpu"].unique() if len(df) else [], space.price_per_hour)
    df = add_costs(df, prices, cfg.search.cost_unit)
    df = rank(df, cfg.search.objectives)
    store.finalize(df, {"space": space.name, "strategy": strategy,
                        "objectives": cfg.search.objectives, "axes": space.axis_names})
    write_tables(df, store.dir, cfg.search.objectives, cfg.search.top)
    pareto = df[df["pareto"]].sort_values("rank") if len(cfg.search.objectives) > 1 \
        else pd.DataFrame()
    return Outcome(store.dir, time.perf_counter() - t0, evaluated, cfg.search.objectives,
                   _config_cols(space), strategy, top=best(df, max(cfg.search.top, 10)),
                   pareto=pareto, counts=counts(df))


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

    depends = {"num_gpus": {"nodes", "gpus_per_node"},
               "global_batch": {"global_batch_tokens", "seq_len"},
               **{f: {"framework", "tp"} for f in profile_fields()}}
    for setting, size, _ in NOOPS:
        depends[setting] = depends.get(setting, set()) | {size, setting}
    consts = {c: v for c, v in constant_columns(frame, exclude=("config_id",)).items()
              if c not in axes and not depends.get(c, set()) & axes}
    return {**consts, "valid": True, "invalid_reason": ""}


def _run_grid(cfg, space, out, workers, address, simulate, check, progress, fresh, on_batch):
    t0 = time.perf_counter()
    s = cfg.search
    bs = s.batch_size or grid_batch_size(space.size)
    prune = bool(s.prune) and _is_default(simulate, check)
    # pruned rows are not stored, and the time bound depends on the objective and K
    pruning = {"prune": [s.objectives[0] if len(s.objectives) == 1 else None,
                         max(s.top, TOP_KEPT)]} if prune else {}
    fp = space.fingerprint(strategy="grid", batch_size=bs, **_model_key(simulate), **pruning)
    store = ResultStore(out, fp, {"space": space.name, "strategy": "grid",
                                  "batch_size": bs}).open(fresh)
    batches = space.batches(bs)
    keep = max(s.top, TOP_KEPT)
    board = Leaderboard(s.objectives, keep)
    constants = grid_constants(space)
    prices = gpu_prices(dict(space.axes).get("gpu") or [space.fixed.get("gpu")],
                        space.price_per_hour)
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
        with ray_session(workers, address) as cap:
            import ray

            task = _remote(_eval_part)
            space_ref = ray.put(space)
            job_ref = ray.put(job)
            bar = _progress(space.size, done_rows, "cfg", progress)
            pending: dict = {}
            queue = list(todo)
            try:
                while queue or pending:
                    # one task more than workers: the next starts while the driver merges
                    while queue and len(pending) < cap + 1:
                        bid, start, stop = queue.pop(0)
                        ref = task.remote(space_ref, bid, start, stop, simulate, check, job_ref,
                                          _kth_best(board, prune))
                        pending[ref] = (bid, start, stop)
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    for ref in ready:
                        bid, start, stop = pending.pop(ref)
                        entry, top, par = _get(ref)
                        if "error" in entry:
                            _drain(pending, store, board)
                            raise store._write_error(
                                Path(entry["error"]), OSError(entry["errno"], entry["strerror"]))
                        store.record_part(f"g{bid:06d}", entry)
                        board.add(top, par, entry["counts"], entry["reasons"])
                        if columns is None and len(top.columns):
                            columns = list(top.columns)
                        evaluated += stop - start
                        bar.update(stop - start)
                        if on_batch is not None:
                            on_batch(bid, len(store.done))
            except KeyboardInterrupt:
                # no ray.cancel: force-cancelling a task that is completing can crash Ray's
                # core worker ("Tried to complete task that was not pending"); a local Ray's
                # shutdown stops the tasks, and on a cluster a task in flight only finishes
                # its batch and writes its part atomically (a re-run records or redoes it)
                bar.close()
                raise Interrupted(len(store.done), len(batches), str(store.dir)) from None
            except SweepError:
                # the driver cannot record (full disk for the manifest): let the tasks in
                # flight finish their atomic writes, so that no temp file is left behind
                _drain(pending, store, board, record=False)
                bar.close()
                raise
            bar.close()
    if board.counts["simulated"] == 0:
        c = board.counts
        require_valid(Census(c["total"], 0, Counter(board.reasons)), space.name)
    return _finish_grid(store, cfg, space, board, constants, columns, t0, evaluated)


def _kth_best(board: Leaderboard, prune: bool) -> float | None:
    """The K-th best value of the only objective so far (the time bound's threshold); None
    with several objectives, without pruning, or before K rows fit."""
    if not prune or len(board.objectives) != 1 or len(board.top) < board.keep:
        return None
    col = objective_columns(board.objectives)[0][0]
    return float(board.top[col].iloc[board.keep - 1])


def _drain(pending: dict, store: ResultStore, board, record: bool = True) -> None:
    """Let the tasks in flight finish after one failed to write its part, and record those
    that wrote theirs (results arrive in any order: a batch finished before the failing one
    must not be redone on resume). What cannot be recorded is redone by a re-run."""
    import ray

    for ref, (bid, _start, _stop) in list(pending.items()):
        try:
            entry, top, par = ray.get(ref)
        except Exception:  # noqa: BLE001 - a task that died: a re-run redoes it
            continue
        if "error" in entry or not record:
            continue
        try:
            store.record_part(f"g{bid:06d}", entry)
        except (OSError, SweepError):  # the manifest cannot be written either
            break
        board.add(top, par, entry["counts"], entry["reasons"])
    pending.clear()


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
    from .results import read_metadata

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
                   _config_cols(space), "grid", top=top,
                   pareto=pareto if len(s.objectives) > 1 else pd.DataFrame(),
                   counts=dict(board.counts), reasons=dict(board.reasons))


def _get(ref):
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, ValueError):  # e.g. a CatalogError raised inside the simulator
            raise SweepError(str(cause).strip().splitlines()[0]) from None
        raise cause from None
    except ray.exceptions.WorkerCrashedError:
        raise SweepError(f"a Ray worker died {TASK_RETRIES + 1} times on the same batch; "
                         "giving up (finished batches are kept)") from None
