"""Board power limits (cluster.power_limit_w) and the power-limited / PCIe Hopper parts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog, compute
from sim_core.simulate import simulate_frame
from sweep.config import fixed_columns, parse_run, parse_space
from sweep.engine.space import Space
from sweep.errors import ConfigError

RUN = {"model": "llama3-8b", "seq_len": 8192, "global_batch": 64, "precision": "bf16",
       "framework": "torchtitan", "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
       "parallel": {"tp": 1, "pp": 1, "micro_batch": 1, "zero": 3}}


def _sim(**over):
    row = {"model": "llama3-8b", "seq_len": 8192, "global_batch": 64, "gpu": "h100-sxm",
           "num_gpus": 8, "tp": 1, "pp": 1, "micro_batch": 1, "zero": 3, "recompute": "none",
           "framework": "torchtitan", **over}
    return simulate_frame(pd.DataFrame([row])).iloc[0]


def test_the_cube_law_clock_matches_nvidias_spec_clocks_conservatively():
    """f ~ P^(1/3) from H100 SXM (700 W, 989.4 TFLOP/s) at 400 W lands within 2% under the
    H100 NVL datasheet (400 W, 835.5 TFLOP/s, the same 132-SM die); at 500 W it gives the
    h100-96gb catalog peak (886.7) within 1%."""
    sxm, nvl, h96 = (catalog.get_gpu(g) for g in ("h100-sxm", "h100-nvl", "h100-96gb"))
    b = {"sm_arch": np.array([90.0, 90.0]), "power_limit_w": np.array([400.0, 500.0]),
         "tdp_w": np.array([sxm.tdp_w, sxm.tdp_w])}
    scale = compute.power_clock_scale(b)
    at400 = sxm.peak_tflops["bf16"] * scale[0]
    assert 0.98 < at400 / nvl.peak_tflops["bf16"] < 1.0
    assert abs(sxm.peak_tflops["bf16"] * scale[1] / h96.peak_tflops["bf16"] - 1) < 0.01


def test_a_power_limit_slows_compute_never_speeds_it_and_zero_means_rated():
    base = _sim()
    assert _sim(power_limit_w=0)["step_time_s"] == base["step_time_s"]
    assert _sim(power_limit_w=700)["step_time_s"] == base["step_time_s"]
    assert _sim(power_limit_w=900)["step_time_s"] == base["step_time_s"]  # no gain above rating
    t500, t300 = _sim(power_limit_w=500)["step_time_s"], _sim(power_limit_w=300)["step_time_s"]
    assert base["step_time_s"] < t500 < t300
    # only compute slows: the slowdown is under the clock ratio (communication, memory-bound)
    assert t500 / base["step_time_s"] < 1 / np.cbrt(500 / 700)


def test_power_limit_is_a_cluster_field_and_a_space_axis():
    cols = fixed_columns(parse_run({**RUN, "cluster": {**RUN["cluster"], "power_limit_w": 500}}))
    assert cols["power_limit_w"] == 500
    with pytest.raises(ConfigError) as ei:
        parse_run({**RUN, "cluster": {**RUN["cluster"], "power_limit_w": -5}})
    assert "cluster.power_limit_w" in str(ei.value) and "\n" not in str(ei.value)
    doc = {"name": "t", **{k: v for k, v in RUN.items() if k != "parallel"},
           "space": {"power_limit_w": [400, 500, 700], "tp": [1, 2]}}
    assert Space.from_config(parse_space(doc)).size == 6
    with pytest.raises(ConfigError) as ei:
        parse_space({**doc, "space": {"power_limit_w": [0, 500]}})
    assert "power_limit_w" in str(ei.value)


@pytest.mark.parametrize("gpu,bf16,bw,tdp,sms", [
    ("h100-pcie", 756.0, 2000.0, 350, 114), ("h100-nvl", 835.5, 3900.0, 400, 132),
    ("h20", 148.0, 4000.0, 400, 78), ("h800", 989.4, 3350.0, 700, 132),
    ("h100-96gb", 886.7, 2400.0, 500, 132)])
def test_power_limited_and_pcie_parts_carry_their_datasheet_figures(gpu, bf16, bw, tdp, sms):
    g = catalog.get_gpu(gpu)
    assert (g.peak_tflops["bf16"], g.hbm_bw_gbs, g.tdp_w, g.sm_count) == (bf16, bw, tdp, sms)
    assert g.peak_tflops["fp8"] == pytest.approx(2 * bf16, rel=0.001)
    assert catalog.default_cluster_for_gpu(gpu).gpu == gpu
    assert len(g.source) > 100


def test_memory_bandwidth_separates_a100_40gb_from_80gb():
    """HBM2 1,555 GB/s against HBM2e 2,039 GB/s: the memory-bound parts (elementwise ops, the
    optimizer step) run slower on the 40 GB part at equal compute."""
    a40, a80 = catalog.get_gpu("a100-40gb"), catalog.get_gpu("a100-80gb")
    assert (a40.hbm_bw_gbs, a80.hbm_bw_gbs) == (1555.0, 2039.0)
    row = {"model": "gpt3-1.7b", "seq_len": 2048, "global_batch": 64, "num_gpus": 8, "tp": 1,
           "pp": 1, "micro_batch": 1, "zero": 1, "recompute": "none",
           "framework": "megatron-core"}
    p = simulate_frame(pd.DataFrame([{**row, "gpu": "a100-40gb"}, {**row, "gpu": "a100-80gb"}]))
    assert p["time_optimizer"].iloc[0] / p["time_optimizer"].iloc[1] == pytest.approx(2039 / 1555)
    assert p["time_compute"].iloc[0] > p["time_compute"].iloc[1]
