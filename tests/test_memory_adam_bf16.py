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



def test_run_files_take_it_and_the_megatron_export_writes_what_was_priced():
    from sweep.advice import export
    from sweep.config.files import fixed_columns, parse_run
    from sweep.errors import ConfigError

    base = {"model": "mixtral-8x7b", "seq_len": 4096, "global_batch": 256,
            "cluster": {"gpu": "h100-sxm", "num_gpus": 64}}
    assert fixed_columns(parse_run({**base, "parallel": {"adam_bf16_states": True}}))[
        "adam_bf16_states"] is True
    with pytest.raises(ConfigError, match="parallel.adam_bf16_states: expected true or false"):
        parse_run({**base, "parallel": {"adam_bf16_states": "bf16"}})
    row = {**RUN, "adam_bf16_states": True, "dp": 8, "seq_len": 4096, "global_batch": 256}
    row = simulate_frame(pd.DataFrame([row])).iloc[0].to_dict() | row
    ns = export.megatron_parser().parse_args(export.megatron_args(row))
    assert ns.use_precision_aware_optimizer and ns.exp_avg_dtype == ns.exp_avg_sq_dtype == "bf16"
    ns = export.megatron_parser().parse_args(export.megatron_args({**row,
                                                                   "adam_bf16_states": False}))
    assert not ns.use_precision_aware_optimizer
