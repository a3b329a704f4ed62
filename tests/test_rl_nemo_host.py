"""NeMo RL v0.3.0's per-sequence loss loop (sim_core/rl/nemo_rl_host.py): host syncs and
kernels counted from its code, and SliceBackward's full-size logit gradients."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, nemo_rl_host, training
from sim_core.rl.phases import simulate_rl
from sim_core.simulate import simulate_frame

BASE = dict(model="llama3.1-8b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
            prompts_per_step=64, responses_per_prompt=32, prompt_len=92, response_mean=795,
            response_max=4004, gpu_memory_utilization=0.6, train_tp=1, train_pp=1,
            train_recompute="none", mini_batches=4, train_seq_len=4096)


def _parts(**row):
    df = pd.DataFrame([{**BASE, **row}])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True))
    return b, tf, sim, nemo_rl_host.seconds(b, tf, sim, training.pack_budget(df, b))


def test_counts_read_from_the_code():
    # ClippedPGLossFn: 9 syncs, segments A + C 14 small kernels, segment B 64 on Megatron
    c = nemo_rl_host.per_call_counts(np.array([1.0, 4.0, 4.0, 1.0, 8.0]),
                                     np.array([1.0, 1.0, 4.0, 1.0, 1.0]),
                                     np.array([False, False, False, True, True]))
    assert list(c["syncs"]) == [9] * 5 and list(c["small"]) == [14] * 5
    # TP pads (+1); CP pads, cats and all-gathers (+1 +1 + 2 + cp); DTensor casts (+1) and at
    # TP 1 takes log_softmax + gather (2) for from_parallel_logits_to_logprobs' 19
    assert list(c["segment_b"]) == [64, 65, 64 + 1 + 3 + 4, 64 - 19 + 2 + 1, 65 + 1]
    s = nemo_rl_host.per_sequence_counts(np.array([1.0, 4.0, 4.0, 1.0]),
                                         np.array([1.0, 1.0, 4.0, 1.0]),
                                         np.array([False, False, False, True]))
    # wrapper 9 syncs (+ Megatron packing's .item(): 1, 2 when padded)
    assert list(s["update_syncs"]) == [10, 11, 11, 9]
    # packed log-probs: packing + two loops of two .item() (+ CP's loop); DTensor three
    assert list(s["log_prob_syncs"]) == [5, 6, 8, 3]


def test_host_loop_prices_syncs_and_kernels_per_sequence():
    b, tf, sim, nh = _parts(rl_framework="nemo_rl")
    s_k = 9.7e-6
    s_y = 20e-6
    seqs = 2048 / 8
    # TP 1: segment B is GPU-bound (the vocabulary passes of ~900 tokens x 128k fp32 logits)
    per_seq = (9 + 10) * s_y + (14 + 3) * s_k
    assert nh["update_host_s"][0] == pytest.approx(seqs * per_seq, rel=1e-6)
    assert nh["log_prob_s"][0] == pytest.approx(seqs * (5 * s_y + 3 * s_k), rel=1e-6)
    # sub-second per update: 256 sequences per rank at ~0.5 ms
    assert 0.1 < nh["update_host_s"][0] < 0.2


def test_slice_backward_materialises_the_whole_bin_per_sequence():
    b, tf, sim, nh = _parts(rl_framework="nemo_rl")
    from sim_core import compute
    hbm = b.hbm_bw_gbs[0] * 1e9 * compute._by_arch(b.sm_arch, "elementwise")[0]
    full = 4096 * b.vocab[0] * 4.0               # a bin's fp32 logits (Float16Module output)
    n = 4096 / (92 + 795)
    want = 2048 / 8 / n * (4 * n - 1) * full / hbm
    assert nh["slice_grad_s"][0] == pytest.approx(want, rel=1e-6)
    # DTensor's bf16 logits: half the bytes
    _, _, _, nd = _parts(rl_framework="nemo_rl", train_zero=3)
    assert nd["slice_grad_s"][0] == pytest.approx(want / 2, rel=1e-6)


def test_unpacked_rows_pay_one_loss_call_per_micro_batch_and_no_slicing():
    b, tf, sim, nh = _parts(rl_framework="nemo_rl", sequence_packing=False)
    calls = sim["num_microbatches"][0] * 4
    assert nh["slice_grad_s"][0] == 0 and nh["log_prob_s"][0] == 0
    assert nh["update_host_s"][0] >= calls * (9 * 20e-6 + 14 * 9.7e-6) - 1e-12


def test_other_frameworks_do_not_move():
    rows = [{**BASE, "rl_framework": fw} for fw in ("verl", "slime", "nemo_rl")]
    df = pd.DataFrame(rows)
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True))
    nh = nemo_rl_host.seconds(b, tf, sim, training.pack_budget(df, b))
    for k, v in nh.items():
        assert v[0] == 0 and v[1] == 0, k
    assert nh["update_s"][2] > 0
    # and the phases carry it: NeMo RL's update grows by the rule's seconds
    r = simulate_rl(pd.DataFrame([{**BASE, "rl_framework": "nemo_rl"}]))
    assert r.update_time_s[0] > nh["update_s"][2]
