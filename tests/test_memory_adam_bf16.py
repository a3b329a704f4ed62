"""bf16 Adam moments (Megatron-Core precision-aware optimizer, specs adam_bf16_states): the
optimizer state drops from 12 to 8 bytes per sharded parameter, nothing else moves."""
from __future__ import annotations

import pandas as pd
import pytest

from sim_core.simulate import simulate_frame

RUN = dict(model="mixtral-8x7b", seq_len=4096, global_batch=256, gpu="h100-sxm", num_gpus=64,
           tp=2, pp=4, ep=8, micro_batch=1, zero=1, framework="megatron-core")


def test_bf16_adam_states_take_two_thirds_of_the_optimizer_bytes():
    out = simulate_frame(pd.DataFrame([RUN, {**RUN, "adam_bf16_states": True}]))
    fp32, bf16 = out.iloc[0], out.iloc[1]
    assert bf16["mem_optimizer"] == pytest.approx(fp32["mem_optimizer"] * 8 / 12, rel=1e-9)
    # weights, gradients and activations are untouched; the peak falls by the difference
    for col in ("mem_weights", "mem_grads", "mem_activations"):
        assert bf16[col] == pytest.approx(fp32[col], rel=1e-12)
    assert fp32["peak_memory_gib"] - bf16["peak_memory_gib"] == pytest.approx(
        fp32["mem_optimizer"] - bf16["mem_optimizer"], rel=1e-6)
    assert bf16["step_time_s"] == pytest.approx(fp32["step_time_s"], rel=1e-12)

