"""SkyRL's Megatron micro-batches: one unpadded sequence each, every MoE layer at the pace of
the longest sequence among the data-parallel replicas of its EP group
(sim_core/rl/ep_lockstep.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import ep_lockstep, generation, inputs, training

# the SkyRL GLM-4.7-Flash row's layout (TP4 EP8 ETP1 on 32 H200, one sequence per micro-batch)
GLM = dict(model="glm-4.7-flash", gpu="h200", num_gpus=32, rollout_tp=4,
           prompts_per_step=1024, responses_per_prompt=16, prompt_len=92, response_mean=3379,
           response_max=8192, train_tp=4, train_ep=8, train_etp=1, mini_batches=4,
           rl_framework="skyrl", sequence_packing=False, remove_padding=True,
           micro_batch_seqs=1, logprob_micro_batch_seqs=1, train_sequence_parallel=True)


def _frame(*rows):
    df = pd.DataFrame([{**GLM, **r} for r in rows])
    b = inputs.to_batch(df)
    return b, training.training_frame(df, b)


def test_expected_maximum_of_the_length_law():
    b, _ = _frame({}, {}, {}, {})
    g = np.array([1.0, 2.0, 4.0, 64.0])
    m = ep_lockstep.expected_max_response(b, g)
    # one sequence: the law's mean; more replicas: longer, never past the cap
    assert m[0] == pytest.approx(3379, rel=1e-3)
    assert np.all(np.diff(m) > 0) and m[-1] <= 8192
    # two draws of the mixture (p at the cap, clipped exponential body), by sampling
    p = generation.truncated_fraction(b)[0]
    th = generation.length_law(b.response_mean, b.response_max, p)[0][0]
    rng = np.random.default_rng(0)
    n = 400_000
    draw = np.where(rng.random((n, 2)) < p, 8192.0, np.minimum(rng.exponential(th, (n, 2)), 8192))
    assert m[1] == pytest.approx(draw.max(axis=1).mean(), rel=0.01)


@pytest.mark.parametrize("over, g", [({}, 2), ({"train_tp": 2}, 4), ({"train_ep": 1}, 1),
                                     ({"train_tp": 8, "train_ep": 8}, 1)])
def test_replicas_in_an_ep_group(over, g):
    _, tf = _frame(over)
    assert ep_lockstep.replicas(tf)[0] == g


def test_skyrl_megatron_micro_batches_run_the_longest_of_their_group():
    b, tf = _frame({}, {"train_ep": 1})
    longest = 92 + ep_lockstep.expected_max_response(b, np.array([2.0, 1.0]))
    # not the budget (prompt + max response) the padded paths price; TP rounds up to 4
    assert tf.seq_len.tolist() == [4 * np.ceil(longest[0] / 4), 4 * np.ceil(longest[1] / 4)]
    assert tf.seq_len.iloc[0] < 92 + 8192


@pytest.mark.parametrize("over", [{"rl_framework": "nemo_rl"}, {"rl_framework": "verl"},
                                  {"remove_padding": False}, {"train_zero": 3, "train_ep": 1}])
def test_padded_and_other_paths_keep_their_pricing(over):
    b, tf = _frame(over)
    assert not ep_lockstep.rows(b, tf)[0]
    _, base = _frame({"remove_padding": False, **{k: v for k, v in over.items()
                                                  if k != "remove_padding"}})
    assert tf.seq_len.iloc[0] == base.seq_len.iloc[0]
