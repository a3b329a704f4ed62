"""vLLM V0's host work per running sequence per decode step (issue 40): derived from WukLab's
published vLLM 0.5.4 profile (data/rl/vllm_v0_host.csv), charged only where the rollout engine
is vLLM V0, serial with the GPU step, its output-processing share hidden when V0's async
output processor runs (CUDA graphs). These tests fail if the term reaches V1 or SGLang rows,
stops growing with the batch, ignores enforce_eager, or drifts from the published figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import generation, inputs, v0_host
from sim_core.rl import engine_host
from tests.rl_decode import BASE, decode_steps, host_seconds

def test_catalog_constants_are_the_published_profile_less_detokenization():
    d = v0_host.derive()
    k = inputs.constants()["vllm"]
    # the least squares passes within 0.4 ms of the three published points
    assert np.abs(d["residual_ms"]).max() < 0.4
    assert d["per_request_s"] > d["per_seq_s"] > 0
    assert k["v0_host_per_seq_s"] == pytest.approx(d["per_seq_s"], rel=0.01)
    assert k["v0_async_output_share"] == pytest.approx(d["async_output_share"], abs=0.002)
    # the breakdown's groups are the whole profile
    assert sum(d["shares"].values()) == pytest.approx(1.0)


def test_v0_pays_per_running_sequence_serially_and_v1_does_not():
    k = inputs.constants()["vllm"]
    eager = {"enforce_eager": True}
    rows = [eager, {**eager, "rollout_vllm_v0": True}]
    b = decode_steps(rows, 1.0)[0]
    v1_serial = engine_host.per_seq_s(b)[0]
    for batch in (64.0, 512.0):
        h = host_seconds(rows, batch)
        # V0 pays its published figure and nothing of V1's; V1 pays its own (engine_host.py)
        np.testing.assert_allclose(h[1], k["v0_host_per_seq_s"] * batch, rtol=1e-9)
        np.testing.assert_allclose(h[0], v1_serial[0] * batch, rtol=1e-9)
        assert v1_serial[1] == 0.0
        # the GPU step is the same whichever engine version
        g = decode_steps(rows, batch, host=False)[1]
        assert g[0] == g[1]
    # with CUDA graphs the async output processor hides the output processing
    h = host_seconds([{"rollout_vllm_v0": True}], 512.0)
    np.testing.assert_allclose(
        h[0], k["v0_host_per_seq_s"] * (1 - k["v0_async_output_share"]) * 512, rtol=1e-9)


def test_the_flag_reaches_only_vllm():
    t = decode_steps([{"rollout_engine": "sglang"},
                      {"rollout_engine": "sglang", "rollout_vllm_v0": True}], 512.0)[1]
    assert t[1] == t[0]


def test_v0_lengthens_generation_most_for_small_models():
    rows = [{}, {"rollout_vllm_v0": True},
            {"model": "qwen2.5-7b"}, {"model": "qwen2.5-7b", "rollout_vllm_v0": True}]
    g = generation.generate(inputs.to_batch(pd.DataFrame([{**BASE, **r} for r in rows])))
    gen = g["gen_time_s"]
    assert gen[1] > gen[0] and gen[3] > gen[2]
    assert gen[1] / gen[0] > gen[3] / gen[2]


def test_table_rows_state_the_engine_and_say_why():
    from sim_core.accuracy import rl

    t = rl.load()
    v0 = t.rollout_vllm_v0.astype(str).str.lower().eq("true").to_numpy()
    assert v0.sum() >= 6
    assert t.notes[v0].str.contains("rollout_vllm_v0 True").all()
    assert t.rollout_engine[v0].str.lower().eq("vllm").all()
    cmp = rl.compare(t)
    blank_vllm = t.rollout_vllm_v0.isna() & t.rollout_engine.astype(str).str.lower().eq("vllm")
    assert blank_vllm.any()
    assert cmp.imputed[blank_vllm.to_numpy()].str.contains("vLLM engine V1").all()


def test_run_file_flag_and_its_one_line_error(rl_rollout_flag):
    base, flagged, rc, err = rl_rollout_flag("vllm_v0")
    assert flagged > base
    assert rc == 2 and len(err) == 1 and "vllm_v0" in err[0]
