"""verl's driver inside the step timer and outside the phase timers (issue 40,
sim_core/rl/verl_driver.py): the reward manager's loop, the advantage and the passes over the
padded batch, counted in verl's ray_trainer.py / reward managers / core_algos.py and priced with
published per-item figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.columns import Batch
from sim_core.rl import verl_driver
from sim_core.rl.inputs import ALGORITHM, RL_FRAMEWORK, constants
from sim_core.rl.phases import simulate_rl

VERL = RL_FRAMEWORK.index("verl")
NEMO = RL_FRAMEWORK.index("nemo_rl")


def batch(**over):
    """Four rows: verl GRPO, verl DAPO over two generation rounds, verl PPO, NeMo RL GRPO."""
    b = Batch()
    base = dict(placement=[0] * 4,
                algorithm=[ALGORITHM.index(a) for a in ("grpo", "dapo", "ppo", "grpo")],
                rl_framework=[VERL, VERL, VERL, NEMO], gen_rounds=[1, 2, np.nan, 1],
                sequences=[6144] * 4, responses_per_prompt=[12] * 4, prompt_max=[2048] * 4,
                response_max=[20480] * 4, prompt_len=[92] * 4, response_mean=[1000] * 4)
    base.update(over)
    for k, v in base.items():
        b[k] = np.asarray(v, dtype=float)
    return b


def test_reward_loop_counts_per_response_and_decoded_token():
    c = verl_driver.counts(batch())
    n = 6144
    # GRPO: 18 torch ops per response; DAPO: + the overlong penalty's 6, every round scored
    assert c["reward_ops"][0] == n * 18
    assert c["reward_ops"][1] == 2 * n * 24
    assert c["reward_ops"][2] == n * 18  # a blank gen_rounds is one round
    # both decodes: the valid prompt and the valid response, at their mean lengths
    assert c["decoded_tokens"][0] == n * 1092
    assert c["decoded_tokens"][1] == 2 * n * 1092
    # other frameworks: none of verl's driver
    assert all(c[k][3] == 0 for k in c)


def test_advantage_counts_grpo_per_sample_ppo_per_position():
    c = verl_driver.counts(batch())
    # GRPO: 8 ops per sample, 2 per group of responses_per_prompt
    assert c["adv_ops"][0] == 6144 * 8 + 512 * 2
    # PPO's GAE loops over the padded response positions, whatever the batch
    assert c["adv_ops"][2] == 20480 * 22
    assert verl_driver.counts(batch(sequences=[12] * 4))["adv_ops"][2] == 20480 * 22


def test_passes_move_the_padded_batch():
    c = verl_driver.counts(batch())
    p, r, n = 2048, 20480, 6144
    mask = 8 * (p + r)
    gather = 8 * (4 * p + 5 * r)  # prompts, responses, ids / mask / positions, response_mask
    grpo = n * (2 * mask + gather + 4 * r + 16 * r)
    assert c["bytes"][0] == pytest.approx(grpo)
    # DAPO's second round scores (and zeroes) another batch; PPO moves more per advantage
    assert c["bytes"][1] == pytest.approx(grpo + n * 4 * r)
    assert c["bytes"][2] == pytest.approx(grpo + n * 24 * r)
    # the padded caps, not the mean lengths, set the bytes
    assert verl_driver.counts(batch(response_mean=[5000] * 4))["bytes"][0] == pytest.approx(grpo)


def test_seconds_price_each_count_with_its_figure():
    b = batch()
    k = constants()
    op = k["verl_driver"]["cpu_op_s"]
    assert op == pytest.approx(4.5e-6)
    c = verl_driver.counts(b)
    s = verl_driver.seconds(b)
    assert s["reward_s"][0] == pytest.approx(c["reward_ops"][0] * op
                                             + c["decoded_tokens"][0] / 47e6)
    assert s["adv_s"][0] == pytest.approx(c["adv_ops"][0] * op)
    assert s["passes_s"][0] == pytest.approx(c["bytes"][0] / (k["ray_calls"]["put_gb_per_s"]
                                                                * 1e9))
    assert s["driver_s"][0] == pytest.approx(s["reward_s"][0] + s["adv_s"][0]
                                             + s["passes_s"][0])
    # seconds, not minutes: 6144 responses of ~1,100 tokens at a 20k cap
    assert 0.5 < s["driver_s"][0] < 5.0
    assert s["driver_s"][3] == 0


ROW = dict(model="qwen2.5-0.5b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
           prompts_per_step=256, responses_per_prompt=4, prompt_len=100, response_mean=200,
           response_max=256, prompt_max=512, gpu_memory_utilization=0.6, train_tp=1,
           train_pp=1, train_zero=3, mini_batches=4, train_seq_len=8000,
           sequence_packing=False, micro_batch_seqs=4, use_ref=True)


def _without_driver(monkeypatch, df):
    real = verl_driver.seconds
    seen = {}

    def zero(b):
        out = real(b)
        seen.update(out)
        return {k: np.zeros_like(v) for k, v in out.items()}

    monkeypatch.setattr(verl_driver, "seconds", zero)
    return simulate_rl(df), seen


def test_serial_in_a_synchronous_step(monkeypatch):
    df = pd.DataFrame([ROW])
    with_driver = simulate_rl(df)
    without, seen = _without_driver(monkeypatch, df)
    d = with_driver.step_time_s[0] - without.step_time_s[0]
    assert seen["driver_s"][0] > 0
    assert d == pytest.approx(seen["driver_s"][0], rel=1e-9)
    assert with_driver.verl_driver_time_s[0] == pytest.approx(seen["driver_s"][0])
    # reported with the rest of the work that does not scale with the model
    assert (with_driver.step_fixed_time_s[0] - without.step_fixed_time_s[0]
            == pytest.approx(seen["driver_s"][0]))


def test_beside_the_generation_one_step_off(monkeypatch):
    """one_step_off: the driver runs on the training pipeline, so a generation-bound step does
    not grow."""
    row = dict(ROW, placement="split", rollout_gpus=2, asynchrony="one_step_off",
               response_max=8192, response_mean=4000, prompts_per_step=64)
    df = pd.DataFrame([row])
    with_driver = simulate_rl(df)
    without, seen = _without_driver(monkeypatch, df)
    assert seen["driver_s"][0] > 0
    assert with_driver.gen_time_s[0] > without.log_prob_time_s[0] + without.update_time_s[0] \
        + seen["driver_s"][0]
    assert with_driver.step_time_s[0] == pytest.approx(without.step_time_s[0])


def test_nemo_rl_rows_untouched(monkeypatch):
    df = pd.DataFrame([dict(ROW, rl_framework="nemo_rl")])
    out = simulate_rl(df)
    assert out.verl_driver_time_s[0] == 0
