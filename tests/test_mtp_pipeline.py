"""DeepSeek-V3's last pipeline stage and busiest rank: multi-token prediction (specs
mtp_layers), Megatron-Bridge's pipeline layout (pp_last_stage_layers) and the all-MoE rank
(workload.stage_moe_share), priced by hand against the simulator's own parts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import compute, step, workload
from sim_core.accuracy import validation
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate_frame

DSV3 = dict(model="deepseek-v3", seq_len=4096, global_batch=8192, gpu="h100-sxm",
            num_gpus=1024, tp=2, pp=8, vpp=4, ep=64, etp=1, micro_batch=1,
            sequence_parallel=True, precision="bf16", framework="megatron-core",
            moe_dispatcher="alltoall", moe_a2a_overlap=False)


def _parts(**over):
    b = frame_to_batch(pd.DataFrame([{**DSV3, **over}]))
    wl = workload.build(b)
    ops = {op.name: op for op in wl.ops}
    return b, wl, ops, compute.stage_times(b, wl)


def test_mtp_adds_a_head_a_loss_and_eh_proj_on_the_last_stage():
    """One MTP layer: the output head and the loss run twice (gpt_model.py L549-561,
    core_v0.15.3); eh_proj is a [T, 2h] x [2h, h/tp] GEMM (multi_token_prediction.py L464)."""
    _, _, base, _ = _parts()
    b, _, mtp, _ = _parts(mtp_layers=1)
    T, h, V, t = 4096, 7168, 129280, 2
    assert float(base["lm_head"].fwd_flops[0]) == pytest.approx(2 * T * h * V / t)
    assert float(mtp["lm_head"].fwd_flops[0]) == pytest.approx(2 * 2 * T * h * V / t)
    assert float(mtp["loss"].fwd_bytes[0]) == pytest.approx(2 * float(base["loss"].fwd_bytes[0]))
    assert float(mtp["mtp_eh_proj"].fwd_flops[0]) == pytest.approx(2 * T * 2 * h * h / t)
    assert "mtp_eh_proj" not in base and "mtp_elementwise" not in base


def test_mtp_layer_costs_one_stage_layer_and_the_layout_moves_layers_off():
    b, wl, _, st = _parts()
    stage = np.array([1.0])
    assert float(step.last_stage_layers_s(b, wl, stage)[0]) == 0.0
    b1, wl1, _, _ = _parts(mtp_layers=1)
    L = float(wl1.layers_per_stage[0])
    assert L == 8  # ceil(61 / 32) x 4
    assert float(step.last_stage_layers_s(b1, wl1, stage)[0]) == pytest.approx(1 / L)
    # Bridge's H100 layout Et|(tt|)*30mL: 6 decoders + MTP on the last rank -> one layer lighter
    b2, wl2, _, _ = _parts(mtp_layers=1, pp_last_stage_layers=6)
    assert float(step.last_stage_layers_s(b2, wl2, stage)[0]) == pytest.approx((1 - 2) / L)
    # with one pipeline stage there is no layout to move layers by
    b3, wl3, _, _ = _parts(pp=1, vpp=1, num_gpus=128, pp_last_stage_layers=6)
    assert float(step.last_stage_layers_s(b3, wl3, stage)[0]) == 0.0


def test_mtp_slows_the_step_and_a_light_last_rank_is_not_the_pace():
    keys = dict(recompute="selective")
    base, mtp, light = (simulate_frame(pd.DataFrame([{**DSV3, **keys, **o}]))["step_time_s"][0]
                        for o in ({}, {"mtp_layers": 1}, {"pp_last_stage_layers": 5}))
    assert mtp > base
    # 5 decoders + head on the last rank: the 8-layer ranks set the pace, the head drops out
    assert light < base


def test_busiest_rank_is_all_moe():
    """DeepSeek-V3's 3 dense layers fill one 2-layer chunk and a half: ranks 0-1 hold them,
    the others only MoE layers; with one stage the model's mix (58 of 61)."""
    b, wl, _, _ = _parts()
    assert float(workload.stage_moe_share(b, wl.dims)[0]) == 1.0
    b1 = frame_to_batch(pd.DataFrame([{**DSV3, "pp": 1, "vpp": 1, "num_gpus": 128}]))
    d1 = workload.model_dims(b1)
    assert float(workload.stage_moe_share(b1, d1)[0]) == pytest.approx(58 / 61)
    # 61 layers over 32 ranks of 2: the 3 dense layers fill 2 of the 32 chunks, 30 ranks all-MoE
    b2 = frame_to_batch(pd.DataFrame([{**DSV3, "pp": 32, "vpp": 1}]))
    assert float(workload.stage_moe_share(b2, workload.model_dims(b2))[0]) == 1.0
    # a dense model stays dense
    b3 = frame_to_batch(pd.DataFrame([{**DSV3, "model": "llama3-70b", "ep": 1}]))
    assert float(workload.stage_moe_share(b3, workload.model_dims(b3))[0]) == 0.0


def test_validate_sets_bridge_deepseek_pipeline():
    f = validation._deepseek_bridge_pipeline
    h100 = f("DeepSeekV3 (dropless)", "Megatron-Bridge ... 25.09 NeMo container", "h100-sxm", 8, 4)
    assert h100 == {"mtp_layers": 1, "pp_last_stage_layers": 6}
    gb200 = f("DeepSeekV3 (w/o MTP) [GB200]", "... 25.11 ...", "gb200", 4, 4)
    assert gb200 == {"mtp_layers": 0, "pp_last_stage_layers": 13}  # 3 chunks of 4 + 1
    assert f("DeepSeekV3", "x", "b200", 2, 4) == {"mtp_layers": 1}  # no layout known


def test_router_gemm_is_not_fp8():
    """Megatron's router GEMM is bf16 under FP8 training (moe_utils.py router_gating_linear,
    core_v0.15.3): switching the layers to FP8 leaves its time alone."""
    import copy
    times = {}
    for prec in ("bf16", "fp8"):
        b = frame_to_batch(pd.DataFrame([{**DSV3, "precision": prec}]))
        wl = workload.build(b)
        only = copy.copy(wl)
        only.ops = [op for op in wl.ops if op.name == "router"]
        times[prec] = float(np.ravel(compute._stage_core(b, only)["layer_gemm_fwd"])[0])
    assert times["bf16"] > 0
    assert times["fp8"] == pytest.approx(times["bf16"])


def test_run_fields_parse_and_refuse_bad_values():
    from sweep.config import fixed_columns, parse_run
    from sweep.errors import ConfigError
    run = {"model": "deepseek-v3", "seq_len": 4096, "global_batch": 8192, "precision": "bf16",
           "cluster": {"gpu": "h100-sxm", "num_gpus": 1024},
           "parallel": {"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "mtp_layers": 1,
                        "pp_last_stage_layers": 6}}
    row = fixed_columns(parse_run(run))
    assert row["mtp_layers"] == 1 and row["pp_last_stage_layers"] == 6
    bad = dict(run, parallel=dict(run["parallel"], mtp_layers=-1))
    with pytest.raises(ConfigError) as ei:
        parse_run(bad)
    msg = str(ei.value)
    assert "\n" not in msg and "mtp_layers" in msg and "non-negative integer" in msg
