"""The rollout engine's host work per running sequence per decode step, vLLM V1 and SGLang
(issue 40, sim_core/rl/engine_host.py): per-request loop bodies counted in the engines' code
at a measured cost per body; V1 (in the trainer's process, no async scheduling at 0.8-0.10)
adds it to the GPU step, SGLang's overlap scheduler hides it under the step unless it is
longer. These tests fail if the term stops growing with the running batch, if an overlapped
engine adds instead of taking the longer, if it reaches vLLM V0 or TensorRT-LLM rows, or if
the constants drift from the published measurement they come from."""

from __future__ import annotations

import numpy as np
import pytest

from sim_core.rl import engine_host, inputs
from tests.rl_decode import decode_steps, host_seconds


def test_more_running_sequences_cost_more_host_time():
    rows = [{}, {"rollout_engine": "sglang"}]
    small, large = host_seconds(rows[:1], 64.0), host_seconds(rows[:1], 1024.0)
    assert 0 < small[0] < large[0]
    # V1's is serial: exactly per sequence
    np.testing.assert_allclose(large[0] / small[0], 1024 / 64, rtol=1e-9)
    serial, overlapped = engine_host.per_seq_s(decode_steps(rows, 1.0)[0])
    assert serial[0] > 0 and overlapped[0] == 0
    assert serial[1] == 0 and overlapped[1] > 0


def test_overlapped_engines_take_the_longer_of_gpu_and_host():
    gpu = np.array([0.010, 0.010])
    seqs = np.array([1000.0, 1000.0])
    # overlapped: 5 ms of host under a 10 ms GPU step is hidden; 20 ms is not
    got = engine_host.combine(gpu, seqs, 0.0, np.array([5e-6, 20e-6]))
    np.testing.assert_allclose(got, [0.010, 0.020])
    # serial: always added
    got = engine_host.combine(gpu, seqs, np.array([5e-6, 20e-6]), 0.0)
    np.testing.assert_allclose(got, [0.015, 0.030])
    # SGLang at the catalog's figures: 1024 sequences of host work hide under the GPU step
    sg = [{"rollout_engine": "sglang"}]
    with_host = decode_steps(sg, 1024.0)[1]
    gpu_only = decode_steps(sg, 1024.0, host=False)[1]
    assert with_host[0] == gpu_only[0]


def test_v0_and_tensorrt_llm_rows_get_none_of_it():
    b = decode_steps([{"rollout_vllm_v0": True}, {"rollout_engine": "tensorrt-llm"}], 1.0)[0]
    serial, overlapped = engine_host.per_seq_s(b)
    np.testing.assert_array_equal(serial, [0.0, 0.0])
    np.testing.assert_array_equal(overlapped, [0.0, 0.0])
    assert host_seconds([{"rollout_engine": "tensorrt-llm"}], 1024.0)[0] == 0.0


def test_logprobs_add_their_loop():
    k = inputs.constants()["engine_host"]
    h = host_seconds([{}, {"rollout_logprobs": False}], 512.0)
    np.testing.assert_allclose(h[0] - h[1], 512 * k["vllm_v1_logprob_loops"] * k["loop_body_s"],
                               rtol=1e-9)


def test_loop_cost_is_vllms_published_update_from_output_measurement():
    # vllm-project/vllm PR 46112: update_from_output 0.142 ms at 128, 0.287 ms at 256 requests
    k = inputs.constants()["engine_host"]
    assert k["loop_body_s"] == pytest.approx(0.287e-3 / 256, rel=0.01)
    assert k["loop_body_s"] == pytest.approx(0.142e-3 / 128, rel=0.01)
    assert k["vllm_v1_loops"] >= 1  # the measured loop is one of them


def test_small_models_feel_it_most():
    rows = [{}, {"model": "qwen2.5-7b"}]
    h = host_seconds(rows, 1024.0)
    gpu = decode_steps(rows, 1024.0, host=False)[1]
    assert h[0] == pytest.approx(h[1], rel=1e-9)  # the host does not know the model size
    assert h[0] / gpu[0] > h[1] / gpu[1]


def test_async_scheduling_moves_v1_from_adding_to_overlapping():
    rows = [{}, {"rollout_async_scheduling": True}]
    b = decode_steps(rows, 1.0)[0]
    serial, overlapped = engine_host.per_seq_s(b)
    assert serial[0] > 0 and overlapped[0] == 0
    assert serial[1] == 0 and overlapped[1] == serial[0]
    h = host_seconds(rows, 1024.0)
    assert h[0] > 0 and h[1] == 0.0  # hidden under the GPU step at the catalog's figures
    # V0 has no such option: the flag leaves a V0 row's serial cost as it was
    v0 = [{"rollout_vllm_v0": True}, {"rollout_vllm_v0": True, "rollout_async_scheduling": True}]
    h = host_seconds(v0, 512.0)
    assert h[0] == h[1] > 0


def test_run_file_async_scheduling_and_its_one_line_error(rl_rollout_flag):
    base, flagged, rc, err = rl_rollout_flag("async_scheduling")
    assert flagged < base
    assert rc == 2 and len(err) == 1 and "async_scheduling" in err[0]
