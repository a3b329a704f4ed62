"""Recipes for fine-tuning runs (issue 39): a torchtune YAML, a TRL + Accelerate (FSDP2) pair of
launch configs, and a Megatron-Bridge PEFT override, written beside the other recipes.

Every key written is one its framework declares: the lists in sweep/advice/data/known_flags/
(torchtune.tsv, trl.tsv, accelerate.tsv, megatron_bridge.tsv) are extracted from each
framework's code by extract.py, and tests/test_finetune_recipes.py checks what this module
emits against them. The settings come from the configuration (task, LoRA rank / alpha /
targets / dropout, packing, sequence length, micro-batch, accumulation steps, recompute,
tensor / pipeline / context parallel sizes).
"""

from __future__ import annotations

import yaml

from sim_core import tasks

from .export import config_of, describe, flatten, known_keys, _prediction_lines

TORCHTUNE_SOURCE = "pytorch/torchtune v0.6.1 (recipes/*_finetune_*.py, models/llama3_1)"
TRL_SOURCE = ("huggingface/trl v1.9.0 (SFTConfig, ModelConfig, ScriptArguments), "
              "huggingface/accelerate v1.14.0 (config_args.py, cluster.py)")
BRIDGE_SOURCE = "NVIDIA-NeMo/Megatron-Bridge v0.6.0 (peft/lora.py LoRA, perf_recipes)"

# catalog model -> torchtune builder stem (torchtune/models/llama3_1/__init__.py v0.6.1) and the
# Hugging Face repository a TRL run loads
TORCHTUNE_MODELS = {"llama3.1-8b": ("llama3_1", "llama3_1_8b"),
                    "llama3.1-70b": ("llama3_1", "llama3_1_70b"),
                    "llama3.1-405b": ("llama3_1", "llama3_1_405b")}
HF_MODELS = {"llama3.1-8b": "meta-llama/Llama-3.1-8B", "llama3.1-70b": "meta-llama/Llama-3.1-70B",
             "llama3.1-405b": "meta-llama/Llama-3.1-405B", "llama3-8b": "meta-llama/Meta-Llama-3-8B",
             "llama3-70b": "meta-llama/Meta-Llama-3-70B"}
# our targets -> each framework's module names
TORCHTUNE_ATTN = {"qkv": ["q_proj", "k_proj", "v_proj"], "proj": ["output_proj"]}
HF_TARGETS = {"qkv": ["q_proj", "k_proj", "v_proj"], "proj": ["o_proj"],
              "fc1": ["gate_proj", "up_proj"], "fc2": ["down_proj"]}
BRIDGE_TARGETS = {"qkv": "linear_qkv", "proj": "linear_proj", "fc1": "linear_fc1",
                  "fc2": "linear_fc2"}


def _ft(d: dict) -> dict:
    """The fine-tuning fields of a configuration, defaults filled (sim_core/tasks.py)."""
    out = dict(tasks.FINETUNE_COLUMNS)
    out.update({k: d[k] for k in tasks.FINETUNE_COLUMNS if d.get(k) is not None})
    out["targets"] = tasks.targets_names(int(out["lora_targets"]))
    out["adapters"] = tasks.TASK_TRAITS[str(out["task"])]["frozen_base"]
    out["nf4"] = tasks.TASK_TRAITS[str(out["task"])]["nf4_base"]
    return out


def _accumulation(d: dict) -> int:
    return max(1, int(d["global_batch"]) // max(1, int(d["dp"]) * int(d["micro_batch"])))


def _head(d: dict, what: str, source: str, run: str) -> list[str]:
    return [f"# {what} for {d.get('model')}: {describe(d)}", f"# keys: {source}",
            f"# run: {run}", *[f"# {x}" for x in _prediction_lines(d)]]


# ---- torchtune ---------------------------------------------------------------------------------
def torchtune_config(row) -> dict:
    d = config_of(row)
    ft = _ft(d)
    pkg, stem = TORCHTUNE_MODELS.get(d.get("model"), ("llama3_1", "llama3_1_8b"))
    prefix = {"qlora": "qlora_", "lora": "lora_"}.get(str(ft["task"]), "")
    model = {"_component_": f"torchtune.models.{pkg}.{prefix}{stem}"}
    if ft["adapters"]:
        attn = [m for t in ("qkv", "proj") if t in ft["targets"] for m in TORCHTUNE_ATTN[t]]
        model.update(lora_attn_modules=attn,
                     apply_lora_to_mlp=bool({"fc1", "fc2"} & set(ft["targets"])),
                     lora_rank=int(ft["lora_rank"]), lora_alpha=float(ft["lora_alpha"]),
                     lora_dropout=float(ft["lora_dropout"]))
    return {
        "model": model,
        "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer",
                      "max_seq_len": int(d["seq_len"])},
        "dataset": {"_component_": "torchtune.datasets.alpaca_dataset",
                    "packed": bool(ft["packing"])},
        "batch_size": int(d["micro_batch"]),
        "gradient_accumulation_steps": _accumulation(d),
        "enable_activation_checkpointing": d.get("recompute") == "full",
        "dtype": "bf16",
        "compile": bool(d.get("fused_elementwise")),
        "fsdp_reshard_after_forward": True,
    }


def torchtune_yaml(row) -> str:
    d = config_of(row)
    ft = _ft(d)
    kind = "lora" if ft["adapters"] else "full"
    where = "single_device" if int(d["num_gpus"]) == 1 else "distributed"
    run = (f"tune run {kind}_finetune_{where} --config this.yaml" if where == "single_device"
           else f"tune run --nproc_per_node {min(int(d['num_gpus']), int(d['gpus_per_node']))} "
                f"{kind}_finetune_{where} --config this.yaml")
    notes = []
    if d.get("model") not in TORCHTUNE_MODELS:
        notes.append(f"# {d.get('model')} has no torchtune builder here: replace "
                     "model._component_ with the model's own")
    if "qkv" in ft["targets"]:
        notes.append("# qkv: sweep prices one fused adapter; torchtune adds one per q/k/v")
    head = _head(d, "torchtune config (keys to merge into a recipe config)", TORCHTUNE_SOURCE,
                 run) + notes + ["# add tokenizer.path, checkpointer, optimizer, lr_scheduler "
                                 "and output_dir as in recipes/configs/llama3_1/*.yaml"]
    return "\n".join(head) + "\n" + yaml.safe_dump(torchtune_config(row), sort_keys=False)


# ---- TRL + Accelerate --------------------------------------------------------------------------
def trl_config(row) -> dict:
    d = config_of(row)
    ft = _ft(d)
    cfg = {
        "model_name_or_path": HF_MODELS.get(d.get("model"), str(d.get("model"))),
        "dtype": "bfloat16",
        "attn_implementation": "flash_attention_2",
        "dataset_name": "trl-lib/Capybara",
        "max_length": int(d["seq_len"]),
        "packing": bool(ft["packing"]),
        "per_device_train_batch_size": int(d["micro_batch"]),
        "gradient_accumulation_steps": _accumulation(d),
        "gradient_checkpointing": d.get("recompute") == "full",
        "bf16": True,
        "output_dir": "out",
    }
    if ft["adapters"]:
        cfg.update(use_peft=True, lora_r=int(ft["lora_rank"]),
                   lora_alpha=int(round(float(ft["lora_alpha"]))),
                   lora_dropout=float(ft["lora_dropout"]),
                   lora_target_modules=[m for t in ft["targets"] for m in HF_TARGETS[t]])
    if ft["nf4"]:
        cfg.update(load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True)
    return cfg


def accelerate_config(row) -> dict:
    d = config_of(row)
    nodes = max(1, int(d["num_gpus"]) // int(d["gpus_per_node"]))
    fsdp = int(d.get("zero", 3)) == 3 and int(d["num_gpus"]) > 1
    cfg = {"compute_environment": "LOCAL_MACHINE",
           "distributed_type": "FSDP" if fsdp else ("MULTI_GPU" if int(d["num_gpus"]) > 1
                                                   else "NO"),
           "mixed_precision": "bf16", "num_machines": nodes, "machine_rank": 0,
           "num_processes": int(d["num_gpus"]), "main_training_function": "main",
           "use_cpu": False}
    if fsdp:
        cfg["fsdp_config"] = {"fsdp_version": 2, "fsdp_reshard_after_forward": True,
                              "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                              "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                              "fsdp_cpu_ram_efficient_loading": True,
                              "fsdp_activation_checkpointing": d.get("recompute") == "full"}
    return cfg


def trl_yaml(row) -> str:
    d = config_of(row)
    head = _head(d, "TRL SFT config", TRL_SOURCE,
                 "accelerate launch --config_file accelerate.yaml -m trl.scripts.sft "
                 "--config trl_sft.yaml (on each node, with its machine_rank)")
    return "\n".join(head) + "\n" + yaml.safe_dump(trl_config(row), sort_keys=False)


def accelerate_yaml(row) -> str:
    d = config_of(row)
    head = _head(d, "Accelerate config (FSDP2)", TRL_SOURCE,
                 "accelerate launch --config_file this.yaml ...")
    return "\n".join(head) + "\n" + yaml.safe_dump(accelerate_config(row), sort_keys=False)


# ---- Megatron-Bridge PEFT ----------------------------------------------------------------------
def bridge_overrides(row) -> dict:
    d = config_of(row)
    ft = _ft(d)
    cfg = {"model.tensor_model_parallel_size": int(d["tp"]),
           "model.pipeline_model_parallel_size": int(d["pp"]),
           "model.context_parallel_size": int(d["cp"]),
           "model.sequence_parallel": bool(d.get("sequence_parallel")) and int(d["tp"]) > 1,
           "model.seq_length": int(d["seq_len"]),
           "train.global_batch_size": int(d["global_batch"]),
           "train.micro_batch_size": int(d["micro_batch"])}
    if int(d.get("vpp", 1)) > 1:
        cfg["model.virtual_pipeline_model_parallel_size"] = int(d["vpp"])
    if d.get("recompute") == "full":
        cfg.update({"model.recompute_granularity": "full", "model.recompute_method": "uniform",
                    "model.recompute_num_layers": 1})
    cfg["mixed_precision"] = _bridge_precision(d)
    if d.get("precision") in ("fp8", "nvfp4") and d.get("fp8_weight_cache") is False:
        # priced without TE's per-step weight cache (compute.py: every weight re-quantised in
        # every micro-batch), as Bridge's fine-tuning perf configs run it
        cfg["model.disable_parameter_transpose_cache"] = True
    if ft["adapters"]:
        cfg.update({"peft.target_modules": [BRIDGE_TARGETS[t] for t in ft["targets"]],
                    "peft.dim": int(ft["lora_rank"]), "peft.alpha": float(ft["lora_alpha"]),
                    "peft.dropout": float(ft["lora_dropout"])})
    return cfg


# the precision that was priced, as a Megatron-Bridge v0.6.0 preset name
# (src/megatron/bridge/training/mixed_precision.py: get_mixed_precision_config resolves it)
BRIDGE_FP8_PRESETS = {"delayed": "bf16_with_fp8_delayed_scaling_mixed",
                      "tensorwise": "bf16_with_fp8_current_scaling_mixed",
                      "mxfp8": "bf16_with_mxfp8_mixed",
                      "blockwise": "bf16_with_fp8_subchannel_scaling_mixed"}


def _bridge_precision(d: dict) -> str:
    if d.get("precision") == "nvfp4":
        return "bf16_with_nvfp4_mixed"
    if d.get("precision") == "fp8":
        return BRIDGE_FP8_PRESETS[d.get("fp8_recipe") or "delayed"]
    return "bf16_mixed"


def bridge_py(row) -> str:
    d = config_of(row)
    ft = _ft(d)
    scheme = "lora" if ft["adapters"] else "none (full SFT)"
    head = _head(d, "Megatron-Bridge recipe overrides", BRIDGE_SOURCE,
                 "apply to the ConfigContainer of a llama finetune recipe (peft_scheme "
                 f"{scheme}), then megatron.bridge.training.finetune.finetune(cfg, ...)")
    lines = head + ([] if not ft["nf4"] else
                    ["# Megatron-Bridge has no NF4 (QLoRA) base weights: run this with torchtune "
                     "or TRL"])
    lines += [f"cfg.{k} = {v!r}" for k, v in bridge_overrides(row).items()]
    return "\n".join(lines) + "\n"


FORMATS = {"torchtune": torchtune_yaml, "trl": trl_yaml, "accelerate": accelerate_yaml,
           "megatron-bridge": bridge_py}
FILES = {"torchtune": "torchtune.yaml", "trl": "trl_sft.yaml", "accelerate": "accelerate.yaml",
         "megatron-bridge": "megatron_bridge_peft.py"}
# which files a fine-tuning configuration gets, by framework (Megatron-Core and NeMo rows get
# the Megatron-Bridge override; torchtune its YAML; hf-trl the TRL + Accelerate pair)
FOR_FRAMEWORK = {"torchtune": ("torchtune",), "hf-trl": ("trl", "accelerate"),
                 "megatron-core": ("megatron-bridge",), "nemo": ("megatron-bridge",)}


def unknown_keys(fmt: str, row) -> list[str]:
    """Keys a recipe writes that its framework does not declare (known_flags/*.tsv)."""
    if fmt == "torchtune":
        return sorted(set(flatten(torchtune_config(row))) - known_keys("torchtune"))
    if fmt == "trl":
        return sorted(set(trl_config(row)) - known_keys("trl"))
    if fmt == "accelerate":
        return sorted(set(flatten(accelerate_config(row))) - known_keys("accelerate"))
    keys = {f"{k}={v}" if k == "mixed_precision" else k for k, v in bridge_overrides(row).items()}
    return sorted(keys - known_keys("megatron_bridge"))


def files_for(row) -> list[tuple[str, str]]:
    """(file name, text) of the fine-tuning recipes of a configuration; none for
    pre-training."""
    d = config_of(row)
    if str(d.get("task") or "pretrain") == "pretrain":
        return []
    return [(FILES[f], FORMATS[f](row)) for f in FOR_FRAMEWORK.get(str(d.get("framework")), ())]
