"""Fit the colocated refit's two per-item costs on NeMo RL's own published refit totals.

    python -m sim_core.rl.refit_fit            # the fit, its error per point
    python -m sim_core.rl.refit_fit --write    # also store it in catalogs/rl.yaml `refit`

The points (`sim_core/data/rl/refit_published.csv`): NeMo RL PR #449's refit seconds before and
after it sent each engine only its own devices' IPC handles, for a ~30B dense and a ~30B MoE
model on 16 x 8 H100 with the DTensor worker (one IPC handle per tensor). Nothing from
`rl_runs.csv` enters the fit: its NeMo RL blog rows are the out-of-sample check.

Per point: refit = what the model already prices (bytes: `weight_sync.py`; host moves:
`phases.py`; the per-tensor collective latency and the measured IPC handle cost:
`refit_host.py`) + tensors x `tensor_s` +
controller entries x `controller_entry_s`, both constants unknown and non-negative. Entries on
the controller's critical path (refit_host.py docstring), W training workers, E engines of tp
GPUs, n entries per worker:
- after PR #449 (own devices): driver W n in + W n out, the engine leader's `collective_rpc`
  sends each of its tp workers the tp devices' entries (tp^2 n) after reading tp n, each
  worker reads tp n: n (2W + tp^2 + 2 tp);
- before (all devices, `run_all_workers_single_data`): driver W n in, E W n out; leader W n in,
  tp W n out; worker W n in: n W (E + tp + 3).
The fit minimises the squared relative errors (weights 1 / measured); the differences
before - after identify the entry cost, the after points the per-tensor one.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

import numpy as np
import pandas as pd

from . import inputs
from .phases import simulate_rl

POINTS = "data/rl/refit_published.csv"


def points() -> pd.DataFrame:
    return pd.read_csv(resources.files("sim_core").joinpath(POINTS).open())


def frame(pts: pd.DataFrame) -> pd.DataFrame:
    """An RL frame per point: NeMo RL colocated GRPO in the layout the point states (the batch
    and lengths only move the offload part, through the training memory)."""
    dt = pts["train_backend"].eq("dtensor")
    return pd.DataFrame({
        "algorithm": "grpo", "model": pts["model"], "gpu": pts["gpu"],
        "num_gpus": pts["num_gpus"].astype(float), "placement": "colocated",
        "rollout_tp": pts["rollout_tp"].astype(float),
        "gpu_memory_utilization": pts["gpu_memory_utilization"].astype(float),
        "prompts_per_step": 64.0, "responses_per_prompt": 32.0, "prompt_len": 92.0,
        "response_mean": 1000.0, "response_max": pts["max_total_len"].astype(float) - 92.0,
        "mini_batches": 4.0, "train_tp": pts["train_tp"].astype(float),
        "train_zero": np.where(dt, 3, 1), "offload_params": True, "offload_optimizer": True,
        "train_seq_len": pts["max_total_len"].astype(float), "rl_framework": "nemo_rl",
        "sequence_packing": True,
    })


def design(pts: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base seconds, the tensors column, the entries column) per point."""
    df = frame(pts)
    p = simulate_rl(df)
    b = inputs.to_batch(df)
    # the base: what is priced without the two unknowns (the per-tensor collective latency
    # stays in it)
    ipc = inputs.constants()["refit"]["ipc_handle_s"]  # measured, not fitted
    base = (p["weight_sync_time_s"] + p["offload_time_s"] - p["refit_host_time_s"]
            + p["refit_chain_time_s"] + p["refit_handles"] * ipc).to_numpy()
    c = {"refit_tensors": p["refit_tensors"].to_numpy(), "refit_entries": p["refit_entries"].to_numpy()}
    n = c["refit_entries"]
    w, tp = b.train_gpus, b.rollout_tp * b.rollout_pp
    e = b.replicas
    passes = np.where(pts["routing"].eq("all_devices"), w * (e + tp + 3), 2 * w + tp ** 2 + 2 * tp)
    return base, c["refit_tensors"], n * passes


def fit(pts: pd.DataFrame) -> dict:
    base, tensors, entries = design(pts)
    y = pts["refit_s"].to_numpy(float)
    wgt = 1.0 / y
    a = np.column_stack([entries, tensors]) * wgt[:, None]
    rhs = (y - base) * wgt
    best = None
    # non-negative least squares over two unknowns: the unconstrained solution, else each
    # constant alone
    cands = [np.linalg.lstsq(a, rhs, rcond=None)[0]]
    for j in range(2):
        x = np.zeros(2)
        x[j] = max(float(a[:, j] @ rhs / (a[:, j] @ a[:, j])), 0.0)
        cands.append(x)
    for x in cands:
        if (x < 0).any():
            continue
        r = float(np.sum((a @ x - rhs) ** 2))
        if best is None or r < best[0]:
            best = (r, x)
    x = best[1]
    pred = base + entries * x[0] + tensors * x[1]
    return {"controller_entry_s": float(x[0]), "tensor_s": float(x[1]), "pred": pred,
            "base": base, "tensors": tensors, "entries": entries, "measured": y}


def write(res: dict) -> None:
    inputs.store_constants({k: f"{res[k]:.3g}" for k in ("controller_entry_s", "tensor_s")})


def fit_cli(argv, doc: str, points, fit, headline, row_line, store) -> int:
    """The command line of a refit fit on published points: print the fit and each point's
    error; with --write, `store(res)` in catalogs/rl.yaml (shared with verl_refit_fit.py)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="store the fit in catalogs/rl.yaml")
    args = ap.parse_args(argv)
    pts = points()
    res = fit(pts)
    print(f"{headline(res)} (fitted on {len(pts)} points)")
    for i, r in pts.iterrows():
        err = res["pred"][i] / res["measured"][i] - 1
        print(f"  {row_line(r, res, i)}  predicted {res['pred'][i]:6.1f} s  measured "
              f"{res['measured'][i]:5.0f} s  ({err:+.0%})")
    if args.write:
        store(res)
        print("written to catalogs/rl.yaml refit")
    return 0


def main(argv=None) -> int:
    return fit_cli(
        argv, __doc__, points, fit,
        lambda res: (f"controller_entry_s = {res['controller_entry_s'] * 1e6:.2f} us, "
                     f"tensor_s = {res['tensor_s'] * 1e3:.3f} ms"),
        lambda r, res, i: (f"{r['point']:<20} tensors {res['tensors'][i]:>7.0f}  entries "
                           f"{res['entries'][i]:>12.3g}  base {res['base'][i]:5.1f} s"),
        write)


if __name__ == "__main__":
    sys.exit(main())
