"""MoE / expert parallelism, context parallelism and FP8 options against closed forms."""

import numpy as np
import pandas as pd
import pytest

from sim_core import rules, workload
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate, simulate_frame

DSV3 = dict(model="deepseek-v3", seq_len=4096, global_batch=8192, gpu="h100-sxm", num_gpus=1024,
            tp=2, pp=8, vpp=4, ep=64, etp=1, micro_batch=1, recompute="selective",
            precision="fp8", sequence_parallel=True)
LLAMA = dict(model="llama3.1-8b", seq_len=131072, global_batch=8, gpu="h100-sxm", num_gpus=64,
             tp=8, cp=8, micro_batch=1, recompute="full", sequence_parallel=True)


def batch(base, **over):
    return frame_to_batch(pd.DataFrame([{**base, **over}]))


def comm(wl, dim, op):
    return [c for c in wl.comms if c.dim == dim and c.op == op]


def test_balanced_routing_has_no_imbalance_and_skew_adds_some():
    f0 = workload.expert_load_factor(batch(DSV3))[0]
    f1 = workload.expert_load_factor(batch(DSV3, expert_skew=0.5))[0]
    f2 = workload.expert_load_factor(batch(DSV3, expert_skew=1.0))[0]
    assert f0 == 1.0 and 1.0 < f1 < f2
    # token dropping caps the busiest expert at the capacity factor
    capped = workload.expert_load_factor(
        batch(DSV3, expert_skew=1.0, moe_dropless=False, capacity_factor=1.25))[0]
    assert capped == pytest.approx(min(f2, 1.25))


def test_zipf_load_factor_closed_form():
    """Rank holding the hottest expert: p1 + (E/ep - 1) average shares of the rest."""
    E, ep, alpha = 256, 64, 1.0
    p1 = 1 / np.sum(np.arange(1, E + 1) ** -alpha)
    expected = ep * (p1 + (E / ep - 1) * (1 - p1) / (E - 1))
    got = workload.expert_load_factor(batch(DSV3, expert_skew=alpha))[0]
    assert got == pytest.approx(expected)


def test_skew_slows_the_step_and_is_reported():
    out = simulate_frame(pd.DataFrame([DSV3, {**DSV3, "expert_skew": 1.0}]))
    assert out["moe_load_factor"].iloc[1] > 1.0 == out["moe_load_factor"].iloc[0]
    assert out["step_time_s"].iloc[1] > out["step_time_s"].iloc[0]


def test_all_to_all_volume_closed_form():
    """Dispatch + combine, forward and backward: 4 all-to-alls per MoE layer and micro-batch,
    each carrying T/tp tokens x top_k copies x hidden x 2 bytes."""
    b = batch(DSV3)
    wl = workload.build(b)
    (a2a,) = comm(wl, "ep", "all_to_all")
    T = 1 * 4096
    assert a2a.nbytes[0] == pytest.approx(2 * T / 2 * 7168 * 8)
    layers_stage = np.ceil(61 / (8 * 4)) * 4
    moe_layers = layers_stage * (61 - 3) / 61
    m = 8192 / (1024 / (2 * 8))
    assert a2a.calls_per_step[0] == pytest.approx(moe_layers * m * 4)
    assert a2a.group[0] == 64


def test_expert_weights_shard_over_ep():
    small = simulate(batch(DSV3, ep=32))
    big = simulate(batch(DSV3, ep=64))
    assert big["params_per_gpu"][0] < small["params_per_gpu"][0]
    assert big["mem_weights"][0] < small["mem_weights"][0]


def test_moe_rules():
    assert rules.check(batch(DSV3, ep=48))[1][0] == "experts % ep != 0"
    assert rules.check(batch(DSV3, ep=128, etp=2))[1][0] == "ep*etp must divide dp*cp*tp"
    assert rules.check(batch(DSV3))[0][0]


def test_mla_attention_parameters():
    """DeepSeek-V3 MLA: q down/up, kv down (+ rope key), kv up, output projection."""
    d = workload.model_dims(batch(DSV3))
    h, a = 7168, 128
    expected = (h * 1536 + 1536 * a * 192 + h * (512 + 64) + 512 * a * (128 + 128)
                + a * 128 * h)
    assert d["attn_params"][0] == expected


def test_ring_cp_volume_closed_form():
    b = batch(LLAMA)
    wl = workload.build(b)
    ring = comm(wl, "cp", "send_recv")[0]
    T = 131072 / 8
    kv = 8 * 128
    assert ring.nbytes[0] == pytest.approx(2 * T * 2 * kv / 8)
    m = 8 / (64 / (8 * 8))
    assert ring.calls_per_step[0] == pytest.approx(32 * m * 7 * (1 + 1 + 2))


def test_cp_divides_activation_memory():
    one = simulate(batch(LLAMA, cp=4, num_gpus=32, global_batch=8))
    two = simulate(batch(LLAMA, cp=8, num_gpus=64, global_batch=8))
    assert one["mem_activations"][0] / two["mem_activations"][0] == pytest.approx(2.0)


def test_ring_cp_hides_behind_attention_allgather_does_not():
    ring = simulate(batch(LLAMA))
    gather = simulate(batch(LLAMA, cp_comm="allgather"))
    assert ring["time_cp"][0] < gather["time_cp"][0]


def test_fp8_param_gather_halves_parameter_all_gather():
    base = dict(model="llama3.1-70b", seq_len=8192, global_batch=128, gpu="h100-sxm",
                num_gpus=64, tp=4, pp=8, vpp=5, precision="fp8", zero=1)
    a = [c for c in workload.build(batch(base)).comms if c.dim == "dp" and c.op == "all_gather"]
    b = [c for c in workload.build(batch(base, fp8_param_gather=True)).comms
         if c.dim == "dp" and c.op == "all_gather"]
    assert b[0].nbytes[0] == pytest.approx(a[0].nbytes[0] / 2)
