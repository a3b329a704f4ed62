"""The work of verl's worker-group calls that does not scale with the model (issue 40,
sim_core/rl/verl_calls.py): counted in verl v0.4.1 / v0.5.0, priced with Ray's
microbenchmark rates, PEFT PR 2894's empty_cache and the project's host sync."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.columns import Batch
from sim_core.moe import table as moe_table
from sim_core.rl import verl_calls
from sim_core.rl.inputs import RL_FRAMEWORK, constants
from sim_core.rl.phases import simulate_rl


def batch(**over):
    """Three rows: verl FSDP PPO with param_offload, verl Megatron GRPO, NeMo RL."""
    b = Batch()
    base = dict(placement=[0, 0, 0], algorithm=[2, 1, 1], use_ref=[1, 1, 1],
                rl_framework=[RL_FRAMEWORK.index("verl")] * 2 + [RL_FRAMEWORK.index("nemo_rl")],
                train_gpus=[8, 8, 8], sequences=[512, 512, 512], prompt_max=[512] * 3,
                response_max=[192] * 3, offload_params=[1, 1, 1], mini_batches=[4, 4, 4],
                ppo_epochs=[1, 1, 1])
    base.update(over)
    for k, v in base.items():
        b[k] = np.asarray(v, dtype=float)
    return b


def test_ray_call_is_one_round_trip_and_one_async_call_per_further_worker():
    k = constants()["ray_calls"]
    assert k["actor_call_sync_per_s"] == pytest.approx(2011.9)
    assert verl_calls.ray_call_s(1) == pytest.approx(1 / 2011.9)
    assert verl_calls.ray_call_s(8) == pytest.approx(1 / 2011.9 + 7 / 8038.2)


def test_bytes_follow_the_batch_ray_trainer_holds_at_each_call():
    s = verl_calls.batch_bytes(512, 192, 1, True)
    rollout = 8 * (4 * 512 + 5 * 192)  # int64 prompts, responses, ids / mask / positions, mask
    assert s["old_log_prob"][0] == rollout
    assert s["old_log_prob"][1] == 2 * 4 * 192  # old_log_probs + entropys, fp32
    assert s["ref"][0] == rollout + 4 * 192  # + old_log_probs
    assert s["values"][0] == rollout + 2 * 4 * 192  # + ref_log_prob
    # + values, scores, rewards, advantages, returns; the updates return only metrics
    assert s["update_actor"][0] == rollout + 7 * 4 * 192
    assert s["update_actor"][1] == 0
    # GRPO without a reference: no ref_log_prob, no values
    g = verl_calls.batch_bytes(512, 192, 0, False)
    assert g["update_actor"][0] == rollout + 5 * 4 * 192


def test_counts_per_phase_and_row():
    b = batch()
    pcie = 51.2e9
    mbs = {"update_actor": np.array([2.0, np.nan, np.nan]),
           "update_critic": np.array([3.0, np.nan, np.nan])}
    out = verl_calls.seconds(b, np.array([True, False, False]), 8.0, pcie, mbs)
    ec = constants()["step_fixed"]["empty_cache_s"]
    sync = moe_table()["host_sync_us"] * 1e-6
    call = verl_calls.ray_call_s(8)
    sizes = verl_calls.batch_bytes(512, 192, 1, True)

    def moved(ph):
        return verl_calls.transfer_s(512, 64, sizes[ph][0], sizes[ph][1], pcie)

    # FSDP with param_offload: offload_fsdp_model_to_cpu's empty_cache in four phases, not
    # the reference's (FSDP's CPUOffload, no offload call)
    assert out["old_log_prob"][0] == pytest.approx(call + moved("old_log_prob") + ec)
    assert out["ref"][0] == pytest.approx(call + verl_calls.transfer_s(
        512, 64, sizes["ref"][0], sizes["ref"][1], pcie))
    assert out["values"][0] == pytest.approx(call + moved("values") + ec)
    # update: 4 optimizer steps x (micro-batches x .item()s + isfinite + grad_norm.item())
    assert out["update_actor"][0] == pytest.approx(
        call + moved("update_actor") + ec + 4 * (2 * 5 + 2) * sync)
    assert out["update_critic"][0] == pytest.approx(
        call + moved("update_critic") + ec + 4 * (3 * 3 + 2) * sync)
    # verl Megatron (GRPO): the Ray call and its bytes only; no critic
    grpo = verl_calls.batch_bytes(512, 192, 1, False)["old_log_prob"]
    assert out["old_log_prob"][1] == pytest.approx(
        call + verl_calls.transfer_s(512, 64, grpo[0], grpo[1], pcie))
    assert out["values"][1] == 0 and out["update_critic"][1] == 0
    # other frameworks: nothing
    assert all(out[ph][2] == 0 for ph in verl_calls.PHASES)
    assert out["total_s"][0] == pytest.approx(sum(out[ph][0] for ph in verl_calls.PHASES))


def test_no_offload_no_empty_cache():
    b = batch(offload_params=[0, 0, 0])
    out = verl_calls.seconds(b, np.array([True, False, False]), 8.0, 51.2e9, {})
    assert out["old_log_prob"][0] < 0.01  # the call and 12 MB of bytes: milliseconds


SMALL = dict(model="qwen2.5-0.5b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
             prompts_per_step=256, responses_per_prompt=4, prompt_len=100, response_mean=200,
             response_max=256, prompt_max=512, gpu_memory_utilization=0.6, train_tp=1,
             train_pp=1, train_zero=3, mini_batches=4, train_seq_len=8000,
             sequence_packing=False, micro_batch_seqs=4, use_ref=True, offload_params=True)


def test_wired_into_the_phases(monkeypatch):
    """training.py adds each phase's call seconds to verl's phases."""
    df = pd.DataFrame([SMALL])
    with_calls = simulate_rl(df)
    real = verl_calls.seconds
    seen = {}

    def zero(*a, **k):
        out = real(*a, **k)
        seen.update(out)
        return {key: np.zeros_like(v) for key, v in out.items()}

    monkeypatch.setattr(verl_calls, "seconds", zero)
    without = simulate_rl(df)
    for col, ph in (("old_log_prob_time_s", "old_log_prob"), ("ref_time_s", "ref")):
        assert with_calls[col][0] - without[col][0] == pytest.approx(seen[ph][0], rel=1e-6)
    assert seen["old_log_prob"][0] > constants()["step_fixed"]["empty_cache_s"]
    d = with_calls["update_time_s"][0] - without["update_time_s"][0]
    assert d == pytest.approx(seen["update_actor"][0] + seen["update_critic"][0], rel=1e-6)


def test_fsdp_chunks_per_worker_megatron_per_data_parallel_rank():
    """DP_COMPUTE_PROTO splits over the world (Ulysses ranks included), MEGATRON_COMPUTE_PROTO
    over the data-parallel ranks: dp 2 of 8 GPUs moves only the Megatron row."""
    b = batch(offload_params=[0, 0, 0])
    on = np.array([True, False, False])
    full = verl_calls.seconds(b, on, 8.0, 51.2e9, {})
    two = verl_calls.seconds(b, on, 2.0, 51.2e9, {})
    assert two["old_log_prob"][0] == pytest.approx(full["old_log_prob"][0])
    assert two["old_log_prob"][1] > full["old_log_prob"][1]
