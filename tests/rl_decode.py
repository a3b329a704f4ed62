"""One decode step of small-model rollouts, priced row by row: the decode tests (sampler, vLLM
V0 host work) vary one field of a common row and compare the steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim_core.rl import generation, inputs

BASE = dict(model="qwen2.5-0.5b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
            prompts_per_step=256, responses_per_prompt=8, prompt_len=100, response_mean=200,
            response_max=1024, gpu_memory_utilization=0.6)


def decode_steps(rows, batch, ctx=300.0, host=True):
    """(batch, step seconds) of BASE updated by each of `rows`, at `batch` running sequences
    of `ctx` tokens of context (`host=False`: without the engine's host work per sequence)."""
    b = inputs.to_batch(pd.DataFrame([{**BASE, **r} for r in rows]))
    n = len(rows)
    return b, generation.step_time(b, np.full(n, float(batch)), np.full(n, ctx),
                                   generation.decode_constants(), host=host)


def host_seconds(rows, batch, ctx=300.0):
    """Seconds the engine's host work adds to each row's decode step at `batch` sequences."""
    return decode_steps(rows, batch, ctx)[1] - decode_steps(rows, batch, ctx, host=False)[1]
