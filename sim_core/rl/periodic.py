"""Validation and checkpoints inside an RL run's wall time, amortised per step (issue 40).

Users budget an RL run by wall clock, and every framework validates every `val_period` steps
and checkpoints every `save_period` steps inside that wall time (NeMo RL's `total_step_time`
timer encloses both: nemo_rl/algorithms/grpo.py at 29f58809, lines 1434, 1839, 2005; verl's
`fit` runs `_validate` and `_save_checkpoint` between steps: trainer/ppo/ray_trainer.py). A
blank period prices nothing, so a row or run that states none is priced as before.

- **Validation** = generation of `val_samples` sequences (one response each) at the
  validation cap on the rollout engine, `generation.generate` on a batch of those sequences,
  in calls of `val_batch` run one after another: NeMo RL's `validate()` runs
  `max_val_samples // val_batch_size` batches, each to completion, before the next (grpo.py
  29f58809 lines 2211-2260); verl iterates a dataloader of `data.val_batch_size` prompts
  (`drop_last=False`: the last call holds the rest), one `generate_sequences` call each, and
  its default (null) sends the whole set in one call (verl 0.4 trainer/ppo/ray_trainer.py as
  vendored by tajwarfahim/maxrl 91118ea5, `_create_dataloader` and `_validate`). The responses
  follow the training's length law (its mean and truncated share) capped at the validation's
  cap: validation sets are stated, their response lengths are not. Colocated, a validation
  costs one more engine sleep / wake cycle: NeMo RL refits before it (grpo.py line 1843: the
  refit the next step would have run, `POLICY_GENERATION_STALE`), puts the engine to sleep
  after it (`finish_generation`) and the next step wakes it without a transfer
  (`prepare_for_generation`, lines 1499-1501): the weights' wake and the fixed sleep / wake.
  verl's `generate_sequences` enters the rollout sharding manager, which pushes the actor's
  weights into the engine on every entry and sleeps it on exit (sharding_manager/fsdp_vllm.py
  `__enter__` / `__exit__`): the weight sync too.
- **Checkpoint period**: `save_period` steps, or a time-based `save_period_s`: AReaL saves a
  recovery checkpoint after the first step that ends `exp_ctrl.ckpt_freq_secs` seconds after
  the last (600 in v0.3.0 `training/configs/*.yaml` and in v0.1.0's
  `examples/train_small_on_ray.sh`), every ceil(600 / step) steps. Its recovery checkpoint is
  the HF model (2 B per parameter, hf_registry.save) and each rank's Megatron distributed-
  optimizer state (fp32 main weights and Adam moments, 12 B, realhf/impl/model/backend/
  megatron.py `save`): Megatron's 14 B, spread over the trainer's ranks.
- **Checkpoint** = the bytes the trainer writes, at the storage's write bandwidth per node
  (catalogs/rl.yaml `periodic.storage_gbs_per_node`, a cited default; a run may set its own):
  per trained parameter fp32 master weights + AdamW's two fp32 moments (12 B) for FSDP / DTensor
  trainers, each rank its shard (verl FSDPCheckpointManager sharded model / optim state dicts
  of the fp32 actor, verl 0.1 to 0.4; NeMo RL DTensor DCP or Automodel sharded safetensors of
  fp32 master weights + optimizer, `save_optimizer: true`, 29f58809), Megatron-Core's
  torch_dist (bf16 weights + fp32 main weights and moments, 14 B, spread over the ranks:
  catalogs/frameworks.yaml); a PPO critic doubles it; `save_hf_model`: rank 0 also writes the
  gathered fp32 model (verl 0.1's FSDPCheckpointManager always does; later verl with
  `checkpoint.contents` hf_model). The busiest node writes its share plus rank 0's export.
  Synchronous: none of these frameworks saves asynchronously at the rows' versions.
"""

from __future__ import annotations

import numpy as np

from ..columns import Batch
from . import generation
from .inputs import constants

GB = 1e9


def _k() -> dict:
    return constants()["periodic"]


def _col(b, name: str, default: float) -> np.ndarray:
    """A batch column as floats (NaN -> default); the default where a batch lacks it."""
    v = b.floats(name)
    return np.where(np.isnan(v), default, v)


def storage_bytes_per_s(b) -> np.ndarray:
    """Per row, the storage's per-node bandwidth in B/s: the row's or run's
    `storage_gbs_per_node`, the catalog's cited default where blank (or not positive: run files
    and spaces reject those). Checkpoints write at it; AReaL's disk refit (disk_refit.py)
    writes and reads at it."""
    v = b.floats("storage_gbs_per_node")
    return np.where(np.isnan(v) | (v <= 0), float(_k()["storage_gbs_per_node"]), v) * GB


def active(b) -> tuple[np.ndarray, np.ndarray]:
    """(rows that validate, rows that checkpoint): a positive period and, for validation, a
    positive number of samples. Blank (NaN / 0) = nothing priced."""
    vp, vs = _col(b, "val_period", 0.0), _col(b, "val_samples", 0.0)
    sp, sps = _col(b, "save_period", 0.0), _col(b, "save_period_s", 0.0)
    return (vp > 0) & (vs > 0), (sp > 0) | (sps > 0)


def save_period_steps(b, step_s) -> np.ndarray:
    """Steps per checkpoint: `save_period` where stated, else the time-based period
    `save_period_s` over the step: AReaL's master worker checks its checkpoint control at
    every step and saves once `ckpt_freq_secs` have passed since the last save
    (inclusionAI/AReaL v0.3.0 realhf/system/master_worker.py `__ckpt_ctl.check`,
    realhf/base/timeutil.py FrequencyControl: `frequency_seconds`), so a step of T seconds
    checkpoints every ceil(period / T) steps (every step once T >= period)."""
    sp, sps = _col(b, "save_period", 0.0), _col(b, "save_period_s", 0.0)
    step = np.maximum(np.nan_to_num(np.asarray(step_s, dtype=float), nan=1.0), 1e-9)
    by_time = np.maximum(np.ceil(sps / step), 1.0)
    return np.where(sp > 0, sp, np.where(sps > 0, by_time, 1.0))


def validation_batch(b, rows: np.ndarray, size: np.ndarray) -> Batch:
    """The rollout batch of one validation call of `size` sequences for `rows` (a mask): one
    response each, at `val_max_len` (blank: the training's cap) with the training's mean
    (capped there) and truncated share."""
    sub = Batch({k: np.asarray(v)[rows] for k, v in b.items()})
    cap = np.where(_col(sub, "val_max_len", 0.0) > 0, _col(sub, "val_max_len", 0.0),
                   sub.response_max)
    sub["prompts_per_step"] = size
    sub["responses_per_prompt"] = np.ones(len(size))
    sub["sequences"] = size
    sub["response_max"] = cap
    sub["response_mean"] = np.minimum(sub.response_mean, cap)
    return sub


def calls(b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequences per full call, full calls, sequences of the last, partial call: 0 if none)
    of one validation: `val_batch` (blank: all `val_samples` in one call)."""
    samples = _col(b, "val_samples", 0.0)
    vb = _col(b, "val_batch", 0.0)
    per = np.minimum(np.where(vb > 0, vb, samples), samples)
    full = np.floor(samples / np.maximum(per, 1.0))
    return per, full, samples - full * per


def validation_seconds(b, resident_gib, gen_scale=1.0, cycle_fixed_s=0.0,
                       cycle_sync_s=0.0) -> dict:
    """Per row: one validation (`validation_run_s`: its generation calls, `gen_scale` times,
    + the colocated engine cycle the caller prices: `cycle_fixed_s` the wake and the fixed
    sleep / wake, `cycle_sync_s` a weight push) and its share of a step, in parts a phase
    scale acts on apart (`validation_gen_s`, `validation_fixed_s`, `validation_sync_s`;
    their sum `validation_time_s` = run / val_period); zeros where no validation is priced."""
    n = len(b.placement)
    on, _ = active(b)
    gen = np.zeros(n)
    if on.any():
        res = (np.asarray(resident_gib, float) * np.ones(n))[on]
        per, full, rest = (x[on] for x in calls(b))
        t = full * generation.generate(validation_batch(b, on, per), resident_gib=res)[
            "gen_time_s"]
        if (rest > 0).any():  # the last call holds what is left (a batch of its own)
            last = generation.generate(validation_batch(b, on, np.maximum(rest, 1.0)),
                                       resident_gib=res)["gen_time_s"]
            t = t + np.where(rest > 0, last, 0.0)
        gen[on] = t * (np.asarray(gen_scale, float) * np.ones(n))[on]
    per_step = np.where(on, 1.0 / _col(b, "val_period", 1.0), 0.0)
    fixed = np.asarray(cycle_fixed_s, float) * np.ones(n)
    sync = np.asarray(cycle_sync_s, float) * np.ones(n)
    parts = {"validation_gen_s": gen * per_step, "validation_fixed_s": fixed * per_step,
             "validation_sync_s": sync * per_step}
    return {"validation_run_s": np.where(on, gen + fixed + sync, 0.0),
            "validation_time_s": sum(parts.values()), **parts}


def checkpoint_bytes(b, fsdp) -> dict:
    """Per row: bytes of one checkpoint in all (`checkpoint_bytes`) and on the busiest node
    (`checkpoint_node_bytes`): the trainer's sharded state spread over its nodes, plus rank
    0's gathered export where `save_hf_model`."""
    k = _k()
    per_param = np.where(np.asarray(fsdp, bool), float(k["fsdp_bytes_per_param"]),
                         float(k["megatron_bytes_per_param"]))
    models = np.where(b.algorithm == 2, 2.0, 1.0)  # ppo: the critic is saved too
    sharded = per_param * b.params * models
    hf = np.where(_col(b, "save_hf_model", 0.0) > 0,
                  float(k["hf_export_bytes_per_param"]) * b.params * models, 0.0)
    nodes = np.maximum(np.ceil(b.train_gpus / np.maximum(b.gpus_per_node, 1.0)), 1.0)
    return {"checkpoint_bytes": sharded + hf, "checkpoint_node_bytes": sharded / nodes + hf}


def checkpoint_seconds(b, fsdp, step_s=None) -> dict:
    """Per row: one checkpoint's write (`checkpoint_write_s`: the busiest node's bytes at the
    storage's per-node write bandwidth) and its share of a step (`checkpoint_time_s` = write /
    the period in steps, `save_period_steps`; step_s: the step a time-based period is counted
    against, the white-box step before validation and checkpoints); zeros where no checkpoint
    is priced."""
    _, on = active(b)
    by = checkpoint_bytes(b, fsdp)
    bw = storage_bytes_per_s(b)
    write = np.where(on, by["checkpoint_node_bytes"] / bw, 0.0)
    step = np.full(len(b.placement), np.nan) if step_s is None else step_s
    period = np.where(on, save_period_steps(b, step), 1.0)
    return {"checkpoint_write_s": write, "checkpoint_time_s": write / period,
            "checkpoint_gib": np.where(on, by["checkpoint_bytes"] / 2.0 ** 30, 0.0)}
