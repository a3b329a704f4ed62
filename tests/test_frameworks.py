"""Framework profiles: each profile's defaults, byte counts and missing settings, checked against
values derived by hand from that framework's code (cited in catalogs/frameworks.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim_core import frameworks, risk
from sim_core.accuracy import memory_error
from sim_core.memory import LOSS_BYTES, LOSS_SEGMENT_BYTES
from sim_core.simulate import check_rules, simulate_frame
from sim_core.specs import LOSS_IMPL
from sweep.advice import export

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024.0**3

BASE = dict(model="llama3-8b", seq_len=4096, global_batch=256, precision="bf16", gpu="h100-sxm",
            num_gpus=64, gpus_per_node=8, tp=1, pp=1, cp=1, ep=1, vpp=1, micro_batch=1,
            recompute="none", zero=1)


def run(**kw) -> pd.Series:
    """Simulate one configuration; framework defaults fill what is not given."""
    row = pd.DataFrame([{**BASE, **kw}])
    return simulate_frame(row).iloc[0]


def resolved(**kw) -> pd.Series:
    return frameworks.resolve_frame(pd.DataFrame([{**BASE, **kw}])).iloc[0]


# ---- defaults -------------------------------------------------------------------------------
def test_every_profile_sets_the_same_fields_with_a_source():
    fields = frameworks.profile_fields()
    assert {"loss_impl", "grad_reduce_fp32", "fused_elementwise", "zero", "pp_schedule"} <= set(fields)
    for fid, p in frameworks.profiles().items():
        assert p["code"], fid
        for f, e in p["defaults"].items():
            assert e["source"].strip(), (fid, f)
        assert p["memory"]["source"] and p["supports"]["source"]


def test_megatron_defaults_are_the_old_spec_defaults():
    r = resolved(framework="megatron-core")
    # the loss: Megatron's CLI default, the unfused vocab-parallel CE (--cross-entropy-loss-fusion
    # is opt-in); the spec default follows the profile
    assert (r["loss_impl"], r["grad_reduce_fp32"], r["fused_elementwise"], r["zero"]) == \
        ("vocab_parallel", True, True, 1)
    assert r["attention_kernel"] == "fa3" and r["pp_schedule"] == "1f1b"


def test_torchtitan_defaults_depend_on_tp():
    # torchtitan/components/loss.py eager CE; DTensor loss_parallel under TP; FSDP2 by default;
    # its TP plan always shards the sequence between TP regions
    one, four = resolved(framework="torchtitan", zero=None), resolved(framework="torchtitan",
                                                                      tp=4, zero=None)
    assert one["loss_impl"] == "eager" and four["loss_impl"] == "eager_parallel"
    assert not one["sequence_parallel"] and four["sequence_parallel"]
    assert one["zero"] == 3 and not one["fused_elementwise"] and one["attention_kernel"] == "fa2"


def test_nemo_recipes_turn_on_tp_overlap_and_bf16_grads():
    r = resolved(framework="nemo", tp=4)
    assert r["tp_comm_overlap"] and r["sequence_parallel"] and not r["grad_reduce_fp32"]
    assert not resolved(framework="nemo", tp=1)["tp_comm_overlap"]


def test_a_field_set_by_hand_wins_over_the_profile():
    r = resolved(framework="nanotron", loss_impl="fused", zero=1)
    assert r["loss_impl"] == "fused" and r["zero"] == 1
    assert resolved(framework="nanotron", zero=None)["zero"] == 0  # examples' zero_stage: 0


def test_unknown_framework_is_one_line():
    from sim_core.catalog import CatalogError

    with pytest.raises(CatalogError, match="framework: unknown value 'jax'; allowed: megatron-core"):
        frameworks.resolve_frame(pd.DataFrame([{**BASE, "framework": "jax"}]))


# ---- byte counts ----------------------------------------------------------------------------
def test_nanotron_keeps_full_fp32_grads_and_ddp_buckets_under_zero1():
    """FP32GradientAccumulator keeps fp32 buffers for all parameters even under ZeRO-1, and torch
    DDP keeps bf16 buckets: 4 + 2 B per parameter where Megatron's distributed optimizer keeps a
    4 B main_grad buffer; optimizer states (12 B, sharded over dp) are the same."""
    mega = run(framework="megatron-core", loss_impl="fused")
    nano = run(framework="nanotron", zero=1)
    params = mega["params_per_gpu"]
    assert mega["mem_grads"] * GIB == pytest.approx(4.0 * params, rel=1e-9)
    assert nano["mem_grads"] * GIB == pytest.approx(6.0 * params, rel=1e-9)
    assert nano["mem_optimizer"] == pytest.approx(mega["mem_optimizer"], rel=1e-9)
    # at ZeRO-2 Megatron-FSDP shards its buffer; nanotron has no ZeRO-2
    assert "nanotron has no ZeRO stage 2" in check_rules(pd.DataFrame([{**BASE, "framework":
                                                                       "nanotron", "zero": 2}]))[0]


def test_nanotron_cross_entropy_bytes():
    """_ShardedCrossEntropy: fp32 logits (4) + shifted copy made softmax in place and saved (4);
    reserved adds the freed bf16 logits' block (2)."""
    i = LOSS_IMPL.index("fp32_parallel")
    assert (LOSS_BYTES[i], LOSS_SEGMENT_BYTES[i]) == (8.0, 10.0)
    assert resolved(framework="nanotron")["loss_impl"] == "fp32_parallel"


def test_eager_glu_keeps_one_more_ffn_tensor():
    """act(gate) * up in eager PyTorch keeps act(gate) for the multiply: 2 B x tokens x ffn per
    layer more than a fused SwiGLU."""
    fused = run(framework="megatron-core", fused_glu=True)
    eager = run(framework="megatron-core", fused_glu=False)
    tokens, ffn, layers = 4096, 14336, 32
    extra = (eager["mem_activations"] - fused["mem_activations"]) * GIB
    from sim_core.memory import FRAGMENTATION

    assert extra == pytest.approx(FRAGMENTATION * 2.0 * tokens * ffn * layers, rel=1e-6)


def test_deepspeed_bf16_optimizer_layout():
    """engine.py sends bf16 + fp32 accumulation at stage 0/1 to BF16_Optimizer: a full fp32
    gradient buffer plus the bf16 .grad it clears only at the next backward (4 + 2 B), and fp32
    master weights + Adam states partitioned over dp even at stage 0."""
    ds = run(framework="deepspeed", zero=0)
    mega = run(framework="megatron-core", zero=0)
    params = ds["params_per_gpu"]
    assert ds["mem_grads"] * GIB == pytest.approx(6.0 * params, rel=1e-9)
    assert ds["mem_optimizer"] * GIB == pytest.approx(12.0 * params / 64, rel=1e-9)
    assert mega["mem_optimizer"] * GIB == pytest.approx(12.0 * params, rel=1e-9)
    assert resolved(framework="deepspeed", zero=None)["zero"] == 0


def test_deepspeed_zero2_holds_its_reduce_bucket():
    """zero/config.py reduce_bucket_size = 5e8 elements, one bf16 bucket at stage 2."""
    z1 = run(framework="deepspeed", zero=1)
    z2 = run(framework="deepspeed", zero=2)
    assert (z2["mem_buffers"] - z1["mem_buffers"]) * GIB == pytest.approx(2 * 5e8, rel=1e-9)


def test_afab_keeps_every_microbatch_in_flight():
    """All-forward-all-backward finishes all forwards first: activations of all m micro-batches
    on the first stage, against pp for 1F1B."""
    kw = dict(framework="nanotron", pp=4, num_gpus=32, recompute="none")
    a = run(pp_schedule="afab", **kw)
    b = run(pp_schedule="1f1b", **kw)
    m = a["num_microbatches"]
    assert m == 32
    assert a["mem_activations"] / b["mem_activations"] == pytest.approx(m / 4, rel=0.02)


# ---- settings a framework does not have ------------------------------------------------------
@pytest.mark.parametrize("fw, change, reason", [
    ("nanotron", {"vpp": 2, "pp": 2}, "nanotron has no interleaved pipeline schedule (vpp > 1)"),
    ("nanotron", {"recompute": "selective"}, "nanotron has no selective recompute"),
    ("nanotron", {"cp": 2}, "nanotron has no context parallelism (cp > 1)"),
    ("llm-foundry", {"pp": 2, "zero": 3}, "llm-foundry has no pipeline parallelism (pp > 1)"),
    ("deepspeed", {"pp": 2, "zero": 2}, "deepspeed has no ZeRO-2/3 with pipeline parallelism"),
    ("deepspeed", {"tp": 2, "tp_comm_overlap": True}, "deepspeed has no TP communication overlap"),
    ("megatron-core", {"pp": 2, "pp_schedule": "afab"}, "megatron-core has no afab pipeline schedule"),
])
def test_missing_settings_are_invalid_with_the_reason(fw, change, reason):
    got = check_rules(pd.DataFrame([{**BASE, "framework": fw, **change}]))[0]
    assert got == reason


def test_settings_a_framework_ignores_are_not_invalid():
    # an afab schedule without a pipeline, TP overlap at tp = 1: nothing to do, not invalid
    ok = pd.DataFrame([{**BASE, "framework": "megatron-core", "pp_schedule": "afab"},
                       {**BASE, "framework": "deepspeed", "tp_comm_overlap": True}])
    assert list(check_rules(ok)) == ["", ""]


# ---- docs, risk table, exports ----------------------------------------------------------------
def test_docs_match_the_catalog():
    doc = (ROOT / "docs" / "frameworks.md").read_text()
    assert doc == frameworks.markdown() + "\n"


def test_memory_error_table_is_what_validate_measures():
    shipped = pd.read_csv(ROOT / "sim_core" / risk.TABLE)
    pd.testing.assert_frame_equal(shipped, memory_error.measure(), check_dtype=False, atol=1e-4)


def _best_row(fw: str, **kw) -> pd.Series:
    row = {**BASE, "framework": fw, **kw}
    frame = frameworks.resolve_frame(pd.DataFrame([row]))
    return pd.concat([frame.iloc[0], simulate_frame(frame).iloc[0]])


def test_nanotron_export_keys_and_batch():
    row = _best_row("nanotron", tp=2, pp=2, micro_batch=2, sequence_parallel=True, zero=1)
    cfg = export.nanotron_config(row)
    assert export.unknown_keys(cfg, "nanotron") == []
    par, tok = cfg["parallelism"], cfg["tokens"]
    assert par["dp"] * par["tp"] * par["pp"] == 64 and par["tp_mode"] == "REDUCE_SCATTER"
    assert par["dp"] * tok["micro_batch_size"] * tok["batch_accumulation_per_replica"] == 256
    assert cfg["optimizer"]["zero_stage"] == 1 and par["pp_engine"] == "1f1b"
    assert yaml.safe_load(export.nanotron_yaml(row)) == cfg


def test_deepspeed_export_keys_and_batch():
    row = _best_row("deepspeed", tp=2, micro_batch=2, zero=2)
    cfg = export.deepspeed_config(row)
    assert export.unknown_keys(cfg, "deepspeed") == []
    assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"]
                                       * cfg["gradient_accumulation_steps"] * 32)
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["tensor_parallel"]["autotp_size"] == 2
    assert json.loads(export.deepspeed_json(row)) == cfg


def test_an_unknown_key_is_caught():
    assert export.unknown_keys({"parallelism": {"dp": 1, "tp_overlap": True}}, "nanotron") == \
        ["parallelism.tp_overlap"]


@pytest.mark.parametrize("space, recipe", [
    ("llama3-8b-nanotron-h100.yaml", "nanotron.yaml"),
    ("llama3.1-8b-torchtitan-h100.yaml", "torchtitan.toml"),
    ("llama3-8b-frameworks-h100.yaml", "run.yaml"),
])
def test_framework_space_searches_recommends_and_exports(space, recipe, tmp_path):
    """A newcomer's space with a framework runs end to end and writes that framework's recipe."""
    sweep = Path(sys.executable).parent / "sweep"
    out = tmp_path / "r"
    r = subprocess.run([str(sweep), "search", str(ROOT / "search_spaces" / space), "--out",
                        str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert (out / "recipe" / recipe).exists() and (out / "recipe" / "run.yaml").exists()
    best = json.loads((out / "recipe" / "recommendation.json").read_text())["best"]
    assert best["oom_risk"] <= risk.DEFAULT_MAX_RISK
    if recipe == "nanotron.yaml":
        assert best["framework"] == "nanotron"
        cfg = yaml.safe_load((out / "recipe" / recipe).read_text())
        assert export.unknown_keys(cfg, "nanotron") == []
    if recipe == "torchtitan.toml":
        import tomllib

        assert best["framework"] == "torchtitan"
        cfg = tomllib.loads((out / "recipe" / recipe).read_text())
        known = export.known_torchtitan_keys()
        assert all(f"{sec}.{k}" in known for sec, body in cfg.items() for k in body)
    from sweep.results import read_results

    results, _ = read_results(out)
    # every configuration ran under its own profile: the simulated values are stored
    by_fw = results.groupby("framework")["loss_impl"].agg(lambda s: set(s))
    if "nanotron" in by_fw:
        assert "fp32_parallel" in by_fw["nanotron"]
    if "torchtitan" in by_fw:
        assert by_fw["torchtitan"] <= {"eager", "eager_parallel"}
    assert np.isfinite(results.loc[results["status"] == "ok", "step_time_s"]).all()
