"""Per-stack decode constants (sim_core/rl/decode_stacks.py, catalogs/rl.yaml decode_stacks):
a stack row replaces the global bandwidth fraction and per-step time for its vendor and
engine only; every other configuration, NVIDIA's included, is priced with the global fitted
constants to the last bit; a fit's overrides price every row uniformly; a bad row is a
one-line error naming its field."""

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import calibrate, decode_stacks, generation, inputs


def _batch(gpus, engines):
    n = len(gpus)
    return inputs.to_batch(pd.DataFrame({
        "model": ["qwen3-4b"] * n, "gpu": gpus, "num_gpus": [4] * n, "rollout_tp": [4] * n,
        "prompts_per_step": [1] * n, "prompt_len": [1000] * n, "response_mean": [1] * n,
        "response_max": [1] * n, "rollout_precision": ["bf16"] * n,
        "rollout_engine": engines}))


def _steps(b, k):
    return generation.step_time(b, np.full(len(b), 8.0), np.full(len(b), 1000.0), k)


def test_table_lookup_matches_vendor_and_engine_only():
    k = generation.decode_constants()
    b = _batch(["ascend-a3", "ascend-a3", "mi300x", "h100-sxm"],
               ["vllm", "sglang", "sglang", "vllm"])
    eff, ovh = decode_stacks.resolve(b, k)
    row = [r for r in k["stacks"] if (r["vendor"], r["engine"]) == ("huawei", "vllm")][0]
    assert (eff[0], ovh[0]) == (row["hbm_efficiency"], row["step_overhead_s"])
    # an engine or vendor no row names falls back to the global constants
    assert (eff[1:] == k["hbm_efficiency"]).all() and (ovh[1:] == k["step_overhead_s"]).all()
    assert ovh[0] > 2 * k["step_overhead_s"]  # the Ascend row is not the global one
    # the step of the unmatched rows is the step without any table, bit for bit
    assert np.array_equal(_steps(b, k)[1:], _steps(b, {**k, "stacks": []})[1:])
    assert _steps(b, k)[0] > _steps(b, {**k, "stacks": []})[0]


def test_nvidia_benchmark_rows_unchanged_to_the_last_bit():
    """calibrate.py's TensorRT-LLM/H100-H200 rows: the generation time with the shipped table
    equals the one with no table at all (so its in-sample and leave-one-model-out figures
    are those of the global fit); a table row for nvidia/tensorrt-llm would move them."""
    bench = calibrate.load().iloc[::6]
    b = inputs.to_batch(calibrate.frame(bench))
    k = generation.decode_constants()
    with_table = generation.generate(b)["gen_time_s"]
    without = generation.generate(b, {"stacks": []})["gen_time_s"]
    assert np.array_equal(with_table, without)
    moved = generation.generate(b, {"stacks": [{"vendor": "nvidia", "engine": "tensorrt-llm",
                                                "step_overhead_s": 0.02}]})["gen_time_s"]
    assert (moved > without).all()
    assert (k["hbm_efficiency"], k["step_overhead_s"]) == (0.95, 0.0075)


def test_fit_overrides_price_every_row_uniformly():
    k = generation.decode_constants({"hbm_efficiency": 0.5, "step_overhead_s": 0.0})
    assert k["stacks"] == []
    b = _batch(["ascend-a3", "h100-sxm"], ["vllm", "vllm"])
    eff, ovh = decode_stacks.resolve(b, k)
    assert (eff == 0.5).all() and (ovh == 0.0).all()
    # an override that names the table keeps it
    k2 = generation.decode_constants({"step_overhead_s": 0.0, "stacks": [
        {"vendor": "huawei", "engine": "vllm", "step_overhead_s": 0.03}]})
    eff, ovh = decode_stacks.resolve(b, k2)
    assert list(ovh) == [0.03, 0.0] and list(eff) == [k2["hbm_efficiency"]] * 2


@pytest.mark.parametrize("row, field", [
    ({"vendor": "intel", "engine": "vllm"}, "decode_stacks[0].vendor"),
    ({"vendor": "amd", "engine": "trt"}, "decode_stacks[0].engine"),
    ({"vendor": "amd", "engine": "vllm", "step_overhead_s": "fast"},
     "decode_stacks[0].step_overhead_s"),
    ({"vendor": "amd", "engine": "vllm", "hbm_efficiency": 0.0},
     "decode_stacks[0].hbm_efficiency"),
])
def test_bad_table_row_names_its_field(row, field):
    with pytest.raises(catalog.CatalogError) as e:
        decode_stacks.table({**generation.decode_constants(), "stacks": [row]})
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_mi300x_vllm_rows_are_fitted_but_not_stored():
    """docs/rl.md: OCI's Llama 3.1 405B FP8 TP8 latencies on MI300X (vLLM 0.6-era, V0) are
    ~25% slower than the global constants predict; their fitted per-step time (~15 ms) is
    printed, not stored (one source, one model), so MI300X keeps the global constants."""
    from sim_core.rl import calibrate_stacks
    t = calibrate_stacks.load("decode_rocm_tpot.csv")
    assert t.url.str.startswith("https://blogs.oracle.com/").all() and t.vllm_v0.all()
    r = calibrate_stacks.report("amd", "vllm", t)
    assert r["stored_overhead_s"] is None and r["left_out_by"] == "row"
    assert (r["global"] < -0.15).all() and 0.010 < r["step_overhead_s"] < 0.020
    assert np.array_equal(r["stored"], r["global"])
