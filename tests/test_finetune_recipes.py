"""Fine-tuning recipes (issue 39): every key the torchtune YAML, the TRL / Accelerate configs and
the Megatron-Bridge override write is one the framework's code declares (known_flags/*.tsv,
extracted by extract.py), and the exported run.yaml reprices the same fine-tuning run."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from sim_core import frameworks
from sim_core.simulate import simulate_frame
from sweep.advice import export, finetune_recipes as fr
from sweep.config.files import fixed_columns, parse_run

ROW = dict(model="llama3.1-70b", seq_len=8192, global_batch=16, precision="bf16",
           gpu="h100-sxm", num_gpus=16, gpus_per_node=8, tp=2, pp=2, cp=2, vpp=1, dp=2,
           micro_batch=1, recompute="full", zero=1, sequence_parallel=True,
           framework="megatron-core", task="lora", lora_rank=16, lora_alpha=32.0,
           lora_targets=15, lora_dropout=0.05, packing=True, mean_seq_len=0)


@pytest.mark.parametrize("task", ["lora", "qlora", "sft"])
@pytest.mark.parametrize("fmt", ["torchtune", "trl", "accelerate", "megatron-bridge"])
def test_every_key_written_is_declared_by_the_framework(fmt, task):
    row = dict(ROW, task=task)
    assert fr.unknown_keys(fmt, row) == []


def test_the_key_check_can_fail():
    assert "model.bogus_rank" not in export.known_keys("torchtune")
    assert "lora_rank" not in export.known_keys("trl")  # TRL names it lora_r
    assert "peft.rank" not in export.known_keys("megatron_bridge")  # Megatron-Bridge: dim


def test_recipes_carry_the_adapter_settings():
    tt = fr.torchtune_config(dict(ROW, task="qlora", lora_targets=1 | 4))
    assert tt["model"]["_component_"] == "torchtune.models.llama3_1.qlora_llama3_1_70b"
    assert tt["model"]["lora_attn_modules"] == ["q_proj", "k_proj", "v_proj"]
    assert tt["model"]["apply_lora_to_mlp"] and tt["model"]["lora_rank"] == 16
    assert tt["gradient_accumulation_steps"] == 16 // (2 * 1)
    trl = fr.trl_config(dict(ROW, task="qlora"))
    assert trl["load_in_4bit"] and trl["bnb_4bit_quant_type"] == "nf4"
    assert trl["lora_target_modules"][-1] == "down_proj" and trl["lora_r"] == 16
    br = fr.bridge_overrides(ROW)
    assert br["peft.target_modules"] == ["linear_qkv", "linear_proj", "linear_fc1",
                                         "linear_fc2"]
    assert br["model.context_parallel_size"] == 2 and br["peft.dim"] == 16
    assert fr.files_for(dict(ROW, task="pretrain")) == []
    assert [n for n, _ in fr.files_for(dict(ROW, framework="hf-trl", zero=3, pp=1, tp=1,
                                            cp=1, dp=16))] == ["trl_sft.yaml",
                                                               "accelerate.yaml"]


def test_exported_run_yaml_reprices_the_fine_tuning_run():
    row = dict(ROW, framework="torchtune", tp=1, pp=1, cp=1, dp=16, zero=3,
               sequence_parallel=False, task="qlora", attention_kernel="fa2",
               recompute="full")
    # a search row carries its framework's defaults (frameworks.resolve_frame), as here
    row = frameworks.resolve_frame(pd.DataFrame([row])).iloc[0].to_dict()
    text = export.run_yaml(row)
    run = yaml.safe_load(text)
    assert run["task"] == "qlora" and run["peft"]["targets"] == ["qkv", "proj", "fc1", "fc2"]
    again = simulate_frame(pd.DataFrame([fixed_columns(parse_run(run))])).iloc[0]
    first = simulate_frame(pd.DataFrame([row])).iloc[0]
    assert again["step_time_s"] == pytest.approx(first["step_time_s"], rel=1e-9)
    assert again["peak_memory_gib"] == pytest.approx(first["peak_memory_gib"], rel=1e-9)


@pytest.mark.parametrize("recipe,preset", sorted(fr.BRIDGE_FP8_PRESETS.items()))
def test_bridge_override_writes_the_priced_precision_and_weight_cache(recipe, preset):
    """The Bridge file must run what was priced: the FP8 preset of the recipe, and
    disable_parameter_transpose_cache where the row was priced without TE's weight cache."""
    row = dict(ROW, precision="fp8", fp8_recipe=recipe, fp8_weight_cache=False)
    br = fr.bridge_overrides(row)
    assert br["mixed_precision"] == preset
    assert br["model.disable_parameter_transpose_cache"] is True
    assert fr.unknown_keys("megatron-bridge", row) == []
    assert "model.disable_parameter_transpose_cache" not in fr.bridge_overrides(
        dict(row, fp8_weight_cache=True))
    assert fr.bridge_overrides(dict(ROW, precision="bf16"))["mixed_precision"] == "bf16_mixed"
    assert f"cfg.mixed_precision = {preset!r}" in fr.bridge_py(row)


def test_bridge_precision_preset_is_checked_against_the_registry():
    assert "mixed_precision=bf16_with_fp8_current_scaling_mixed" in export.known_keys(
        "megatron_bridge")
    assert "mixed_precision=bf16_with_fp8_tensorwise_mixed" not in export.known_keys(
        "megatron_bridge")
