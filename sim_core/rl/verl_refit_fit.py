"""Fit verl's per-key host cost of a Megatron refit on published weight-transfer totals.

    python -m sim_core.rl.verl_refit_fit            # the fit, its error per point
    python -m sim_core.rl.verl_refit_fit --write    # also store it in catalogs/rl.yaml `refit`

The points (`sim_core/data/rl/refit_published_verl.csv`): verl issue 5311's DeepSeek-V3.1
weight-transfer durations through mbridge's `export_weights` at two stated layouts (TP8 PP16
EP8 on 128 GPUs: 120 s; PP16 EP16 on 256 GPUs: 80 s). Nothing from `rl_runs.csv` enters the
fit: its verl Megatron rows are the out-of-sample check.

Per point: duration = what `weight_sync.py` prices without the constant (the bytes of verl's
walk, its per-key NCCL latencies, the engine's copy) + keys walked x `verl_key_s`, one unknown,
non-negative, minimising the squared relative errors. Keys: every stage's Megatron keys and one
EP rank's experts (`refit_host.megatron_keys`), 4,139 and 2,283 at the two layouts: the second
point walks half the keys and takes two thirds of the time, which a cost per key explains
(a cost per Hugging Face tensor would not: both points yield the same ~46,000).
"""

from __future__ import annotations

import sys
from importlib import resources

import numpy as np
import pandas as pd

from . import inputs, refit_fit, weight_sync

POINTS = "data/rl/refit_published_verl.csv"


def points() -> pd.DataFrame:
    return pd.read_csv(resources.files("sim_core").joinpath(POINTS).open())


def design(pts: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(seconds priced without the constant, keys walked) per point."""
    df = pd.DataFrame({
        "algorithm": "grpo", "model": pts["model"], "gpu": pts["gpu"],
        "num_gpus": pts["num_gpus"].astype(float), "placement": "colocated",
        "rollout_tp": pts["rollout_tp"].astype(float), "prompts_per_step": 64.0,
        "responses_per_prompt": 8.0, "prompt_len": 256.0, "response_mean": 1024.0,
        "response_max": 4096.0, "gpu_memory_utilization": 0.6, "mini_batches": 1.0,
        "rl_framework": "verl"})
    b = inputs.to_batch(df)
    col = lambda c: pts[c].to_numpy(float)
    ws = weight_sync.sync_time(b, col("train_tp"), col("train_pp"), np.ones(len(pts)),
                               col("train_ep"), b.train_gpus, col("train_etp"))
    base = ws["weight_sync_time_s"] - ws["sync_verl_key_host_s"]
    return base, ws["sync_verl_keys"]


def fit(pts: pd.DataFrame) -> dict:
    base, keys = design(pts)
    y = pts["refit_s"].to_numpy(float)
    a, r = keys / y, (y - base) / y
    c = max(float(a @ r / (a @ a)), 0.0)
    return {"verl_key_s": c, "pred": base + c * keys, "base": base, "keys": keys,
            "measured": y}


def main(argv=None) -> int:
    return refit_fit.fit_cli(
        argv, __doc__, points, fit,
        lambda res: f"verl_key_s = {res['verl_key_s'] * 1e3:.2f} ms per Megatron key",
        lambda r, res, i: (f"{r['point']:<24} keys {res['keys'][i]:>6.0f}  priced without it "
                           f"{res['base'][i]:5.1f} s"),
        lambda res: inputs.store_constants({"verl_key_s": f"{res['verl_key_s']:.3g}"}))


if __name__ == "__main__":
    sys.exit(main())
