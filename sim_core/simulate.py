"""The simulator's front door: configurations in, predictions out.

`simulate(batch)` is the vectorized hot path (numpy arrays in, arrays out);
`simulate_frame(df)` wraps it for tables (the search engine, the CLI, validation).
Invalid configurations are computed on harmless stand-in values and then blanked, so the
hot path never branches per configuration.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import distinct, finetune, frameworks, goodput, memory, risk, rules, step, workload
from .arrays import keep_freed_memory, select, where
from .columns import Batch, frame_to_batch

# the simulator's temporaries reuse freed heap instead of faulting fresh pages (arrays.py)
keep_freed_memory()

# fields replaced by 1 in invalid rows so that the arithmetic stays finite
_SAFE_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "dp")


def _safe(b: Batch, valid: np.ndarray) -> Batch:
    if valid.all():
        return b
    s = Batch(b)
    for f in _SAFE_FIELDS:
        s[f] = select(valid, b[f], 1.0 if f != "dp" else 0.0)
    # num_gpus must match the stand-in world size
    s["num_gpus"] = select(valid, b.num_gpus, 1.0)
    s["global_batch"] = select(valid, b.global_batch, 1.0)
    sp = np.asarray(b.sequence_parallel)
    # (for a bool column the same as np.where(valid, sp, False), without a branch per row)
    s["sequence_parallel"] = sp & valid if sp.dtype == bool else np.where(valid, sp, False)
    return s


def simulate(b: Batch, profile=None, with_fabric: bool = False) -> dict:
    """Predict step time, breakdown and memory for every configuration in the batch
    (with_fabric: also the `fabric_*` columns a run calibration fits on, step.fabric)."""
    with distinct.scope():
        return _simulate(b, profile, with_fabric)


def _simulate(b: Batch, profile, with_fabric: bool = False) -> dict:
    valid, reason = rules.check(b)
    s = _safe(b, valid)
    with np.errstate(divide="ignore", invalid="ignore"):
        # without ops: the compute model builds and prices them once per distinct input
        wl = workload.build(s, ops=not distinct.enabled())
        times = step.compose(s, wl, profile, with_fabric)
        mem = memory.estimate(s, wl)
        step_t = times["step_time_s"]
        tokens = s.global_batch * s.seq_len
        if "mean_seq_len" in s:  # unpacked fine-tuning samples: the padding is not data
            tokens = tokens * finetune.useful_token_share(s)
        n = s.num_gpus
        peak = s.peak_bf16 * 1e12
        # MFU against the bf16 dense peak (also for FP8 runs, as NVIDIA and torchtitan report)
        mfu = wl.model_flops_per_step / (step_t * n * peak)
        recompute_share = where(s.recompute == 2, 1.0 / 3.0, 0.0)  # full: +1 fwd of 3 passes
        hfu = mfu * (1 + recompute_share)
    out = {
        "valid": valid,
        "invalid_reason": reason,
        "dp": wl.dp,
        "num_microbatches": wl.num_microbatches,
        "step_time_s": step_t,
        "tokens_per_s_per_gpu": tokens / (step_t * n),
        "mfu": mfu,
        "hfu": hfu,
        **{k: v for k, v in times.items() if k != "step_time_s"},
        **mem,
        # probability that the real peak exceeds HBM, from the memory model's measured error
        "oom_risk": risk.oom_risk(mem["peak_memory_gib"], s.hbm_gib,
                                  frameworks.column(s, "framework")),
        # failures, checkpoints and restarts (goodput.py)
        **goodput.estimate(s, wl, step_t),
        "params_per_gpu": wl.params_stage,
        "moe_load_factor": wl.moe_load,
    }
    # blank the invalid rows: x * 1 is x exactly (x * NaN is NaN), and a product is cheaper
    # than a select on a scattered mask
    keep = where(valid, 1.0, np.nan)
    for k, v in out.items():
        if k in ("valid", "invalid_reason"):
            continue
        if k == "fits":
            out[k] = v & valid if v.dtype == bool else np.where(valid, v, False)
        else:
            out[k] = np.asarray(v, dtype=np.float64) * keep
    return out


def simulate_frame(df: pd.DataFrame, profile=None, with_fabric: bool = False) -> pd.DataFrame:
    """Simulate a table of configurations (columns named as in specs.ALL_COLUMNS)."""
    if len(df) == 0:
        return pd.DataFrame(index=df.index)
    b = frame_to_batch(df)
    out = simulate(b, profile, with_fabric)
    return pd.DataFrame(out, index=df.index)


def check_rules(df: pd.DataFrame) -> pd.Series:
    """Reason each configuration is invalid ('' where valid), without simulating."""
    b = frame_to_batch(df)
    _, reason = rules.check(b)
    return pd.Series(reason, index=df.index, dtype=object)
