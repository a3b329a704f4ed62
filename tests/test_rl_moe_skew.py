"""Uneven EP load where an RL framework trains the MoE router without balancing
(sim_core/rl/moe_skew.py): each exponent reproduces its published per-rank load through the
core's law (TensorRT-LLM's DeepSeek-R1 EP32 by default, cann-recipes-train's Qwen3-30B EP16 for
the Qwen3 MoE routers), it applies to the NeMo RL / slime / SkyRL Megatron MoE rows and to
verl's where its config_converter turns balancing off (not DeepSeek-V3's MLA models), and
dense, balanced, FSDP and EP 1 rows do not move."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import inputs, moe_skew, training

from .rl_rows import NEMO_QWEN3_30B_A3B, priced_training_frame

# the NeMo RL v0.3 blog's Qwen3-30B-A3B row (TP2 EP8 SP, 64 H100)
ROW = NEMO_QWEN3_30B_A3B


def _frame(**over):
    df = pd.DataFrame([{**ROW, **over}])
    b = inputs.to_batch(df)
    return training.training_frame(df, b)


def test_exponent_reproduces_the_published_imbalance():
    # TensorRT-LLM ep_load_balancer README: DeepSeek-R1, 256 experts, EP 32, (max-mean)/mean 1.564
    a = moe_skew.exponent()
    assert a == pytest.approx(0.6365, abs=1e-3)
    assert moe_skew.load_factor(256, 32, a)[0] == pytest.approx(2.564272, rel=1e-6)
    # carried by the same law: Qwen3-30B-A3B (128 experts) and GLM-4.7-Flash (64) on EP 8
    assert moe_skew.load_factor(128, 8, a)[0] == pytest.approx(1.4535, abs=1e-3)
    assert moe_skew.load_factor(64, 8, a)[0] == pytest.approx(1.5787, abs=1e-3)
    # fewer ranks, or more experts per rank, spread the hot expert's share thinner
    assert moe_skew.load_factor(128, 4, a)[0] < moe_skew.load_factor(128, 8, a)[0]
    assert moe_skew.load_factor(128, 1, a)[0] == 1.0


def test_qwen3_routers_take_their_own_measurement():
    # cann-recipes-train Qwen3-235B report sec. 2.3.2: Qwen3-30B on gsm8k, EP16, the tokens per
    # rank of layers 0 / 20 / 47: max / mean 1.5740, 1.8361, 1.6132 -> 1.6744
    t = moe_skew.published()
    row = t[t.model == "qwen3-30b-a3b"].iloc[0]
    assert row.busiest_over_mean == pytest.approx((1.5740 + 1.8361 + 1.6132) / 3, abs=1e-4)
    a = moe_skew.exponent("qwen3-30b-a3b")
    assert moe_skew.load_factor(128, 16, a)[0] == pytest.approx(1.674433, rel=1e-6)
    # Qwen3-235B-A22B shares the router design (128 experts, top-8 softmax)
    assert moe_skew.exponent("qwen3-235b-a22b") == a
    # below the DeepSeek-R1 law at the same shape (1.97): a flatter router
    assert a < moe_skew.exponent()
    assert moe_skew.load_factor(128, 8, a)[0] == pytest.approx(1.315, abs=1e-3)
    assert moe_skew.load_factor(128, 32, a)[0] == pytest.approx(2.394, abs=1e-3)
    # models no measurement names keep the default
    assert moe_skew.exponent("glm-4.7-flash") == moe_skew.exponent()
    assert moe_skew.exponent("deepseek-v3") == moe_skew.exponent()


def test_unbalanced_frameworks_get_the_skew():
    for fw in ("nemo_rl", "slime", "skyrl"):
        assert _frame(rl_framework=fw)["expert_skew"].iloc[0] == pytest.approx(
            moe_skew.exponent("qwen3-30b-a3b"))
    # a model no measurement names: the default exponent
    assert _frame(model="glm-4.7-flash", train_tp=4)["expert_skew"].iloc[0] == pytest.approx(
        moe_skew.exponent())


def test_verl_follows_its_config_converter():
    # verl v0.6.0 / v0.7.0 config_converter.py hf_to_mcore_config_qwen3moe:
    # moe_router_load_balancing_type="none" ("turn off aux_loss as it hurts perf in RL")
    assert _frame(rl_framework="verl")["expert_skew"].iloc[0] == pytest.approx(
        moe_skew.exponent("qwen3-30b-a3b"))
    # hf_to_mcore_config_dpskv3: seq_aux_loss and the expert bias updated (rate 0.001): balanced
    assert _frame(rl_framework="verl", model="deepseek-v3", train_tp=8)["expert_skew"].iloc[0] \
        == 0.0


@pytest.mark.parametrize("over", [
    {"model": "qwen3-32b", "train_ep": 1},          # dense
    {"train_ep": 1},                                # MoE without EP: no busiest rank
    {"train_moe_router_balanced": True},            # stated balanced
    {"rl_framework": "verl", "train_moe_router_balanced": True},
])
def test_dense_and_balanced_rows_stay_balanced(over):
    assert _frame(**over)["expert_skew"].iloc[0] == 0.0


def test_busiest_rank_sets_the_nemo_row_pace():
    _, _, _, skewed, _, _ = priced_training_frame(ROW)
    _, _, _, flat, _, _ = priced_training_frame({**ROW, "train_moe_router_balanced": True})
    assert skewed["moe_load_factor"].iloc[0] == pytest.approx(1.315, abs=1e-3)
    assert flat["moe_load_factor"].iloc[0] == 1.0
    # slower, but by less than the load: attention, norms and the dense parts do not scale
    ratio = skewed["step_time_s"].iloc[0] / flat["step_time_s"].iloc[0]
    assert 1.03 < ratio < 1.315


def test_bad_value_is_one_line():
    with pytest.raises(catalog.CatalogError, match="train_moe_router_balanced: 'maybe'"):
        _frame(train_moe_router_balanced="maybe")
