"""Running a sweep on Ray: grid batches or an Optuna study, resumable, with progress.

Grid: the product of the space is cut into batches of `batch_size` consecutive config ids.
Each batch is one Ray task that builds its configurations, prunes them with the rules
(vectorized), simulates the survivors in one `simulate_frame` call and returns the rows.
The driver writes each returned batch as its own parquet part and records it in the manifest;
a re-run skips recorded batches. Tasks are retried when their worker dies (`max_retries`); the
driver only ever records a batch id once, so nothing is lost or counted twice.

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim_core.frameworks import resolve_frame

from .config import SpaceConfig
from .errors import Interrupted, SweepError
from .results import (
    ResultStore, add_costs, best, counts, gpu_prices, rank, summary, write_tables,
)
from .space import Space, census, require_valid, rule_reasons, sim_frame

DEFAULT_GRID_BATCH = 20_000  # candidate configurations per Ray task
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


def evaluate(frame: pd.DataFrame, simulate=None, check=None) -> pd.DataFrame:
    """Rules, then simulation of the valid rows; one output row per input row.

    Adds the simulator's columns (NaN for invalid rows), `status` (ok | oom | invalid) and
    `invalid_reason` ('' unless invalid).
    """
    # the framework's defaults are resolved here, so that results show the values simulated
    out = resolve_frame(frame.reset_index(drop=True))
    n = len(out)
    reasons = rule_reasons(out, check)
    ok = reasons == ""
    cols: dict[str, np.ndarray] = {}
    if ok.any():
        sim = simulate or default_simulate()
        pred = sim(sim_frame(out.loc[ok]))
        pos = np.flatnonzero(ok)
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
        valid &= cols["valid"].astype(bool)
    if "invalid_reason" in cols:
        sim_reason = np.where(cols["invalid_reason"] == None, "", cols["invalid_reason"])  # noqa: E711
        reasons = np.where(ok, sim_reason, reasons).astype(object)
    cols["valid"] = valid
    fits = cols["fits"].astype(bool) & valid if "fits" in cols else np.zeros(n, dtype=bool)
    cols["fits"] = fits
    cols["invalid_reason"] = np.where(valid, "", np.where(reasons == "", "invalid", reasons))
    cols["status"] = np.where(~valid, "invalid", np.where(fits, "ok", "oom")).astype(object)
    extra = pd.DataFrame(cols, index=out.index)
    out = out.drop(columns=[c for c in extra.columns if c in out.columns])
    return pd.concat([out, extra], axis=1)


def _eval_range(space: Space, start: int, stop: int, simulate, check) -> pd.DataFrame:
    return evaluate(space.frame(start, stop), simulate, check)


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
    results: pd.DataFrame
    out_dir: Path
    seconds: float
    evaluated: int  # configurations evaluated by this run (not resumed ones)
    objectives: list
    config_cols: list
    strategy: str
    pareto: pd.DataFrame = field(default_factory=pd.DataFrame)
    note: str = ""

    @property
    def counts(self) -> dict:
        return counts(self.results)

    @property
    def best(self) -> pd.DataFrame:
        return best(self.results, 1)

    def summary(self) -> str:
        text = summary(self.results, self.config_cols, self.seconds, self.objectives,
                       self.out_dir, self.evaluated)
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
    return Outcome(df, store.dir, time.perf_counter() - t0, evaluated, cfg.search.objectives,
                   _config_cols(space), strategy, pareto)


def _run_grid(cfg, space, out, workers, address, simulate, check, progress, fresh, on_batch):
    t0 = time.perf_counter()
    bs = cfg.search.batch_size or DEFAULT_GRID_BATCH
    fp = space.fingerprint(strategy="grid", batch_size=bs, **_model_key(simulate))
    store = ResultStore(out, fp, {"space": space.name, "strategy": "grid",
                                  "batch_size": bs}).open(fresh)
    require_valid(census(space, check), space.name)
    batches = space.batches(bs)
    todo = [b for b in batches if f"g{b[0]:06d}" not in store.done]
    done_rows = sum(stop - start for i, start, stop in batches if f"g{i:06d}" in store.done)
    evaluated = 0
    if todo:
        with ray_session(workers, address) as cap:
            import ray

            task = _remote(_eval_range)
            space_ref = ray.put(space)
            bar = _progress(space.size, done_rows, "cfg", progress)
            pending: dict = {}
            queue = list(todo)
            try:
                while queue or pending:
                    while queue and len(pending) < cap:
                        bid, start, stop = queue.pop(0)
                        ref = task.remote(space_ref, start, stop, simulate, check)
                        pending[ref] = (bid, start, stop)
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    for ref in ready:
                        bid, start, stop = pending.pop(ref)
                        df = _get(ref)
                        store.write_part(f"g{bid:06d}", df, start=start, stop=stop)
                        evaluated += stop - start
                        bar.update(stop - start)
                        if on_batch is not None:
                            on_batch(bid, len(store.done))
            except KeyboardInterrupt:
                for ref in pending:
                    ray.cancel(ref, force=True)
                bar.close()
                raise Interrupted(len(store.done), len(batches), str(store.dir)) from None
            bar.close()
    return _assemble(store, cfg, space, t0, evaluated, "grid")


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
