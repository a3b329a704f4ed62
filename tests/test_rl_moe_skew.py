"""Uneven EP load where an RL framework trains the MoE router without balancing
(sim_core/rl/moe_skew.py): the exponent reproduces TensorRT-LLM's published DeepSeek-R1 EP32
per-rank imbalance through the core's law, it applies only to the NeMo RL / slime / SkyRL
Megatron MoE rows, and dense, balanced, FSDP and EP 1 rows do not move."""

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


def test_unbalanced_frameworks_get_the_skew():
    for fw in ("nemo_rl", "slime", "skyrl"):
        assert _frame(rl_framework=fw)["expert_skew"].iloc[0] == pytest.approx(
            moe_skew.exponent())


@pytest.mark.parametrize("over", [
    {"model": "qwen3-32b", "train_ep": 1},          # dense
    {"train_ep": 1},                                # MoE without EP: no busiest rank
    {"rl_framework": "verl"},                       # router settings not read: balanced
    {"train_moe_router_balanced": True},            # stated balanced
])
def test_dense_and_balanced_rows_stay_balanced(over):
    assert _frame(**over)["expert_skew"].iloc[0] == 0.0


def test_busiest_rank_sets_the_nemo_row_pace():
    _, _, _, skewed, _, _ = priced_training_frame(ROW)
    _, _, _, flat, _, _ = priced_training_frame({**ROW, "train_moe_router_balanced": True})
    assert skewed["moe_load_factor"].iloc[0] == pytest.approx(1.4535, abs=1e-3)
    assert flat["moe_load_factor"].iloc[0] == 1.0
    # slower, but by less than the load: attention, norms and the dense parts do not scale
    ratio = skewed["step_time_s"].iloc[0] / flat["step_time_s"].iloc[0]
    assert 1.05 < ratio < 1.4535


def test_bad_value_is_one_line():
    with pytest.raises(catalog.CatalogError, match="train_moe_router_balanced: 'maybe'"):
        _frame(train_moe_router_balanced="maybe")
