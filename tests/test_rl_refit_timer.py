"""What NeMo RL's refit timer holds (sim_core/rl/refit_timer.py) and how validate compares it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl
from sim_core.rl import generation, inputs, refit_timer, step_fixed, training, weight_sync
from sim_core.rl.phases import simulate_rl

GIB = 2.0 ** 30
GC, EC = 0.172, 0.080          # catalogs/rl.yaml step_fixed (huggingface/peft PR 2894)
WAKE = (0.26, 0.823)           # vLLM sleep-mode blog, A100, level 1 (means)
GB = (1.2, 8.4)

# the NeMo RL v0.3 blog's Llama 3.1-8B Megatron row, as rl_runs.csv states it
NEMO = dict(model="llama3.1-8b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
            prompts_per_step=64, responses_per_prompt=32, prompt_len=200, response_mean=795,
            response_max=4096, gpu_memory_utilization=0.6, train_tp=1, train_pp=1,
            train_zero=1, rl_framework="nemo_rl", offload_params=True,
            offload_optimizer=True)


def frame(*rows):
    return pd.DataFrame([{**NEMO, **r} for r in rows])


def parts(df):
    b = inputs.to_batch(df)
    return b, training.passes(df, b), generation.generate(b), training.pcie_bytes_per_s(b)


def test_timer_is_the_sync_plus_wake_offload_out_and_cleaning():
    df = frame({}, {"train_zero": 3})
    r = simulate_rl(df)
    b, tr, gen, pcie = parts(df)
    slow = inputs.constants()["pageable_slowdown"]
    wake = (gen["rollout_weights_gib"] * GIB / step_fixed.wake_bytes_per_s(pcie)
            + step_fixed.wake_fixed_s())
    opt = tr["train_optimizer_gib"]
    # Megatron: the precision-aware Adam state (10 of 12 B) pageable, the bf16 weights pinned
    meg = (tr["train_weights_gib"][0] + 10 / 12 * opt[0] * slow) * GIB / pcie[0]
    # DTensor: fp32 parameters and moments (12 B) pageable, no bf16 copy
    dt = opt[1] * slow * GIB / pcie[1]
    assert r.refit_wake_s.to_numpy() == pytest.approx(wake, rel=1e-9)
    assert r.refit_offload_s.to_numpy() == pytest.approx([meg, dt], rel=1e-9)
    assert r.refit_timer_s.to_numpy() == pytest.approx(
        (r.weight_sync_time_s + r.refit_wake_s + r.refit_offload_s
         + r.refit_cleanup_time_s).to_numpy(), rel=1e-12)
    # the cleaning counted in step_fixed.py: Megatron 2 + 2, DTensor 3 + 3, and one pair more
    # where the refit streams (the current release; v0.4.0 on): both ends clean after it
    assert r.refit_cleanup_time_s.to_numpy() == pytest.approx([3 * (GC + EC), 4 * (GC + EC)])
    assert (r.refit_timer_s > r.weight_sync_time_s + 1.0).all()
    # v0.3's controller path: no stream pair, but v0.3.0's workers clean more around the
    # refit (Megatron 3 + 3, DTensor 5 + 5: step_fixed.py)
    old = simulate_rl(df.assign(rl_framework_version=0.3))
    assert old.refit_cleanup_time_s.to_numpy() == pytest.approx([3 * (GC + EC), 5 * (GC + EC)])


def test_other_frameworks_and_split_keep_the_weight_sync():
    df = frame({"rl_framework": "verl"}, {"placement": "split", "rollout_gpus": 4},
               {"rl_framework": "slime"})
    r = simulate_rl(df)
    assert r.refit_timer_s.to_numpy() == pytest.approx(r.weight_sync_time_s.to_numpy())
    assert (r.refit_wake_s == 0).all() and (r.refit_offload_s == 0).all()


def test_wake_rate_is_the_blog_slope_carried_by_the_host_link():
    slope_gbs = (GB[1] - GB[0]) / (WAKE[1] - WAKE[0])      # 12.8 GB/s on the A100
    pcie = inputs.constants()["pcie_gbs"]
    a100, h100 = step_fixed.wake_bytes_per_s(np.array([pcie[80], pcie[90]]) * 1e9)
    assert a100 == pytest.approx(slope_gbs * 1e9, rel=1e-9)
    assert h100 / a100 == pytest.approx(pcie[90] / pcie[80])
    assert a100 < pcie[80] * 1e9 * 0.6       # half the Gen4 link: not a streaming copy
    # the step's offload holds the wake at that rate (vLLM), the link's rate otherwise
    df = frame({}, {"rollout_engine": "sglang"})
    r = simulate_rl(df)
    b, tr, gen, p = parts(df)
    gap = gen["rollout_weights_gib"][0] * GIB * (1 / step_fixed.wake_bytes_per_s(p)[0]
                                                 - 1 / p[0])
    assert r.offload_time_s[0] - r.offload_time_s[1] == pytest.approx(gap, rel=1e-6)


def test_nemo_megatron_offload_moves_the_precision_aware_optimizer_state():
    df = frame({"offload_optimizer": False}, {}, {"rl_framework": "slime"},
               {"rl_framework": "slime", "offload_optimizer": False})
    r = simulate_rl(df)
    b, tr, gen, pcie = parts(df)
    slow = inputs.constants()["pageable_slowdown"]
    share = refit_timer.optimizer_moved_share(b, np.zeros(4, bool))
    # TE FusedAdam's state under NeMo RL's use_precision_aware_optimizer: exp_avg, exp_avg_sq
    # (4 + 4 B) and the fp32 main parameters' int16 remainders (2 B) of the simulator's 12 B
    assert share.tolist() == pytest.approx([10 / 12, 10 / 12, 1, 1])
    moved = 2 * tr["train_optimizer_gib"] * slow * GIB / pcie
    assert r.offload_time_s[1] - r.offload_time_s[0] == pytest.approx(10 / 12 * moved[1],
                                                                       rel=1e-6)
    assert r.offload_time_s[2] - r.offload_time_s[3] == pytest.approx(moved[2], rel=1e-6)
    # what stays is resident while the engine generates (the simulator's 12 B less the
    # optimizer's 10)
    kept = tr["train_optimizer_gib"][1] / 6
    assert r.rollout_peak_gib[1] - r.rollout_peak_gib[2] == pytest.approx(kept, rel=1e-6)


def test_nemo_dtensor_gathers_fp32_parameters():
    df = frame({"train_zero": 3}, {"train_zero": 3, "rl_framework": "verl"})
    b = inputs.to_batch(df)
    ones = np.ones(2)
    ws = weight_sync.sync_time(b, ones, ones, 8 * ones)
    from sim_core import nccl
    net = inputs.network(b)
    full = b.params * 2.0
    t = [nccl.collective_time("all_gather", full * k, 8 * ones, ones, net)["time_s"][i]
         for i, k in ((0, 2.0), (1, 1.0))]
    assert ws["sync_gather_s"] == pytest.approx(t, rel=1e-9)
    assert ws["sync_gather_s"][0] > ws["sync_gather_s"][1]


def test_validate_holds_the_blog_refit_column_to_the_timer():
    t = rl.load()
    blog = t.index[t.source.astype(str).str.startswith("NeMo RL v0.3 blog")]
    cmp = rl.compare(t.loc[blog].reset_index(drop=True))
    df, _, _ = rl.to_frame(t.loc[blog].reset_index(drop=True))
    p = simulate_rl(df)
    assert cmp.meas_refit_timer_s.tolist() == pytest.approx(
        pd.to_numeric(t.loc[blog, "weight_sync_time_s"]).tolist())
    assert cmp.pred_refit_timer_s.to_numpy() == pytest.approx(p.refit_timer_s.to_numpy())
    # every blog row's timer holds more than its weight sync
    assert (p.refit_timer_s > p.weight_sync_time_s + 1.0).all()
    ph = rl.phase_summary(cmp)
    assert ph["refit"]["rows"] == len(blog)
    ratio = p.refit_timer_s / cmp.meas_refit_timer_s
    assert ph["refit"]["median_ratio"] == pytest.approx(float(np.median(ratio)))
