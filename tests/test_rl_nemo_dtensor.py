"""NeMo RL v0.3.0's DTensor worker (FSDP2 + DTensor TP): the kernels the Hugging Face model
runs in eager PyTorch and the micro-batches NeMo RL's dynamic batching forms
(sim_core/rl/nemo_rl.py dtensor_fields, dynamic_microbatches; training.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import generation, inputs, nemo_rl, training
from sim_core.rl.phases import simulate_rl
from sim_core.simulate import simulate_frame

from .rl_rows import NEMO_DTENSOR_8B, NEMO_DTENSOR_70B

# the blog's Llama 3.1-8B DTensor row (rl_runs.csv), and its 70B TP8 sibling
BASE = NEMO_DTENSOR_8B
BIG = NEMO_DTENSOR_70B


def _frame(*rows):
    df = pd.DataFrame([{**BASE, **r} for r in rows])
    b = inputs.to_batch(df)
    return df, b, training.training_frame(df, b)


def test_dtensor_rows_get_the_eager_hf_kernels_and_others_keep_their_profile():
    df, b, tf = _frame({}, {"train_zero": 1}, {"rl_framework": "verl"},
                       {**BIG, "train_sequence_parallel": True}, BIG,
                       {"train_sequence_parallel": True})
    # DTensor rows (nemo_rl + FSDP): FlashAttention-2, unfused norm/RoPE/SwiGLU, TP exposed
    for i in (0, 3, 4, 5):
        assert tf["attention_kernel"][i] == "fa2"
        assert tf["fused_elementwise"][i] is False and tf["fused_glu"][i] is False
        assert tf["tp_comm_overlap"][i] is False
    # Megatron (ZeRO-1) and verl's FSDP rows are left to their framework profile
    for i in (1, 2):
        assert all(pd.isna(tf[f][i]) for f in nemo_rl.DTENSOR_KERNELS)
        assert pd.isna(tf["sequence_parallel"][i])
    # sequence parallel as stated (dtensor_cfg.sequence_parallel, default false), never at TP 1
    assert list(tf["sequence_parallel"][[0, 3, 4, 5]]) == [False, True, False, False]


def test_eager_kernels_make_the_update_slower_than_the_fused_profile():
    df, b, tf = _frame({})
    tf = tf.reset_index(drop=True)
    eager = simulate_frame(tf)
    fused = simulate_frame(tf.drop(columns=list(nemo_rl.DTENSOR_KERNELS)))
    # unfused elementwise ops and FA2 instead of FA3 cost compute time (8B: ~25%)
    assert eager["time_compute"][0] > 1.1 * fused["time_compute"][0]
    # the same row trained by Megatron (ZeRO-1, megatron-core's fused profile) is faster
    r = simulate_rl(pd.DataFrame([BASE, {**BASE, "train_zero": 1}]))
    assert r.update_time_s[0] > 1.2 * r.update_time_s[1]


def _greedy(lengths, budget):
    """NeMo RL v0.3.0 shard_by_batch_size's loop, written plainly (one row)."""
    n, cur, longest, padded = 1, 0, 0.0, 0.0
    for v in lengths:
        new = max(longest, v)
        if (cur + 1) * new <= budget:
            cur, longest = cur + 1, new
        else:
            padded += cur * longest
            n, cur, longest = n + 1, 1, v
    return n, padded + cur * longest


@pytest.mark.parametrize("mean,shards,chunk,budget", [(395, 8, 512, 4096), (777, 8, 512, 4096),
                                                      (395, 8, 2048, 8192), (1500, 2, 300, 6000),
                                                      (200, 1, 64, 4096)])
def test_dynamic_microbatches_match_the_greedy_over_sorted_strided_lengths(mean, shards, chunk,
                                                                            budget):
    df = pd.DataFrame([{**BASE, "response_mean": mean}])
    b = inputs.to_batch(df)
    width = 4096.0
    n, padded = nemo_rl.dynamic_microbatches(b, np.array([chunk]), np.array([shards]),
                                             np.array([budget]), np.array([width]))
    size = chunk // shards
    # shard index i holds sorted sequences i*shards .. i*shards + shards - 1 on the ranks: its
    # longest is the quantile of the last; rounded up to 64, at most the padded width
    u = ((np.arange(size) + 1) * shards - 0.5) / (size * shards)
    raw = np.minimum(nemo_rl._quantile_length(b, u), width)
    lengths = np.minimum(np.ceil(raw / 64) * 64, width)
    want_n, want_padded = _greedy(lengths, budget)
    assert n[0] == want_n
    assert padded[0] == pytest.approx(want_padded, rel=0.05)  # runs sampled, not summed
    # padding never removes tokens: at least the rank's real tokens
    assert padded[0] >= size * (b.prompt_len[0] + mean) * 0.97


def test_quantile_length_follows_the_length_law():
    df = pd.DataFrame([BASE])
    b = inputs.to_batch(df)
    u = (np.arange(20000) + 0.5) / 20000
    lens = nemo_rl._quantile_length(b, u) - b.prompt_len[0]
    assert lens.mean() == pytest.approx(777, rel=0.01)  # the stated mean
    assert lens.max() == pytest.approx(4004)            # the truncated ones sit at the cap
    # at the cap: the truncated share p, plus the clipped body's tail beyond it
    p = generation.truncated_fraction(b)[0]
    th = generation.length_law(b.response_mean, b.response_max, np.array([p]))[0][0]
    want = p + (1 - p) * np.exp(-4004 / th)
    assert (lens >= 4004 - 1e-6).mean() == pytest.approx(want, abs=0.001)


def test_dynamic_batching_sets_the_micro_batches_of_the_training_frame():
    df, b, tf = _frame(BIG, {**BIG, "dynamic_batching": False})
    dp = 8.0
    chunk = np.ceil(b.sequences / b.mini_batches)
    n, padded = nemo_rl.dynamic_microbatches(b, chunk, np.full(2, dp), np.full(2, 4096.0),
                                             np.full(2, 4096.0))
    mbs = tf["global_batch"] / (dp * tf["micro_batch"])
    # the dynamic row runs NeMo RL's micro-batches per optimizer step, at their padded tokens
    assert mbs[0] == n[0]
    assert tf["global_batch"][0] * tf["seq_len"][0] / dp == pytest.approx(padded[0], rel=0.02)
    # 64 sequences of ~490 tokens per rank: the truncated ones run alone, the rest padded to
    # their micro-batch's longest: more micro-batches than the length-biased packing gives
    assert mbs[0] > mbs[1]
    r = simulate_rl(pd.DataFrame([{**BASE, **BIG}, {**BASE, **BIG, "dynamic_batching": False}]))
    assert r.update_time_s[0] > r.update_time_s[1]


def test_dynamic_batching_is_nemo_rls_only():
    df, b, tf = _frame({**BIG, "rl_framework": "verl"}, {**BIG, "rl_framework": "verl",
                                                         "dynamic_batching": False})
    for c in ("global_batch", "micro_batch", "seq_len"):
        assert tf[c][0] == tf[c][1]


def test_dynamic_log_prob_passes_count_their_own_micro_batches():
    df, b, tf = _frame(BIG, {**BIG, "dynamic_batching": False})
    tok, gathers = nemo_rl.dynamic_logprob_ratios(b, tf, np.full(2, 4096.0))
    # the whole batch (2048 sequences) over 8 ranks, logprob_mb_tokens = 4096 x 2
    n_lp, pad_lp = nemo_rl.dynamic_microbatches(b, b.sequences, np.full(2, 8.0),
                                                np.full(2, 8192.0), np.full(2, 4096.0))
    n_tr = tf["global_batch"][0] / (8 * tf["micro_batch"][0]) * 4
    assert gathers[0] == pytest.approx(n_lp[0] / n_tr)
    assert tok[0] == pytest.approx(pad_lp[0] / (tf["global_batch"][0] * tf["seq_len"][0] / 8 * 4))
    # twice the budget: fewer micro-batches (gathers) than training's, about as many tokens
    assert gathers[0] < 0.6 and 0.85 < tok[0] < 1.05
    # other rows: the training frame's tokens, logprob_batch_size times fewer gathers
    assert tok[1] == 1.0 and gathers[1] == pytest.approx(0.5)
