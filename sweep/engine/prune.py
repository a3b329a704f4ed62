"""Pruning by bounds: configurations the grid need not simulate, because a bound proves they
cannot change the result.

Memory bound. Within a sub-space whose members differ only in micro-batch and recompute, a
member B needs at least the memory of a member A with a micro-batch no larger and at least as
much recompute (tests/test_prune.py checks this on random configurations over a wide set of
fields; tests/test_properties.py checks its two halves). So when A does not fit, B does not
either: B is counted as "pruned by the memory bound" and never simulated. Members are
simulated in passes of increasing (micro-batch rank + recompute deficit), so the lightest ones
go first; a pass skips every member that a member out of memory of an earlier pass dominates.
Each pass costs one simulator call, hence only MEMORY_PASSES of them.

Time bound. The simulator's MFU is below 1 (below 2 for FP8 runs) against the bf16 peak, as
the property tests check, so step_time > model FLOPs / (num_gpus x bf16 peak x that limit), and
every objective is monotone in the step time for a given configuration
(`step_time_lower_bound`, `objective_bound`). A single-objective grid search skips the valid
configurations whose bound is strictly worse than the K-th best value found so far: they cannot
enter the top K. (With several objectives the Pareto set and its ranks depend on every row, so
only the memory bound applies.)

Pruned configurations are not stored; the counters say how many were pruned, and why.
"""

from __future__ import annotations

import numpy as np

RECOMPUTE_ORDER = ("none", "selective", "full")  # sim_core's codes 0, 1, 2: more recompute
# simulator calls per batch for the memory bound: the lightest diagonal, the next, the rest
MEMORY_PASSES = 3
PRUNED = ("pruned_memory", "pruned_time")  # statuses of pruned rows (never stored)


def model_flops(b) -> np.ndarray:
    """Model FLOPs per step (the MFU convention) of each valid configuration: they depend on
    the model, sequence length and global batch only, so the workload is built once per
    distinct combination of those."""
    from sim_core import workload
    from sim_core.columns import Batch
    from sim_core.specs import MODEL_COLUMNS

    keys = [k for k in (*MODEL_COLUMNS, "seq_len", "global_batch")
            if k in b and np.asarray(b[k]).dtype.kind in "biuf"]
    table = np.column_stack([np.asarray(b[k], dtype=np.float64) for k in keys])
    _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
    reps = Batch({k: np.asarray(v)[first] for k, v in b.items()})
    with np.errstate(divide="ignore", invalid="ignore"):
        flops = np.asarray(workload.build(reps).model_flops_per_step, dtype=np.float64)
    return flops[np.asarray(inverse).reshape(-1)]


def step_time_lower_bound(b) -> np.ndarray:
    """A lower bound on the simulated step time of each valid configuration of Batch `b`:
    the step at MFU 1 (2 for FP8) of the bf16 dense peak."""
    mfu_max = np.where(np.asarray(b.precision) == 1, 2.0, 1.0)
    return model_flops(b) / (b.num_gpus * b.peak_bf16 * 1e12 * mfu_max)


def objective_bound(b, objective: str, price, cost_unit: str = "mtok") -> np.ndarray:
    """The best value `objective` can take on each configuration (a lower bound for the
    objectives minimized, an upper bound for those maximized): the objective at the step-time
    bound, computed as `sweep.results.add_costs` and the simulator compute it.
    `price`: USD per GPU-hour of each row (NaN: unknown, the cost bound is NaN)."""
    lb = step_time_lower_bound(b)
    n = np.asarray(b.num_gpus, dtype=np.float64)
    tokens = np.asarray(b.global_batch, dtype=np.float64) * np.asarray(b.seq_len, np.float64)
    if objective == "step_time":
        return lb
    if objective == "cost":
        per_step = n * lb / 3600.0 * np.asarray(price, dtype=np.float64)
        return per_step / (tokens / 1e6) if cost_unit == "mtok" else per_step
    if objective == "throughput":
        return tokens / (lb * n)
    if objective == "mfu":
        return model_flops(b) / (lb * n * b.peak_bf16 * 1e12)
    raise ValueError(f"no bound for objective {objective!r}")


def worse_than(bound: np.ndarray, threshold: float, objective: str) -> np.ndarray:
    """Rows whose best possible value is strictly worse than `threshold` (NaN: never)."""
    from ..config import OBJECTIVES

    with np.errstate(invalid="ignore"):
        if OBJECTIVES[objective][1] == "minimize":
            return bound > threshold
        return bound < threshold


def simulate_with_memory_bound(b, group: np.ndarray, core, skip: np.ndarray | None = None,
                               passes: int = MEMORY_PASSES, within: np.ndarray | None = None):
    """Simulate the rows of Batch `b` (all valid) but those the memory bound proves out of
    memory. group: sub-space id of each row (rows equal but for micro_batch and recompute).
    skip: rows not to simulate at all (pruned by the time bound). within: the rows are those
    positions of `b` (default: all of it), so that each pass takes its rows from `b` at once.

    Returns (positions simulated, the simulator's outputs for them in that order, mask of the
    rows pruned by the memory bound); positions among the rows, not in `b`."""
    from sim_core.columns import Batch

    n = len(group)
    todo = np.ones(n, dtype=bool) if skip is None else ~skip
    pruned = np.zeros(n, dtype=bool)
    mb = np.asarray(b.micro_batch if within is None else b.micro_batch[within], dtype=np.float64)
    rc = np.asarray(b.recompute if within is None else b.recompute[within]).astype(np.int64)
    _, g = np.unique(group, return_inverse=True)
    g = np.asarray(g).reshape(-1)
    mbi = np.searchsorted(np.unique(mb), mb)
    level = mbi + (len(RECOMPUTE_ORDER) - 1 - rc)  # rows on one level never dominate each other
    levels = np.unique(level[todo])
    cuts = [levels[:1], levels[1:2], levels[2:]] if passes >= 3 and len(levels) > 2 else \
        [levels[:1], levels[1:]]
    # least micro-batch rank of a row out of memory, per sub-space and recompute code, among
    # the rows with at least that much recompute
    least_oom = np.full((int(g.max()) + 1 if n else 0, len(RECOMPUTE_ORDER)),
                        np.iinfo(np.int64).max)
    done_pos, outs = [], []
    for cut in cuts:
        if not len(cut):
            continue
        rows = np.flatnonzero(todo & np.isin(level, cut))
        dominated = least_oom[g[rows], rc[rows]] <= mbi[rows]
        pruned[rows[dominated]] = True
        rows = rows[~dominated]
        if not len(rows):
            continue
        at = rows if within is None else within[rows]
        sub = b if len(at) == len(b) else Batch({k: np.asarray(v)[at] for k, v in b.items()})
        out = core(sub)
        done_pos.append(rows)
        outs.append(out)
        oom = rows[~np.asarray(out["fits"], dtype=bool)]
        for k in range(len(RECOMPUTE_ORDER)):
            sel = oom[rc[oom] >= k]
            np.minimum.at(least_oom[:, k], g[sel], mbi[sel])
    if not outs:
        return np.zeros(0, dtype=np.int64), None, pruned
    pos = np.concatenate(done_pos)
    order = np.argsort(pos, kind="stable")
    merged = {k: np.concatenate([np.asarray(o[k]) for o in outs])[order] for k in outs[0]}
    return pos[order], merged, pruned
