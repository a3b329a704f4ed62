"""Flash attention on a GPU whose tensor rate per SM is cut (H20): the compute model scales
Hopper's attention curves by the GPU's published level (issue 40; catalog.attention_scales,
data/kernels/published/attention_gpu_levels.csv: Dao-AILab/flash-attention issue #1310)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog, compute
from sim_core.simulate import frame_to_batch


def batch(gpu, kernel, seq=8192, mb=1):
    df = pd.DataFrame([dict(model="qwen2.5-7b", gpu=gpu, num_gpus=8, tp=1, pp=1,
                            micro_batch=mb, global_batch=8 * mb, seq_len=seq,
                            attention_kernel=kernel)])
    return frame_to_batch(df)


def test_h20_levels_are_the_published_ones_over_hoppers_kernel_maxima():
    s = catalog.attention_scales()
    # FlashAttention-2 83.7 and cuDNN 129.1 TFLOP/s (non-causal, hd128, 2k) on 148 TFLOP/s,
    # over the H100 kernel-level maxima 0.364 (fa2) and 0.70 (fa3)
    assert s["h20"]["fa2"] == pytest.approx(83.7 / 148 / 0.364, abs=1e-4)
    assert s["h20"]["fa3"] == pytest.approx(129.1 / 148 / 0.70, abs=1e-4)
    assert set(s) == {"h20"}
    table = catalog.gpu_table()
    assert table.loc["h100-sxm", "attn_scale_fa2"] == 1.0
    assert table.loc["h20", "attn_scale_fa3"] == pytest.approx(s["h20"]["fa3"])


@pytest.mark.parametrize("kernel", ["fa2", "fa3"])
def test_h20_attention_is_hoppers_curve_scaled_and_h100_is_unchanged(kernel):
    h20, h100 = batch("h20", kernel), batch("h100-sxm", kernel)
    scale = catalog.attention_scales()["h20"][kernel]
    for d in ("fwd", "bwd"):
        e20 = compute.attention_efficiency(h20, d)
        e100 = compute.attention_efficiency(h100, d)
        # same architecture (sm 90), same shape: the curve differs only by the H20's level
        assert e20 == pytest.approx(e100 * scale)
        # H100's curve without the columns (a batch built elsewhere) is the same
        bare = type(h100)({k: v for k, v in h100.items() if not k.startswith("attn_scale")})
        assert compute.attention_efficiency(bare, d) == pytest.approx(e100)


def test_scaled_attention_never_exceeds_the_peak():
    b = batch("h20", "fa3", seq=65536, mb=4)
    b["attn_scale_fa3"] = np.full(1, 10.0)
    assert compute.attention_efficiency(b, "fwd") == pytest.approx(1.0)


def test_the_published_causal_points_sit_above_the_unscaled_h20_curve():
    # what the level corrects: Hopper's fitted FA2 curve on the H20's 148 TFLOP/s prices the
    # published causal 2k point (65.9 TFLOP/s, batch 2, 16 heads of 128) at well under half
    df = pd.read_csv("sim_core/data/kernels/published/attention_gpu_levels.csv", comment="#")
    pt = df[(df.kernel == "fa2") & df.causal & (df.headdim == 128)].iloc[0]
    b = batch("h20", "fa2", seq=int(pt.seqlen), mb=int(pt.batch))
    b["heads"] = np.full(1, 2048.0 / pt.headdim)
    b["head_dim"] = np.full(1, float(pt.headdim))
    unscaled = compute.attention_efficiency(b, "fwd")[0] / b["attn_scale_fa2"][0]
    assert unscaled * 148 < 0.5 * pt.tflops
    assert compute.attention_efficiency(b, "fwd")[0] * 148 < pt.tflops  # still under it
