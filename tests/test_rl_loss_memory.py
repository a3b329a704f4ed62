"""The RL frameworks' loss tensors over the logits as training memory (sim_core/rl/loss_memory.py):
the bytes per logit by framework, worker and release, and what they do to the shipped verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl, rl_memory
from sim_core.rl import inputs, loss_memory, training
from sim_core.rl.phases import simulate_rl
from sim_core.simulate import simulate_frame


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = dict(algorithm="grpo", model="qwen2.5-1.5b", gpu="h100-sxm", num_gpus=8,
                placement="colocated", rollout_tp=1, prompts_per_step=32,
                responses_per_prompt=16, prompt_len=512, response_mean=1024, response_max=2560,
                train_zero=3,
                train_seq_len=3072)
    return pd.DataFrame([{**base, **r} for r in rows])


def _bytes(rows):
    df = _frame(rows)
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b, for_memory=True).reset_index(drop=True)
    return loss_memory.bytes_per_logit(b, tf)


def test_bytes_per_logit_by_framework_worker_and_release():
    nan = float("nan")
    rows = [
        # NeMo RL DTensor, TP 1: before PR 875 the bf16 logits live through backward
        dict(rl_framework="nemo_rl", rl_framework_version=0.3, train_tp=1),
        dict(rl_framework="nemo_rl", rl_framework_version=0.5, train_tp=1),
        # TP 2: v0.3's one_hot backward (int64) against v0.4's scatter_add backward
        dict(rl_framework="nemo_rl", rl_framework_version=0.3, train_tp=2),
        dict(rl_framework="nemo_rl", rl_framework_version=nan, train_tp=2),
        # verl FSDP: v0.2's entropy in the update against the current release's none
        dict(rl_framework="verl", rl_framework_version=0.2),
        dict(rl_framework="verl", rl_framework_version=nan),
        # a Megatron worker and SkyRL: not priced here
        dict(rl_framework="nemo_rl", rl_framework_version=0.3, train_zero=1),
        dict(rl_framework="skyrl"),
    ]
    got = _bytes(rows)
    np.testing.assert_array_equal(got["update"][:6], [14, 12, 22, 14, 6, 2])
    np.testing.assert_array_equal(got["log_prob"][:6], [10, 10, 14, 14, 2, 2])
    assert np.isnan(got["update"][6:]).all() and np.isnan(got["log_prob"][6:]).all()


def test_larger_logprob_micro_batch_raises_the_peak_and_replaces_not_adds():
    """NeMo RL's log-prob micro-batch is logprob_batch_size x the total: at 8 its pass is the
    peak, at 1 the update is; the frame's own loss bytes are replaced, never added twice."""
    df = _frame([dict(rl_framework="nemo_rl", rl_framework_version=0.5, train_tp=1,
                      logprob_batch_size=k) for k in (1, 8)])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b, for_memory=True).reset_index(drop=True)
    mem = simulate_frame(tf)
    p = loss_memory.peaks_gib(b, tf, mem, training.logprob_budget(df, b))
    assert p["log_prob_tokens"].tolist() == [3072, 8 * 3072]
    assert p["log_prob_gib"][1] > p["log_prob_gib"][0]
    # 10 B x 7 more micro-batches' logits of 151,936 columns
    extra = 10 * 7 * 3072 * 151936 / 2 ** 30
    assert p["log_prob_gib"][1] - p["log_prob_gib"][0] == pytest.approx(extra, rel=1e-6)
    peak = loss_memory.training_peak(b, tf, mem, mem["peak_memory_gib"].to_numpy(),
                                     training.logprob_budget(df, b))
    assert peak[1] == pytest.approx(p["log_prob_gib"][1])
    assert peak[0] == pytest.approx(max(mem["peak_memory_gib"][0], p["update_loss_gib"][0]))
    # the update's phase at 12 B a logit, over the frame's 6 B segments where its loss wins
    assert p["update_loss_gib"][0] <= mem["peak_memory_gib"][0] + 6 * 3072 * 151936 / 2 ** 30


def test_issue_604_pair_is_now_told_apart_and_no_fitted_run_turns_oom():
    """NeMo RL issue 604 (v0.3, DTensor TP 1): 12,288 tokens a micro-batch OOM on one H100,
    3,072 fit; every row stated to fit stays predicted to fit."""
    t = rl_memory.load()
    c = rl_memory.compare(t)
    i604 = t.source.str.startswith("NeMo RL issue 604").to_numpy()
    assert sorted(zip(t.outcome[i604], c.predicted[i604])) == [("fits", "fits"), ("oom", "oom")]
    fitted = (t.outcome == "fits").to_numpy()
    assert (c.predicted[fitted] == "fits").all()


def test_published_runs_still_fit():
    """The rows of rl_runs.csv that ran on NeMo RL's DTensor worker or verl's FSDP actor keep a
    fitting verdict under the framework's loss bytes (runs that ran cannot be OOM)."""
    t = rl.load() if hasattr(rl, "load") else None
    if t is None:
        pytest.skip("accuracy.rl has no loader")
    df, _, _ = rl.to_frame(t)
    df = df.reset_index(drop=True)
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b, for_memory=True).reset_index(drop=True)
    priced = ~np.isnan(loss_memory.bytes_per_logit(b, tf)["update"])
    assert priced.sum() >= 10
    out = simulate_rl(df)
    assert not (out.oom_reason.to_numpy()[priced] != "").any()
