"""The transformers sparse-MoE expert path under FSDP (sim_core/rl/hf_moe.py): which path each
framework's lock runs, the counts read from transformers v4.52.4 / v5.8.0, and that dense and
Megatron rows do not move."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl
from sim_core.rl import hf_moe, inputs, training
from sim_core.rl.phases import simulate_rl

# a Qwen3-30B-A3B GRPO step on 16 H100 trained with FSDP2 at EP 1, one sequence per micro-batch
ROW = dict(model="qwen3-30b-a3b", gpu="h100-sxm", num_gpus=16, rollout_tp=4,
           prompts_per_step=32, responses_per_prompt=8, prompt_len=100, response_mean=1000,
           response_max=2048, gpu_memory_utilization=0.6, train_zero=3, train_ep=1,
           mini_batches=1, micro_batch_seqs=1, logprob_micro_batch_seqs=1,
           sequence_packing=False, rl_framework="nemo_rl")


def _frame(**over):
    df = pd.DataFrame([{**ROW, **over}])
    b = inputs.to_batch(df)
    return df, b, training.training_frame(df, b)


def test_counts_from_the_code():
    # v4.52.4 Qwen3MoeSparseMoeBlock, per expert: nonzero 2 + index 1 + MLP 5 + routing 2 +
    # index_add_ 1; router 9
    assert hf_moe.LOOP_FWD == 2 + 1 + 5 + 2 + 1
    assert hf_moe.ROUTER_FWD == 9
    # backward: 1 + 2 + 2 + 1 + 6 + 2 + 1 + 1 + 2 + 1 + 1 (hf_moe docstring)
    assert hf_moe.LOOP_BWD == 20
    df, b, tf = _frame()
    k = hf_moe.layer_seconds(b, tf, np.array([4096.0]), np.array([0.01]), np.array([0.02]))
    # 4096 tokens x top-8 of 128 experts hit all 128: one sync per expert
    assert k["syncs_fwd"][0] == pytest.approx(128.0)
    assert k["kernels_fwd"][0] == pytest.approx(128 * 11 + 9)
    # a few tokens hit few experts
    assert hf_moe.experts_hit(b, np.array([1.0]))[0] == pytest.approx(8.0)


def test_which_path_each_framework_runs():
    _, b, tf = _frame()
    assert hf_moe.path(b, tf)[0] == hf_moe.LOOP           # NeMo RL v0.3.0: transformers 4.52.4
    _, b, tf = _frame(rl_framework="skyrl")
    assert hf_moe.path(b, tf)[0] == hf_moe.GROUPED        # SkyRL a9564572: 5.8.0 grouped_mm
    _, b, tf = _frame(rl_framework="verl")
    assert hf_moe.path(b, tf)[0] == hf_moe.LOOP
    _, b, tf = _frame(train_zero=1, train_ep=8)
    assert hf_moe.path(b, tf)[0] == 0                     # Megatron-Core: moe_host.py's
    _, b, tf = _frame(model="llama3.1-8b")
    assert hf_moe.path(b, tf)[0] == 0                     # dense


def test_loop_is_host_bound_and_grouped_mm_is_not():
    df, b, tf = _frame()
    tok = np.array([1100.0])
    loop = hf_moe.layer_seconds(b, tf, tok, np.array([2e-3]), np.array([4e-3]))
    s = 9.7e-6
    g_e = hf_moe.expert_gemm_s(b, tok)[0]
    assert g_e < 11 * s           # ~69 tokens per expert: the GEMMs are shorter than the issue
    assert loop["fwd"][0] == pytest.approx(128 * (11 * s - g_e + 20e-6) + 9 * s, rel=1e-6)
    _, b2, tf2 = _frame(rl_framework="skyrl")
    grp = hf_moe.layer_seconds(b2, tf2, tok, np.array([2e-3]), np.array([4e-3]))
    assert grp["fwd"][0] == 0.0 and grp["bwd"][0] == 0.0
    # a layer under the grouped path's host time is host-bound too
    tiny = hf_moe.layer_seconds(b2, tf2, tok, np.array([1e-5]), np.array([2e-5]))
    assert tiny["fwd"][0] == pytest.approx(22 * s - 1e-5)


def test_the_loop_reaches_the_phases(monkeypatch):
    df = pd.DataFrame([ROW])
    with_loop = training.passes(df, inputs.to_batch(df))
    monkeypatch.setattr(hf_moe, "TRANSFORMERS", {})
    without = training.passes(df, inputs.to_batch(df))
    # the loop's host time and syncs lengthen both passes of the NeMo RL DTensor row
    assert with_loop["update_time_s"][0] > without["update_time_s"][0] + 1.0
    assert with_loop["old_log_prob_time_s"][0] > without["old_log_prob_time_s"][0]


def test_validation_rows_other_than_fsdp_moe_do_not_move(monkeypatch):
    t = rl.load()
    before = rl.compare(t)
    monkeypatch.setattr(hf_moe, "TRANSFORMERS", {})
    after = rl.compare(t)
    cols = ["pred_step_s", "pred_log_prob_time_s", "pred_update_time_s"]
    # the one FSDP-trained MoE row: marin issue 8653 (SkyRL, Qwen3-235B-A22B, EP 1)
    moe = (before["source"] == "marin issue 8653").to_numpy()
    assert moe.sum() == 1
    np.testing.assert_allclose(before[cols].to_numpy(float)[~moe],
                               after[cols].to_numpy(float)[~moe], rtol=0, atol=1e-9,
                               equal_nan=True)
    # grouped_mm adds nothing there; the experts' FSDP gathers a little (fsdp_experts.py)
    d = before[cols].to_numpy(float)[moe] - after[cols].to_numpy(float)[moe]
    assert (d > 0).all() and (d[0, 1:] < 5.0).all()


def test_fsdp_gathers_the_experts_every_micro_batch():
    from sim_core.rl import fsdp_experts
    from sim_core.simulate import simulate_frame
    df, b, tf = _frame()
    sim = simulate_frame(tf.reset_index(drop=True))
    n = np.array([10.0])
    upd = fsdp_experts.pass_seconds(b, tf, sim, n, False)[0]
    lp = fsdp_experts.pass_seconds(b, tf, sim, n, True)[0]
    ag = fsdp_experts._all_gather(b, b.routed_params, sim["dp"].to_numpy(float))[0]
    # at least the first layer's share of each gather, per micro-batch
    assert upd >= 10 * 2 * ag / b.layers[0] - 1e-12 and lp >= 10 * ag / b.layers[0] - 1e-12
    # with no compute to hide behind, the whole gathers show
    none = sim.assign(time_compute=0.0, time_recompute=0.0)
    assert fsdp_experts.pass_seconds(b, tf, none, n, False)[0] == pytest.approx(
        10 * 2 * ag * (1 + 1 / b.layers[0]), rel=1e-6)
    # EP > 1, Megatron, dense: nothing
    for over in (dict(train_ep=8), dict(train_zero=1), dict(model="llama3.1-8b")):
        d2, b2, tf2 = _frame(**over)
        s2 = simulate_frame(tf2.reset_index(drop=True))
        assert fsdp_experts.pass_seconds(b2, tf2, s2, n, False)[0] == 0.0
