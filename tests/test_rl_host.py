"""The host floor of verl's eager FSDP micro-batches (issue 40, sim_core/rl/host.py): kernels
counted from the code the rows ran, times the per-kernel host seconds of a published
host-bound eager run; a micro-batch lasts max(GPU time, host time)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import host, verl_calls
from sim_core.rl.phases import simulate_rl

# a verl GRPO row of Qwen2.5-0.5B (24 layers) on 8 H100 with FSDP, four sequences per
# micro-batch: 256 x 4 sequences / 8 GPUs = 128 per GPU = 32 log-prob micro-batches
SMALL = dict(model="qwen2.5-0.5b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
             prompts_per_step=256, responses_per_prompt=4, prompt_len=100, response_mean=200,
             response_max=256, prompt_max=512, gpu_memory_utilization=0.6, train_tp=1,
             train_pp=1, train_zero=3, mini_batches=4, train_seq_len=8000,
             sequence_packing=False, micro_batch_seqs=4, use_ref=False)


@pytest.fixture(autouse=True)
def _floor_alone(monkeypatch):
    """These tests price the floor alone: verl's per-call work (verl_calls.py) set to zero."""
    real = verl_calls.seconds
    monkeypatch.setattr(verl_calls, "seconds", lambda *a, **k: {
        key: np.zeros_like(v) for key, v in real(*a, **k).items()})


def run(*rows):
    return simulate_rl(pd.DataFrame([{**SMALL, **r} for r in rows]))


def set_host(monkeypatch, seconds):
    """Every host-side figure of host.py set to `seconds` (0: the GPU time alone)."""
    monkeypatch.setattr(host, "seconds_per_kernel", lambda: seconds)
    monkeypatch.setattr(host, "view_seconds", lambda: seconds)


def test_kernel_counts_per_layer_unit_and_micro_batch():
    # 24 layers, 25 FSDP units (the layers and the root)
    assert host.forward_kernels(24) == 24 * 51 + 25 * 2 + 45
    full = host.update_kernels(24, True)
    assert full == pytest.approx(24 * (51 * host.update_over_forward() + 51) + 25 * (2 + 9) + 135)
    # gradient checkpointing replays exactly one forward of every layer
    assert full - host.update_kernels(24, False) == pytest.approx(24 * 51)
    assert host.step_kernels(24) == 25 * 2 + 30
    # vectorized over rows
    assert list(host.forward_kernels(np.array([16, 24]))) == [16 * 53 + 2 + 45, 24 * 53 + 2 + 45]


def test_optimizer_step_is_on_the_host_floor_once_per_step():
    # no micro-batch: the step's grad-norm clipping and foreach AdamW launches alone
    assert host.update_floor(24, 0, True) == pytest.approx(
        (25 * 2 + 30) * host.seconds_per_kernel())
    two = host.update_floor(np.array([24.0]), np.array([2.0]), np.array([False]))
    one = host.update_floor(np.array([24.0]), np.array([1.0]), np.array([False]))
    # a micro-batch more adds its kernels and views, the step's cost stays once
    assert two - one == pytest.approx(host.update_kernels(24, False) * host.seconds_per_kernel()
                                      + 24 * host.view_seconds())


def test_per_kernel_figure_is_qwens_transformers_benchmark():
    # Qwen3-32B (64 layers) and 0.6B (28) steps at 26.24 and 58.57 tok/s: the layers' slope,
    # over the 60 kernels of a Qwen3 decode layer
    per_layer = (1 / 26.24 - 1 / 58.57) / (64 - 28)
    assert host.seconds_per_kernel() == pytest.approx(per_layer / 60, rel=0.01)
    # the 36-layer 4B and 8B steps sit on the same line within 2%
    rest = 1 / 58.57 - 28 * per_layer
    for tok_s in (45.94, 45.32):
        assert 1 / tok_s == pytest.approx(rest + 36 * per_layer, rel=0.02)


def test_fsdp1_views_are_pytorch_pr_96958s_figure_per_weight():
    # 6.112 ms for 400 parameters' views (default safe setattr); 9 weights per decoder layer
    assert host.view_seconds() == pytest.approx(6.112e-3 / 400 * 9, rel=0.01)


def test_host_bound_log_prob_pass_is_micro_batches_times_host_time():
    r = run({})
    per_mb = host.forward_kernels(24) * host.seconds_per_kernel() + 24 * host.view_seconds()
    assert r.old_log_prob_time_s[0] == pytest.approx(32 * per_mb, rel=1e-9)


def test_floor_binds_for_small_micro_batches_only(monkeypatch):
    rows = ({}, {"micro_batch_seqs": 2}, {"model": "qwen2.5-7b", "sequence_packing": True})
    with_floor = run(*rows)
    set_host(monkeypatch, 0.0)
    gpu = run(*rows)
    # the 0.5B model at four sequences per micro-batch waits on the host
    assert with_floor.update_time_s[0] > 1.3 * gpu.update_time_s[0]
    assert with_floor.old_log_prob_time_s[0] > 1.3 * gpu.old_log_prob_time_s[0]
    # host-bound, halving the micro-batch doubles the passes' time (the floor is per
    # micro-batch), where the GPU time alone barely moves
    assert with_floor.old_log_prob_time_s[1] / with_floor.old_log_prob_time_s[0] \
        == pytest.approx(2.0, rel=1e-6)
    assert gpu.old_log_prob_time_s[1] / gpu.old_log_prob_time_s[0] < 1.6
    # a 7B model on 8000-token micro-batches is GPU-bound: unchanged
    assert with_floor.update_time_s[2] == pytest.approx(gpu.update_time_s[2], rel=1e-12)
    assert with_floor.old_log_prob_time_s[2] == pytest.approx(gpu.old_log_prob_time_s[2],
                                                               rel=1e-12)


def test_checkpointing_replay_is_on_the_host_too():
    r = run({"train_recompute": "full"}, {"train_recompute": "none"})
    # per optimizer step: micro-batches x the replayed layers' kernels; 4 mini-batches of
    # 8 micro-batches per GPU (128 / 4 / 4)
    replay = 4 * 8 * 24 * (51 * host.seconds_per_kernel() + host.view_seconds())
    assert r.update_time_s[0] - r.update_time_s[1] == pytest.approx(replay, rel=1e-6)


def test_off_for_nemo_rl_rows(monkeypatch):
    # NeMo RL's and Megatron's rows keep their own pricing: the floor does not touch them
    rows = ({"rl_framework": "nemo_rl"}, {"train_zero": 1})
    before = run(*rows)
    set_host(monkeypatch, 1.0)
    after = run(*rows)
    for c in ("old_log_prob_time_s", "update_time_s", "step_time_s"):
        assert list(after[c]) == pytest.approx(list(before[c]), rel=1e-12)


def test_update_over_forward_is_the_measured_hf_layers_host_floor():
    """catalogs/rl.yaml eager_update_over_forward: (forward + bwd) / forward of transformers'
    own Qwen2 decoder layer at qwen2.5-0.5b's shape on the H100 table's two host-bound rows
    (2,048 tokens x 1 and x 4: 4x the tokens for under 25% more time), their mean; and it is
    above what counting the backward's kernels at a forward kernel's price gives."""
    from importlib import resources

    df = pd.read_csv(resources.files("sim_core").joinpath(
        "data/kernels/run-shapes/h100-sxm-hf-layers.csv"), comment="#")
    small = df[(df["model"] == "qwen2.5-0.5b") & (df["seq"] == 2048)]
    t = small.pivot_table(index="batch", columns="direction", values="time_us")
    assert t.loc[4].sum() < 1.25 * t.loc[1].sum()  # host-bound: the tokens barely count
    ratios = (t["fwd"] + t["bwd"]) / t["fwd"]
    assert host.update_over_forward() == pytest.approx(ratios.mean(), rel=0.01)
    assert host.update_over_forward() > 1.5 * (host.LAYER_FORWARD + host.LAYER_BACKWARD) / host.LAYER_FORWARD
