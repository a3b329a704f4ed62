"""The routed experts' eager activation with wide router probabilities (sim_core/rl/moe_glu.py):
the byte counts from Megatron-Core's TEGroupedMLP unfused path, where the rule applies, and the
error on a bad value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import inputs, moe_glu, training

from .rl_rows import NEMO_QWEN3_30B_A3B, priced_training_frame

# the NeMo RL v0.3 blog's Qwen3-30B-A3B row (TP2 EP8 SP, 64 H100, one 4,096-token sequence
# per training micro-batch, four per log-prob micro-batch)
ROW = NEMO_QWEN3_30B_A3B


def _glu(**over):
    df, b, tf, sim, tok, _ = priced_training_frame({**ROW, **over})
    return moe_glu.exposed(b, df, tf, sim, tok), b, tf


def test_byte_counts_from_the_eager_path():
    e = moe_glu.eager_bytes([2, 4, 8])
    # forward: silu 2+2, gate multiply 4+2, probability multiply 2+w, cast back w+2 (w > 2)
    assert e["fwd"].tolist() == [14, 22, 30]
    # backward: cast, the product's gradient, the probabilities' gradient, gate, silu, chunk
    assert e["bwd"].tolist() == [38, 60, 88]
    extra_f = e["fwd"] - moe_glu.FUSED_FWD
    extra_b = e["bwd"] - moe_glu.FUSED_BWD
    assert extra_f.tolist() == [8, 16, 24] and extra_b.tolist() == [26, 48, 76]


def test_fused_activation_adds_nothing():
    # stated fused; slime's Qwen3 scripts (bias-SwiGLU fusion on); NeMo's DeepSeek config
    for over in ({"train_moe_glu_fusion": True}, {"rl_framework": "slime"},
                 {"model": "deepseek-v3", "train_ep": 8}):
        g, _, _ = _glu(**over)
        assert g["update_s"][0] == 0 and g["log_prob_s"][0] == 0


def test_nemo_rl_qwen3_moe_defaults_to_the_eager_activation():
    blank, _, _ = _glu()
    stated, _, _ = _glu(train_moe_glu_fusion=False)
    assert blank["update_s"][0] > 0 and blank["update_s"][0] == stated["update_s"][0]


def test_eager_fp64_on_the_nemo_rl_row():
    g, b, tf = _glu(train_moe_glu_fusion=False)
    # 2,048 tokens per GPU (4,096 over SP 2) x top-8 x 768: 12.6 M elements per MoE layer;
    # 24 + 76 bytes each at 3.35 TB/s x 0.8
    elems = 2048 * 8 * 768
    hbm = 3.35e12 * 0.80
    assert g["extra_fwd_s"][0] == pytest.approx(24 * elems / hbm, rel=0.01)
    assert g["extra_bwd_s"][0] == pytest.approx(76 * elems / hbm, rel=0.01)
    # per optimizer step: 16 micro-batches x 48 MoE layers
    assert g["update_s"][0] == pytest.approx(16 * 48 * 100 * elems / hbm, rel=0.01)
    # the log-prob pass: forward only, over the same tokens
    assert g["log_prob_s"][0] == pytest.approx(16 * 48 * 24 * elems / hbm, rel=0.01)


def test_wider_router_dtype_costs_more_and_nemo_rl_defaults_to_fp64():
    s = {d: _glu(train_moe_glu_fusion=False, train_moe_router_dtype=d)[0]["update_s"][0]
         for d in ("bf16", "fp32", "fp64")}
    assert s["bf16"] < s["fp32"] < s["fp64"]
    assert s["fp64"] / s["bf16"] == pytest.approx((24 + 76) / (8 + 26))
    blank = _glu(train_moe_glu_fusion=False)[0]["update_s"][0]
    assert blank == s["fp64"]
    # slime's default router dtype is the activations' bf16
    assert _glu(train_moe_glu_fusion=False, rl_framework="slime")[0]["update_s"][0] \
        == pytest.approx(s["bf16"])


def test_full_recompute_replays_the_forward():
    none, _, _ = _glu(train_moe_glu_fusion=False)
    full, _, _ = _glu(train_moe_glu_fusion=False, train_recompute="full")
    per = full["extra_fwd_s"][0] + full["extra_bwd_s"][0]
    assert full["update_s"][0] / per == pytest.approx(
        none["update_s"][0] / (none["extra_fwd_s"][0] + none["extra_bwd_s"][0])
        * (per + full["extra_fwd_s"][0]) / per)


def test_dense_models_and_fsdp_are_untouched():
    g, _, _ = _glu(train_moe_glu_fusion=False, model="qwen3-32b", train_ep=1)
    assert g["update_s"][0] == 0
    g, _, _ = _glu(train_moe_glu_fusion=False, train_backend="fsdp", train_zero=3)
    assert g["update_s"][0] == 0


def test_bad_values_name_the_field():
    df = pd.DataFrame([{**ROW, "train_moe_router_dtype": "fp16x"}])
    b = inputs.to_batch(df)
    with pytest.raises(catalog.CatalogError, match="train_moe_router_dtype: 'fp16x'"):
        moe_glu.prob_bytes(df, b)
    df = pd.DataFrame([{**ROW, "train_moe_glu_fusion": "maybe"}])
    with pytest.raises(catalog.CatalogError, match="train_moe_glu_fusion: 'maybe'"):
        moe_glu.glu_fused(df, inputs.to_batch(df))


def test_only_the_nemo_rl_qwen3_moe_row_of_the_shipped_table_moves():
    from sim_core.accuracy import rl
    df, _, _ = rl.to_frame(rl.load())
    b = inputs.to_batch(df)
    on = moe_glu.megatron_moe_rows(b, training.training_frame(df, b)) & ~moe_glu.glu_fused(df, b)
    assert np.flatnonzero(on).tolist() == [10]
