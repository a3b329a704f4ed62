"""What a run trains: pre-training, full fine-tuning (SFT) or low-rank adapters (LoRA, QLoRA).

The task is an input of the simulator like the framework: one small enum (`TASKS`) and the
properties each task has (`TASK_TRAITS`), so that the physics (`sim_core/finetune.py`) asks
"are the base weights frozen?" or "are they stored in 4 bits?" instead of comparing names.
Adding a task is one line in TASK_TRAITS (appended: earlier codes keep their meaning).
`pretrain` is the default and leaves every prediction as it was.

The fine-tuning fields of a run (`task`, the `peft:` and `data:` sections of a run file) become
the run-frame columns of `FINETUNE_COLUMNS`; LoRA's target modules are one integer column, a
bit per targeted linear (`targets_mask` reads the names people write).
"""

from __future__ import annotations

import numpy as np

# per task, in code order (append only: earlier codes keep their meaning): base weights frozen
# (trained through adapters), base weights stored in NF4 4-bit (bitsandbytes). SFT is
# pre-training's compute on fine-tuning data: what differs is the `data:` section (packing,
# mean_seq_len), open to every task
TASK_TRAITS = {
    "pretrain": {"frozen_base": False, "nf4_base": False},
    "sft": {"frozen_base": False, "nf4_base": False},
    "lora": {"frozen_base": True, "nf4_base": False},
    "qlora": {"frozen_base": True, "nf4_base": True},
}
TASKS = tuple(TASK_TRAITS)  # the enum the run field `task` takes (specs.CATEGORICAL)


def trait(task_code, name: str) -> np.ndarray:
    """TASK_TRAITS[task][name] for an array of task codes."""
    table = np.array([TASK_TRAITS[t][name] for t in TASKS])
    return table[np.asarray(task_code, dtype=np.int64)]


# LoRA target modules, in Megatron-Core's names (NeMo / Megatron-Bridge LoRA.target_modules:
# linear_qkv, linear_proj, linear_fc1, linear_fc2; Megatron-Bridge v0.6.0
# src/megatron/bridge/peft/lora.py). Hugging Face PEFT / torchtune name them q_proj, k_proj,
# v_proj (qkv), o_proj / output_proj (proj), gate_proj + up_proj / w1 + w3 (fc1) and
# down_proj / w2 (fc2).
TARGETS = ("qkv", "proj", "fc1", "fc2")
TARGET_BIT = {name: 1 << i for i, name in enumerate(TARGETS)}
# groups a user may write instead of the list (PEFT's target_modules="all-linear" excludes the
# LM head, as here: peft v0.20.0 src/peft/tuners/tuners_utils.py _maybe_include_all_linear_layers)
TARGET_GROUPS = {"all_linear": TARGETS, "attention": ("qkv", "proj"), "mlp": ("fc1", "fc2")}
# the framework-neutral names people write, mapped to ours
TARGET_ALIASES = {
    "linear_qkv": "qkv", "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv",
    "linear_proj": "proj", "o_proj": "proj", "output_proj": "proj",
    "linear_fc1": "fc1", "gate_proj": "fc1", "up_proj": "fc1", "w1": "fc1", "w3": "fc1",
    "linear_fc2": "fc2", "down_proj": "fc2", "w2": "fc2",
    "all-linear": "all_linear", "all": "all_linear",
    # NeMo 1 (megatron_gpt_finetuning_config.yaml), Megatron-LM / MLPerf and GPT-NeoX names
    "attention_qkv": "qkv", "qkv_proj": "qkv", "query_key_value": "qkv",
    "attention_dense": "proj", "dense": "proj", "mlp_fc1": "fc1", "mlp_fc2": "fc2",
    "dense_h_to_4h": "fc1", "dense_4h_to_h": "fc2",
}
ALL_TARGETS = TARGET_BIT["qkv"] | TARGET_BIT["proj"] | TARGET_BIT["fc1"] | TARGET_BIT["fc2"]


class TaskError(ValueError):
    """A fine-tuning field with a value it cannot take (one line)."""


def targets_mask(value, where: str = "peft.targets") -> int:
    """The bit mask of a LoRA target list: a name, a group (all_linear, attention, mlp), a list
    of names, or a comma/semicolon/space-separated string of them ('qkv,proj'). An integer
    already a mask passes through."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if 0 < int(value) <= ALL_TARGETS:
            return int(value)
        raise TaskError(f"{where}: expected a mask 1-{ALL_TARGETS} or target names, got {value}")
    if isinstance(value, float) and value.is_integer():
        return targets_mask(int(value), where)
    if isinstance(value, str):
        # also a Python/JSON-style list written into a table cell: "['q_proj', 'v_proj']"
        for ch in "[]'\"":
            value = value.replace(ch, " ")
        parts = [p for p in value.replace(";", ",").replace(" ", ",").split(",") if p]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = None
    allowed = ", ".join(TARGETS + tuple(TARGET_GROUPS))
    if not parts:
        raise TaskError(f"{where}: expected target modules among {allowed}, got {value!r}")
    mask = 0
    for p in parts:
        name = str(p).strip().lower()
        name = name.rsplit(".", 1)[-1]  # a module path: self_attn.q_proj
        name = TARGET_ALIASES.get(name, name)
        if name in TARGET_GROUPS:
            for t in TARGET_GROUPS[name]:
                mask |= TARGET_BIT[t]
        elif name in TARGET_BIT:
            mask |= TARGET_BIT[name]
        else:
            raise TaskError(f"{where}: unknown target module {p!r}; allowed: {allowed}")
    return mask


def targets_names(mask: int) -> list[str]:
    """The target names of a mask (for recipes and reports)."""
    return [t for t in TARGETS if int(mask) & TARGET_BIT[t]]


def targeted(mask, name: str) -> np.ndarray:
    """1.0 where the mask targets module `name`, else 0.0 (arrays of masks)."""
    return ((np.asarray(mask, dtype=np.int64) & TARGET_BIT[name]) > 0).astype(np.float64)


# Run-frame columns of fine-tuning (merged into specs.ALL_COLUMNS). Defaults: Megatron-Bridge's
# LoRA (dim 32, alpha 32, dropout 0.0, all four linears; v0.6.0 src/megatron/bridge/peft/lora.py
# L101-106), packed samples as its SFT/PEFT recipes ship (packed_sequence_specs), and
# mean_seq_len 0 = every sequence fills seq_len (pre-training's data).
FINETUNE_COLUMNS = {
    "task": "pretrain",
    "lora_rank": 32,
    "lora_alpha": 32.0,
    "lora_targets": ALL_TARGETS,
    "lora_dropout": 0.0,
    "packing": True,
    "mean_seq_len": 0.0,
}
