"""FP8 recipes (run field fp8_recipe): framework defaults, what each framework offers, the cost
each recipe adds (quantisation traffic, amax all-reduces, bf16 weight gradients) and export."""

from __future__ import annotations

import pandas as pd
import pytest

from sim_core import compute, frameworks
from sim_core.simulate import simulate_frame
from sweep.advice import export
from sweep.config import parse_run, parse_space
from sweep.engine.space import Space
from sweep.errors import ConfigError

ROW = dict(model="llama3-70b", seq_len=8192, global_batch=128, gpu="h100-sxm", num_gpus=64,
           tp=8, pp=1, micro_batch=1, recompute="none", precision="fp8",
           sequence_parallel=True)


def sim(**kw) -> pd.Series:
    return simulate_frame(pd.DataFrame([{**ROW, **kw}])).iloc[0]


@pytest.mark.parametrize("framework,recipe", [
    ("megatron-core", "delayed"), ("nemo", "delayed"), ("torchtitan", "tensorwise"),
    ("llm-foundry", "delayed")])
def test_each_framework_sets_its_code_default(framework, recipe):
    r = frameworks.resolve_frame(pd.DataFrame([{**ROW, "framework": framework}])).iloc[0]
    assert r["fp8_recipe"] == recipe


def test_a_recipe_the_framework_or_gpu_lacks_is_invalid_with_the_reason():
    assert sim(framework="megatron-core", fp8_recipe="rowwise")["invalid_reason"] == \
        "megatron-core has no rowwise FP8 recipe"
    assert sim(framework="torchtitan", fp8_recipe="delayed", zero=3)["invalid_reason"] == \
        "torchtitan has no delayed FP8 recipe"
    assert "Blackwell" in sim(framework="megatron-core", fp8_recipe="mxfp8")["invalid_reason"]
    assert sim(framework="megatron-core", fp8_recipe="mxfp8", gpu="b200")["valid"]
    # bf16 runs ignore the recipe
    assert sim(framework="megatron-core", fp8_recipe="mxfp8", precision="bf16")["valid"]


def test_recipes_cost_what_their_kernels_and_collectives_move():
    t = {r: sim(framework="megatron-core", fp8_recipe=r)["time_compute"]
         for r in ("delayed", "tensorwise", "blockwise")}
    # current scaling reads every GEMM input once more for its amax and all-reduces it over
    # tp; blockwise writes a second FP8 copy and its GEMMs run 1.13x slower on Hopper
    # (measured, efficiency.yaml gemm_time): delayed < tensorwise < blockwise
    assert t["delayed"] < t["tensorwise"] < t["blockwise"]
    tw = {r: sim(framework="torchtitan", zero=3, fp8_recipe=r)["time_compute"]
          for r in ("tensorwise", "rowwise", "rowwise_with_gw_hp")}
    # the bf16 weight gradient of rowwise_with_gw_hp costs more than the FP8 one it replaces
    assert tw["rowwise"] < tw["rowwise_with_gw_hp"]


def _layer_part(part="layer_gemm_fwd", **kw) -> float:
    from sim_core import workload
    from sim_core.columns import frame_to_batch

    b = frame_to_batch(pd.DataFrame([{**ROW, "framework": "megatron-core", **kw}]))
    return float(compute.stage_times(b, workload.build(b))[part][0])


def test_current_scaling_amax_pass_is_fused_into_a_fused_norm_only():
    from sim_core import workload
    from sim_core.columns import frame_to_batch

    # TE normalization.cpp FUSED_NORM_AMAX_FP8: LayerNormLinear's input (qkv_proj, dense fc1)
    # gets its amax from the norm kernel; out_proj and fc2 inputs pay the amax read
    extra = {f: _layer_part(fp8_recipe="tensorwise", fused_elementwise=f)
             - _layer_part(fp8_recipe="delayed", fused_elementwise=f) for f in (True, False)}
    assert 0 < extra[True] < extra[False]
    # the forward bytes saved are exactly the amax read (2 B) of the two norm-fed inputs
    b = frame_to_batch(pd.DataFrame([{**ROW, "framework": "megatron-core"}]))
    wl = workload.build(b)
    hbm = float(b.hbm_bw_gbs[0]) * 1e9 * compute._by_arch(b.sm_arch, "elementwise")[0]
    # m*k elements of all layers (the cast is priced per element of the GEMM input)
    fed = sum(float(op.fwd_flops[0] / op.gemm_n[0]) for op in wl.ops
              if op.name in compute.NORM_FED_GEMMS) / 2
    assert extra[False] - extra[True] == pytest.approx(2.0 * fed / hbm, rel=1e-6)
    # gradients pay the amax read whatever the norm: the backward is the same
    bwd = {f: _layer_part("layer_bwd", fp8_recipe="tensorwise", fused_elementwise=f)
           - _layer_part("layer_bwd", fp8_recipe="delayed", fused_elementwise=f)
           for f in (True, False)}
    assert bwd[True] > 0 and bwd[True] == pytest.approx(bwd[False], rel=1e-12)
    # torchao's tensorwise (torchtitan) takes its amax in a reduction of its own, compiled or not
    tt = [_layer_part(framework="torchtitan", zero=3, fp8_recipe="tensorwise",
                          fused_elementwise=f) for f in (True, False)]
    assert tt[0] == tt[1]


def test_current_scaling_all_reduces_only_sequence_parallel_tp_tensors():
    from sim_core.columns import frame_to_batch

    frame = pd.DataFrame([{**ROW, "framework": "megatron-core", "fp8_recipe": "tensorwise"},
                          {**ROW, "framework": "megatron-core", "fp8_recipe": "tensorwise",
                           "tp": 1, "sequence_parallel": False},
                          {**ROW, "framework": "megatron-core", "fp8_recipe": "rowwise"}])
    b = frame_to_batch(frame)
    rec = compute.fp8_recipe_arrays(b)
    sync = compute.fp8_scale_sync_s(b, rec, b.precision == 1, 80)
    # tp 8 in one node: 2 per layer x 80 layers x 2 log2(8) steps x 2 us
    assert sync[0] == pytest.approx(2 * 80 * 6 * 2e-6)
    assert sync[1] == 0.0 and sync[2] == 0.0


def test_export_names_the_recipe_where_the_framework_has_the_flag():
    args = export.megatron_args({**ROW, "framework": "megatron-core", "fp8_recipe": "blockwise",
                                 "dp": 8})
    assert args[args.index("--fp8-recipe") + 1] == "blockwise"
    ns = export.megatron_parser().parse_args(args)
    assert ns.fp8_recipe == "blockwise"
    cfg = export.torchtitan_config({**ROW, "framework": "torchtitan", "zero": 3, "dp": 8,
                                    "fp8_recipe": "rowwise"})
    f8 = cfg["quantize.linear.float8"]
    assert f8["recipe_name"] == "rowwise" and not f8["enable_fsdp_float8_all_gather"]
    cfg = export.torchtitan_config({**ROW, "framework": "torchtitan", "zero": 3, "dp": 8,
                                    "fp8_recipe": "tensorwise"})
    assert "recipe_name" not in cfg["quantize.linear.float8"]
    assert cfg["quantize.linear.float8"]["enable_fsdp_float8_all_gather"]


def test_fp8_recipe_is_a_checked_run_field_and_a_space_axis():
    run = {"model": "llama3-8b", "seq_len": 8192, "global_batch": 64, "precision": "fp8",
           "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
           "parallel": {"tp": 1, "fp8_recipe": "tensorwise"}}
    assert parse_run(run).parallel.fp8_recipe == "tensorwise"
    with pytest.raises(ConfigError) as ei:
        parse_run({**run, "parallel": {"fp8_recipe": "per-tensor"}})
    assert "parallel.fp8_recipe" in str(ei.value) and "\n" not in str(ei.value)
    doc = {"name": "t", **{k: v for k, v in run.items() if k != "parallel"},
           "space": {"fp8_recipe": ["delayed", "tensorwise", "blockwise"], "tp": [1, 2]}}
    assert Space.from_config(parse_space(doc)).size == 6


def test_finer_scales_run_slower_gemms_by_the_measured_ratio():
    """rowwise and blockwise FP8 GEMMs take their measured gemm_time over per-tensor ones
    (h100-sxm-edges.csv): torchtitan's forward GEMM part grows by nearly that factor from
    tensorwise to rowwise (same casts, which dilute it a little); Megatron's blockwise is
    at least that much slower than delayed (it also adds a cast)."""
    table = compute.fp8_recipe_table()
    base = _layer_part(framework="torchtitan", zero=3, fp8_recipe="tensorwise")
    t = _layer_part(framework="torchtitan", zero=3, fp8_recipe="rowwise")
    factor = table["rowwise"]["gemm_time"]
    assert 1.0 + 0.8 * (factor - 1) < t / base < factor
    delayed = _layer_part(framework="megatron-core", fp8_recipe="delayed")
    block = _layer_part(framework="megatron-core", fp8_recipe="blockwise")
    assert block / delayed > 1.0 + 0.8 * (table["blockwise"]["gemm_time"] - 1)
