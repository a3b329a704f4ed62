"""Stand-ins for tests of the search engine (Ray workers import them as `tests.fakes`: the
conftest puts the repository root on the PYTHONPATH they inherit).

`fake_simulate` is a cheap analytic formula with the output columns of
`sim_core.simulate_frame`; `KillOnce` wraps a simulate function and kills its own worker
process the first time it runs (a marker file remembers that it did), to test task retries.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd


def fake_check(df: pd.DataFrame) -> pd.Series:
    """The divisibility rules of sim_core without the simulator (catalog lookups only)."""
    from sim_core import rules
    from sim_core.columns import frame_to_batch

    _, reason = rules.check(frame_to_batch(df))
    return pd.Series(reason, index=df.index, dtype=object)


def fake_simulate(df: pd.DataFrame) -> pd.DataFrame:
    """Deterministic made-up predictions with the simulator's column names."""
    g = lambda c, d: (df[c] if c in df.columns else pd.Series(d, index=df.index))  # noqa: E731
    tp, pp, cp = g("tp", 1).astype(float), g("pp", 1).astype(float), g("cp", 1).astype(float)
    mb, vpp = g("micro_batch", 1).astype(float), g("vpp", 1).astype(float)
    n = g("num_gpus", 8).astype(float)
    gb, seq = g("global_batch", 64).astype(float), g("seq_len", 2048).astype(float)
    rc = g("recompute", "none").map({"none": 0.0, "selective": 0.1, "full": 0.33}).astype(float)
    zero = g("zero", 1).astype(float)
    dp = n / (tp * pp * cp)
    m = gb / (dp * mb)
    compute = gb * seq * 1e-7 / n * (1 + rc) * (1 + 0.03 * np.log2(tp))
    bubble = compute * (pp - 1) / (m * vpp)
    comm = 0.002 * np.log2(dp + 1) * (1 + 0.1 * zero)
    step = compute + bubble + comm
    mem = 200.0 / (tp * pp) + mb * seq * 4e-3 * (1 - 0.8 * rc) / tp + 60.0 / (1 + zero) / dp ** 0.5
    out = pd.DataFrame(index=df.index)
    out["valid"] = True
    out["invalid_reason"] = ""
    out["dp"] = dp
    out["num_microbatches"] = m
    out["step_time_s"] = step
    out["tokens_per_s_per_gpu"] = gb * seq / (step * n)
    out["mfu"] = 0.5 * compute / step
    out["hfu"] = out["mfu"] * (1 + rc)
    out["time_compute"] = compute
    out["time_bubble"] = bubble
    out["time_dp"] = comm
    out["mem_weights"] = 200.0 / (tp * pp)
    out["mem_activations"] = mem - out["mem_weights"]
    out["peak_memory_gib"] = mem
    out["fits"] = mem < 75.0
    return out


class KillOnce:
    """A simulate function that SIGKILLs its worker on the first call (marker file), then
    behaves like `inner`."""

    def __init__(self, marker: str | os.PathLike, inner=fake_simulate):
        self.marker = str(marker)
        self.inner = inner

    def __call__(self, df: pd.DataFrame) -> pd.DataFrame:
        p = Path(self.marker)
        if not p.exists():
            p.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner(df)


class CountCalls:
    """Wraps a simulate function and appends the number of rows of each call to a file."""

    def __init__(self, log: str | os.PathLike, inner=fake_simulate):
        self.log = str(log)
        self.inner = inner

    def __call__(self, df: pd.DataFrame) -> pd.DataFrame:
        with open(self.log, "a") as f:
            f.write(f"{len(df)}\n")
        return self.inner(df)


class RecordNode:
    """Wraps a simulate function and appends the Ray node id it ran on to a file."""

    def __init__(self, log: str | os.PathLike, inner=fake_simulate):
        self.log = str(log)
        self.inner = inner

    def __call__(self, df: pd.DataFrame) -> pd.DataFrame:
        import ray

        with open(self.log, "a") as f:
            f.write(ray.get_runtime_context().get_node_id() + "\n")
        return self.inner(df)


class FullDiskAfter:
    """A simulate function that, in whichever process runs it, makes the writes of result parts
    into `parts_dir` fail with ENOSPC (leaving a partial temp file, like a disk that fills up)
    once `ok` parts have been written there by all processes together (counted by files in
    `counter_dir`). The latest call for a `parts_dir` sets its limit in that process."""

    def __init__(self, counter_dir: str | os.PathLike, ok: int, parts_dir: str | os.PathLike,
                 inner=fake_simulate):
        self.counter_dir, self.ok, self.inner = str(counter_dir), ok, inner
        self.parts_dir = str(Path(parts_dir).resolve())
        Path(counter_dir).mkdir(parents=True, exist_ok=True)

    def __call__(self, df: pd.DataFrame) -> pd.DataFrame:
        _FAULTS[self.parts_dir] = (Path(self.counter_dir), self.ok)
        _install_fault()
        return self.inner(df)


_FAULTS: dict = {}


def _install_fault() -> None:
    import errno

    from sweep import results

    if getattr(results.pq.write_table, "_full_disk", False):
        return
    real = results.pq.write_table

    def write_table(table, where, *args, **kw):
        p = Path(str(where))
        fault = _FAULTS.get(str(p.parent.resolve()))
        if fault is not None and p.name.startswith(".g"):
            counter, ok = fault
            n = len(list(counter.iterdir()))
            if n >= ok:
                p.write_bytes(b"PAR1\x00partial")
                raise OSError(errno.ENOSPC, "No space left on device", str(where))
            (counter / f"{os.getpid()}-{n}").write_bytes(b"")
        return real(table, where, *args, **kw)

    write_table._full_disk = True
    results.pq.write_table = write_table
