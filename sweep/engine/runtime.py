"""Where work runs: Ray tasks (a cluster, the Ray already running here, or a local one started
for the run) or the driver itself, behind one small executor interface (put, submit, wait,
get); and the progress bar. Strategies use these; this module knows nothing of any strategy.

A local run whose work is small (`in_process`) evaluates in the driver: starting and
stopping a local Ray costs more than the second core saves. `SWEEP_RAY=1` forces Ray.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from contextlib import contextmanager

from ..errors import SweepError


TASK_RETRIES = 3


def remote(fn):
    """The Ray remote version of a task function (made per run: a RemoteFunction kept across
    ray.shutdown()/ray.init() can point at objects of the old session)."""
    import ray

    return ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(fn)


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


def progress_bar(total: int, initial: int, unit: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit=unit, unit_scale=True, disable=not enabled,
                file=sys.stderr, dynamic_ncols=True, smoothing=0.3, leave=False)


def one_line(exc: ValueError) -> SweepError:
    """A ValueError raised by the work (e.g. a CatalogError inside the simulator) as the one-line
    SweepError the CLI prints, wherever the work ran."""
    return SweepError(str(exc).strip().splitlines()[0])


def task_result(ref):
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, ValueError):
            raise one_line(cause) from None
        raise cause from None
    except ray.exceptions.WorkerCrashedError:
        raise SweepError(f"a Ray worker died {TASK_RETRIES + 1} times on the same batch; "
                         "giving up (finished batches are kept)") from None


# ---------------------------------------------------------------------------------------------
# In the driver: where starting a local Ray would cost more than the second core saves
# ---------------------------------------------------------------------------------------------
# Below this many rows (candidates of a grid, trial budget x rows per trial of Optuna) a local
# run evaluates in the driver: starting and stopping a local Ray costs 5-7 s, more than a
# second core saves on the simulation of so few rows (benchmarks/search_strategies.py: 2,000
# trials x 288 rows of the 12-axis space simulate in about 4 s of one CPU).
IN_PROCESS_ROWS = 1_000_000


def in_process(address: str | None, rows: int, limit: int = IN_PROCESS_ROWS) -> bool:
    """Evaluate in the driver: no cluster given, no Ray already running here (a caller that
    started one wants it used), and at most `limit` rows of work."""
    if address or os.environ.get("SWEEP_RAY") == "1":
        return False
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return False
    return rows <= limit


class Deferred:
    """Work evaluated in the driver when its result is asked for (the Ray-task interface:
    submit, then fetch)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def result(self):
        try:
            return self.fn(*self.args)
        except SweepError:
            raise
        except ValueError as exc:  # as task_result does on Ray
            raise one_line(exc) from None


class DriverExecutor:
    """Work run in the driver, one piece when its result is asked for (the in-process
    stand-in for RayExecutor: same calls, one task in flight)."""

    cap = 1

    def put(self, obj):
        return obj

    def submit(self, fn, *args) -> Deferred:
        return Deferred(fn, *args)

    def wait(self, handles) -> list:
        return [next(iter(handles))]

    def get(self, handle):
        return handle.result()

    def finished(self, handles):
        """(handle, result) of the pieces already run: none (each runs when asked for)."""
        return iter(())


class RayExecutor:
    """Work run as Ray tasks (retried when their worker dies), `cap` of them in flight."""

    def __init__(self, cap: int):
        self.cap = cap
        self._remote: dict = {}

    def put(self, obj):
        import ray

        return ray.put(obj)

    def submit(self, fn, *args):
        if fn not in self._remote:
            self._remote[fn] = remote(fn)
        return self._remote[fn].remote(*args)

    def wait(self, handles) -> list:
        import ray

        ready, _ = ray.wait(list(handles), num_returns=1)
        return ready

    def get(self, handle):
        return task_result(handle)

    def finished(self, handles):
        """(handle, result) of the tasks in flight once they end; a task that died is left
        out (a re-run redoes it)."""
        import ray

        for h in list(handles):
            try:
                yield h, ray.get(h)
            except Exception:  # noqa: BLE001 - a task that died
                continue


@contextmanager
def executor(workers: int | None, address: str | None, rows: int, limit: int = IN_PROCESS_ROWS):
    """The executor for `rows` of work: in the driver when `in_process` says so (at most
    `limit` rows), else Ray."""
    if in_process(address, rows, limit):
        yield DriverExecutor()
        return
    with ray_session(workers, address) as cap:
        yield RayExecutor(cap)

