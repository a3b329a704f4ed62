"""FP4 training (precision nvfp4 | mxfp4, sim_core/fp4.py): which GPUs and frameworks run it,
what the recipes cost against FP8, and what the recipes export."""

from __future__ import annotations

import pytest

from sim_core import catalog, fp4


def _evaluate(gpu, precision, framework="megatron-core", **parallel):
    from sweep.config import parse_run
    from sweep.engine.evaluate import evaluate
    from sweep.engine.space import Space

    d = {"model": "llama3-70b", "seq_len": 8192, "global_batch": 512, "precision": precision,
         "framework": framework, "cluster": {"gpu": gpu, "num_gpus": 64},
         "parallel": {"tp": 4, "pp": 1, "zero": 1, "recompute": "selective", **parallel}}
    return evaluate(Space.from_config(parse_run(d)).frame(0, 1)).iloc[0]


def test_recipes_are_the_codes_numbers():
    r = fp4.recipes()
    # NVFP4: 1x16 E4M3 scales, an amax pass before the fused RHT quantize, a per-tensor amax
    # all-reduce; MXFP4: 1x32 E8M0 scales, block-local (no amax pass, no reduction)
    assert r["nvfp4"]["block"] == 16 and r["mxfp4"]["block"] == 32
    assert r["nvfp4"]["saved_bytes"] == pytest.approx(0.5 + 1 / 16)
    assert r["mxfp4"]["saved_bytes"] == pytest.approx(0.5 + 1 / 32)
    assert r["nvfp4"]["extra_cast_bytes"] == pytest.approx(2.0 + 2 * (0.5 + 1 / 16) - 1.0)
    assert r["mxfp4"]["extra_cast_bytes"] == pytest.approx(2 * (0.5 + 1 / 32) - 1.0)
    assert (r["nvfp4"]["amax_reduce"], r["mxfp4"]["amax_reduce"]) == ("tp_tensor", "none")


def test_datasheet_peaks():
    t = catalog.gpu_table()
    assert t.loc["b200", "peak_nvfp4"] == 9000 and t.loc["gb200", "peak_nvfp4"] == 10000
    assert t.loc["gb300", "peak_nvfp4"] == 15000
    assert t.loc["mi355x", "peak_mxfp4"] == pytest.approx(10066.3)
    assert t.loc["mi350x", "peak_mxfp4"] == pytest.approx(9227.5)
    assert t.loc["mi355x", "peak_nvfp4"] == 0 and t.loc["h100-sxm", "peak_mxfp4"] == 0


@pytest.mark.parametrize("gpu, precision, framework, reason", [
    ("h100-sxm", "nvfp4", "megatron-core", "precision nvfp4 needs a GPU with NVFP4 tensor cores"),
    ("mi300x", "mxfp4", "megatron-core", "precision mxfp4 needs a GPU with MXFP4 tensor cores"),
    ("b200", "mxfp4", "megatron-core", "megatron-core has no MXFP4 training"),
    ("mi355x", "nvfp4", "megatron-core", "megatron-core has no NVFP4 training on ROCm"),
    ("b200", "nvfp4", "torchtitan", "torchtitan has no NVFP4 training"),
])
def test_invalid_combinations_say_why(gpu, precision, framework, reason):
    row = _evaluate(gpu, precision, framework)
    assert row["status"] == "invalid" and reason in row["invalid_reason"]


def test_fp4_is_faster_than_fp8_and_keeps_less_per_activation():
    for gpu, fmt in (("b200", "nvfp4"), ("gb300", "nvfp4"), ("mi355x", "mxfp4")):
        bf16, fp8, f4 = (_evaluate(gpu, p) for p in ("bf16", "fp8", fmt))
        assert f4["status"] == fp8["status"] == "ok"
        assert f4["step_time_s"] < fp8["step_time_s"] < bf16["step_time_s"]
        # the GEMMs alone would be 2x FP8's; attention, norms, the LM head and the quantizers
        # stay, so the step gains less than 2x
        assert fp8["step_time_s"] / f4["step_time_s"] < 1.6
    # the NVFP4 cast traffic (amax pass + two copies) is larger than MXFP4's
    nv = fp4.recipes()["nvfp4"]["extra_cast_bytes"]
    assert nv > 10 * fp4.recipes()["mxfp4"]["extra_cast_bytes"]


def test_fp4_param_gather_sends_fewer_bytes():
    """fp8_param_gather on an NVFP4 row is Megatron's --fp4-param-gather (Megatron-Bridge's
    NVFP4 recipe sets it): the ZeRO parameter all-gather moves 0.5625 B per parameter, not 2."""
    on = _evaluate("b200", "nvfp4", zero=1, fp8_param_gather=True)
    off = _evaluate("b200", "nvfp4", zero=1)
    assert on["status"] == off["status"] == "ok"
    assert on["time_dp"] < 0.8 * off["time_dp"]


def test_recipes_export_the_fp4_flags():
    from sweep.advice import export

    text = export.megatron_text(_evaluate("b200", "nvfp4", fp8_param_gather=True))
    args = export.parse_megatron_text(text)
    assert args[args.index("--fp4-format") + 1] == "e2m1"
    assert args[args.index("--fp4-recipe") + 1] == "nvfp4" and "--fp4-param-gather" in args
    assert "--fp8-format" not in args
    known = export.known_megatron_flags()
    assert all(a in known for a in args if a.startswith("--"))
    amd = export.megatron_text(_evaluate("mi355x", "mxfp4"))
    assert "fp4_recipe: mxfp4" in amd and "--fp4-recipe" not in amd


@pytest.mark.parametrize("space, fmt, gpus", [("nvfp4-b200.yaml", "nvfp4", {"b200", "gb300"}),
                                              ("mxfp4-mi355x.yaml", "mxfp4", {"mi355x"})])
def test_bundled_fp4_spaces_run_and_report_bf16_fp8_fp4_on_one_plot(tmp_path, space, fmt, gpus):
    from pathlib import Path

    from sweep import api
    from sweep.advice import report

    out = tmp_path / fmt
    api.search(Path(__file__).parent.parent / "search_spaces" / space, out)
    r = report.build(out)
    pf = r["precision_front"]
    assert set(pf["precision"]) == {"bf16", "fp8", fmt} and set(pf["gpu"]) <= gpus
    assert r["png"]["precision_frontier"][:4] == b"\x89PNG"
    # on the same space the FP4 frontier's fastest point beats FP8's, which beats BF16's
    fastest = pf.groupby("precision")["tokens_per_s"].max()
    assert fastest[fmt] > fastest["fp8"] > fastest["bf16"]
    md = report.render_md(r, "plots")
    assert "Each precision's own frontier" in md and "plots/precision_frontier.png" in md


def test_catalog_listing_says_what_is_a_stand_in():
    from sweep.cli.catalog import gpu_lines

    lines = {ln.split()[0]: ln for ln in gpu_lines()}
    assert "attention is a stand-in" in lines["mi300x"] and "stand-in" in lines["mi355x"]
    assert "stand-in" not in lines["h100-sxm"]
    assert "mxfp4 10,066" in lines["mi355x"] and "nvfp4 9,000" in lines["b200"]
