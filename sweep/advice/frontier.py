"""Cost-vs-throughput Pareto frontier (cost: lower is better, throughput: higher is better)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def pareto_front(cost, throughput) -> np.ndarray:
    """Boolean mask of the non-dominated points.

    Point i is dominated when some j has cost_j <= cost_i and thr_j >= thr_i, better in at
    least one. Exact duplicates do not dominate each other (both stay on the frontier).
    NaN points are never on the frontier and never dominate. O(n log n).
    """
    cost = np.asarray(cost, dtype=float)
    thr = np.asarray(throughput, dtype=float)
    n = len(cost)
    keep = np.zeros(n, dtype=bool)
    ok = np.isfinite(cost) & np.isfinite(thr)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return keep
    order = idx[np.lexsort((cost[idx], -thr[idx]))]  # throughput descending, then cost
    best_above = np.inf  # min cost among points with strictly higher throughput
    i = 0
    while i < len(order):
        j = i
        t = thr[order[i]]
        while j < len(order) and thr[order[j]] == t:
            j += 1
        group = order[i:j]
        gmin = cost[group[0]]  # sorted by cost within the group
        if gmin < best_above:
            keep[group[cost[group] == gmin]] = True
        best_above = min(best_above, gmin)
        i = j
    return keep


def dominated_by(cost, throughput, i: int) -> np.ndarray:
    """Mask of the points that dominate point i (for tests and explanations)."""
    cost = np.asarray(cost, dtype=float)
    thr = np.asarray(throughput, dtype=float)
    return ((cost <= cost[i]) & (thr >= thr[i]) & ((cost < cost[i]) | (thr > thr[i])))


def frontier(df: pd.DataFrame) -> pd.DataFrame:
    """Rows on the cost (USD/Mtok, lower better) vs cluster tokens/s (higher better) frontier,
    sorted by throughput."""
    mask = pareto_front(df["cost_per_mtok_usd"].to_numpy(float), df["tokens_per_s"].to_numpy(float))
    return df[mask].sort_values(["tokens_per_s", "cost_per_mtok_usd"])



def failure_frontier(df: pd.DataFrame) -> pd.DataFrame:
    """The same frontier with failures, checkpoints and restarts counted: cost and throughput
    divided and multiplied by each configuration's goodput (empty without a goodput column).
    Where the two frontiers part, adding GPUs pays less than the failure-free one says."""
    if "goodput" not in df.columns:
        return df.iloc[:0]
    good = df["goodput"].to_numpy(float)
    cost = df["cost_per_mtok_usd"].to_numpy(float) / good
    thr = df["tokens_per_s"].to_numpy(float) * good
    out = df[pareto_front(cost, thr)].copy()
    out["cost_per_mtok_goodput_usd"] = out["cost_per_mtok_usd"] / out["goodput"]
    out["tokens_per_s_goodput"] = out["tokens_per_s"] * out["goodput"]
    return out.sort_values(["tokens_per_s_goodput", "cost_per_mtok_goodput_usd"])
