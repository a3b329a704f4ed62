"""One RL step: the phases composed by placement and asynchrony, memory per phase, verdicts.

- **Colocated** (verl's hybrid engine, NeMo RL `colocated.enabled: true`): every GPU generates,
  then computes log-probs and trains; the phases add. Between them the engine sleeps (verl
  v0.7.0 rollout.yaml `free_cache_engine: True`: vLLM's sleep mode drops the KV cache and
  moves its weights to the host) and wakes (weights back over PCIe, at the rate vLLM's
  sleep-mode blog measured), and the training states the run offloads (`param_offload`,
  `optimizer_offload`) go to the host and back. Memory
  during generation holds the resident training states plus the engine's
  `gpu_memory_utilization` share; during training, the training peak.
- **Split** (verl `recipe/one_step_off_policy` / `fully_async_policy`, NeMo RL non-colocated):
  rollout_gpus generate, the others train. `sync`: the phases still add (each side idles while
  the other works). `one_step_off`: generation of the next batch overlaps this update, the step
  is the slower of the two pipelines plus the weight sync that both wait for (verl v0.7.0
  recipe/one_step_off_policy/ray_trainer.py `fit`: wait for the pending generation, then
  `sync_rollout_weights` on the critical path, then launch the next generation and run
  old_log_prob, ref, update_actor while it runs). `async` with `partial_rollout` (verl v0.7.0
  recipe/fully_async_policy config `partial_rollout: True`: the rollouter is interrupted at
  a sync and its in-flight requests resume on the new weights; NeMo RL v0.7.0
  `in_flight_weight_updates: true`: ongoing generations finish on their KV caches): rollouts
  stream with at most `staleness` policy versions of lag, so the tail's idle slots are filled
  by the next batches' requests: generation costs its throughput time plus the tail spread
  over 1 + staleness steps. `async` without it (NeMo RL's default: trajectory_collector.py
  `prepare_for_refit` waits for all pending generations before every refit, and grpo.py warns
  that a larger max_trajectory_age_steps then gives no benefit): the tail drains before each
  sync, so the step composes as one step off whatever the staleness.
- AReaL v0.3 moves the weights through shared storage (`disk_refit.py`, `refit_via_disk`): the
  trainer's save and the engines' load replace the NCCL weight sync; an AReaL async step also
  prefills the interrupted requests again once per update (`reprefill_on_update`,
  generation.reprefill_time), on its generation side.
- Colocated with `one_step_off`/`async` is invalid (nothing to overlap on the same GPUs).
- Work that does not scale with the model (`step_fixed.py`): the engine's sleep / wake beyond
  its bytes and the trainer's allocator cleaning around the refit add to a colocated step; the
  cleaning before the log-prob pass and the update joins the training pipeline everywhere, as
  does verl's driver between the phases (`verl_driver.py`: reward, advantage, batch passes).
- Validation and checkpoints inside the run's wall time (`periodic.py`), amortised per step,
  add to the composed step in every mode (the trainer waits for both); a row or run that
  states no period is priced without them (`step_time_without_periodic_s` is the step
  before them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import (disk_refit, generation, inputs, periodic, refit_host, refit_timer, step_fixed,
               training, verl_driver, weight_sync)


def _pcie(b) -> np.ndarray:
    return training.pcie_bytes_per_s(b)


# per-phase multiplicative scales of a calibration profile (`sweep calibrate rl-runs`,
# sim_core/calibration/rl_phases.py), installed by sim_core.profiles.activate; None = the
# shipped scales (default_scales: NeMo RL's two fitted training-pass scales, white-box
# everywhere else)
PHASE_SCALES = ("generation", "log-probs", "update", "weight sync")
_phase_scales: dict | None = None


def set_phase_scales(scales: dict | None) -> None:
    """Install (or with None remove) the phase scales every later simulate_rl applies."""
    global _phase_scales
    if scales:
        bad = sorted(set(scales) - set(PHASE_SCALES))
        if bad:
            raise ValueError(f"{bad[0]}: not an RL phase (phases: {', '.join(PHASE_SCALES)})")
    _phase_scales = {k: float(v) for k, v in scales.items()} if scales else None


def phase_scales() -> dict | None:
    """The installed phase scales (None: the white-box model)."""
    return dict(_phase_scales) if _phase_scales else None


def default_scales(b) -> dict:
    """The shipped phase scales per row: NeMo RL's log-prob passes and update times the fitted
    `nemo_rl_logprob_scale` / `nemo_rl_update_scale` (catalogs/rl.yaml, where why and how they
    were fitted is said; sim_core/calibration/rl_defaults.py fits them); 1 on every other row.
    Empty when no row is NeMo RL's."""
    nemo = b.rl_framework == inputs.RL_FRAMEWORK.index("nemo_rl")
    if not nemo.any():
        return {}
    k = default_scales_values()
    return {p: np.where(nemo, v, 1.0) for p, v in k.items()}


def default_scales_values() -> dict:
    """NeMo RL's shipped training-pass scales by phase (catalogs/rl.yaml)."""
    k = inputs.constants()
    return {"log-probs": float(k["nemo_rl_logprob_scale"]),
            "update": float(k["nemo_rl_update_scale"])}


def compose_step(asynchrony, g_tail, g_async, lp, up, sync, t_off, fixed_serial=0.0,
                 prep=0.0) -> np.ndarray:
    """The step from its phases (module docstring): sync adds them; one step off overlaps
    the generation (with its tail) with log-probs + update, then waits for the weight sync;
    async overlaps its streamed generation the same way. `fixed_serial`: work on the serial
    path of a colocated step only (step_fixed.py: the engine's sleep / wake, the cleaning
    around the refit); `prep`: the training pipeline's own cleaning, with log-probs + update."""
    serial = g_tail + lp + up + sync + t_off + fixed_serial + prep
    return np.select([asynchrony == 0, asynchrony == 1],
                     [serial, np.maximum(g_tail, lp + up + prep) + sync],
                     np.maximum(g_async, lp + up + prep) + sync)


def _offloaded_gib(b, tr: dict, zero) -> np.ndarray:
    """GiB of training states a colocated run moves off the GPU for generation: the
    parameters with their gradient buffers (param_offload) and the optimizer's moved share."""
    moved = refit_timer.optimizer_moved_share(b, zero >= 3)
    return (b.offload_params * (tr["train_weights_gib"] + tr["train_grads_gib"])
            + b.offload_optimizer * moved * tr["train_optimizer_gib"])


def _gen_paths(b, gen: dict) -> tuple[np.ndarray, np.ndarray]:
    """(the generation a synchronous step waits for, with its tail; what an asynchronous step
    streams) from generation.generate's seconds."""
    # DAPO's dynamic-sampling filter: each round generates the whole batch again, tail
    # included (SkyRL trainer_utils.handle_dynamic_sampling; verl recipe/dapo): `gen_rounds`
    rounds = np.maximum(np.nan_to_num(b.gen_rounds, nan=1.0), 1.0)
    g_tail = gen["gen_time_s"] * rounds
    g_thr = gen["gen_time_throughput_s"] * rounds
    g_spread = g_thr + (g_tail - g_thr) / (1 + np.maximum(b.staleness, 0))
    # without partial rollouts / in-flight weight updates every sync waits for the pending
    # generations: the tail is paid each step, as one step off
    g_async = np.where(b.partial_rollout > 0, g_spread, g_tail)
    # each weight update (one per step) interrupts the running requests, prefilled again on
    # the new weights (generation.reprefill_time; 0 unless the run does)
    return g_tail, g_async + gen["reprefill_time_s"]


def simulate_rl(df: pd.DataFrame, profile=None, phase_scales=None) -> pd.DataFrame:
    """Predict one RL step for every row of `df` (columns of inputs.RL_COLUMNS plus the
    training layout as train_tp, train_pp, ...). Returns one row of predictions per row.

    phase_scales: {phase: factor} multiplying a phase's seconds before the step is composed
    (so overlap and the critical path stay physical); None takes the installed ones
    (set_phase_scales, a profile's `rl_phases`) or, with none installed, the shipped ones
    (default_scales: NeMo RL's training passes); {} forces the white-box model."""
    df = df.reset_index(drop=True)
    b = inputs.to_batch(df)
    tr = training.passes(df, b, profile)
    ttp = _train(df, "train_tp")
    tpp = _train(df, "train_pp")
    zero = _train(df, "train_zero", 1.0)
    colo = b.placement == 0
    # what the colocated trainer keeps on the GPU while the engine generates (the states it
    # does not offload, off_gib below): SGLang's mem_fraction_static applies to the memory
    # left (sglang_memory.py); vLLM's share of the total does not depend on it
    resident = np.where(colo, tr["train_states_gib"] - _offloaded_gib(b, tr, zero), 0.0)
    gen = generation.generate(b, resident_gib=resident)
    # FSDP shards over every training rank: its data-parallel ranks times verl's Ulysses group
    # (verl v0.5.0 workers/fsdp_workers.py: the FSDP device_mesh spans the world, the Ulysses
    # (dp, sp) mesh only routes the data)
    shard = np.where(zero >= 3, tr["train_dp"] * training.ulysses(df), 1.0)
    ws = weight_sync.sync_time(b, ttp, tpp, np.nan_to_num(shard, nan=1.0),
                              _train(df, "train_ep"), b.train_gpus, _train(df, "train_etp"))
    colo = b.placement == 0
    split = ~colo
    # NeMo RL's colocated refit: the per-tensor collectives, Python and controller entries
    # (refit_host.py); groups are sized on the memory free once the optimizer is offloaded and
    # the engine's weights are woken
    # (what NeMo RL's Megatron offload leaves of the simulator's 12 B: refit_timer.py)
    moved = refit_timer.optimizer_moved_share(b, zero >= 3)
    kept_opt = b.offload_optimizer * (1.0 - moved) * tr["train_optimizer_gib"]
    free = (b.hbm_gib - tr["train_weights_gib"] - gen["rollout_weights_gib"]
            - np.where(colo, kept_opt, 0.0)) * 2.0 ** 30
    rh = refit_host.host_time(b, zero >= 3, np.maximum(free, 0.0), ttp, tpp,
                              _train(df, "train_ep"), np.nan_to_num(shard, nan=1.0),
                              inputs.network(b))
    ws["weight_sync_time_s"] = ws["weight_sync_time_s"] + rh["refit_host_s"]

    # offload / reload around generation (colocated): the engine's weights back in, and the
    # training states the run offloads out and back
    gib = 2.0 ** 30
    # the gradient buffers leave the GPU with the parameters: NeMo RL's offload_before_refit
    # moves them out (v0.7.0 megatron_policy_worker.py `move_model(..., move_grads=True)`, "get
    # rid of grad buffers"; Megatron frees them, storage().resize_(0)), verl's recipes set
    # `megatron.grad_offload=${offload}` with `param_offload` (run_qwen3-235b_megatron_96gb.sh,
    # run_deepseek671b_math_megatron_80gb.sh ALL_OFFLOAD at v0.7.0): memory only, no copy priced
    off_gib = _offloaded_gib(b, tr, zero)
    # weights through pinned buffers at PCIe rate; optimizer states through pageable memory
    # (catalogs/rl.yaml pageable_slowdown: NeMo RL's `v.to("cpu")` and back)
    pinned = 2 * b.offload_params * tr["train_weights_gib"]
    pageable = (2 * b.offload_optimizer * moved * tr["train_optimizer_gib"]
                * tr["gen_optimizer_moves"])
    slow = float(inputs.constants().get("pageable_slowdown", 1.0))
    # the engine's weights back in: vLLM's wake_up at the rate the sleep-mode blog measured
    # (step_fixed.wake_bytes_per_s); other engines at the link's rate
    wake_rate = np.where(b.rollout_engine == 0, step_fixed.wake_bytes_per_s(_pcie(b)), _pcie(b))
    wake_bytes_s = gen["rollout_weights_gib"] * gib / wake_rate
    t_off = np.where(colo, wake_bytes_s + (pinned + pageable * slow) * gib / _pcie(b), 0.0)

    # AReaL v0.3: the weights go through shared storage, the trainer's save then every
    # engine's load (disk_refit.py), in place of an NCCL broadcast
    disk = disk_refit.active(b)
    dr = disk_refit.seconds(b, tpp)
    ws["weight_sync_time_s"] = np.where(disk, dr["disk_refit_s"], ws["weight_sync_time_s"])
    lp, up, sync = tr["log_prob_time_s"], tr["update_time_s"], ws["weight_sync_time_s"]
    s_gen = 1.0
    sc = phase_scales
    # the work that does not scale with the model (step_fixed.py): the engine's sleep / wake
    # beyond its bytes and the trainer's allocator cleaning around the refit (colocated, on the
    # serial path), and the cleaning before the log-prob pass and the update (the training
    # pipeline, every placement)
    fx = step_fixed.fixed_time(b, zero >= 3)
    fixed_colo = np.where(colo, fx["engine_s"] + fx["refit_side_s"], 0.0)
    # verl's driver between the phases (verl_driver.py: reward manager, advantage, passes over
    # the padded batch), on the training pipeline with the phases' cleaning
    drv = verl_driver.seconds(b)
    prep = fx["phase_side_s"] + drv["driver_s"]
    # the white-box step, before any phase scale: what a time-based checkpoint period counts
    # (composed only where a row has one: periodic.save_period_steps reads it nowhere else)
    step_white = (compose_step(b.asynchrony, *_gen_paths(b, gen), lp, up, sync, t_off,
                               fixed_colo, prep)
                  if (b.floats("save_period_s", 0.0) > 0).any() else None)
    if sc is None:  # a profile's installed scales, else NeMo RL's shipped ones (catalogs/rl.yaml)
        sc = _phase_scales if _phase_scales is not None else default_scales(b)
    if sc:  # phase scales, per row or one each (none: the arrays are left untouched)
        s_gen, s_lp, s_up, s_ws = (np.asarray(sc.get(k, 1.0), dtype=float)
                                   for k in PHASE_SCALES)
        gen = {**gen, **{k: gen[k] * s_gen for k in (
            "gen_time_s", "gen_time_throughput_s", "prefill_time_s", "decode_time_s",
            "reprefill_time_s")}}
        tr = {**tr, **{k: tr[k] * s_lp for k in (
            "old_log_prob_time_s", "ref_time_s", "ref_swap_time_s", "values_time_s")}}
        rh = {**rh, **{k: rh[k] * s_ws for k in ("refit_host_s", "refit_chain_s")}}
        lp, up, sync = lp * s_lp, up * s_up, sync * s_ws
    # what a NeMo RL "refit" timer holds (refit_timer.py): the sync plus the engine's wake, the
    # trainer's offload out and the cleaning around it; the sync elsewhere
    rt = refit_timer.timer(b, zero >= 3, sync, wake_bytes_s,
                           tr["train_weights_gib"], tr["train_optimizer_gib"],
                           tr["gen_optimizer_moves"], _pcie(b),
                           np.where(colo, fx["refit_side_s"], 0.0))
    g_tail, g_async = _gen_paths(b, gen)
    step = compose_step(b.asynchrony, g_tail, g_async, lp, up, sync, t_off, fixed_colo, prep)
    # validation and checkpoints, amortised per step (periodic.py; none where the row or run
    # states no period). Colocated, a validation adds one engine sleep / wake with the weights'
    # wake; verl's sharding manager also pushes the weights in again (periodic.py docstring)
    verl = b.rl_framework == inputs.RL_FRAMEWORK.index("verl")
    val = periodic.validation_seconds(b, resident, s_gen,
                                      np.where(colo, wake_bytes_s + fx["engine_s"], 0.0),
                                      np.where(colo & verl, sync, 0.0))
    # a time-based checkpoint period counts steps of the white-box step (the same under any
    # phase scales: calibration/rl_phases.step_with keeps the checkpoint share fixed)
    ckpt = periodic.checkpoint_seconds(b, zero >= 3, step_white)
    base_step = step
    # (summed in the order calibration/rl_phases.step_with recomposes them)
    step = (base_step + val["validation_gen_s"] + val["validation_sync_s"]
            + (val["validation_fixed_s"] + ckpt["checkpoint_time_s"]))
    gen_eff = np.select([b.asynchrony == 0, b.asynchrony == 1],
                        [g_tail, g_tail], g_async)

    # ---- validity and memory --------------------------------------------------------------
    g = b.rollout_tp * b.rollout_pp
    reason = np.full(len(df), "", dtype=object)

    def flag(mask, text):
        nonlocal reason
        reason = np.where((reason == "") & mask, text, reason)

    flag(split & ((b.rollout_gpus <= 0) | (b.rollout_gpus >= b.num_gpus)),
         "split: rollout_gpus must leave GPUs to both sides")
    flag(b.replicas < 1, "rollout_tp x rollout_pp exceeds the rollout GPUs")
    flag(np.mod(b.rollout_gpus, g) != 0, "rollout GPUs not a multiple of rollout_tp x rollout_pp")
    flag(colo & (b.asynchrony > 0), "colocated placement runs sync only")
    flag((b.rollout_ep > 1) & ((b.experts == 0) | (np.mod(b.experts, b.rollout_ep) != 0)
                               | (b.rollout_ep > b.rollout_gpus)),
         "rollout_ep must divide the experts of an MoE model and fit the rollout GPUs")
    flag((b.gpu_memory_utilization <= 0) | (b.gpu_memory_utilization > 1),
         "gpu_memory_utilization must be in (0, 1]")
    flag(~tr["train_valid"].astype(bool),
         np.array([f"training: {r}" for r in tr["train_invalid_reason"]], dtype=object))
    valid = reason == ""
    hbm = b.hbm_gib
    rollout_peak = resident + gen["rollout_peak_gib"]
    oom = np.full(len(df), "", dtype=object)
    oom = np.where(gen["kv_cache_gib"] <= 0, "rollout: weights and activations exceed "
                   "gpu_memory_utilization", oom)
    oom = np.where((oom == "") & ~gen["kv_fits"], "rollout: KV cache below one sequence of "
                   "prompt + max response", oom)
    oom = np.where((oom == "") & (rollout_peak > hbm), "rollout: resident training states + "
                   "gpu_memory_utilization exceed HBM", oom)
    oom = np.where((oom == "") & (tr["train_peak_gib"] > hbm), "training: peak exceeds HBM", oom)
    fits = valid & (oom == "")

    n = b.num_gpus
    keep = np.where(valid, 1.0, np.nan)
    out = {
        "valid": valid, "invalid_reason": reason, "fits": fits, "oom_reason": oom,
        "step_time_s": step * keep,
        # the step without validation and checkpoints, and their shares (periodic.py)
        "step_time_without_periodic_s": base_step * keep,
        "validation_time_s": val["validation_time_s"] * keep,
        "checkpoint_time_s": ckpt["checkpoint_time_s"] * keep,
        "validation_run_s": val["validation_run_s"] * keep,
        "validation_gen_s": val["validation_gen_s"] * keep,
        "validation_fixed_s": val["validation_fixed_s"] * keep,
        "validation_sync_s": val["validation_sync_s"] * keep,
        "checkpoint_write_s": ckpt["checkpoint_write_s"] * keep,
        "checkpoint_gib": ckpt["checkpoint_gib"],
        "gen_time_s": gen_eff * keep,
        "gen_tail_time_s": g_tail * keep,
        "gen_share": gen_eff / step * keep,
        "prefill_time_s": gen["prefill_time_s"] * keep,
        "decode_time_s": gen["decode_time_s"] * keep,
        "old_log_prob_time_s": tr["old_log_prob_time_s"] * keep,
        "ref_time_s": tr["ref_time_s"] * keep,
        "ref_swap_time_s": tr["ref_swap_time_s"] * keep,
        "log_prob_time_s": lp * keep,
        "values_time_s": tr["values_time_s"] * keep,
        "update_time_s": up * keep,
        # SkyRL's eager micro-batch floor above the GPU, inside the passes (skyrl_host.py)
        "skyrl_host_floor_s": tr["skyrl_host_floor_s"] * keep,
        # what slime's (vime's) `perf/train_time` times: timer("train") around the log-prob
        # passes and the update (slime 44d29ee megatron_utils/actor.py train_actor)
        "train_time_s": (lp + up) * keep,
        "weight_sync_time_s": sync * keep,
        # the refit as NeMo RL's `prepare_for_generation` timer holds it (refit_timer.py)
        "refit_timer_s": rt["refit_timer_s"] * keep,
        "refit_wake_s": rt["refit_wake_s"] * keep,
        "refit_offload_s": rt["refit_offload_s"] * keep,
        "offload_time_s": t_off * keep,
        # step_fixed.py: what does not scale with the model, in total and by side
        "step_fixed_time_s": (fixed_colo + prep) * keep,
        "engine_sleep_wake_fixed_s": np.where(colo, fx["engine_s"], 0.0) * keep,
        "refit_cleanup_time_s": np.where(colo, fx["refit_side_s"], 0.0) * keep,
        "phase_cleanup_time_s": fx["phase_side_s"] * keep,
        # verl_driver.py: the driver's reward, advantage and passes inside the step timer
        "verl_driver_time_s": drv["driver_s"] * keep,
        "verl_reward_time_s": drv["reward_s"] * keep,
        "verl_adv_time_s": drv["adv_s"] * keep,
        "verl_driver_passes_s": drv["passes_s"] * keep,
        "refit_host_time_s": rh["refit_host_s"] * keep,
        "refit_chain_time_s": rh["refit_chain_s"] * keep,
        "refit_tensors": rh["refit_tensors"], "refit_groups": rh["refit_groups"],
        "refit_handles": rh["refit_handles"], "refit_entries": rh["refit_entries"],
        "refit_meta_entries": rh["refit_meta_entries"], "refit_passes": rh["refit_passes"],
        "refit_ray_time_s": rh["refit_ray_s"] * keep,
        "refit_trainer_python_s": rh["refit_trainer_python_s"] * keep,
        "concurrency": gen["concurrency"], "replicas": b.replicas,
        "rollout_gpus": b.rollout_gpus, "train_gpus": b.train_gpus,
        "kv_cache_gib": gen["kv_cache_gib"], "kv_tokens": gen["kv_tokens"],
        "rollout_peak_gib": rollout_peak, "train_peak_gib": tr["train_peak_gib"],
        "train_global_batch": tr["train_global_batch"], "train_seq_len": tr["train_seq_len"],
        "train_dp": tr["train_dp"],
        "samples_per_s_per_gpu": b.sequences / (step * n) * keep,
        "tokens_per_s_per_gpu": b.sequences * (b.prompt_len + b.response_mean) / (step * n)
        * keep,
        "cost_per_1000_steps": step * 1000 / 3600 * n * b.price_per_hour * keep,
    }
    return pd.DataFrame(out)


def _train(df: pd.DataFrame, col: str, default: float = 1.0) -> np.ndarray:
    if col not in df.columns:
        return np.full(len(df), default)
    return pd.to_numeric(df[col]).fillna(default).to_numpy(dtype=float)
