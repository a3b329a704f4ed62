"""The per-step work that does not scale with the model (sim_core/rl/step_fixed.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import step_fixed
from sim_core.rl.phases import simulate_rl

# the published figures the rule is built from (catalogs/rl.yaml step_fixed)
GC, EC = 0.172, 0.080          # huggingface/peft PR 2894: 43 s and 20 s over 250 calls
WAKE = (0.26, 0.823)           # vLLM blog, A100, level 1: Qwen3-0.6B, Phi-3-vision (means)
SLEEP = (0.0933, 0.415)
GB = (1.2, 8.4)                # 0.6B and 4.2B parameters in bf16

SMALL = dict(model="qwen2.5-1.5b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
             prompts_per_step=32, responses_per_prompt=16, prompt_len=92, response_mean=188,
             response_max=512, gpu_memory_utilization=0.6, train_tp=1, train_pp=1,
             train_zero=3)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**SMALL, **r} for r in rows]))


def test_sleep_wake_fixed_part_is_the_intercept_of_the_blog_figures():
    def intercept(t):
        return t[0] - GB[0] * (t[1] - t[0]) / (GB[1] - GB[0])

    fixed = step_fixed.sleep_wake_fixed_s()
    assert fixed == pytest.approx(intercept(WAKE) + intercept(SLEEP), rel=1e-12)
    assert intercept(WAKE) == pytest.approx(0.166, abs=1e-3)
    assert intercept(SLEEP) == pytest.approx(0.040, abs=1e-3)
    # the line gives back both measured calls (the part above the intercept is bytes)
    for t in (WAKE, SLEEP):
        slope = (t[1] - t[0]) / (GB[1] - GB[0])
        assert intercept(t) + slope * GB[1] == pytest.approx(t[1])


def test_nemo_rl_counts_read_in_the_code():
    nemo = {"rl_framework": "nemo_rl"}
    r = run(nemo, {**nemo, "train_zero": 1}, {**nemo, "rollout_engine": "sglang"},
            {**nemo, "placement": "split", "rollout_gpus": 4})
    sw = step_fixed.sleep_wake_fixed_s()
    # DTensor colocated: 3 gc + 3 empty_cache around the refit (+1 + 1 at the end of the
    # streamed refit of the current release), 3 + 4 before the phases
    assert r.step_fixed_time_s[0] == pytest.approx(sw + 7 * GC + 8 * EC)
    assert r.engine_sleep_wake_fixed_s[0] == pytest.approx(sw)
    assert r.refit_cleanup_time_s[0] == pytest.approx(4 * GC + 4 * EC)
    assert r.phase_cleanup_time_s[0] == pytest.approx(3 * GC + 4 * EC)
    # Megatron colocated: 2 + 2 around the refit (+1 + 1 streamed), 1 + 2 before the phases
    assert r.step_fixed_time_s[1] == pytest.approx(sw + 4 * GC + 5 * EC)
    # v0.3's controller refit (v0.3.0 workers): no stream pair, but DTensor cleans 5 + 5
    # (prepare_weights_for_ipc's move_to_cuda, offload_after_refit's closing pair) and
    # Megatron 3 + 3 (offload_after_refit's closing pair); the phase side is unchanged
    old = run({**nemo, "rl_framework_version": 0.3},
              {**nemo, "train_zero": 1, "rl_framework_version": 0.3})
    assert old.refit_cleanup_time_s[0] == pytest.approx(5 * GC + 5 * EC)
    assert old.refit_cleanup_time_s[1] == pytest.approx(3 * GC + 3 * EC)
    assert old.phase_cleanup_time_s[0] == pytest.approx(r.phase_cleanup_time_s[0])
    assert old.phase_cleanup_time_s[1] == pytest.approx(1 * GC + 2 * EC)
    # SGLang: no vLLM sleep mode priced (torch_memory_saver has no published figure)
    assert r.engine_sleep_wake_fixed_s[2] == 0
    assert r.step_fixed_time_s[2] == pytest.approx(6 * GC + 7 * EC)
    # split: no sleep, no offload around the refit; the phases' cleaning stays
    assert r.engine_sleep_wake_fixed_s[3] == 0 and r.refit_cleanup_time_s[3] == 0
    assert r.step_fixed_time_s[3] == pytest.approx(3 * GC + 4 * EC)


def test_verl_and_where_nothing_applies():
    r = run({}, {"placement": "split", "rollout_gpus": 4}, {"rollout_engine": "sglang"},
            {"rl_framework": "skyrl"}, {"rl_framework": "slime"},
            {"train_zero": 1, "use_ref": True}, {"train_zero": 1, "use_ref": False})
    sw = step_fixed.sleep_wake_fixed_s()
    # verl FSDP colocated vLLM: sleep / wake and the sharding manager's four empty_cache calls
    # (plus verl's driver between the phases, verl_driver.py, on every verl row)
    drv = r.verl_driver_time_s
    assert (drv[:3] > 0).all() and (drv[3:5] == 0).all()
    assert r.step_fixed_time_s[0] - drv[0] == pytest.approx(sw + 4 * EC)
    assert r.phase_cleanup_time_s[0] == 0
    # verl FSDP split, verl with SGLang, SkyRL, slime: nothing priced
    np.testing.assert_array_equal((r.step_fixed_time_s - drv)[1:5].to_numpy(), 0.0)
    # verl's Megatron workers: one empty_cache after each of log-prob, reference and update
    assert r.phase_cleanup_time_s[5] == pytest.approx(3 * EC)
    assert r.phase_cleanup_time_s[6] == pytest.approx(2 * EC)


def test_fixed_work_adds_to_the_step_and_does_not_scale_with_the_model():
    nemo = {"rl_framework": "nemo_rl"}
    r = run(nemo, {**nemo, "model": "llama3.1-8b"})
    assert r.step_fixed_time_s[0] == pytest.approx(r.step_fixed_time_s[1])
    parts = (r.gen_time_s + r.log_prob_time_s + r.update_time_s + r.weight_sync_time_s
             + r.offload_time_s + r.step_fixed_time_s)
    np.testing.assert_allclose(r.step_time_s, parts, rtol=1e-12)
    # so it is a larger share of the small model's step
    share = r.step_fixed_time_s / r.step_time_s
    assert share[0] > share[1]


def test_async_puts_the_phase_cleaning_on_the_training_pipeline():
    nemo = {"rl_framework": "nemo_rl", "placement": "split", "rollout_gpus": 4,
            "asynchrony": "one_step_off"}
    r = run(nemo)
    train = r.log_prob_time_s[0] + r.update_time_s[0] + r.phase_cleanup_time_s[0]
    assert r.step_time_s[0] == pytest.approx(max(r.gen_tail_time_s[0], train)
                                             + r.weight_sync_time_s[0])
