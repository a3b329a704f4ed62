"""Sliding-window attention (GPT-OSS): catalog fields, exact query-key pair counts with and
without context parallelism, the kernel efficiency at the window's length, the CP rule, and
models without a window priced exactly as before."""

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog, compute, rules, workload
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate_frame

OSS = dict(model="gpt-oss-120b", seq_len=4096, global_batch=512, gpu="h100-sxm", num_gpus=64,
           tp=1, pp=4, ep=8, micro_batch=1)


def _batch(**over):
    return frame_to_batch(pd.DataFrame([{**OSS, **over}]))


def _inline(base: str, **fields) -> dict:
    """The columns of catalog model `base` with some shape fields replaced."""
    return {**catalog.model_from_dict({"base": base, **fields}).columns(), "model": base}


def _op(b, name):
    return next(op for op in workload.build(b).ops if op.name == name)


def _brute_pairs(s: int, w: int) -> int:
    """Pairs (i, j) with j <= i < s and i - w < j: HF's sliding-window causal mask."""
    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    return int(((j <= i) & (j > i - w)).sum())


def test_catalog_window_fields():
    for name, layers in (("gpt-oss-120b", 36), ("gpt-oss-20b", 24)):
        m = catalog.get_model(name)
        assert (m.sliding_window, m.window_attn_skip_freq, m.layers) == (128, 2, layers)
        assert "not modelled" not in m.source.split("Attention sinks")[0]
    for name in ("mixtral-8x7b", "mixtral-8x22b", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"):
        m = catalog.get_model(name)
        assert (m.sliding_window, m.window_attn_skip_freq) == (0, 0)
    with pytest.raises(catalog.CatalogError, match="window_attn_skip_freq"):
        catalog.model_from_dict({"base": "llama3-8b", "window_attn_skip_freq": 2})
    with pytest.raises(catalog.CatalogError, match="sliding_window"):
        catalog.model_from_dict({"base": "llama3-8b", "sliding_window": -4})


@pytest.mark.parametrize("layers,freq,share", [(36, 2, 0.5), (24, 2, 0.5), (10, 3, 0.7),
                                               (10, 0, 1.0), (10, 1, 0.0)])
def test_window_layer_share_follows_megatron_skip_freq(layers, freq, share):
    """Layer l (1-indexed) is windowed unless l % freq == 0; freq 0 windows every layer."""
    b = frame_to_batch(pd.DataFrame([{**OSS, **_inline("gpt-oss-120b", layers=layers,
                                                         window_attn_skip_freq=freq), "pp": 1}]))
    assert workload.window_layers(b)[0][0] == pytest.approx(share, abs=1e-12)
    expect = sum(1 for layer in range(1, layers + 1) if freq == 0 or layer % freq != 0)
    assert share == expect / layers


@pytest.mark.parametrize("w", [1, 128, 1000, 4095])
def test_window_pairs_match_the_mask(w):
    s = 4096
    assert float(workload.window_pairs(s, w)) == _brute_pairs(s, w)


def test_windowed_attention_flops_are_the_exact_pair_count():
    """GPT-OSS at seq 4096: half the layers attend to 128 keys. Their FLOPs are 4*pairs*heads*
    head_dim per layer (QK^T and AV), pairs counted exactly: about 128/2048 of causal."""
    b = _batch()
    full, win = _op(b, "attention"), _op(b, "attention_window")
    L_stage, heads, hd, s = 9, 64, 64, 4096
    n_win = 0.5 * L_stage  # 18 of 36 layers; the stage's average layer carries the share
    pairs = _brute_pairs(s, 128)
    assert float(win.fwd_flops[0]) == pytest.approx(4 * pairs * heads * hd * n_win, rel=1e-12)
    assert float(full.fwd_flops[0]) == pytest.approx(4 * s * s / 2 * heads * hd * n_win,
                                                     rel=1e-12)
    ratio = float(win.fwd_flops[0] / full.fwd_flops[0])
    assert ratio == pytest.approx(pairs / (s * s / 2), rel=1e-12)
    assert 0.9 * 128 / 2048 < ratio < 128 / 2048
    assert float(win.bwd_flops[0]) == pytest.approx(2.5 * float(win.fwd_flops[0]), rel=1e-12)
    assert float(win.attn_keys[0]) == 128


def test_window_as_long_as_the_sequence_is_full_causal_attention():
    """A window that covers the sequence masks nothing: full causal FLOPs, no windowed op."""
    no_win = frame_to_batch(pd.DataFrame([{**OSS, **_inline("gpt-oss-120b", sliding_window=0,
                                                            window_attn_skip_freq=0)}]))
    for w in (4096, 8192):
        b = frame_to_batch(pd.DataFrame([{**OSS, **_inline("gpt-oss-120b", sliding_window=w)}]))
        assert float(_op(b, "attention_window").fwd_flops[0]) == 0.0
        assert float(_op(b, "attention").fwd_flops[0]) == float(_op(no_win, "attention")
                                                                .fwd_flops[0])


@pytest.mark.parametrize("cp,w", [(2, 128), (4, 128), (4, 700), (8, 1500), (2, 3000)])
def test_windowed_pairs_under_cp_are_the_busiest_ranks(cp, w):
    """Megatron's CP layout: 2*cp chunks, rank r holds chunks r and 2cp-1-r. The workload
    prices the rank with the most pairs, counted from the mask."""
    s = 4096
    chunk = s // (2 * cp)
    i = np.arange(s)
    per_query = np.minimum(i + 1, w)
    ranks = [per_query[r * chunk:(r + 1) * chunk].sum()
             + per_query[(2 * cp - 1 - r) * chunk:(2 * cp - r) * chunk].sum() for r in range(cp)]
    b = _batch(cp=cp, cp_comm="allgather", num_gpus=64 * cp // 2 if cp > 2 else 64,
               **({"global_batch": 512} if cp <= 2 else {}))
    got = float(workload.window_pairs_per_gpu(b, np.array([float(w)]))[0])
    assert got == max(ranks)
    assert sum(ranks) == _brute_pairs(s, w)


def test_window_kernel_runs_at_the_windows_efficiency():
    """The windowed op's time is its FLOPs at the attention curve evaluated at the window's
    length (same query blocks), full layers at the sequence's."""
    b = _batch()
    eff_full = compute.attention_efficiency(b, "fwd")
    eff_win = compute.attention_efficiency(b, "fwd", np.array([128.0]))
    tab = compute.efficiency_table()[90]
    half = tab["attn_seq_half_fwd"]["fa3"]
    assert float(eff_win[0] / eff_full[0]) == pytest.approx((128 / (128 + half))
                                                            / (4096 / (4096 + half)), rel=1e-12)
    wl = workload.build(b)
    st = compute.stage_times(b, wl)
    peak = float(b.peak_bf16[0]) * 1e12 * float(compute.power_clock_scale(b)[0])
    ops = {op.name: op for op in wl.ops}
    expect = (float(ops["attention"].fwd_flops[0]) / (peak * float(eff_full[0]))
              + float(ops["attention_window"].fwd_flops[0]) / (peak * float(eff_win[0])))
    assert float(st["layer_attn_fwd"][0]) == pytest.approx(expect, rel=1e-12)


def test_window_makes_gpt_oss_faster_and_keeps_memory():
    rows = pd.DataFrame([OSS, {**OSS, **_inline("gpt-oss-120b", sliding_window=0,
                                                 window_attn_skip_freq=0)}])
    out = simulate_frame(rows)
    assert out["step_time_s"].iloc[0] < out["step_time_s"].iloc[1]
    # flash attention keeps no s x s scores: a window changes no stored activation
    assert out["peak_memory_gib"].iloc[0] == out["peak_memory_gib"].iloc[1]


def test_models_without_a_window_are_priced_bit_identically():
    """A dense model with a window as long as its sequence (nothing masked) steps exactly as the
    catalog model: the windowed op is skipped, full layers keep their FLOPs to the last bit."""
    base = dict(model="llama3-8b", seq_len=8192, global_batch=256, gpu="h100-sxm", num_gpus=64,
                tp=2, pp=2, cp=2, micro_batch=1, cp_comm="allgather")
    rows = pd.DataFrame([base, {**base, **_inline("llama3-8b", sliding_window=8192)}])
    out = simulate_frame(rows)
    assert out["step_time_s"].iloc[0] == out["step_time_s"].iloc[1]
    assert out["peak_memory_gib"].iloc[0] == out["peak_memory_gib"].iloc[1]


def test_cp_ring_with_a_window_is_invalid():
    valid, reason = rules.check(_batch(cp=2, cp_comm="ring"))
    assert not valid[0] and "sliding-window" in reason[0]
    valid, _ = rules.check(_batch(cp=2, cp_comm="allgather"))
    assert valid[0]
    valid, _ = rules.check(frame_to_batch(pd.DataFrame([{**OSS, "model": "mixtral-8x7b",
                                                         "cp": 2, "cp_comm": "ring"}])))
    assert valid[0]
