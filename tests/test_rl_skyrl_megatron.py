"""SkyRL's Megatron worker per micro-batch (sim_core/rl/skyrl_megatron.py): log-probs over the
batch's padded width and the loss's host syncs, counted from SkyRL f6bf2f91."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import compute
from sim_core.rl import host, inputs, nemo_rl, skyrl_megatron, training
from sim_core.rl.phases import simulate_rl
from sim_core.simulate import simulate_frame

# the SkyRL GLM-4.7-Flash row's layout (TP4 EP8 ETP1 on 32 H200, one sequence per micro-batch)
GLM = dict(model="glm-4.7-flash", gpu="h200", num_gpus=32, placement="colocated", rollout_tp=4,
           algorithm="grpo", prompts_per_step=1024, responses_per_prompt=16, prompt_len=92,
           prompt_max=512, response_mean=3379, response_max=8192, train_tp=4, train_ep=8,
           train_etp=1, mini_batches=4, rl_framework="skyrl", sequence_packing=False,
           remove_padding=True, micro_batch_seqs=1, logprob_micro_batch_seqs=1,
           train_sequence_parallel=True, train_recompute="full")


def _frame(*rows):
    df = pd.DataFrame([{**GLM, **r} for r in rows])
    b = inputs.to_batch(df)
    return df, b, training.training_frame(df, b)


def test_bytes_follow_the_padded_width_not_the_sequence():
    _, b, tf = _frame({})
    per = skyrl_megatron.per_micro_batch(b, tf)
    v = 154880 / 4
    w, a = 512 + 8192, 8192
    t = tf["seq_len"].iloc[0]
    f, bw = nemo_rl._sim_loss_bytes(tf)
    hbm = b.hbm_bw_gbs[0] * 1e9 * compute._by_arch(b.sm_arch, "elementwise")[0]
    sync = host.sync_seconds()
    fwd = v * (44 * w + 14 * t - (f[0] + bw[0]) / 3 * t) / hbm + 7 * sync
    upd = v * (60 * w + 40 * a + 28 * t - (f[0] + bw[0]) * t) / hbm + 13 * sync
    assert per["fwd"][0] == pytest.approx(fwd)
    assert per["upd"][0] == pytest.approx(upd)
    # a few ms on an H200, far below the ~0.35 s / ~1.1 s the notes measure per micro-batch
    assert 1e-3 < per["fwd"][0] < 10e-3 and 2e-3 < per["upd"][0] < 20e-3


def test_wider_batches_cost_more_at_the_same_sequence():
    _, b, tf = _frame({}, {"response_max": 16384, "response_mean": 3379})
    w, _ = skyrl_megatron.widths(b)
    assert list(w) == [8704, 16896]
    per = skyrl_megatron.per_micro_batch(b, tf)
    assert per["fwd"][1] > per["fwd"][0] and per["upd"][1] > per["upd"][0]


def test_only_skyrl_megatron_rows():
    _, b, tf = _frame({}, {"rl_framework": "nemo_rl"}, {"rl_framework": "verl"},
                      {"train_zero": 3, "train_ep": 1, "train_tp": 1})
    per = skyrl_megatron.per_micro_batch(b, tf)
    assert per["fwd"][0] > 0
    assert list(per["fwd"][1:]) == [0, 0, 0] and list(per["upd"][1:]) == [0, 0, 0]


def test_passes_add_it_per_micro_batch():
    df, b, tf = _frame({})
    sim = simulate_frame(tf.reset_index(drop=True))
    s = skyrl_megatron.seconds(b, tf, sim)
    per = skyrl_megatron.per_micro_batch(b, tf)
    m = sim["num_microbatches"].iloc[0]
    assert m == 16384 / 4 / 8          # 512 one-sequence micro-batches per optimizer step
    assert s["update_s"][0] == pytest.approx(m * per["upd"][0])
    r = simulate_rl(df)
    # the phases hold it: 4 mini-batches of log-prob micro-batches, 4 optimizer steps
    saved = skyrl_megatron.per_micro_batch
    try:
        skyrl_megatron.per_micro_batch = lambda b_, tf_: {"fwd": np.zeros(len(tf_)),
                                                          "upd": np.zeros(len(tf_))}
        r0 = simulate_rl(df)
    finally:
        skyrl_megatron.per_micro_batch = saved
    assert r.old_log_prob_time_s[0] - r0.old_log_prob_time_s[0] == pytest.approx(
        4 * m * per["fwd"][0], rel=1e-6)
    assert r.update_time_s[0] - r0.update_time_s[0] == pytest.approx(
        4 * m * per["upd"][0], rel=1e-6)
