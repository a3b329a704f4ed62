"""SGLang's mem_fraction_static against vLLM's gpu_memory_utilization (rl/sglang_memory.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import generation, inputs, sglang_memory
from sim_core.rl.phases import simulate_rl

GIB = 2.0 ** 30
BASE = dict(model="qwen3-32b", gpu="h100-sxm", num_gpus=64, rollout_tp=4,
            prompts_per_step=512, responses_per_prompt=16, prompt_len=1024, response_mean=3000,
            response_max=8192, gpu_memory_utilization=0.6, train_tp=8, train_pp=2,
            train_recompute="full", mini_batches=4)


def frame(*rows):
    return pd.DataFrame([{**BASE, **r} for r in rows])


def test_reserve_follows_sglang_heuristic():
    # server_args.py _handle_gpu_memory_settings (sglang PR 10975), in MiB: H100 TP8:
    # 512 + 1.5 x 8192 + 2 x 512 + 1024 x 8 / 8 = 14848; H100 TP1: 512 + 12288 + 2 x 256 +
    # 128 = 13440; A100 40GB TP1 (chunked prefill 4096, graphs to 32): 512 + 6144 + 64 + 128
    # = 6848, under the 10 GiB floor that only GPUs over 60 GiB get
    b = inputs.to_batch(frame({"rollout_tp": 8}, {"rollout_tp": 1},
                              {"rollout_tp": 1, "gpu": "a100-40gb"}))
    r = sglang_memory.reserve_bytes(b, np.ones(3), np.zeros(3, bool)) / 2 ** 20
    np.testing.assert_allclose(r, [14848, 13440, 6848])
    spec = sglang_memory.reserve_bytes(b, np.ones(3), np.ones(3, bool)) / 2 ** 20
    np.testing.assert_allclose(spec - r, 2048)


def test_static_budget_is_weights_plus_kv_of_the_free_memory():
    df = frame({"rollout_engine": "sglang", "placement": "split", "rollout_gpus": 32,
                "asynchrony": "sync"},
               {"rollout_engine": "sglang"})
    b = inputs.to_batch(df)
    resident = np.array([0.0, 20.0])
    m = generation.rollout_memory(b, resident)
    w = generation.weights_per_gpu(b)
    init = 2.0 * GIB  # a TP4 engine's start-up usage (catalogs/rl.yaml sglang_memory)
    free = b.hbm_gib * GIB - resident * GIB - init
    np.testing.assert_allclose(m["kv_cache_gib"] * GIB, 0.6 * free - w, rtol=1e-9)
    # the peak: start-up usage + the static budget + the reserve (+ the trainer's CUDA
    # context when colocated), above the static budget by more than SGLang's 10 GiB floor
    reserve = sglang_memory.reserve_bytes(b, np.ones(2), np.zeros(2, bool))
    ctx = np.array([0.0, 0.5]) * GIB
    np.testing.assert_allclose(m["rollout_peak_gib"] * GIB, init + 0.6 * free + reserve + ctx,
                               rtol=1e-9)
    assert (m["rollout_peak_gib"] - 0.6 * free / GIB > 10).all()


def test_vllm_rows_keep_their_rule_and_ignore_the_resident_states():
    b = inputs.to_batch(frame({}, {"rollout_engine": "sglang"}))
    a = generation.rollout_memory(b, np.array([0.0, 0.0]))
    c = generation.rollout_memory(b, np.array([30.0, 30.0]))
    # vLLM: a share of the total, whatever the trainer keeps
    assert a["rollout_peak_gib"][0] == pytest.approx(0.6 * b.hbm_gib[0])
    assert c["kv_cache_gib"][0] == a["kv_cache_gib"][0]
    # SGLang: a share of what is left, so the trainer's states shrink the KV pool by 0.6 x
    assert a["kv_cache_gib"][1] - c["kv_cache_gib"][1] == pytest.approx(0.6 * 30.0)


def test_a_fraction_vllm_fits_can_oom_sglang():
    split = {"placement": "split", "rollout_gpus": 32, "asynchrony": "sync",
             "gpu_memory_utilization": 0.85}
    r = simulate_rl(frame(split, {**split, "rollout_engine": "sglang"},
                          {**split, "rollout_engine": "sglang", "gpu_memory_utilization": 0.7}))
    # vLLM: 0.85 of the device caps everything; SGLang: 0.85 of the free memory for weights +
    # KV, and its ~14 GiB reserve on top (server_args.py would default to (HBM - reserve) /
    # HBM = 0.82 here)
    assert r.fits[0] and r.rollout_peak_gib[0] == pytest.approx(0.85 * 79.11, rel=1e-3)
    assert not r.fits[1] and "rollout" in r.oom_reason[1]
    assert r.fits[2]
