"""Goodput: the share of wall time a training job spends on useful steps once failures,
checkpoints and restarts are counted.

At thousands of GPUs a job is interrupted every few hours (Llama 3: 419 unexpected
interruptions in 54 days on 16,384 H100), so the fastest configuration on 16k GPUs can lose to a
slower one on 8k. Per configuration, vectorized:

- failures: interruptions per server-day by GPU generation (catalogs/reliability.yaml, cited)
  or the cluster's `mtbf_node_hours`; a job on n servers fails n times as often (it stops at the
  first failure of any of them), so its mean time between failures is M = MTBF_node / n.
- checkpoint: what the framework saves (frameworks.yaml `checkpoint`: weights and optimizer
  bytes per parameter, never gradients), in total and on the rank that writes most; written
  and read at the storage bandwidth (`storage_gbs`, default 1 GB/s per server). A synchronous
  save blocks training for the write; an asynchronous one only for the device-to-host copy,
  but a failure during its background write loses that checkpoint (one write time more lost).
- restart: detection + rescheduling + process start (`restart_min`, default 10 min) + the load.
- interval: Daly's (2006) higher-order optimum, as a whole number of steps, unless the run sets
  `checkpoint.interval_steps`.
- goodput: Daly's expected wall time under Poisson failures (Daly 2006, eq. for T_w):
      T_wall / T_solve = M e^{R/M} (e^{(tau + delta)/M} - 1) / tau
  goodput = T_solve / T_wall. Its first-order form is 1 - delta/tau - (tau/2 + R)/M.

Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974;
Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
2006. Both reproduce Daly's own figure values (tests/test_goodput.py).
"""

from __future__ import annotations

import functools
from importlib import resources
from types import SimpleNamespace

import numpy as np

from . import catalog_yaml, distinct, finetune, frameworks
from .arrays import where
from .columns import Batch

GB = 1e9
CATALOG_GPUS_PER_NODE = 8  # the published rates are per 8-GPU server


@functools.lru_cache(maxsize=1)
def catalog() -> dict:
    """catalogs/reliability.yaml as loaded (rates by sm_arch, storage, staging, restart)."""
    text = resources.files("sim_core").joinpath("catalogs/reliability.yaml").read_text()
    return catalog_yaml.read(text)


def _by_arch(table: dict, arch: np.ndarray) -> np.ndarray:
    """Look a per-generation value up by sm_arch: the newest generation at or below it (the
    oldest for anything older)."""
    keys = sorted(int(k) for k in table)
    vals = np.array([float(table[k]) for k in keys])
    idx = np.searchsorted(np.array(keys), np.asarray(arch, dtype=np.float64), side="right") - 1
    return vals[np.clip(idx, 0, len(keys) - 1)]


def node_interruptions_per_day(arch) -> np.ndarray:
    """Published unexpected interruptions per 8-GPU server per day for each sm_arch."""
    gens = catalog()["generations"]
    return _by_arch({k: g["interruptions_per_node_day"] for k, g in gens.items()}, arch)


# ---------------------------------------------------------------------------------------------
# The formulas (plain functions of arrays; the tests check them against hand-derived values)
# ---------------------------------------------------------------------------------------------
def young_interval(delta, mtbf):
    """Young (1974): compute time between checkpoints tau = sqrt(2 delta M)."""
    return np.sqrt(2.0 * np.asarray(delta) * np.asarray(mtbf))


def daly_interval(delta, mtbf):
    """Daly (2006): tau = sqrt(2 delta M) [1 + 1/3 sqrt(delta/2M) + 1/9 (delta/2M)] - delta for
    delta < 2M, else M."""
    delta, mtbf = np.asarray(delta, dtype=np.float64), np.asarray(mtbf, dtype=np.float64)
    x = delta / (2.0 * mtbf)
    tau = np.sqrt(2.0 * delta * mtbf) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - delta
    return where(delta < 2.0 * mtbf, tau, mtbf)


def goodput_fraction(tau, delta, restart, mtbf):
    """Useful time / wall time under Poisson failures (Daly 2006): checkpoint every tau of
    compute, each blocking delta, a restart of `restart` after each failure, mean time between
    failures `mtbf` (inf: no failures, tau / (tau + delta))."""
    tau, delta = np.asarray(tau, dtype=np.float64), np.asarray(delta, dtype=np.float64)
    restart, mtbf = np.asarray(restart, dtype=np.float64), np.asarray(mtbf, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        wall = mtbf * np.exp(restart / mtbf) * np.expm1((tau + delta) / mtbf) / tau
        wall = where(np.isinf(mtbf), (tau + delta) / tau, wall)
    return 1.0 / wall


# ---------------------------------------------------------------------------------------------
# Per configuration
# ---------------------------------------------------------------------------------------------
def _col(b, name, default):
    """A batch column, or its default where a hand-built batch leaves it out."""
    return np.asarray(b[name], dtype=np.float64) if name in b else np.full(len(b.tp), default,
                                                                              dtype=np.float64)


def checkpoint_bytes(b, wl) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(total bytes of one checkpoint, bytes the busiest rank writes, async by default) as
    the configuration's framework saves them."""
    fw_code = frameworks.column(b, "framework")
    ck = frameworks.checkpoint_arrays(fw_code)
    mem = frameworks.memory_arrays(fw_code, b.zero)
    total = (ck["weights_bytes"] + ck["optimizer_bytes"]) * wl.params_total
    if wl.params_trainable is not None:  # LoRA / QLoRA: the adapters are the checkpoint
        fz = finetune.frozen(b)
        total = where(fz, (ck["weights_bytes"] + ck["optimizer_bytes"])
                         * finetune.adapter_params_total(b, wl.dims), total)
    # the busiest rank's parameters, as memory.py shards them: dense ones over dp x cp, expert
    # ones over the expert data-parallel group
    ds = wl.dp * b.cp
    edp = np.maximum(wl.dp * b.cp * b.tp / (b.ep * where(b.etp > 0, b.etp, b.tp)), 1.0)
    P = wl.params_stage if wl.params_trainable is None else wl.params_trainable
    P_exp = P * wl.expert_fraction
    P_shard = (P - P_exp) / ds + P_exp / edp
    # written once, spread over the data-parallel ranks (Megatron fully_parallel_save, DCP):
    # every rank writes its 1/dp share; otherwise data-parallel rank 0 writes the replicated
    # weights and each rank its optimizer shard (or all of it when unsharded)
    spread = (ck["weights_bytes"] + ck["optimizer_bytes"]) * P_shard
    weights = ck["weights_bytes"] * where(b.zero >= 3, P_shard, P)
    opt = ck["optimizer_bytes"] * where(b.zero >= mem["optimizer_shard_zero"], P_shard, P)
    shard = where(ck["dedup"], spread, weights + opt)
    return total, shard, ck["async"]


# the workload arrays the checkpoint model reads, as columns of the batch it is factorised on
_WL_FIELDS = ("params_total", "params_stage", "expert_fraction", "dp")


def estimate(b, wl, step_time_s) -> dict:
    """Failures, checkpoint and restart figures, the interval and the goodput per
    configuration (arrays; see the module doc for the model). What does not depend on the step
    time (`fixed`) is evaluated once per distinct input (sim_core.distinct); the interval and
    the goodput, which do, per row."""
    if wl.params_trainable is None and distinct.enabled():
        # the workload's arrays ride along as columns, so that the key holds them too
        aug = Batch(b)
        aug.update({f"_wl_{k}": getattr(wl, k) for k in _WL_FIELDS})
        f = distinct.on_distinct("goodput.fixed", aug, lambda sb: fixed(sb, SimpleNamespace(
            params_trainable=None, **{k: sb[f"_wl_{k}"] for k in _WL_FIELDS})))
    else:
        f = fixed(b, wl)
    return with_step(f, step_time_s)


def fixed(b, wl) -> dict:
    """The failure rate, checkpoint sizes and times, restart and Daly's interval in seconds:
    everything `estimate` needs but the step time."""
    cat = catalog()
    n = b.num_gpus
    gpn = _col(b, "gpus_per_node", 8.0)
    nodes = n / gpn
    arch = _col(b, "sm_arch", 90.0)
    # failures per second of the job
    user_mtbf = _col(b, "mtbf_node_hours", 0.0)
    per_gpu_s = node_interruptions_per_day(arch) / CATALOG_GPUS_PER_NODE / 86400.0
    rate = where(user_mtbf > 0, nodes / (where(user_mtbf > 0, user_mtbf, 1.0) * 3600.0),
                    n * per_gpu_s)
    mtbf = 1.0 / rate
    # checkpoint size and times
    total, shard, fw_async = checkpoint_bytes(b, wl)
    storage = _col(b, "storage_gbs", 0.0)
    storage = where(storage > 0, storage, cat["storage_gbs_per_node"] * nodes) * GB
    # the busiest writer gets its 1/n share of the bandwidth (balanced writers: total / bw)
    write_s = np.maximum(total, shard * n) / storage
    load_s = write_s  # read back at the same bandwidth
    stage_s = shard / (_by_arch(cat["staging_gbs"], arch) * GB)
    ask = _col(b, "ckpt_async", -1.0)
    is_async = where(ask >= 0, ask > 0, fw_async)
    delta = where(is_async, stage_s, write_s)
    restart_min = _col(b, "restart_min", 0.0)
    restart_s = where(restart_min > 0, restart_min * 60.0, cat["restart_s"]) + load_s
    # an async save still being written when a failure hits is lost: one write time more
    lost = restart_s + where(is_async, write_s, 0.0)
    return {"mtbf": mtbf, "rate": rate, "total": total, "shard": shard, "write_s": write_s,
            "delta": delta, "restart_s": restart_s, "lost": lost, "is_async": is_async,
            "user_steps": _col(b, "ckpt_interval_steps", 0.0),
            "daly_s": daly_interval(delta, mtbf)}


def with_step(f: dict, step_time_s) -> dict:
    """`estimate`'s outputs from `fixed`'s parts and the step time."""
    mtbf, rate, write_s, delta = f["mtbf"], f["rate"], f["write_s"], f["delta"]
    is_async, lost, user_steps = f["is_async"], f["lost"], f["user_steps"]
    total, shard, restart_s = f["total"], f["shard"], f["restart_s"]
    # interval: whole steps; an async save must finish before the next one starts
    step = np.maximum(np.asarray(step_time_s, dtype=np.float64), 1e-9)
    best = np.maximum(np.round(f["daly_s"] / step), 1.0)
    best = np.maximum(best, where(is_async, np.ceil(write_s / step), 1.0))
    steps = where(user_steps > 0, user_steps, best)
    tau = steps * step
    good = goodput_fraction(tau, delta, lost, mtbf)
    return {
        "goodput": good,
        "interruptions_per_day": rate * 86400.0,
        "job_mtbf_h": mtbf / 3600.0,
        "ckpt_total_gb": total / GB,
        "ckpt_rank_gb": shard / GB,
        "ckpt_write_s": write_s,
        "ckpt_block_s": delta,
        "ckpt_is_async": is_async.astype(np.float64),
        "ckpt_every_steps": steps,
        "ckpt_interval_min": tau / 60.0,
        "restart_s": restart_s,
    }
