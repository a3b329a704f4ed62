"""Recipes: Megatron-LM flags and torchtitan TOML keys are the projects' real names (checked
against the declared lists in sweep/advice/data/known_flags/, with their source commits), the
Megatron flags parse with an argparse parser built from that list, the TOML parses with
tomllib, and the run YAML simulates to the same step time."""

from __future__ import annotations

import tomllib

import pandas as pd
import pytest
import yaml

from sweep.advice import export
from sweep.advice.simulation import simulate_run
from sweep.config import parse_run, parse_space
from sweep.engine.evaluate import evaluate
from sweep.engine.space import Space

BASE = {"model": "llama3-70b", "seq_len": 8192, "global_batch": 256,
        "cluster": {"gpu": "h100-sxm", "num_gpus": 256}}
CASES = [  # (model and run overrides, parallel)
    ({}, {"tp": 8, "pp": 4, "vpp": 2, "micro_batch": 1, "recompute": "full",
          "sequence_parallel": True, "zero": 1}),
    ({"precision": "fp8"}, {"tp": 4, "pp": 2, "cp": 2, "micro_batch": 2,
                            "recompute": "selective", "sequence_parallel": True, "zero": 3,
                            "tp_comm_overlap": True}),
    ({}, {"tp": 2, "pp": 1, "micro_batch": 1, "zero": 0, "grad_reduce_fp32": False,
          "attention_kernel": "fa2"}),
    ({}, {"tp": 4, "pp": 2, "zero": 2, "micro_batch": 1, "recompute": "full"}),
    ({"model": "llama3.1-405b", "global_batch": 512, "cluster": {"gpu": "h100-sxm",
                                                                 "num_gpus": 1024}},
     {"tp": 8, "pp": 16, "vpp": 2, "micro_batch": 1, "recompute": "full",
      "sequence_parallel": True}),  # 126 layers: uneven split
    ({"model": "mixtral-8x7b", "seq_len": 4096, "global_batch": 512,
      "cluster": {"gpu": "h100-sxm", "num_gpus": 64}},
     {"tp": 2, "pp": 2, "vpp": 2, "ep": 8, "micro_batch": 1, "sequence_parallel": True,
      "moe_a2a_overlap": True, "moe_delay_wgrad": True, "moe_dispatcher": "flex",
      "moe_permute_fusion": True, "moe_router_fusion": True}),
    ({"model": "deepseek-v3", "seq_len": 4096, "global_batch": 4096,
      "cluster": {"gpu": "h100-sxm", "num_gpus": 1024}},
     {"tp": 2, "pp": 16, "ep": 64, "micro_batch": 1, "recompute": "full",
      "sequence_parallel": True}),
]


def _row(over: dict, parallel: dict) -> pd.Series:
    d = {**BASE, **over, "parallel": parallel}
    space = Space.from_config(parse_run(d))
    out = evaluate(space.frame(0, 1))
    return out.iloc[0]


@pytest.fixture(scope="module")
def rows():
    return [_row(o, p) for o, p in CASES]


@pytest.fixture(scope="module")
def gpt3_best():
    """Best GPT-3 175B configuration on 1024 A100 of a small in-process grid."""
    cfg = parse_space({
        "name": "g", "model": "gpt3-175b", "seq_len": 2048, "global_batch": 1536,
        "cluster": {"gpu": "a100-80gb", "num_gpus": 1024},
        "space": {"tp": [4, 8], "pp": [8, 16], "vpp": [1, 2, 6], "micro_batch": [1, 2],
                  "recompute": ["none", "full"], "sequence_parallel": [True]}})
    space = Space.from_config(cfg)
    df = evaluate(space.frame(0, space.size))
    ok = df[df["status"] == "ok"].sort_values("step_time_s")
    return ok.iloc[0]


def test_known_flag_lists_have_sources():
    for name in ("megatron_lm.tsv", "torchtitan.tsv"):
        head = (export.KNOWN_FLAGS_DIR / name).read_text().splitlines()[:3]
        assert any("commit" in h and len(h.split("commit")[1].strip()) >= 40 for h in head)
    flags = export.known_megatron_flags()
    assert len(flags) > 400 and flags["--recompute-granularity"] == ("value", ["full", "selective"])
    assert "parallelism.tensor_parallel_degree" in export.known_torchtitan_keys()


def test_megatron_flags_are_known_and_parse(rows, gpt3_best):
    known = export.known_megatron_flags()
    parser = export.megatron_parser()
    for row in rows + [gpt3_best]:
        args = export.megatron_args(row)
        flags = [a for a in args if a.startswith("--")]
        assert flags and all(f in known for f in flags), [f for f in flags if f not in known]
        assert len(set(flags)) == len(flags)
        ns = parser.parse_args(args)  # choices and arity from the declared list
        text_args = export.parse_megatron_text(export.megatron_text(row))
        assert text_args == args
        d = export.config_of(row)
        assert int(ns.tensor_model_parallel_size) == d["tp"]
        assert int(ns.pipeline_model_parallel_size) == d["pp"]
        assert int(ns.micro_batch_size) == d["micro_batch"]
        assert int(ns.global_batch_size) == d["global_batch"]
        assert int(ns.seq_length) == d["seq_len"]
        assert ns.bf16
        assert ns.sequence_parallel == bool(d["sequence_parallel"] and d["tp"] > 1)
        assert ns.recompute_granularity == (None if d["recompute"] == "none" else d["recompute"])
        assert ns.use_distributed_optimizer == (d["zero"] == 1)
        if d["zero"] in (2, 3):
            assert ns.use_megatron_fsdp
            assert ns.data_parallel_sharding_strategy == (
                "optim_grads" if d["zero"] == 2 else "optim_grads_params")
        assert (ns.fp8_format == "hybrid") == (d["precision"] == "fp8")
        if d["cp"] > 1:
            assert int(ns.context_parallel_size) == d["cp"]
        if d["vpp"] > 1:
            n_layers = int(ns.num_layers)
            if ns.num_layers_per_virtual_pipeline_stage:
                assert n_layers // (d["pp"] * int(ns.num_layers_per_virtual_pipeline_stage)) \
                    == d["vpp"]
            else:
                assert int(ns.num_virtual_stages_per_pipeline_rank) == d["vpp"]


def test_megatron_moe_and_mla(rows):
    ns = export.megatron_parser().parse_args(export.megatron_args(rows[5]))
    assert int(ns.num_experts) == 8 and int(ns.expert_model_parallel_size) == 8
    assert ns.overlap_moe_expert_parallel_comm and ns.delay_wgrad_compute
    assert ns.moe_token_dispatcher_type == "flex" and ns.moe_enable_deepep
    assert ns.moe_permute_fusion and ns.moe_router_fusion and ns.moe_grouped_gemm
    assert rows[5]["status"] == "ok", rows[5]["invalid_reason"]
    ns = export.megatron_parser().parse_args(export.megatron_args(rows[6]))
    assert ns.multi_latent_attention and int(ns.kv_lora_rank) > 0
    assert ns.moe_layer_freq.startswith("([0]*")


def test_megatron_sliding_window(rows):
    """GPT-OSS: HF's 128-key window is TE's (127, 0) on every other layer; windowless models
    pass no window flag."""
    row = _row({"model": "gpt-oss-120b", "seq_len": 4096, "global_batch": 512,
                "cluster": {"gpu": "h100-sxm", "num_gpus": 64}},
               {"tp": 1, "pp": 4, "ep": 8, "micro_batch": 1})
    args = export.megatron_args(row)
    known = export.known_megatron_flags()
    assert all(f in known for f in args if f.startswith("--"))
    ns = export.megatron_parser().parse_args(args)
    assert ns.window_size == "127,0" and int(ns.window_attn_skip_freq) == 2
    assert all("--window-size" not in export.megatron_args(r) for r in rows)


def test_megatron_flags_name_the_cross_entropy_that_was_priced():
    """vocab_parallel is Megatron's default (no flag); fused adds --cross-entropy-loss-fusion,
    te also --cross-entropy-fusion-impl te (workload.LOSS_TRAFFIC prices each differently)."""
    parallel = {"tp": 8, "pp": 4, "micro_batch": 1, "sequence_parallel": True}
    got = {}
    for impl in ("vocab_parallel", "fused", "te"):
        ns = export.megatron_parser().parse_args(
            export.megatron_args(_row({}, {**parallel, "loss_impl": impl})))
        got[impl] = (bool(ns.cross_entropy_loss_fusion), ns.cross_entropy_fusion_impl)
    assert got == {"vocab_parallel": (False, None), "fused": (True, None), "te": (True, "te")}


def test_gpt3_175b_1024_a100_flags(gpt3_best):
    args = export.megatron_args(gpt3_best)
    d = export.config_of(gpt3_best)
    assert args[:4] == ["--tensor-model-parallel-size", str(d["tp"]),
                        "--pipeline-model-parallel-size", str(d["pp"])]
    for want in ("--num-layers", "96", "--hidden-size", "12288", "--global-batch-size", "1536",
                 "--bf16"):
        assert want in args



def test_torchtitan_toml_keys_are_known(rows, gpt3_best):
    known = export.known_torchtitan_keys()
    for row in rows + [gpt3_best]:
        doc = tomllib.loads(export.torchtitan_toml(row))
        flat = export.flatten(doc)
        for key, value in flat.items():
            assert key in known, key
            typ, choices = known[key]
            if choices:
                assert str(value) in choices, (key, value)
            base = typ.split("|")[0]
            pytype = {"int": int, "bool": bool, "str": str, "float": (int, float)}.get(base)
            if base.startswith("list"):
                assert isinstance(value, list), key
            elif pytype is not None:
                assert isinstance(value, pytype) and (base == "bool") == isinstance(value, bool), \
                    (key, value)
        d = export.config_of(row)
        par = doc["parallelism"]
        assert par["tensor_parallel_degree"] == d["tp"]
        assert par["pipeline_parallel_degree"] == d["pp"]
        assert par["context_parallel_degree"] == d["cp"]
        assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == d["dp"]
        assert doc["activation_checkpoint"]["mode"] == d["recompute"]
        assert doc["training"]["global_batch_size"] == d["global_batch"]
        assert ("quantize.linear.float8" in doc["model"].get("converters", [])) == \
            (d["precision"] == "fp8")
        if d["pp"] > 1:
            assert doc["training"]["local_batch_size"] * d["dp"] == d["global_batch"]


def test_run_yaml_round_trip(rows, gpt3_best):
    for row in rows[:4] + [gpt3_best]:
        doc = yaml.safe_load(export.run_yaml(row))
        rep = simulate_run(parse_run(doc))
        assert rep["step_time_s"] == pytest.approx(float(row["step_time_s"]), rel=1e-9)
        assert rep["peak_memory_gib"] == pytest.approx(float(row["peak_memory_gib"]), rel=1e-9)
