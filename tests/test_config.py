"""Run/space file validation: every wrong field gives ONE line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweep.config import (
    fixed_columns, load_run, load_space, parse_axis, parse_run, parse_space, read_yaml,
)
from sweep.errors import ConfigError
from sweep.engine.space import Space

ROOT = Path(__file__).resolve().parents[1]
# pre-training files (`task: rl` files have their own schema and tests: tests/test_rl.py)
SPACES = sorted(p for p in (ROOT / "search_spaces").glob("*.yaml")
                if "task: rl" not in p.read_text())
EXAMPLES = sorted(p for p in (ROOT / "search_spaces" / "examples").glob("*.yaml")
                  if "task: rl" not in p.read_text())

RUN = {
    "model": "gpt3-175b", "seq_len": 2048, "global_batch": 1536, "precision": "bf16",
    "cluster": {"gpu": "a100-80gb", "num_gpus": 1024, "gpus_per_node": 8},
    "parallel": {"tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full"},
}


def space_doc(**over):
    d = {"name": "t", **{k: v for k, v in RUN.items() if k != "parallel"},
         "space": {"tp": [1, 2, 4, 8], "pp": [1, 2]}}
    d.update(over)
    return d


def error_of(fn, *args) -> str:
    with pytest.raises(ConfigError) as ei:
        fn(*args)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_shipped_spaces_parse():
    names = {p.name for p in SPACES}
    assert {"gpt3-175b-1024xa100.yaml", "llama3-70b-h100.yaml", "llama3.1-405b-h100.yaml",
            "quickstart.yaml"} <= names
    for p in SPACES:
        cfg = load_space(p)
        assert cfg.name == p.stem
        assert Space.from_config(cfg).size > 1


def test_gpt3_space_is_big_enough():
    space = Space.from_config(load_space(ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml"))
    assert space.size >= 20_000


def test_shipped_examples_parse():
    names = {p.name for p in EXAMPLES}
    assert "gpt3-175b-1024xa100.yaml" in names
    for p in EXAMPLES:
        cfg = load_run(p)
        row = fixed_columns(cfg)
        assert row["gpu"] and row["seq_len"] > 0
    gpt3 = fixed_columns(load_run(ROOT / "search_spaces/examples/gpt3-175b-1024xa100.yaml"))
    assert (gpt3["tp"], gpt3["pp"], gpt3["micro_batch"], gpt3["recompute"]) == (8, 16, 1, "full")


def test_fixed_columns_defaults_and_derivations():
    row = fixed_columns(parse_run(RUN))
    assert row["model"] == "gpt3-175b" and row["num_gpus"] == 1024
    assert row["cp"] == 1 and "dp" not in row  # dp derived
    # the framework's defaults are filled per configuration, not in the fixed row
    assert "zero" not in row and row["framework"] == "megatron-core"
    from sim_core.frameworks import resolve_frame
    import pandas as pd
    assert resolve_frame(pd.DataFrame([row]))["zero"].iloc[0] == 1
    d = dict(RUN, cluster={"gpu": "h100-sxm", "nodes": 4}, parallel={"fsdp": True})
    row = fixed_columns(parse_run(d))
    assert row["nodes"] == 4 and "num_gpus" not in row and row["zero"] == 3


def test_inline_model():
    d = dict(RUN, model={"name": "tiny", "layers": 4, "hidden": 256, "heads": 4, "ffn": 1024,
                         "vocab": 1000, "activation": "gelu"})
    row = fixed_columns(parse_run(d))
    assert row["model"] == "tiny" and row["layers"] == 4 and row["seq_len"] == 2048


@pytest.mark.parametrize("model, expect", [
    ({"layers": "x", "hidden": 1, "heads": 1, "ffn": 1, "vocab": 1}, "model.layers"),
    ({"layrs": 4}, "unknown field 'model.layrs'; did you mean 'layers'?"),
    ({"hidden": 64}, "model.layers: required field is missing"),
    (42, "model: expected a model catalog id"),
])
def test_inline_model_errors(model, expect):
    assert expect in error_of(parse_run, dict(RUN, model=model))


@pytest.mark.parametrize("spec, values", [
    ([1, 2, 4], [1, 2, 4]),
    (8, [8]),
    ({"range": [1, 4]}, [1, 2, 3, 4]),
    ({"range": [2, 10], "step": 4}, [2, 6, 10]),
    ({"pow2": [1, 64]}, [1, 2, 4, 8, 16, 32, 64]),
    ({"pow2": [3, 20]}, [4, 8, 16]),
    ({"values": [2, 2, 1]}, [2, 1]),  # duplicates dropped
])
def test_axis_forms(spec, values):
    assert parse_axis("tp", spec) == values


def test_axis_values_typed():
    assert parse_axis("recompute", ["None", "full"]) == ["none", "full"]
    assert parse_axis("sequence_parallel", [False, True]) == [False, True]
    assert parse_axis("zero", {"range": [0, 3]}) == [0, 1, 2, 3]
    assert parse_axis("gpu", ["a100-80gb", "h100-sxm"]) == ["a100-80gb", "h100-sxm"]


@pytest.mark.parametrize("name, spec, expect", [
    ("tp", ["abc"], "space.tp: expected a list of positive integers, got 'abc'"),
    ("tp", "abc", "space.tp: expected a list of positive integers, got 'abc'"),
    ("tp", [0, 1], "space.tp: expected a list of positive integers, got 0"),
    ("pp", [-2], "space.pp: expected a list of positive integers, got -2"),
    ("tp", [2.5], "space.tp: expected a list of positive integers, got 2.5"),
    ("tp", [True], "space.tp: expected a list of positive integers, got True"),
    ("tp", [], "space.tp: expected a non-empty list"),
    ("tp", None, "space.tp: expected a list of positive integers, got None"),
    ("zero", [4], "space.zero: expected a list of integers 0-3, got 4"),
    ("recompute", ["some"], "space.recompute: expected a list of values among none, selective"),
    ("sequence_parallel", ["yes"], "space.sequence_parallel: expected a list of booleans"),
    ("tp", {"range": [8, 1]}, "space.tp.range: low 8 is above high 1"),
    ("tp", {"range": [1, 8], "step": 0}, "space.tp.step: expected a positive integer"),
    ("tp", {"pow2": [0, 8]}, "space.tp.pow2: expected [low, high] positive integers"),
    ("tp", {"log": [1, 8]}, "space.tp: expected a list, {range: [low, high], step: n}"),
    ("micro_batchs", [1], "unknown field 'space.micro_batchs'; did you mean 'micro_batch'?"),
    ("dp", [1, 2], "unknown field 'space.dp'; dp is derived"),
    ("gpu", ["h100"], "space.gpu: unknown gpu 'h100': did you mean 'h100-sxm'?"),
    ("model", ["gpt3-176b"], "space.model: unknown model 'gpt3-176b'"),
])
def test_axis_errors(name, spec, expect):
    assert expect in error_of(parse_axis, name, spec)


@pytest.mark.parametrize("change, expect", [
    ({"seqlen": 2048}, "unknown field 'seqlen'; did you mean 'seq_len'?"),
    ({"cluster": {"gpu": "a100-80gb", "num_gpu": 8}},
     "unknown field 'cluster.num_gpu'; did you mean 'num_gpus'?"),
    ({"parallel": {"tpp": 2}}, "unknown field 'parallel.tpp'; did you mean 'tp'?"),
    ({"parallel": {"tp": "abc"}}, "parallel.tp: expected a positive integer, got 'abc'"),
    ({"parallel": {"tp": 0}}, "parallel.tp: expected a positive integer, got 0"),
    ({"parallel": {"recompute": "most"}}, "parallel.recompute: expected one of 'none'"),
    ({"parallel": {"zero": 5}}, "parallel.zero: expected an integer 0-3 (3 = FSDP), got 5"),
    ({"parallel": {"sequence_parallel": "yes"}}, "parallel.sequence_parallel: expected true"),
    ({"parallel": {"loss_impl": "liger"}}, "parallel.loss_impl: expected one of 'fused'"),
    ({"cluster": {"gpu": "a100-80gb", "num_gpus": -8}},
     "cluster.num_gpus: expected a positive integer, got -8"),
    ({"cluster": {"gpu": "a100-80gb", "num_gpus": 0}},
     "cluster.num_gpus: expected a positive integer, got 0"),
    ({"cluster": {"gpu": "h100", "num_gpus": 8}},
     "cluster.gpu: unknown gpu 'h100': did you mean 'h100-sxm'?"),
    ({"cluster": {"num_gpus": 8}}, "cluster.gpu: required field is missing"),
    ({"cluster": {"gpu": "a100-80gb"}}, "cluster.num_gpus: required field is missing"),
    ({"cluster": {"gpu": "a100-80gb", "num_gpus": 8, "nodes": 1}}, "not both"),
    # a string names a cloud instance type (issue 26: `cluster: aws-p5`); other scalars are
    # still not a mapping
    ({"cluster": "big"}, "cluster.instance: unknown instance 'big'"),
    ({"cluster": 5}, "cluster: expected a mapping of fields, got 5"),
    ({"model": "gpt-3"}, "model: unknown model 'gpt-3'"),
    ({"seq_len": 0}, "seq_len: expected a positive integer, got 0"),
    ({"global_batch": "many"}, "global_batch: expected a positive integer, got 'many'"),
    ({"global_batch_tokens": 1 << 20}, "give global_batch or global_batch_tokens, not both"),
    ({"precision": "fp16"}, "precision: expected one of 'bf16', 'fp8', 'nvfp4' or 'mxfp4', got 'fp16'"),
])
def test_run_errors(change, expect):
    assert expect in error_of(parse_run, {**RUN, **change})


def test_missing_required():
    d = dict(RUN)
    del d["seq_len"]
    assert error_of(parse_run, d) == "seq_len: required field is missing"
    d = dict(RUN)
    del d["global_batch"]
    assert "global_batch: required field is missing" in error_of(parse_run, d)


@pytest.mark.parametrize("change, expect", [
    ({"name": "a b"}, "name: expected a name of letters"),
    ({"search": {"strategy": "bayes"}},
     "search.strategy: expected one of 'grid', 'optuna' or 'auto'"),
    ({"search": {"objectives": ["speed"]}}, "search.objectives.0: expected one of"),
    ({"search": {"trials": 0}}, "search.trials: expected a positive integer, got 0"),
    ({"search": {"sampelr": "tpe"}}, "unknown field 'search.sampelr'; did you mean 'sampler'?"),
    ({"search": {"objectives": ["cost", "cost"]}}, "search.objectives: duplicate"),
    ({"space": {"num_gpus": [8], "nodes": [1]}}, "space: vary num_gpus or nodes, not both"),
    ({"space": ["tp"]}, "space: expected a mapping of fields"),
    ({"spaces": {}}, "unknown field 'spaces'; did you mean 'space'?"),
])
def test_space_errors(change, expect):
    assert expect in error_of(parse_space, space_doc(**change))


def test_space_overrides_fixed_and_cluster_axes():
    d = space_doc(parallel={"tp": 8, "pp": 4},
                  space={"tp": [1, 2], "nodes": [1, 2], "gpu": ["a100-80gb", "h100-sxm"]})
    space = Space.from_config(parse_space(d))
    assert "tp" not in space.fixed and space.fixed["pp"] == 4
    assert "num_gpus" not in space.fixed  # nodes varies instead
    assert space.size == 8


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nspace:\n  tp: [1, 2\n  pp: [1]\n")
    msg = error_of(read_yaml, bad)
    assert msg.startswith(f"{bad}: invalid YAML at line")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert "file is empty" in error_of(read_yaml, empty)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    assert "expected a mapping of fields at the top level, got list" in error_of(read_yaml, lst)
    assert "no such file" in error_of(read_yaml, tmp_path / "nope.yaml")


def test_load_space_name_from_file(tmp_path):
    d = space_doc()
    del d["name"]
    p = tmp_path / "my-space.yaml"
    p.write_text(yaml.safe_dump(d))
    assert load_space(p).name == "my-space"


def test_run_file_refuses_space_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(space_doc()))
    assert "this is a search-space file" in error_of(load_run, p)
