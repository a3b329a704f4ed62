"""Speculative decoding with a batch-size switch (`spec_max_running`: vLLM's
`disable_by_batch_size`, vLLM-Ascend SAM's adaptive switch): a replica drafts only while at
most that many requests run (sim_core/rl/generation.py spec_active)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim_core.rl import generation, inputs

BASE = {"algorithm": "grpo", "model": "qwen3-32b", "gpu": "h100-sxm", "num_gpus": 8,
        "placement": "colocated", "rollout_tp": 2, "prompts_per_step": 64,
        "responses_per_prompt": 8, "prompt_len": 500, "response_mean": 2000,
        "response_max": 8192, "gpu_memory_utilization": 0.6}


def _batch(**kw):
    return inputs.to_batch(pd.DataFrame([{**BASE, **kw}]))


def test_a_replica_drafts_only_at_or_below_the_switch():
    b = _batch(spec_tokens=3, spec_max_running=8)
    sizes = np.array([[1.0, 8.0, 9.0, 64.0]])
    assert generation.spec_active(b, sizes).tolist() == [[True, True, False, False]]
    assert generation.spec_active(_batch(spec_tokens=3), sizes).all()   # no switch: always
    assert not generation.spec_active(_batch(), sizes).any()            # no drafting at all
    k = generation.decode_constants()
    plain, spec = _batch(), _batch(spec_tokens=3)
    # above the switch a step is the plain step; at or below it, the drafting one
    for n, like in ((64.0, plain), (4.0, spec)):
        got = generation.step_time(b, np.array([[n]]), np.array([[1500.0]]), k)
        want = generation.step_time(like, np.array([[n]]), np.array([[1500.0]]), k)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_the_switch_puts_generation_between_never_and_always_drafting():
    t = {name: generation.generate(_batch(**kw))["gen_time_s"][0] for name, kw in (
        ("never", {}), ("always", {"spec_tokens": 3}),
        ("switch", {"spec_tokens": 3, "spec_max_running": 8}))}
    assert t["always"] < t["switch"] < t["never"]
