"""What each of verl's worker-group calls costs beyond the model's passes.

verl's driver runs every training phase as one call on a Ray worker group
(`ray_trainer.py` v0.4.1 / v0.5.0: `marked_timer("old_log_prob")` encloses
`actor_rollout_wg.compute_log_prob(batch)`, `"ref"` `compute_ref_log_prob`, `"values"`
`critic_wg.compute_values`, `"update_critic"` / `"update_actor"` the updates). Besides the
micro-batches `verl.py` prices, each call does work that does not grow with the model; this
module counts it in verl's code at v0.4.0-v0.5.0 and prices each item with a published
per-call figure (catalogs/rl.yaml `ray_calls`, `step_fixed`, `moe.yaml host_sync_us`).
Nothing is fitted on the validation rows.

1. **The Ray call** (`single_controller/ray/base.py func_generator`; `@register(dispatch_mode=
   Dispatch.DP_COMPUTE_PROTO)` on the FSDP workers' five methods, `MEGATRON_COMPUTE_PROTO` on
   the Megatron workers'): the driver chunks the DataProto per worker (`DataProto.chunk`),
   issues one `.remote` per worker and `ray.get`s them: one synchronous actor round trip plus
   one asynchronous call per further worker (Ray's microbenchmark rates).
2. **The DataProto's bytes** (`protocol.py __getstate__`: `torch.save` of the TensorDict into
   a buffer; `__setstate__` loads it back): the driver serialises the whole batch, each worker
   deserialises its chunk (in parallel) and copies it to the GPU (`data.to(get_device_id())`,
   PCIe); the outputs come back the same way (`output.to("cpu")`, the driver concatenates).
   Serialisation at Ray's measured put rate, the copies at the host link's. The batch is what
   `ray_trainer.py` holds at the call: the rollout's int64 `prompts` [P], `responses` [R],
   `input_ids` / `attention_mask` / `position_ids` [P + R], `response_mask` [R] (P, R the
   padded caps), then one fp32 [R] tensor per earlier phase's output (`old_log_probs`,
   `ref_log_prob`, `values`) and, for the updates, `token_level_scores` / `_rewards`,
   `advantages`, `returns`. Outputs: `old_log_probs` + `entropys`, `ref_log_prob`, `values`;
   the updates return only metrics. The `non_tensor_batch` (numpy object arrays: uid, raw
   prompt ids, data source) is not counted: its size is not in the row.
3. **`torch.cuda.empty_cache()`** in `fsdp_utils.offload_fsdp_model_to_cpu` (default
   `empty_cache=True`): the FSDP workers call it at the end of `compute_log_prob`,
   `compute_values`, `update_actor`, `update_critic` when `param_offload` is on (no other
   cleaning in those phases: `step_fixed.py` counts the rollout sharding manager's, whose
   `__enter__` offload is followed at once by its own `empty_cache`, already counted there).
   Priced at huggingface/peft PR 2894's measured 0.080 s per call.
4. **Host syncs of the update loops** (`dp_actor.py update_policy`, `dp_critic.py
   update_critic`): per update micro-batch the actor's metrics `.item()` four times
   (`pg_loss`, `pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`) plus `kl_loss` with
   `use_kl_loss` (the reference pass's rows), the critic's three (`vf_loss`, `vf_clipfrac`,
   `vpred_mean`); per optimizer step `_optimizer_step`'s `if not torch.isfinite(grad_norm)`
   and `grad_norm.detach().item()`: two. Each at `moe.yaml host_sync_us`. The kernels these
   issue are in `host.py`'s floor already; this is the stall of the host waiting.

Counted and left unpriced (no published per-call figure, each Python of microseconds to a
millisecond): `lr_scheduler.step()`, `FlopsCounter.estimate_flops` (a Python loop over the
batch's sequence lengths), `torch.cuda.max_memory_allocated` / `psutil.virtual_memory`, FSDP1's
root `_handle.reshard(True)`, `log_gpu_memory_usage`'s `mem_get_info` (offload rows), the
driver's `agg_loss(entropys).item()` and `batch.union` inside the timers.

FSDP rows get all four; verl's Megatron rows get 1-2 (the same single controller: one Ray
call per phase, each data-parallel rank sent its chunk): their `empty_cache`s are
`step_fixed.py`'s (`megatron_actor.py`'s own `empty_cache` at the end of `compute_log_prob` and
`update_policy` runs back to back with the worker's, nothing allocated between them: not
priced twice), their update loops are Megatron's. Zero for other frameworks.
"""

from __future__ import annotations

import numpy as np

from . import host
from .inputs import RL_FRAMEWORK, constants

VERL = RL_FRAMEWORK.index("verl")

# int64 [*, P] and [*, R] tensors of the rollout batch (module docstring, item 2):
# prompts + 3 of [P + R] -> 4 P; responses + response_mask + 3 of [P + R] -> 5 R
INT64_PROMPT_TENSORS = 4
INT64_RESPONSE_TENSORS = 5
# fp32 [R] tensors the update calls carry beyond the earlier phases' outputs:
# token_level_scores, token_level_rewards, advantages, returns
UPDATE_FP32_TENSORS = 4
# per update micro-batch `.item()`s: actor (without / with use_kl_loss), critic
ACTOR_ITEMS = 4
CRITIC_ITEMS = 3
# per optimizer step: the isfinite condition and grad_norm.item()
STEP_SYNCS = 2

PHASES = ("old_log_prob", "ref", "values", "update_actor", "update_critic")


def ray_call_s(workers) -> np.ndarray:
    """Seconds of one worker-group call's dispatch: a synchronous round trip and one
    asynchronous call per further worker (catalogs/rl.yaml `ray_calls`)."""
    k = constants()["ray_calls"]
    w = np.maximum(np.asarray(workers, float), 1.0)
    return 1.0 / k["actor_call_sync_per_s"] + (w - 1.0) / k["actor_call_async_per_s"]


def batch_bytes(prompt_cap, response_cap, use_ref, ppo) -> dict:
    """Bytes per sequence each call sends (`in`) and returns (`out`), by phase."""
    p = np.asarray(prompt_cap, float)
    r = np.asarray(response_cap, float)
    ref = np.asarray(use_ref, float) > 0
    ppo = np.asarray(ppo, bool)
    rollout = 8.0 * (INT64_PROMPT_TENSORS * p + INT64_RESPONSE_TENSORS * r)
    fp = 4.0 * r
    after_olp = 1.0
    after_ref = after_olp + ref
    after_values = after_ref + ppo
    upd = after_values + UPDATE_FP32_TENSORS
    return {"old_log_prob": (rollout, 2.0 * fp),
            "ref": (rollout + after_olp * fp, fp),
            "values": (rollout + after_ref * fp, fp),
            "update_actor": (rollout + upd * fp, 0.0 * fp),
            "update_critic": (rollout + upd * fp, 0.0 * fp)}


def transfer_s(seqs, chunk_seqs, in_b, out_b, pcie_bytes_per_s) -> np.ndarray:
    """Seconds of one call's DataProto bytes: the driver serialises the whole batch and
    deserialises every output (Ray's put rate), a worker its chunk both ways and its GPU
    copies (the host link)."""
    put = constants()["ray_calls"]["put_gb_per_s"] * 1e9
    per = in_b + out_b
    return seqs * per / put + chunk_seqs * per / put + chunk_seqs * per / pcie_bytes_per_s


def seconds(b, fsdp_on, dp, pcie_bytes_per_s, micro_batches: dict) -> dict:
    """Per row and phase (`PHASES`, seconds; zero off verl or where the phase does not run)
    and `total_s`. `fsdp_on`: verl FSDP rows (verl.active); `dp`: data-parallel ranks (the
    Megatron workers' chunks; FSDP's are per worker); `micro_batches`: update micro-batches per optimizer step on one GPU, keys
    `update_actor`, `update_critic` (verl.phases' counts; NaN / absent off FSDP)."""
    n = len(b.placement)
    verl = b.rl_framework == VERL
    fsdp_on = np.asarray(fsdp_on, bool) & verl
    ppo = b.algorithm == 2
    runs = {"old_log_prob": verl, "ref": verl & (b.use_ref > 0), "values": verl & ppo,
            "update_actor": verl, "update_critic": verl & ppo}
    dp = np.maximum(np.asarray(dp, float) * np.ones(n), 1.0)
    seqs = b.sequences
    # DP_COMPUTE_PROTO chunks over the worker group's world (Ulysses ranks each get a chunk and
    # all-gather in `preprocess_data`); MEGATRON_COMPUTE_PROTO over the data-parallel ranks
    chunk = seqs / np.where(fsdp_on, np.maximum(b.train_gpus, 1.0), dp)
    pcie = np.asarray(pcie_bytes_per_s, float) * np.ones(n)
    call = ray_call_s(b.train_gpus)
    sizes = batch_bytes(b.prompt_max, b.response_max, b.use_ref, ppo)
    ec = constants()["step_fixed"]["empty_cache_s"]
    sync = host.sync_seconds()
    offload = fsdp_on & (b.offload_params > 0)
    steps = b.mini_batches * b.ppo_epochs
    items = {"update_actor": ACTOR_ITEMS + (b.use_ref > 0), "update_critic": CRITIC_ITEMS}
    out = {}
    for ph in PHASES:
        in_b, out_b = sizes[ph]
        t = call + transfer_s(seqs, chunk, in_b, out_b, pcie)
        if ph != "ref":  # the reference has no offload call (FSDP's own CPUOffload streams it)
            t = t + np.where(offload, ec, 0.0)
        if ph in items:
            mb = np.nan_to_num(np.asarray(micro_batches.get(ph, np.zeros(n)), float)
                               * np.ones(n))
            t = t + np.where(fsdp_on, steps * (mb * items[ph] + STEP_SYNCS) * sync, 0.0)
        out[ph] = np.where(runs[ph], t, 0.0)
    out["total_s"] = sum(out[ph] for ph in PHASES)
    return out

