"""The RL search: the configurations of a `task: rl` space priced by
`sim_core.rl.phases.simulate_rl` in chunks, ranked by the space's objective.

A space is evaluated in chunks of `CHUNK` combinations (`RLConfig.frame(start, stop)` builds a
chunk's table from its combinations' digits), each written as a part of the results folder
(`parts/`, recorded in `manifest.json`) and reduced to its best `keep` rows, so the driver
holds one chunk and the running top K whatever the size of the space: 10^6-10^7 RL
configurations (every GPU split, rollout layout, KV share and training layout of a large
cluster) sweep like the pre-training grid. A re-run of the same space resumes: finished
chunks are read back one at a time. Large spaces run as Ray tasks (`runtime.executor`: a
local Ray, or `--address`), small ones in the driver.

The folder holds `results.parquet/` (every configuration with its prediction),
`ranking.csv` (the best that fit, at most max(top, KEEP) rows), `pareto.csv` (the
cost-versus-throughput frontier: step time against cost per 1,000 steps, which a space over
`num_gpus` trades) and `recipe/` (verl and NeMo RL for the best, written by the CLI).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim_core.rl import phases
from sim_core.rl.phases import simulate_rl

from ..errors import Interrupted, SweepError
from ..results.store import ResultStore, _atomic_write_bytes, pareto_mask, write_parquet
from .runtime import IN_PROCESS_ROWS, DriverExecutor, executor, progress_bar

OBJECTIVES = {"step_time": ("step_time_s", True),
              "samples_per_gpu": ("samples_per_s_per_gpu", False),
              "tokens_per_gpu": ("tokens_per_s_per_gpu", False),
              "cost": ("cost_per_1000_steps", True)}
# combinations per chunk: some 20,000 RL rows take a few seconds and ~0.3 GB to price
CHUNK = 20_000
# rows the ranking keeps at least (search.top more when asked)
KEEP = 1000
# the cost-versus-throughput frontier: step time and cost per 1,000 steps, both minimised (a
# space over `num_gpus` trades one for the other; on one cluster size the two agree)
FRONTIER = ("step_time_s", "cost_per_1000_steps")


def _predict(df: pd.DataFrame, scales) -> pd.DataFrame:
    """The chunk's configurations with their predictions (a prediction that resolves an input,
    rollout_gpus or the packing budget train_seq_len, replaces it: one column each)."""
    try:
        pred = simulate_rl(df, phase_scales=scales)
    except ValueError as exc:  # sim_core.catalog.CatalogError: one line naming the field
        raise SweepError(str(exc).splitlines()[0]) from None
    out = pd.concat([df.drop(columns=[c for c in pred if c in df]), pred], axis=1)
    # the pre-training results' status, so that the results tools read an RL folder too
    out["status"] = np.select([~out["valid"].astype(bool), ~out["fits"].astype(bool)],
                              ["invalid", "oom"], "ok")
    return out


def evaluate(cfg) -> pd.DataFrame:
    """Configurations of the RL config (its space, or the run alone) with their predictions,
    in one table (`sweep simulate` / `sweep check`; the search goes by chunks)."""
    return _predict(cfg.frame(), None)


def census(cfg, chunk: int = CHUNK) -> dict:
    """The space's counters (`sweep check`), priced chunk by chunk in the driver: bounded
    memory whatever its size."""
    total = {"combinations": 0, "rows": 0, "fit": 0, "invalid": 0, "oom": 0}
    size = cfg.space_size()
    for start in range(0, size, chunk):
        _, counts, _ = _priced(cfg, start, min(start + chunk, size), None)
        for k, v in counts.items():
            total[k] += v
    return total


def _priced(cfg, start: int, stop: int, scales) -> tuple[pd.DataFrame | None, dict, dict]:
    """Combinations [start, stop) priced: (their rows with predictions, or None when every one
    repeats an earlier combination; the counters; the out-of-memory reasons counted)."""
    df = cfg.frame(start, stop)
    if not len(df):
        return None, {"combinations": stop - start, "rows": 0, "fit": 0, "invalid": 0,
                      "oom": 0}, {}
    res = _predict(df, scales)
    return (res, *_counts(res, stop - start))


def sort_key(objective: str) -> tuple[list[str], list[bool]]:
    """Columns and directions of the ranking: the objective; ties (a one-step-off pipeline
    bound by its training side) go to the faster generation, then the smaller rollout
    footprint, then the space's order."""
    col, asc = OBJECTIVES[objective]
    return [col, "gen_time_s", "rollout_peak_gib", "config_id"], [asc, True, True, True]


def rank(res: pd.DataFrame, objective: str) -> pd.DataFrame:
    """The rows that fit, best first."""
    cols, asc = sort_key(objective)
    return res[res["fits"].astype(bool)].sort_values(cols, ascending=asc, kind="stable")


def frontier(res: pd.DataFrame) -> pd.DataFrame:
    """The rows that fit and that no other fitting row beats on both step time and cost, sorted
    by step time; among exact ties the one the ranking prefers (faster generation, smaller
    rollout footprint, then the space's order)."""
    fit = res[res["fits"].astype(bool)]
    if not len(fit):
        return fit
    fit = fit.sort_values(["gen_time_s", "rollout_peak_gib", "config_id"], kind="stable")
    vals = np.nan_to_num(fit[list(FRONTIER)].to_numpy(float), nan=np.inf)
    return fit[pareto_mask(vals)].sort_values(list(FRONTIER) + ["config_id"], kind="stable") \
        .reset_index(drop=True)


def fingerprint(cfg, chunk: int, scales) -> str:
    """What the stored parts depend on: the configuration and its space (not the ranking's
    objective or length), the chunking, and the RL phase scales in force."""
    key = {"config": cfg.model_dump(mode="json", exclude={"search", "name"}), "chunk": chunk,
           "rl_phases": scales, "kind": "rl"}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _counts(res: pd.DataFrame, combos: int) -> tuple[dict, dict]:
    valid = res["valid"].astype(bool).to_numpy()
    fits = res["fits"].astype(bool).to_numpy()
    counts = {"combinations": int(combos), "rows": int(len(res)), "fit": int(fits.sum()),
              "invalid": int((~valid).sum()), "oom": int((valid & ~fits).sum())}
    why = res.loc[valid & ~fits, "oom_reason"].value_counts()
    return counts, {str(k): int(v) for k, v in why.items()}


def _eval_chunk(cfg, bid: int, start: int, stop: int, parts_dir: str, fp: str, objective: str,
                keep: int, scales):
    """One chunk (in the driver or a Ray worker): price it, write it as a part, return its
    manifest entry, its best `keep` rows and its frontier (none and no part when every
    combination of the chunk repeats an earlier one)."""
    res, counts, reasons = _priced(cfg, start, stop, scales)
    info = {"start": start, "stop": stop, "counts": counts, "reasons": reasons}
    if res is None:
        return {"file": "", "rows": 0, "sha256": "", **info}, pd.DataFrame(), pd.DataFrame()
    top = rank(res, objective).head(keep)
    front = frontier(res)
    name = f"r{bid:06d}"
    path = Path(parts_dir) / f"{name}.parquet"
    try:
        digest = write_parquet(path, res, {"batch_id": name, "fingerprint": fp, **info})
    except OSError as exc:  # full disk, ...: one line from the driver, the rest kept
        raise SweepError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return ({"file": f"{name}.parquet", "rows": int(len(res)), "sha256": digest, **info}, top,
            front)


class Board:
    """The best `keep` rows seen so far, the frontier and the counters, merged chunk by chunk
    (the frontier of the union of the chunks' frontiers is the space's)."""

    def __init__(self, objective: str, keep: int):
        self.objective, self.keep = objective, keep
        self.top = pd.DataFrame()
        self.front = pd.DataFrame()
        self.counts = {"combinations": 0, "rows": 0, "fit": 0, "invalid": 0, "oom": 0}
        self.reasons: dict[str, int] = {}

    def add(self, top: pd.DataFrame, front: pd.DataFrame, counts: dict, reasons: dict) -> None:
        if len(front):
            self.front = frontier(pd.concat([d for d in (self.front, front) if len(d)],
                                            ignore_index=True))
        if len(top):
            both = pd.concat([d for d in (self.top, top) if len(d)], ignore_index=True)
            cols, asc = sort_key(self.objective)
            self.top = both.sort_values(cols, ascending=asc, kind="stable").head(self.keep) \
                .reset_index(drop=True)
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + int(v)
        for k, v in reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + int(v)


def search(cfg, out: str | Path, *, workers: int | None = None, address: str | None = None,
           progress: bool = False, fresh: bool = False, chunk: int = CHUNK,
           on_chunk=None) -> dict:
    """Price every configuration of the space in chunks, keep the results on disk and the best
    in memory; returns {"ranking", "pareto", "counts", "reasons", "out"}.

    on_chunk(chunk_id, chunks_done) is called after each chunk is recorded (tests interrupt a
    search with it)."""
    out = Path(out)
    size = cfg.space_size()
    scales = phases.phase_scales()  # a profile's installed RL phase scales, or None
    keep = max(cfg.search.top, KEEP)
    objective = cfg.search.objective
    fp = fingerprint(cfg, chunk, scales)
    store = ResultStore(out, fp, {"space": cfg.name, "strategy": "rl-grid",
                                  "batch_size": chunk}).open(fresh)
    board = Board(objective, keep)
    # chunks of an earlier run: counters from the manifest, best rows from their part (one at
    # a time: bounded memory)
    for bid, entry in sorted(store.batches.items()):
        if "counts" not in entry:
            continue
        top = front = pd.DataFrame()
        if entry.get("file"):
            part = pd.read_parquet(store.parts_dir / entry["file"])
            top, front = rank(part, objective).head(keep), frontier(part)
        board.add(top, front, entry["counts"], entry.get("reasons") or {})
    done = {b for b, e in store.batches.items() if "counts" in e}
    chunks = [(i, s, min(s + chunk, size)) for i, s in enumerate(range(0, size, chunk))]
    todo = [c for c in chunks if f"r{c[0]:06d}" not in done]
    bar = progress_bar(size, sum(s1 - s0 for i, s0, s1 in chunks if f"r{i:06d}" in done),
                       "cfg", progress)
    # a profile is installed in this process only: its chunks are priced here
    limit = size if scales is not None and not address else IN_PROCESS_ROWS
    try:
        with executor(workers, address, size, limit) as ex:
            if scales is not None and not isinstance(ex, DriverExecutor):
                raise SweepError("--profile with an RL search on Ray: the profile is installed "
                                 "in this process only; run it without --address")
            cfg_ref = ex.put(cfg)
            pending: dict = {}
            queue = list(todo)
            while queue or pending:
                while queue and len(pending) < ex.cap + 1:
                    bid, s0, s1 = queue.pop(0)
                    ref = ex.submit(_eval_chunk, cfg_ref, bid, s0, s1, str(store.parts_dir),
                                    fp, objective, keep, scales)
                    pending[ref] = (bid, s0, s1)
                for ref in ex.wait(pending):
                    bid, s0, s1 = pending.pop(ref)
                    entry, top, front = ex.get(ref)
                    store.record_part(f"r{bid:06d}", entry)
                    board.add(top, front, entry["counts"], entry["reasons"])
                    bar.update(s1 - s0)
                    if on_chunk is not None:
                        on_chunk(bid, len(store.done))
    except KeyboardInterrupt:
        bar.close()
        store.flush()
        raise Interrupted(len(store.done), len(chunks), str(store.dir)) from None
    finally:
        bar.close()
    store.flush()
    store.finalize_parts({"counts": board.counts, "objective": objective})
    for name, table in (("ranking.csv", board.top), ("pareto.csv", board.front)):
        path = out / name
        try:
            _atomic_write_bytes(path, table.to_csv(index=False).encode())
        except OSError as exc:
            raise SweepError(f"{path}: cannot write ({exc.strerror or exc}); the results are "
                             f"kept in {out}: free space and run the same command again") from None
    return {"ranking": board.top, "pareto": board.front, "counts": board.counts,
            "reasons": board.reasons, "out": out}
