"""Derive the colocated refit's per-item costs from NeMo RL's own published refit figures.

    python -m sim_core.rl.refit_fit            # the derivation, its error per point
    python -m sim_core.rl.refit_fit --write    # also store it in catalogs/rl.yaml `refit`

Two sources, neither a row of `rl_runs.csv` (its NeMo RL rows are the out-of-sample check):

1. NeMo RL's refit blog (`sim_core/data/rl/refit_published_breakdown.csv`): DeepSeek-V3's
   refit at v0.3 in its three steps (Megatron EP64 PP8 -> vLLM TP64, 512 H100). Each step
   gives one constant, in this order: the update step over the HF tensors is `tensor_s` (the
   engine's load per tensor); the gather step less what `weight_sync.py` and the collective
   chain price, over the HF tensors, is `megatron_tensor_s` (the trainer's gather loop,
   conversion and packing); the IPC step less the Ray calls, the handles and the handle
   entries priced, over the metadata entries on the controller's path, is `meta_entry_s`.
   One point, three steps, three constants: derived, not fitted; reproduced exactly.
2. NeMo RL PR #449's refit seconds before and after it sent each engine only its own devices'
   IPC handles, for a ~30B dense and a ~30B MoE model on 16 x 8 H100 with the DTensor worker
   (one IPC handle per tensor, so every controller entry is a handle):
   `controller_entry_s`, the one unknown, fitted on the four points with everything else
   priced (bytes: `weight_sync.py`; host moves: `phases.py`; the collective chain, the
   handles opened, the engine's load per tensor and the Ray calls: `refit_host.py`). Entries
   on the controller's critical path (refit_host.py docstring), W training workers, E
   engines of tp GPUs, n entries per worker:
   - after PR #449 (own devices): driver W n in + W n out, the engine leader's
     `collective_rpc` sends each of its tp workers the tp devices' entries (tp^2 n) after
     reading tp n, each worker reads tp n: n (2W + tp^2 + 2 tp);
   - before (all devices, `run_all_workers_single_data`): driver W n in, E W n out; leader
     W n in, tp W n out; worker W n in: n W (E + tp + 3).
   The fit minimises the squared relative errors (weights 1 / measured).
The blog's constants are derived with the shipped `controller_entry_s` and the PR #449 fit
with the shipped `tensor_s`; `--write` iterates the two to a fixed point.
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
BREAKDOWN = "data/rl/refit_published_breakdown.csv"


def points() -> pd.DataFrame:
    return pd.read_csv(resources.files("sim_core").joinpath(POINTS).open())


def breakdown_points() -> pd.DataFrame:
    return pd.read_csv(resources.files("sim_core").joinpath(BREAKDOWN).open())


def frame(pts: pd.DataFrame) -> pd.DataFrame:
    """An RL frame per point: NeMo RL colocated GRPO in the layout the point states (the batch
    and lengths only move the offload part, through the training memory)."""
    dt = pts["train_backend"].eq("dtensor")
    extra = {c: pts[c].astype(float) for c in ("train_pp", "train_ep") if c in pts.columns}
    return pd.DataFrame({**extra,
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
        # both sources time the controller path of v0.3 and before (PR #449 merged for
        # v0.3.0; the blog's Table 1 is v0.3), not v0.4's stream (refit_host.py)
        "rl_framework_version": 0.3,
    })


def _parts(pts: pd.DataFrame) -> tuple[pd.DataFrame, object]:
    df = frame(pts)
    return simulate_rl(df), inputs.to_batch(df)


def design(pts: pd.DataFrame, tensor_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base seconds, the tensors column, the entries column) per PR #449 point; the base
    holds everything priced but the entries, the engine's load at `tensor_s`."""
    p, b = _parts(pts)
    k = inputs.constants()["refit"]
    tensors = p["refit_tensors"].to_numpy()
    base = (p["weight_sync_time_s"] + p["offload_time_s"] - p["refit_host_time_s"]
            + p["refit_chain_time_s"] + p["refit_handles"] * k["ipc_handle_s"]
            + p["refit_ray_time_s"] + p["refit_trainer_python_s"]).to_numpy() + tensors * tensor_s
    n = p["refit_entries"].to_numpy()
    w, tp = b.train_gpus, b.rollout_tp * b.rollout_pp
    e = b.replicas
    passes = np.where(pts["routing"].eq("all_devices"), w * (e + tp + 3), 2 * w + tp ** 2 + 2 * tp)
    return base, tensors, n * passes


def fit_entries(pts: pd.DataFrame, tensor_s: float) -> dict:
    """controller_entry_s on the PR #449 points (non-negative weighted least squares)."""
    base, tensors, entries = design(pts, tensor_s)
    y = pts["refit_s"].to_numpy(float)
    wgt = 1.0 / y
    a, rhs = entries * wgt, (y - base) * wgt
    x = max(float(a @ rhs / (a @ a)), 0.0)
    return {"controller_entry_s": x, "pred": base + entries * x, "base": base,
            "tensors": tensors, "entries": entries, "measured": y}


def derive_steps(pts: pd.DataFrame, controller_entry_s: float) -> dict:
    """The blog's three steps -> tensor_s, megatron_tensor_s, meta_entry_s (module docstring),
    with the handle entries at `controller_entry_s`. One row (the first) is used."""
    p, _ = _parts(pts.iloc[:1])
    k = inputs.constants()["refit"]
    r = pts.iloc[0]
    n = float(p["refit_tensors"].iloc[0])
    handles = float(p["refit_handles"].iloc[0])
    passes = float(p["refit_passes"].iloc[0])
    meta = float(p["refit_meta_entries"].iloc[0])
    # the gather step as priced without the trainer's Python: the bytes (weight_sync.py, the
    # device load included) and the collective latencies
    gather = float(p["weight_sync_time_s"].iloc[0] - p["refit_host_time_s"].iloc[0]
                   + p["refit_chain_time_s"].iloc[0])
    ipc = float(p["refit_ray_time_s"].iloc[0]) + handles * (k["ipc_handle_s"]
                                                          + passes * controller_entry_s)
    out = {"tensor_s": float(r["update_s"]) / n,
           "megatron_tensor_s": max(float(r["gather_s"]) - gather, 0.0) / n,
           "meta_entry_s": max(float(r["ipc_s"]) - ipc, 0.0) / max(meta * passes, 1.0),
           "priced_gather_s": gather, "priced_ipc_s": ipc, "tensors": n, "groups":
           float(p["refit_groups"].iloc[0]), "meta_entries": meta * passes}
    return out


def fit(pts: pd.DataFrame, bd: pd.DataFrame | None = None, rounds: int = 1) -> dict:
    """Both sources, `rounds` passes (each: the PR #449 fit with the current tensor_s, then the
    blog's derivation with that controller_entry_s)."""
    bd = breakdown_points() if bd is None else bd
    k = inputs.constants()["refit"]
    tensor_s, entry_s = float(k["tensor_s"]), float(k["controller_entry_s"])
    for _ in range(max(rounds, 1)):
        res = fit_entries(pts, tensor_s)
        steps = derive_steps(bd, res["controller_entry_s"])
        moved = abs(steps["tensor_s"] - tensor_s) + abs(res["controller_entry_s"] - entry_s)
        tensor_s, entry_s = steps["tensor_s"], res["controller_entry_s"]
        if moved < 1e-12:
            break
    res = fit_entries(pts, tensor_s)
    return {**res, **{key: steps[key] for key in ("tensor_s", "megatron_tensor_s",
                                                  "meta_entry_s")}, "steps": steps}


KEYS = ("controller_entry_s", "tensor_s", "megatron_tensor_s", "meta_entry_s")


def write(res: dict) -> None:
    inputs.store_constants({k: f"{res[k]:.3g}" for k in KEYS})


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


def _headline(res: dict) -> str:
    s = res["steps"]
    return (f"NeMo RL refit blog, DeepSeek-V3 v0.3 ({s['tensors']:.0f} HF tensors, "
            f"{s['groups']:.0f} groups): tensor_s = {res['tensor_s'] * 1e6:.1f} us (update "
            f"step), megatron_tensor_s = {res['megatron_tensor_s'] * 1e6:.1f} us (gather step "
            f"less {s['priced_gather_s']:.1f} s priced), meta_entry_s = "
            f"{res['meta_entry_s'] * 1e6:.3f} us (IPC step less {s['priced_ipc_s']:.1f} s "
            f"priced, over {s['meta_entries']:.3g} entries)\n"
            f"PR #449: controller_entry_s = {res['controller_entry_s'] * 1e6:.2f} us")


def main(argv=None) -> int:
    return fit_cli(
        argv, __doc__, points, lambda pts: fit(pts, rounds=20), _headline,
        lambda r, res, i: (f"{r['point']:<20} tensors {res['tensors'][i]:>7.0f}  entries "
                           f"{res['entries'][i]:>12.3g}  base {res['base'][i]:5.1f} s"),
        write)


if __name__ == "__main__":
    sys.exit(main())
