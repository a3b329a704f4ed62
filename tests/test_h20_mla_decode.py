"""FlashMLA's decode attention on a compute-poor Hopper part (H20): padded 64-row tiles make it
compute-bound where an H100's or H200's stays bound by the cache read (issue 40; rl/mla_decode.py,
data/kernels/published/mla_decode_levels.csv: FlashMLA issue 30, its README, achatbot PR 123)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.calibration import mla_decode_levels
from sim_core.rl import generation, inputs, mla_decode


def v3(gpu="h20", engine="vllm", tp=32, eager=True):
    df = pd.DataFrame([dict(model="deepseek-v3", gpu=gpu, num_gpus=tp, rollout_tp=tp,
                            rollout_engine=engine, prompts_per_step=96, responses_per_prompt=8,
                            prompt_len=360.0, response_mean=1960.0, response_max=9632.0,
                            gpu_memory_utilization=0.6, enforce_eager=eager)])
    return inputs.to_batch(df)


def step(b, seqs, ctx, k=None):
    k = k or generation.decode_constants()
    return generation.step_time(b, np.array([float(seqs)]), np.array([float(ctx)]), k)


def test_levels_are_the_published_rates_over_the_catalog_peaks():
    lv = mla_decode.levels()
    # FlashMLA issue 30: eleven H20 rows at 120-130 TFLOP/s, median 127, on 148 dense bf16
    assert lv["h20"] == pytest.approx(127 / 148)
    # the README's 580 TFLOP/s on an H800 SXM5 (989.4 dense bf16)
    assert lv["h800"] == pytest.approx(580 / catalog.peak_tflops(catalog.get_gpu("h800"), "bf16"))
    lo = mla_decode.level_of(["h20", "h100-sxm", "h200", "a100-80gb", "mi300x", "b200"])
    # other Hopper parts take the H800's; FlashMLA does not run (here) off Hopper
    assert lo[0] == pytest.approx(lv["h20"])
    assert lo[1] == lo[2] == pytest.approx(lv["h800"])
    assert list(lo[3:]) == [0.0, 0.0, 0.0]


def test_a_gpu_holding_few_heads_pays_a_whole_tile():
    # 4 heads (DeepSeek-V3's 128 over TP 32) run the 64-row tile; 65 run two
    one = mla_decode.padded_flops(1, 1000, 4, 1.0, 1, 576, 512)
    assert one == pytest.approx(2 * 1000 * 64 * (576 + 512))
    assert mla_decode.padded_flops(1, 1000, 64, 1.0, 1, 576, 512) == pytest.approx(one)
    assert mla_decode.padded_flops(1, 1000, 65, 1.0, 1, 576, 512) == pytest.approx(2 * one)
    # drafted tokens add query rows: 4 heads x 2 tokens still fit one tile
    assert mla_decode.padded_flops(1, 1000, 4, 2.0, 1, 576, 512) == pytest.approx(one)


def test_h20_mla_decode_is_compute_bound_and_hoppers_big_parts_are_not():
    b20, b200 = v3("h20"), v3("h200")
    seqs, ctx = 95, 2319
    c = lambda x: np.asarray(x, float)
    zero = np.zeros(1)
    t20 = mla_decode.compute_time(b20, np.array([seqs]), np.array([ctx]), zero, c, True)
    read20 = seqs * ctx * 61 * 576 * 2 / (4000e9 * generation.decode_constants()["hbm_efficiency"])
    # padded tiles at 127 TFLOP/s: ~3.6x the read at 0.95 of 4.0 TB/s
    assert t20[0] == pytest.approx(2 * seqs * ctx * 61 * 64 * 1088 / 127e12, rel=1e-6)
    assert t20[0] > 3 * read20
    t200 = mla_decode.compute_time(b200, np.array([seqs]), np.array([ctx]), zero, c, True)
    read200 = seqs * ctx * 61 * 576 * 2 / (4800e9 * generation.decode_constants()["hbm_efficiency"])
    # 121 FLOP/B under the H200's ridge at the H800's level: the read still binds there
    assert t200[0] < read200
    # so the H20's step grows by the difference and nothing else
    b_off = v3("h20")
    b_off["mla_decode_level"] = np.zeros(1)
    assert step(b20, seqs, ctx) - step(b_off, seqs, ctx) == pytest.approx(t20[0] - read20,
                                                                           rel=1e-6)


@pytest.mark.parametrize("engine", ["sglang", "tensorrt-llm"])
def test_only_vllm_runs_flashmla(engine):
    b = v3("h20", engine=engine)
    base = v3("h20", engine=engine)
    base["mla_decode_level"] = np.zeros(1)
    # the engine's step is priced by the cache read alone, as before
    assert step(b, 95, 2319) == pytest.approx(step(base, 95, 2319))


def test_dense_models_and_bare_batches_are_untouched():
    df = pd.DataFrame([dict(model="qwen2.5-7b", gpu="h20", num_gpus=2, rollout_tp=2,
                            prompts_per_step=8, prompt_len=100.0, response_mean=500.0,
                            response_max=1000.0)])
    b = inputs.to_batch(df)
    c = lambda x: np.asarray(x, float)
    assert mla_decode.compute_time(b, np.array([64.0]), np.array([900.0]), np.zeros(1), c,
                                   True)[0] == 0
    bare = type(b)({k: v for k, v in b.items() if k != "mla_decode_level"})
    assert step(bare, 64, 900) == pytest.approx(step(b, 64, 900))


def test_the_published_kernel_rows_are_priced_within_a_few_percent():
    k = mla_decode_levels.check(generation.decode_constants()["hbm_efficiency"])
    h20 = k[k.gpu == "h20"]
    assert len(h20) == 11
    # the level left out row by row: every H20 row within 6%; the read alone ~10x short
    assert np.all(np.abs(h20.ratio - 1) < 0.06)
    assert np.all(h20.ratio_read_only < 0.11)
    # Modal's H100 rows: the same time for 16, 32 and 64 heads (one tile), read-bound as priced
    h100 = k[k.gpu == "h100-sxm"]
    assert np.all(h100.compute_ms < h100.read_ms)
    assert np.all(np.abs(h100.ratio - 1) < 0.15)
