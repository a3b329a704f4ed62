"""RL physics (issue 40): the truncated-response tail, and how sync / one-step-off / async
steps compose."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim_core.rl import generation, inputs
from sim_core.rl.phases import simulate_rl

BASE = dict(model="llama3.1-70b", gpu="h100-sxm", num_gpus=64, rollout_tp=4,
            prompts_per_step=64, responses_per_prompt=32, prompt_len=512, response_mean=400,
            response_max=4096, gpu_memory_utilization=0.6, train_tp=4, train_pp=4,
            train_recompute="none", mini_batches=4)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]))


def _truncation_rate(p, mean, cap):
    """P(L = cap) of the mixture: the point mass plus the body's clipped mass."""
    body = (mean - p * cap) / (1 - p)
    th = generation.length_scale(np.array([body]), np.array([cap]))[0]
    return p + (1 - p) * np.exp(-cap / th)


def test_truncated_fraction_reproduces_the_published_truncation_rate():
    # catalogs/rl.yaml: NeMo RL's Nemotron 3.5 Lightning guide, ~0.1 truncated at ~3,000
    # generated tokens per sample with max_new_tokens 8192; an exponential law alone: 0.08
    p = inputs.constants()["length"]["truncated_fraction"]
    assert abs(_truncation_rate(p, 3000.0, 8192.0) - 0.10) < 0.003
    assert _truncation_rate(0.0, 3000.0, 8192.0) < 0.085


def test_mixture_keeps_the_stated_mean_and_is_bounded():
    mean, mx = np.array([200.0, 749.0, 3000.0]), np.array([16384.0, 16384.0, 8192.0])
    p = np.array([0.038, 0.038, 0.038])
    th, m1, m2 = generation.length_law(mean, mx, np.minimum(p, 0.5 * mean / mx))
    np.testing.assert_allclose(m1, mean, rtol=2e-3)
    assert (m2 > m1 ** 2).all()
    b = inputs.to_batch(pd.DataFrame([{**BASE, "response_mean": 200, "response_max": 16384},
                                      {**BASE, "response_clip_ratio": 0.01}]))
    got = generation.truncated_fraction(b)
    assert got[0] == 0.5 * 200 / 16384  # bounded: the body keeps half the mean
    assert got[1] == 0.01  # a run's own clip ratio wins


def test_truncated_responses_carry_the_step_to_the_cap():
    # 2,048 responses, 3.8% truncated: the longest of a synchronous step is the cap, and its
    # generation is at least cap decode steps at small batch
    r = run({}, {"response_clip_ratio": 0.0})
    b = inputs.to_batch(pd.DataFrame([{**BASE}, {**BASE, "response_clip_ratio": 0.0}]))
    g = generation.generate(b)
    assert g["longest_response"][0] == 4096 and g["longest_response"][1] < 4096
    step1 = generation.step_time(b, np.array([1.0, 1.0]), np.array([2000.0, 2000.0]),
                                 generation.decode_constants())
    assert r.gen_time_s[0] > 4096 * step1[0] and r.gen_time_s[0] > r.gen_time_s[1]
    # fewer responses than 1 / (2p): the point mass alone does not reach the cap
    few = inputs.to_batch(pd.DataFrame([{**BASE, "prompts_per_step": 1,
                                         "responses_per_prompt": 8, "response_clip_ratio": 0.02}]))
    assert generation.generate(few)["longest_response"][0] < 4096


def test_run_file_states_its_clip_ratio():
    import pytest

    from sweep.errors import ConfigError
    from sweep.config.rl import parse_rl

    data = dict(task="rl", model="llama3.1-70b", cluster={"gpu": "h100-sxm", "num_gpus": 64},
                prompts_per_step=64, responses_per_prompt=32, prompt_len=512,
                response_len={"mean": 400, "max": 4096, "clip_ratio": 0.01},
                rollout={"tp": 4}, parallel={"tp": 4, "pp": 4})
    assert parse_rl(data).frame()["response_clip_ratio"].iloc[0] == 0.01
    with pytest.raises(ConfigError, match="response_len.clip_ratio"):
        parse_rl({**data, "response_len": {"mean": 400, "max": 4096, "clip_ratio": 1.5}})


def test_every_asynchrony_predicts_and_composes_as_the_frameworks_do():
    split = {"placement": "split", "rollout_gpus": 32}
    r = run({**split, "asynchrony": "sync"}, {**split, "asynchrony": "one_step_off"},
            {**split, "asynchrony": "async", "staleness": 1},
            {**split, "asynchrony": "async", "staleness": 3},
            {**split, "asynchrony": "async", "staleness": 3, "partial_rollout": False},
            {"asynchrony": "async"})
    assert np.isfinite(r.step_time_s[:5]).all() and r.valid[:5].all()
    # colocated has nothing to overlap
    assert not r.valid[5] and "sync only" in r.invalid_reason[5]
    lp_up = r.log_prob_time_s + r.update_time_s + r.phase_cleanup_time_s + r.verl_driver_time_s
    # verl one_step_off ray_trainer: wait for the pending generation, sync on the critical path
    np.testing.assert_allclose(r.step_time_s[1], max(r.gen_tail_time_s[1], lp_up[1])
                               + r.weight_sync_time_s[1], rtol=1e-9)
    np.testing.assert_allclose(r.step_time_s[0], r.gen_tail_time_s[0] + lp_up[0]
                               + r.weight_sync_time_s[0] + r.offload_time_s[0]
                               + r.engine_sleep_wake_fixed_s[0] + r.refit_cleanup_time_s[0],
                               rtol=1e-9)
    assert r.step_time_s[1] < r.step_time_s[0]
    # streaming with partial rollouts: more staleness spreads more of the tail
    assert r.gen_time_s[3] < r.gen_time_s[2] < r.gen_tail_time_s[2]
    # NeMo RL without in-flight weight updates drains the tail before every refit
    np.testing.assert_allclose(r.step_time_s[4], r.step_time_s[1], rtol=1e-9)


def test_moe_decode_check_reads_published_rows():
    from sim_core.rl import calibrate

    chk = calibrate.moe_tpot_check()
    assert len(chk) == 18 and chk.url.str.startswith("https://").all()
    assert chk.url.nunique() == 3 and np.isfinite(chk.pred_tpot_ms).all()
    # more concurrent requests touch more experts: a longer step, measured and predicted
    for _, g in chk.groupby(["url", "engine", "gpu", "isl", "osl"]):
        g = g.sort_values("concurrency")
        assert g.pred_tpot_ms.is_monotonic_increasing
        # measured too, within one sweep (InferenceX's concurrency-4 row is another job)
        sweep = g[g.concurrency != 4] if "InferenceX" in g.url.iloc[0] else g
        assert sweep.tpot_ms.is_monotonic_increasing
