"""Compare the simulator with published, measured training runs.

`load_published()` turns each row of the shipped dataset (data/published_runs.csv, a copy of
shared/calibration/published_runs.csv with its `source` column) into a run frame the simulator
takes, with every field a source leaves unstated filled by a documented rule (IMPUTATION).
`validate()` simulates all rows in one vectorized call and returns the per-row comparison.
"""

from __future__ import annotations

import re
from importlib import resources

import numpy as np
import pandas as pd

from .. import catalog, frameworks, specs
from ..simulate import simulate_frame

# How unstated fields are filled; printed with the report so that nothing is hidden.
IMPUTATION = {
    "micro_batch": "unstated: the fastest predicted of 1, 2, 4, 8 that divides the batch and "
                   "fits (published benchmarks are tuned); torchtitan's 'local batch N per DP "
                   "rank' with PP: N / number of pipeline stages (its default micro-batching)",
    "vpp": "1 when not stated",
    "sequence_parallel": "on when tp > 1 for Megatron-Core/NeMo/torchtitan-TP rows unless 'no'",
    "recompute": "unstated: Megatron-LM 2021 rows use full (the paper's default); otherwise the "
                 "fastest predicted mode that fits, chosen jointly with an unstated micro-batch "
                 "(MoE rows may also get the MoE recompute modules moe_act or moe); a MoE row "
                 "whose fastest fitting mode is a full recompute, or where none fits, gets the "
                 "fastest of full and Megatron's recompute module lists (sim_core/recompute.py)",
    "network": "interconnect column: '400Gb/s RDMA/GPU' -> 50 GB/s per GPU, '1600 Gbps RoCE' "
               "-> 25 GB/s per GPU, HDR IB -> 25 GB/s per GPU; else the GPU's default cluster",
    "zero": "FSDP/FULL_SHARD/Megatron-FSDP -> 3, SHARD_GRAD_OP -> 2, distributed optimizer "
            "-> 1, Megatron-LM 2021 -> 0, else the framework's default",
    "tp_comm_overlap": "on for NeMo/Megatron-Bridge/Megatron-Core rows with tp > 1 (their "
                       "H100 recipes enable it) and torchtitan AsyncTP rows",
    "ffn": "4 x hidden when not stated (GPT family)",
    "model shape": "a shape field (layers, hidden, heads, kv_heads, ffn, vocab) written as text "
                   "that is not a number (e.g. '~50k ... (padded)') or left empty takes the "
                   "catalog model's value when the row names a catalog model (said in the row's "
                   "`imputed`); otherwise the row is skipped naming the field",
    "etp": "1 for MoE rows (Megatron-Bridge MoE recipes set expert_tensor_parallel_size=1)",
    "moe": "MoE rows use the catalog model (experts, MLA, dense layers); 'tokendrop' rows drop "
           "tokens at capacity factor 1, others are dropless; routing is force-balanced; "
           "unstated EP all-to-all overlap (moe_a2a_overlap) is imputed like micro-batch",
    "framework": "the row's framework profile (sim_core/catalogs/frameworks.yaml): torchtitan, "
                 "llm-foundry, nemo (NeMo, Megatron-Bridge), else megatron-core; the profile "
                 "sets grad_reduce_fp32, fused_elementwise, attention_kernel and loss_impl",
    "torch.compile": "torchtitan rows that say 'compile': fused elementwise ops and GLU, and the "
                     "compiled loss except in the Dec-2024 benchmark (its loss compile was "
                     "switched off then)",
    "loss": "the cross-entropy the row's launch config selects (_loss_impl_of): Megatron-LM "
            "README and 2021 rows the CLI default (unfused vocab-parallel, "
            "--cross-entropy-loss-fusion off); Megatron-LM examples/llama fused (its script "
            "passes --cross-entropy-loss-fusion); NeMo 24.07 fused where the launcher's model "
            "yaml sets cross_entropy_loss_fusion (Llama 3, Nemotron 4B-22B), else unfused; "
            "Megatron-Bridge TE's kernel (perf configs: cross_entropy_fusion_impl te)",
    "moe dispatch": "MoE rows: fused permutation and fused router on (Megatron-Bridge's "
                    "Qwen3/DeepSeek/GPT-OSS model providers and every MoE perf config set "
                    "moe_permute_fusion and moe_router_fusion); dispatcher and combined 1F1B "
                    "EP overlap from the Megatron-Bridge perf config of the row's release "
                    "(_MOE_RECIPES: DeepSeek-V3 H100 DeepEP + overlap; 25.09 Qwen3 alltoall "
                    "without overlap; 25.11 Qwen3 H100 alltoall + overlap, GB200 HybridEP (flex); "
                    "26.04/26.06 Qwen3-30B HybridEP (flex), Qwen3-235B alltoall + overlap; "
                    "GPT-OSS alltoall), the overlap with delayed wgrad as Bridge's override "
                    "sets it; rows not in that table get the fastest predicted of alltoall/flex "
                    "and overlap on/off; shared-expert overlap on where the model has shared "
                    "experts and the dispatcher is alltoall without 1F1B overlap (the DeepSeek "
                    "provider's default); routing force-balanced (expert_skew 0); Megatron-Bridge "
                    "DeepSeek-V3 rows keep bf16 Adam moments (its recipe's precision-aware "
                    "optimizer: adam_bf16_states) and its MTP layer and pipeline layout "
                    "(mtp_layers, pp_last_stage_layers: _deepseek_bridge_pipeline)",
    "memory measured": "the dataset's peak_mem_gib (torchtitan) is peak reserved memory, "
                       "compared with peak_reserved_gib; TorchSim tracks live tensors, so its "
                       "tables compare with peak_allocated_gib",
    "precision": "nvfp4 / mxfp4 where the precision column names the FP4 format (a bare "
                 "'FP4': NVFP4 on NVIDIA, MXFP4 on AMD), fp8 where it names FP8 and does not "
                 "negate it ('BF16 (no float8)', 'TE_FP8=0' are BF16), else bf16",
    "fp8 recipe": "what the precision column states (FP8-CS / current scaling -> tensorwise, "
                  "FP8-MX -> mxfp8, FP8-SS / blockwise -> blockwise, FP8-DS / delayed -> delayed, "
                  "rowwise); otherwise the framework profile's default (Megatron-Core/NeMo "
                  "delayed, torchtitan tensorwise)",
    "activation": "the activation column where stated (swiglu, gelu, relu2); else swiglu for "
                  "Llama/Qwen/Mixtral/DeepSeek/GPT-OSS and every nanotron row, relu2 for "
                  "Nemotron, else gelu",
    "measured step time": "step_time_s, else derived_step_time_s, else global batch x "
                          "sequence / (tokens_per_s_per_gpu x GPUs), else from reported "
                          "TFLOP/s with the source's own FLOP formula (Megatron 2021 counts "
                          "recompute: 96*B*s*l*h^2*(1+s/6h+V/16lh); Megatron-Core r0.8 counts "
                          "model FLOPs: 72*B*s*l*h^2*(1+s/6h+V/12lh))",
}

def dataset_path():
    return resources.files("sim_core").joinpath("data/published_runs.csv")


def _gpu_id(text: str) -> str:
    """Catalog id of a row's GPU column (sim_core/gpu_names.py), or ''."""
    return catalog.resolve_gpu(text) or ""


def _unknown_gpu(text: str) -> str:
    """The skip reason of a GPU no rule names, with a did-you-mean when one is close."""
    from .. import gpu_names

    hint = gpu_names.suggest(text, catalog.gpu_names(), cutoff=0.8)
    return f"unknown GPU '{text}'" + (f" (did you mean {hint}?)" if hint else "")


def _num(x, default=np.nan):
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def _family(src: str) -> str:
    for key in ("Primus", "Megatron-Bridge", "NeMo", "torchtitan", "torchtune", "llm-foundry", "Megatron-LM",
                "Narayanan21"):
        if key.lower() in src.lower():
            return {"Narayanan21": "Megatron-LM"}.get(key, key)
    return "other"


ACTIVATIONS = ("swiglu", "gelu", "relu2")


def _activation(name: str, framework: str = "", stated: str = "") -> str:
    """What the row's `activation` column states, else what the model's name or the framework
    implies: nanotron's models are Llama-family (src/nanotron/models/llama.py and qwen.py,
    GLUActivation, 2411b022) but for starcoder2.py (a GELU MLP), so a nanotron row is SwiGLU
    unless its model is a StarCoder."""
    if stated.strip().lower() in ACTIVATIONS:
        return stated.strip().lower()
    n = name.lower()
    if any(k in n for k in ("llama", "qwen", "mixtral", "deepseek", "gpt oss", "gpt-oss")):
        return "swiglu"
    if ("nanotron" in framework.lower() or "nanotron" in n) and "starcoder" not in n:
        return "swiglu"
    if "nemotron" in n:
        return "relu2"
    return "gelu"


def _catalog_model(name: str) -> str:
    """Catalog id for a row's model name (e.g. 'GPT3-5B' -> gpt3-5b, 'GPT-3 175B' ->
    gpt3-175b, 'Llama 3.1 8B' -> llama3.1-8b), or '' (catalog.resolve_model)."""
    return catalog.resolve_model(name)[0] or ""


# shape fields of a dense row: (column, ModelSpec field); kv_heads and ffn have stated defaults
_SHAPE_FIELDS = (("layers", "layers"), ("hidden", "hidden"), ("heads", "heads"),
                 ("kv_heads", "kv_heads"), ("ffn", "ffn"), ("vocab", "vocab"))


def _dense_shape(r: pd.Series) -> tuple[dict, str, str]:
    """The dense row's shape -> (fields, imputed note, skip reason). A field written as text
    that is not a number ('~50k ... (padded)') or left empty takes the catalog model's value
    when the row names a catalog model (said in the note); otherwise the row is skipped with
    the field named. Empty kv_heads = heads, empty ffn = 4 x hidden (IMPUTATION['ffn'])."""
    vals = {col: _num(r[col]) for col, _ in _SHAPE_FIELDS}
    texts = {col: str(r[col]).strip() for col, _ in _SHAPE_FIELDS}
    defaulted = {"kv_heads", "ffn"}
    bad = [c for c, _ in _SHAPE_FIELDS
           if np.isnan(vals[c]) and (texts[c] or c not in defaulted)]
    notes = []
    if bad:
        mid = _catalog_model(str(r["model"]))
        if not mid:
            c = bad[0]
            what = f"'{texts[c]}' is not a number" if texts[c] else "is not stated"
            return {}, "", (f"{c} {what} and model '{r['model']}' is not in the catalog "
                            "to take it from")
        spec = catalog.get_model(mid)
        for c in bad:
            vals[c] = float(getattr(spec, dict(_SHAPE_FIELDS)[c]) or
                            (spec.heads if c == "kv_heads" else np.nan))
            notes.append(f"{c}={vals[c]:g} from catalog {mid}"
                         + (f" (stated '{texts[c]}')" if texts[c] else ""))
    if np.isnan(vals["kv_heads"]):
        vals["kv_heads"] = vals["heads"]
    if np.isnan(vals["ffn"]):
        vals["ffn"] = 4 * vals["hidden"]
    return vals, "; ".join(notes), ""


_MOE_MODELS = [(r"deepseek.?v3", "deepseek-v3"), (r"qwen3.?30b", "qwen3-30b-a3b"),
               (r"qwen3.?235b", "qwen3-235b-a22b"), (r"gpt.?oss.?120b", "gpt-oss-120b"),
               (r"mixtral.?8x22b", "mixtral-8x22b"), (r"mixtral.?8x7b", "mixtral-8x7b"),
               (r"gpt.?oss.?20b", "gpt-oss-20b"), (r"kimi.?k2", "kimi-k2"),
               (r"deepseek.?v2.?lite", "deepseek-v2-lite"), (r"deepseek.?v2", "deepseek-v2")]


def _moe_model(name: str) -> str:
    """Catalog id of a MoE row's model (the catalog carries experts, MLA and dense layers).
    The performance summaries' own spellings first (_MOE_MODELS: 'DeepSeekV3 (dropless)',
    'Qwen3_235B_a22B [GB200]'), then the one resolver every table uses, so that a MoE model the
    catalog has ('GLM-4.5-Air', 'moonshotai/Moonlight-16B-A3B') is priced rather than skipped
    as unknown; a name that resolves to a dense model is not taken for a MoE row."""
    for pat, mid in _MOE_MODELS:
        if re.search(pat, name, re.I):
            return mid
    mid = _catalog_model(name)
    return mid if mid and catalog.get_model(mid).experts else ""


# NeMo 24.07's launcher model yamls that set cross_entropy_loss_fusion: true
# (NVIDIA/NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/llama/llama3_*.yaml and
# nemotron/nemotron_{4,8,15,22}b.yaml); the others (gpt3/*, llama2_*, nemotron_340b) leave it to
# Megatron-Core's default, off (core_r0.8.0 megatron/core/model_parallel_config.py L201; NeMo
# r2.0.0rc1 megatron_base_model.build_transformer_config passes absent keys as defaults)
_NEMO_2407_FUSED_LOSS = r"llama ?3|nemotron-(4|8|15|22)b"


def _loss_impl_of(framework: str, fw: str, model: str) -> str:
    """The cross-entropy implementation a row ran, from its launch config; '' keeps the
    framework profile's default."""
    if framework == "torchtitan":
        # torch.compile compiles the loss from 2025 on (the Dec-2024 benchmark kept it eager)
        compiled = re.search(r"compile", fw, re.I) and not re.search(r"202412", fw)
        return "compiled" if compiled else ""
    if re.search(r"examples/llama", fw):
        return "fused"  # examples/llama/train_llama3_8b_h100_fp8.sh --cross-entropy-loss-fusion
    if framework == "nemo" and re.search(r"24\.07", fw):
        return "fused" if re.search(_NEMO_2407_FUSED_LOSS, model, re.I) else "vocab_parallel"
    return ""


def _row_to_run(r: pd.Series) -> tuple[dict, str]:
    """One dataset row -> (run fields, skip reason or '')."""
    fw = f"{r['framework']} {r['source']}"
    gpu = _gpu_id(str(r["gpu"]))
    if not gpu:
        from .. import gpu_names

        named = gpu_names.resolve(str(r["gpu"]))
        return {}, (f"GPU '{r['gpu']}' ({named}) not in the catalog" if named
                    else _unknown_gpu(str(r["gpu"])))
    tp, pp = _num(r["tp"]), _num(r["pp"])
    if np.isnan(tp) or np.isnan(pp):
        return {}, "parallel layout (tp/pp) not stated"
    run: dict = {}
    moe_id = _moe_model(str(r["model"])) if _is_moe(r["moe"]) else ""
    if _is_moe(r["moe"]) and not moe_id:
        return {}, "MoE model not in the catalog"
    if moe_id:
        run["model"] = moe_id
    elif np.isnan(_num(r["layers"])):
        mid = _catalog_model(str(r["model"]))
        if not mid:
            return {}, "model shape not stated and not in the catalog"
        run["model"] = mid
    else:
        shape, note, skip = _dense_shape(r)
        if skip:
            return {}, skip
        run.update(shape, activation=_activation(str(r["model"]), fw,
                                                  str(r.get("activation", ""))))
        if note:
            run["imputed_note"] = note
    for col, field in (("seq_len", "seq_len"), ("gbs_seqs", "global batch"),
                       ("num_gpus", "num_gpus")):
        if np.isnan(_num(r[col])):
            text = str(r[col]).strip()
            return {}, (f"{field} '{text}' is not a number" if text else f"{field} not stated")
    prec = _precision(str(r["precision"]))
    if prec == "fp4":  # NVIDIA's block-scaled FP4 training recipe is NVFP4, AMD's MXFP4
        prec = "mxfp4" if catalog.get_gpu(gpu).vendor == "amd" else "nvfp4"
    recipe = _fp8_recipe(str(r["precision"])) if prec == "fp8" else ""
    mbs_text = str(r["mbs"])
    mbs = _num(mbs_text, 0.0)  # 0 = unstated
    vpp = _num(r["vp"], 1.0)
    local = re.search(r"local batch (\d+)", mbs_text)
    if local:
        # torchtitan splits the local batch into as many micro-batches as pipeline stages
        # (its default), i.e. pp for 1F1B and 2*pp for its interleaved schedule (2 per rank)
        if "interleaved" in str(r["framework"]).lower():
            vpp = 2.0
        mbs = max(1.0, float(local.group(1)) / (pp * vpp)) if pp > 1 else float(local.group(1))
    cp = _num(r["cp"], 1.0)
    z_text = f"{r['zero_fsdp']}".lower()
    # what the row states; otherwise its framework's default (frameworks.yaml), except the
    # Megatron-LM 2021 paper, which predates the distributed optimizer
    # "ZeRO-1", "zero stage 2", "ZeRO3" (users' tables, e.g. nanotron's zero_stage) name the
    # stage; "none"/"no"/"ddp" alone say there is none
    z_stage = re.search(r"zero[\s_-]*(?:stage)?[\s_-]*([0-3])\b", z_text)
    # "FSDP=0" (AMD's launcher switch), "fsdp: false", "no FSDP" say there is none
    fsdp = re.search(r"(?<!no )fsdp(?!\d*[a-z_])(?!\d*\s*[=:]?\s*(?:0|false|off|no|none)\b)",
                     z_text)
    zero = (2 if "shard_grad_op" in z_text else 3 if fsdp or "full_shard" in z_text
            else 1 if "dist" in z_text else int(z_stage.group(1)) if z_stage
            else 0 if z_text.strip() in ("none", "no", "ddp", "0")
            else 0 if "2021" in str(r["framework"]) else None)
    sp_text = str(r["seq_parallel"]).lower()
    modern = bool(re.search(r"megatron-core|nemo|bridge|torchtitan", fw, re.I))
    sp = (tp > 1) and (sp_text.startswith("yes") or (modern and not sp_text.startswith("no")))
    overlap = (tp > 1) and bool(re.search(r"nemo|bridge|megatron-core|tp-comm overlap|asynctp",
                                          fw + " " + str(r["notes"]), re.I))
    rc = str(r["recompute"]).lower()
    recompute = "full" if rc.startswith("full") else "selective" if rc.startswith("selective") \
        else "none" if rc.startswith("none") else ""
    if not recompute and "2021" in str(r["framework"]):
        recompute = "full"
    ic = str(r["interconnect"]).lower()
    nic = 50.0 if "400gb/s rdma/gpu" in ic else 25.0 if ("1600 gbps" in ic or "hdr" in ic) else 0.0
    framework = _framework(fw)
    run.update(
        framework=framework,
        seq_len=_num(r["seq_len"]), global_batch=_num(r["gbs_seqs"]), precision=prec, gpu=gpu,
        num_gpus=_num(r["num_gpus"]),
        gpus_per_node=catalog.default_cluster_for_gpu(gpu).gpus_per_node, tp=tp, pp=pp, cp=cp,
        vpp=vpp, micro_batch=mbs, recompute=recompute, sequence_parallel=sp,
        zero=zero, tp_comm_overlap=overlap,
        ep=_num(r["ep"], 1.0), moe_dropless=not re.search(r"tokendrop", str(r["model"]), re.I),
        etp=1 if moe_id else 0,
        nics_per_node=8 if nic else 0, nic_bw_gbs=nic,
    )
    if recipe:  # IMPUTATION["fp8 recipe"]: what the row states, else the framework's default
        run["fp8_recipe"] = recipe
    # what the row states beyond its framework's defaults (frameworks.yaml): torch.compile fuses
    # the elementwise ops (and the loss: _loss_impl_of)
    if framework == "torchtitan" and re.search(r"compile", fw, re.I):
        run["fused_elementwise"] = run["fused_glu"] = True
    loss = _loss_impl_of(framework, fw, str(r["model"]))
    if loss:  # IMPUTATION["loss"]
        run["loss_impl"] = loss
    if zero is None:
        zero = frameworks.default_value(framework, "zero")
        run["zero"] = zero
    run["distributed_optimizer"] = zero >= 1
    if moe_id:  # IMPUTATION["moe dispatch"]
        disp, a2a = _moe_recipe(moe_id, str(r["source"]) + " " + str(r["framework"]), gpu)
        run.update(moe_permute_fusion=True, moe_router_fusion=True, moe_dispatcher=disp,
                   moe_a2a_overlap=a2a)
        # Megatron-Bridge's DeepSeek-V3 recipe: precision-aware optimizer with bf16 exp_avg and
        # exp_avg_sq (v0.1.0rc4 src/megatron/bridge/recipes/deepseek/deepseek_v3.py L240-244,
        # NeMo 25.09; v0.2.0 L272-276; v0.6.0 perf_recipes/deepseek/common.py L41-46)
        if re.search(r"deepseek", moe_id, re.I) and re.search(r"bridge", fw, re.I):
            run["adam_bf16_states"] = True
            run.update(_deepseek_bridge_pipeline(str(r["model"]), str(r["source"]), gpu,
                                                 pp, vpp))
    if zero == 3 and pp > 1:
        run["zero"] = 1  # torchtitan with PP: FSDP shards optimizer/grads across dp only
    stated, skip = _stated_fields(r)
    if skip:
        return {}, skip
    run.update(stated)
    ft, skip = _task_fields(r)
    if skip:
        return {}, skip
    run.update(ft)
    return run, ""


# what a row's `task` / `peft` column may say, and the task it is (sim_core/tasks.py)
_TASK_WORDS = [(r"^(pre-?train(ing)?|)$", "pretrain"), (r"q-?lora", "qlora"), (r"lora", "lora"),
               (r"sft|full|fine-?tun", "sft")]


def _task_fields(r: pd.Series) -> tuple[dict, str]:
    """The fine-tuning columns of a run table (`task`, `peft`, `lora_rank`, `lora_alpha`,
    `lora_targets`, `packing`, `mean_seq_len`): a row without `task` is pre-training (or the
    method its `peft` column names); what a row leaves empty takes tasks.FINETUNE_COLUMNS."""
    from ..tasks import TASKS, TaskError, targets_mask

    text = str(r.get("task", "")).strip().lower()
    peft = str(r.get("peft", "")).strip().lower()
    if not text and peft not in _NO:
        text = peft
    if not text and str(r.get("lora_rank", "")).strip():
        text = "lora"  # a LoRA rank alone says the run trains adapters
    task = next((t for pat, t in _TASK_WORDS if re.search(pat, text)), "")
    if not task:
        return {}, f"task '{text}' is not one of {', '.join(TASKS)}"
    # a generic fine-tuning task with the method in the `peft` column ("finetune", "LoRA")
    method = next((t for pat, t in _TASK_WORDS[1:3] if re.search(pat, peft)), "")
    if task == "sft" and method:
        task = method
    out: dict = {"task": task}
    for col, field in (("lora_rank", "lora_rank"), ("lora_alpha", "lora_alpha"),
                       ("mean_seq_len", "mean_seq_len")):
        raw = str(r.get(col, "")).strip()
        if raw:
            v = _num(raw)
            if np.isnan(v) or v <= 0:
                return {}, f"{col} '{raw}' is not a positive number"
            out[field] = v
    raw = str(r.get("lora_targets", "")).strip()
    if raw:
        try:
            out["lora_targets"] = float(targets_mask(raw, "lora_targets"))
        except TaskError as exc:
            return {}, str(exc)
    raw = str(r.get("packing", "")).strip().lower()
    if raw:
        if raw not in _STATED_YES + _STATED_NO:
            return {}, f"packing '{raw}' is not yes/no"
        out["packing"] = raw in _STATED_YES
    return out, ""


# Run fields a table may state in a column of the field's own name, beyond the published
# format's columns (docs/calibration.md): what a row states wins over its framework's default
# and over what its free text implies. Fields the format already carries under another name
# (tp, mbs, recompute, zero_fsdp, ...) or that are derived together (zero and the distributed
# optimizer, dp) are not among them.
STATED_FIELDS = ("power_limit_w", "attention_kernel", "attention_dropout", "fp8_recipe",
                 "loss_impl", "fused_elementwise", "fused_glu", "tp_comm_overlap",
                 "overlap_grad_reduce",
                 "overlap_param_gather", "grad_reduce_fp32", "fp8_param_gather", "fp8_weight_cache",
                 "adam_bf16_states",
                 "cp_comm",
                 "pp_schedule", "gpus_per_node", "nics_per_node", "nic_bw_gbs",
                 "moe_dispatcher", "moe_a2a_overlap", "moe_permute_fusion",
                 "moe_router_fusion", "moe_dropless", "capacity_factor", "expert_skew")
_STATED_YES, _STATED_NO = ("yes", "true", "1", "on"), ("no", "false", "0", "off")


def _stated_fields(r: pd.Series) -> tuple[dict, str]:
    """The STATED_FIELDS a row fills (an empty cell says nothing), parsed by the field's type:
    yes/no, one of the field's choices, or a number with an optional unit ('400 W')."""
    out = {}
    for field in STATED_FIELDS:
        text = str(r.get(field, "")).strip()
        if not text:
            continue
        default = specs.ALL_COLUMNS[field]
        if field in specs.CATEGORICAL:
            allowed = specs.CATEGORICAL[field]
            if text.lower() not in allowed:
                return {}, f"{field} '{text}' is not one of {', '.join(allowed)}"
            out[field] = text.lower()
        elif isinstance(default, bool):
            if text.lower() not in _STATED_YES + _STATED_NO:
                return {}, f"{field} '{text}' is not yes or no"
            out[field] = text.lower() in _STATED_YES
        else:
            num = re.fullmatch(r"([-+0-9.eE]+)\s*[A-Za-z/]*", text)
            value = _num(num.group(1)) if num else np.nan
            if not value >= 0:
                return {}, f"{field} '{text}' is not a number >= 0"
            out[field] = value
    return out, ""


_FP8_RECIPES = [(r"\bCS\b|current", "tensorwise"), (r"\bMX|mxfp8", "mxfp8"),
                (r"\bSS\b|sub.?channel|blockwise", "blockwise"), (r"\bDS\b|delayed", "delayed"),
                (r"rowwise.?with.?gw", "rowwise_with_gw_hp"), (r"rowwise", "rowwise"),
                (r"tensorwise", "tensorwise")]


# a format the row says it did NOT use: "BF16 (no float8)", "bf16, without FP8", "w/o fp8",
# a launcher switch set off ("TE_FP8=0" in AMD's Megatron scripts, "fp8: false"), Megatron's
# argument dump ("fp8 ........ None", "fp8 None": the run is not FP8)
_NEGATED = re.compile(r"\b(?:no|without|w/o|not)\s+(?:float8|fp8)\b|\b(?:float8|fp8)\s+(?:off|"
                      r"disabled)\b|\w*(?:float8|fp8)\s*[=:]\s*(?:0|false|off|no|none)\b|"
                      r"\b(?:float8|fp8)[\s.]+none\b", re.I)


def _precision(text: str) -> str:
    """The run's training precision from the row's precision column: nvfp4 / mxfp4 where it
    names the FP4 format ("fp4" where it says FP4 only), fp8 where it names FP8 (fp8, float8,
    FP8-CS, MXFP8) and does not negate it ("BF16 (no float8)", "TE_FP8=0" are BF16), else
    bf16."""
    said = _NEGATED.sub(" ", text)
    # FP4 training (sim_core/fp4.py): the block-scaled format the row names; a bare "FP4" is
    # read by the GPU's vendor in _row_to_run (NVFP4 on NVIDIA, MXFP4 on AMD)
    for fmt in ("nvfp4", "mxfp4"):
        if re.search(fmt, said, re.I):
            return fmt
    if re.search(r"fp4", said, re.I):
        return "fp4"
    return "fp8" if re.search(r"fp8|float8", said, re.I) else "bf16"


def _fp8_recipe(text: str) -> str:
    """The FP8 recipe a precision column states ('FP8-CS', 'per-tensor current scaling',
    'FP8-MX', ...), first match wins; '' = the framework's default."""
    for pat, recipe in _FP8_RECIPES:
        if re.search(pat, text, re.I):
            return recipe
    return ""


def _framework(fw: str) -> str:
    """The framework profile of a row, from its framework and source text."""
    for pat, fid in ((r"torchtitan", "torchtitan"), (r"llm-foundry", "llm-foundry"),
                     (r"torchtune", "torchtune"), (r"\btrl\b|hugging ?face", "hf-trl"),
                     (r"nanotron", "nanotron"), (r"deepspeed", "deepspeed"),
                     (r"nemo|bridge", "nemo")):
        if re.search(pat, fw, re.I):
            return fid
    return "megatron-core"


# Megatron-Bridge perf configs behind the archive's MoE rows (github NVIDIA-NeMo/Megatron-Bridge):
# (model id pattern, release pattern, GPU pattern) -> (dispatcher, 1F1B EP overlap).
# 25.09 = v0.1.0rc4 scripts/performance/run_script.py (DeepSeek-V3 on H100: DeepEP and the
# 1F1B EP overlap with delayed wgrad; Qwen3: the provider's alltoall, overlap off); 25.11 = v0.2.0 scripts/performance/
# configs/*/workload_base_configs.py; 26.04/26.06 = v0.4.0/v0.5.0 configs/*/..._workload_base_
# configs.py. HybridEP (moe_flex_dispatcher_backend="hybridep", Megatron core_v0.16+) is priced
# as flex: the same dedup'd NVLink/RDMA dispatch.
_MOE_RECIPES = [
    (r"deepseek", r"25\.09", r"h100", "flex", True),
    (r"qwen3", r"25\.09", r"h100", "alltoall", False),
    (r"deepseek", r"25\.11", r"h100", "flex", True),
    (r"qwen3", r"25\.11", r"h100", "alltoall", True),
    (r"deepseek|qwen3", r"25\.11", r"gb200", "flex", False),
    (r"gpt-oss", r".", r".", "alltoall", False),
    (r"qwen3-30b", r"26\.0[46]", r"h100", "flex", False),
    (r"qwen3-235b", r"26\.0[46]", r"h100", "alltoall", True),
]


def _moe_recipe(model_id: str, release: str, gpu: str) -> tuple:
    """(dispatcher, moe_a2a_overlap) of the row's published recipe, or (None, None) = impute."""
    for mod, rel, g, disp, a2a in _MOE_RECIPES:
        if re.search(mod, model_id) and re.search(rel, release) and re.search(g, gpu):
            return disp, a2a
    return None, None


# Megatron-Bridge's DeepSeek-V3 pipeline layouts: decoder layers on the last pipeline rank
# (its chunks r = pp-1, pp-1+pp, ...). The H100 perf run of NeMo 25.09 passes
# "Et|(tt|)*30mL" (v0.1.0rc4 scripts/performance/run_script.py L64-66: pp 8, vp 4; chunks
# 7, 15, 23 hold two decoders, chunk 31 MTP + loss); otherwise the recipe's map by (pp, vp)
# (v0.1.0rc4 recipes/deepseek/deepseek_v3.py L96-108, v0.2.0 L235-243): the last chunk
# holds 13 (4, 1), 5 (8, 1 / 4, 2) or 1 decoder(s) (16, 1 / 8, 2 / 4, 4) beside MTP + loss
_DSV3_LAST_CHUNK = {(4, 1): 13, (8, 1): 5, (4, 2): 5, (16, 1): 1, (8, 2): 1, (4, 4): 1}
_DSV3_CHUNK = {(4, 1): 16, (8, 1): 8, (4, 2): 8, (16, 1): 4, (8, 2): 4, (4, 4): 4}


def _deepseek_bridge_pipeline(model: str, source: str, gpu: str, pp, vpp) -> dict:
    """mtp_layers and pp_last_stage_layers of a Megatron-Bridge DeepSeek-V3 row: the recipe
    builds one MTP layer (mtp_num_layers=1, v0.1.0rc4 recipes/deepseek/deepseek_v3.py
    pretrain_config; v0.2.0 L174; no perf script of v0.2.0 changes it) unless the row says
    it ran without ('w/o MTP'); the last rank's decoders from the layout above."""
    out = {"mtp_layers": 0 if re.search(r"w/?o\s*MTP|without\s*MTP|no\s*MTP", model, re.I)
           else 1}
    p, v = int(_num(pp, 1)), int(_num(vpp, 1) or 1)
    if re.search(r"25\.09", source) and re.search(r"h100", gpu, re.I) and (p, v) == (8, 4):
        out["pp_last_stage_layers"] = 3 * 2
    elif (p, v) in _DSV3_LAST_CHUNK:
        out["pp_last_stage_layers"] = (v - 1) * _DSV3_CHUNK[(p, v)] + _DSV3_LAST_CHUNK[(p, v)]
    return out


def _measured_step(r: pd.Series) -> tuple[float, str]:
    for col in ("step_time_s", "derived_step_time_s"):
        v = _num(r[col])
        if not np.isnan(v):
            return v, col
    # tokens/s per GPU (Megatron's "tokens per GPU (tokens/s/GPU)", torchtitan's tps): a step
    # is global batch x sequence tokens over all GPUs, whatever FLOP formula the source uses
    tps, B, s, n = (_num(r[c]) for c in ("tokens_per_s_per_gpu", "gbs_seqs", "seq_len",
                                           "num_gpus"))
    if tps > 0 and B > 0 and s > 0 and n > 0:
        return B * s / (tps * n), "tokens_per_s_per_gpu"
    tflops = _num(r["tflops_per_gpu"])
    if np.isnan(tflops):
        return np.nan, ""
    B, s, L, h, V = (_num(r[c]) for c in ("gbs_seqs", "seq_len", "layers", "hidden", "vocab"))
    if "2021" in str(r["framework"]) or "Narayanan" in str(r["source"]):
        flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    else:
        flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    return flops / (tflops * 1e12 * _num(r["num_gpus"])), "tflops_per_gpu"


# a row needs these; every other column of the published format may be absent or empty
REQUIRED_COLUMNS = ("model", "gpu", "num_gpus", "tp", "pp", "seq_len", "gbs_seqs")
_NO = {"", "no", "false", "0", "n", "none", "dense", "-"}


def _is_moe(text) -> bool:
    """The `moe` column: empty, no, false, 0, none or dense mean a dense model."""
    return str(text).strip().lower() not in _NO


def load_published(path=None) -> pd.DataFrame:
    """Dataset rows as run frames plus `measured_*`, `id`, `source`, `family`, `skip`.
    A row is compared on whatever it measured: step time, peak memory, or both."""
    raw = pd.read_csv(path or dataset_path(), dtype=str, keep_default_na=False)
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"missing column(s) {', '.join(missing)} (the published_runs format "
                         f"needs {', '.join(REQUIRED_COLUMNS)})")
    for col in pd.read_csv(dataset_path(), nrows=0).columns:
        if col not in raw.columns:
            raw[col] = ""
    # sequence lengths as tables write them: "8k", "4K", "128K" (x 1024, as context lengths are
    # counted); anything else is left for the row's own error
    raw["seq_len"] = raw["seq_len"].str.replace(
        r"^\s*(\d+)\s*[kK]\s*$", lambda m: str(int(m.group(1)) * 1024), regex=True)
    if (raw["id"] == "").all():
        raw["id"] = [str(i + 1) for i in range(len(raw))]
    recs = []
    for _, r in raw.iterrows():
        run, skip = _row_to_run(r)
        step, how = _measured_step(r)
        if not skip and np.isnan(step) and np.isnan(_num(r["peak_mem_gib"])):
            skip = "nothing measured (no step time, throughput or peak memory)"
        recs.append({"id": r["id"], "source": r["source"], "family": _family(r["source"]),
                     "is_moe": _is_moe(r["moe"]),
                     "reliability": r["reliability"], "label": r["model"], "skip": skip,
                     "measured_step_s": step, "measured_from": how,
                     "measured_mem_gib": _num(r["peak_mem_gib"]), **run})
    return pd.DataFrame(recs)


def _impute(runs: pd.DataFrame) -> pd.DataFrame:
    """Fill unstated micro-batch and recompute with the fastest predicted choice that fits,
    the way the publisher would have tuned them (IMPUTATION). Uses no measured value."""
    runs = runs.copy()
    # fields taken from the catalog while reading the row (_dense_shape) come first
    runs["imputed"] = (runs["imputed_note"].fillna("").astype(str)
                       .map(lambda x: f"{x}; " if x else "") if "imputed_note" in runs else "")
    moe = runs["is_moe"] if "is_moe" in runs else pd.Series(False, index=runs.index)
    if "moe_a2a_overlap" not in runs:
        runs["moe_a2a_overlap"] = np.where(moe, None, False)
    if "moe_dispatcher" not in runs:
        runs["moe_dispatcher"] = np.where(moe, None, "alltoall")
    runs["moe_dispatcher"] = runs["moe_dispatcher"].astype(object)
    runs["moe_dispatcher"] = runs["moe_dispatcher"].where(runs["moe_dispatcher"].notna() | moe,
                                                          "alltoall")
    if "moe_recompute" not in runs:
        runs["moe_recompute"] = "none"
    if "recompute_modules" not in runs:
        runs["recompute_modules"] = ""
    # a dense row has no EP all-to-all: nothing to impute there (a table with one MoE row
    # carries the column, NaN on its dense rows)
    runs["moe_a2a_overlap"] = runs["moe_a2a_overlap"].astype(object).where(
        runs["moe_a2a_overlap"].notna() | moe, False)
    todo = ((runs["micro_batch"] == 0) | (runs["recompute"] == "")
            | runs["moe_a2a_overlap"].isna() | runs["moe_dispatcher"].isna())
    if not todo.any():
        return runs
    sub = runs.loc[todo]
    mbs_opts = [1, 2, 4, 8]
    # (recompute, MoE recompute module, Megatron recompute modules): the MoE ones only for MoE
    # rows (the rules refuse them elsewhere), as selective modules on top of no layer recompute.
    # Megatron's module lists (sim_core/recompute.py; MOE_MODULE_OPTIONS: the lists Megatron-
    # Bridge's MoE perf configs use, v0.2.0-v0.4.0 scripts/performance/configs: DeepSeek-V3 /
    # Kimi-K2 mla_up_proj (+mlp), GPT-OSS layernorm + moe_act; and others) are a fallback,
    # for MoE rows where the other modes leave only a full recompute or nothing that fits
    # (IMPUTATION["recompute"]; docs/accuracy.md says why not a first choice)
    rc_opts = [("none", "none", ""), ("selective", "none", ""), ("full", "none", ""),
               ("none", "moe_act", ""), ("none", "moe", "")]
    rc_opts += [("selective", "none", m) for m in MOE_MODULE_OPTIONS]
    trials = []
    for mb in mbs_opts:
        for rc, moe_rc, mods in rc_opts:
            if mods and not moe.any():
                continue
            for a2a in (False, True):
                for disp in ("alltoall", "flex"):
                    t = sub.copy()
                    t["micro_batch"] = np.where(sub["micro_batch"] == 0, mb, sub["micro_batch"])
                    t["recompute"] = np.where(sub["recompute"] == "", rc, sub["recompute"])
                    t["moe_recompute"] = np.where(sub["recompute"] == "", moe_rc,
                                                  sub["moe_recompute"])
                    # module lists for unstated MoE rows; a dense row keeps what it had
                    t["recompute_modules"] = np.where((sub["recompute"] == "") & moe.loc[todo],
                                                      mods, sub["recompute_modules"])
                    if mods:  # the list applies with recompute selective on MoE rows only
                        t["recompute"] = np.where((sub["recompute"] == "") & ~moe.loc[todo],
                                                  "none", t["recompute"])
                    t["moe_a2a_overlap"] = np.where(sub["moe_a2a_overlap"].isna(), a2a,
                                                    sub["moe_a2a_overlap"]).astype(bool)
                    t["moe_dispatcher"] = np.where(sub["moe_dispatcher"].isna(), disp,
                                                   sub["moe_dispatcher"])
                    _moe_overlap_flags(t)
                    t["_fallback"] = bool(mods)
                    trials.append(t)
    cand = pd.concat(trials)
    pred = simulate_frame(cand.drop(columns="_fallback").reset_index(drop=True))
    cand = cand.assign(_t=np.where(pred["fits"] & pred["valid"], pred["step_time_s"], np.inf))
    cand = cand.assign(_row=np.tile(np.arange(len(sub)), len(trials)))
    first = cand[~cand["_fallback"]].sort_values(["_row", "_t"]).groupby("_row").head(1)
    first = first.sort_values("_row")
    # the module lists where the first choice is a full recompute, or nothing fits
    forced = (~np.isfinite(first["_t"].to_numpy())
              | ((first["recompute"] == "full") & (sub["recompute"] == "").to_numpy()).to_numpy())
    overall = cand.sort_values(["_row", "_t"]).groupby("_row").head(1).sort_values("_row")
    best = pd.concat([first[~forced], overall[forced]]).sort_values("_row")
    for col in ("micro_batch", "recompute", "moe_a2a_overlap", "moe_dispatcher"):
        was = sub[col].to_numpy()
        runs.loc[todo, col] = best[col].to_numpy()
        unstated = {"micro_batch": was == 0, "recompute": was == "",
                    "moe_a2a_overlap": pd.isna(was), "moe_dispatcher": pd.isna(was)}[col]
        runs.loc[sub.index[unstated], "imputed"] += f"{col} "
    for col in ("moe_delay_wgrad", "moe_shared_expert_overlap", "moe_recompute",
                "recompute_modules"):
        if col not in runs:
            runs[col] = False
        runs[col] = runs[col].astype(object)
        runs.loc[todo, col] = best[col].to_numpy()
    # which recompute modules an unstated MoE row got (Megatron's names), in its note
    got = [",".join(filter(None, [str(mods), "" if mr in ("none", "", None) else str(mr)]))
           for mods, mr in zip(best["recompute_modules"], best["moe_recompute"])]
    rows = sub.index[(sub["recompute"] == "").to_numpy() & moe.loc[todo].to_numpy()]
    for i, g in zip(sub.index, got):
        if g and i in rows:
            runs.loc[i, "imputed"] = runs.loc[i, "imputed"].replace(
                "recompute ", f"recompute (modules {g}) ", 1)
    return runs


# Megatron recompute module lists the imputation falls back to on MoE rows (see _impute): the
# Bridge perf configs' lists, the single MoE modules, and MLA's up-projection with the whole
# MoE layer (the leanest that keeps the 1F1B EP overlap, which a full recompute rules out)
MOE_MODULE_OPTIONS = ("moe_act", "moe", "layernorm,moe_act", "mla_up_proj", "mla_up_proj,mlp",
                      "mla_up_proj,moe_act", "mla_up_proj,moe_act,layernorm", "mla_up_proj,moe",
                      "layernorm,mla_up_proj,moe")


def _moe_overlap_flags(t: pd.DataFrame) -> None:
    """Delayed wgrad with the 1F1B EP overlap (Megatron-Bridge sets both together); shared-
    expert overlap where the model has shared experts, the dispatcher is alltoall and the 1F1B
    overlap is off (IMPUTATION['moe dispatch'])."""
    a2a = t["moe_a2a_overlap"].astype(bool)
    t["moe_delay_wgrad"] = a2a
    shared = pd.Series([catalog.get_model(m).shared_experts > 0 if isinstance(m, str) and m
                        else False for m in t.get("model", pd.Series("", index=t.index))],
                       index=t.index)
    t["moe_shared_expert_overlap"] = shared & (t["moe_dispatcher"] == "alltoall") & ~a2a


def validate(data: pd.DataFrame | None = None) -> pd.DataFrame:
    """Simulate every usable row; per-row predicted vs measured step time and memory."""
    data = load_published() if data is None else data
    use = data[data["skip"] == ""].copy()
    use = _impute(use)
    pred = simulate_frame(use)
    if "task" not in use:
        use["task"] = "pretrain"
    out = use[["id", "is_moe", "family", "framework", "source", "reliability", "label", "task",
               "gpu", "num_gpus",
               "seq_len", "precision",
               "tp", "pp", "cp", "vpp", "micro_batch", "recompute", "zero",
               "imputed", "measured_step_s", "measured_from", "measured_mem_gib"]].copy()
    out["predicted_step_s"] = pred["step_time_s"]
    out["step_error"] = out["predicted_step_s"] / out["measured_step_s"] - 1
    out["predicted_mem_gib"] = pred["peak_reserved_gib"]  # torchtitan logs peak reserved
    out["mem_error"] = out["predicted_mem_gib"] / out["measured_mem_gib"] - 1
    out["fits"] = pred["fits"]
    out["no_error_because"] = _why_no_error(out, pred)
    out["params_b"] = [_params_b(r) for _, r in use.iterrows()]
    return out


def _params_b(r: pd.Series) -> float:
    """The row's total parameters in billions (catalog.param_count of its catalog model or
    stated shape), for the model-size buckets."""
    m = r.get("model")
    if isinstance(m, str) and m:
        return catalog.param_count(m) / 1e9
    spec = {k: r[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                              "activation")}
    try:
        return catalog.param_count(spec) / 1e9
    except (catalog.CatalogError, TypeError, ValueError):
        return np.nan


def _why_no_error(out: pd.DataFrame, sim: pd.DataFrame) -> pd.Series:
    """Why a compared row has no step-time error ('' where it has one): nothing is NaN
    without a reason."""
    why = pd.Series("", index=out.index, dtype=object)
    pred, meas = out["predicted_step_s"], out["measured_step_s"]
    why[meas.isna()] = "no step time measured (compared on memory only)"
    bad = meas.notna() & ~np.isfinite(pred.astype(float))
    why[bad & ~out["fits"].astype(bool)] = "the simulator finds the layout does not fit memory"
    why[bad & out["fits"].astype(bool)] = "the simulator returned no step time for this layout"
    invalid = bad & ~sim["valid"].astype(bool)
    why[invalid] = "the simulator rejects the layout: " + sim.loc[invalid, "invalid_reason"]
    return why


def validate_memory() -> pd.DataFrame:
    """Peak memory vs measured: the dataset rows that report it (torchtitan, peak reserved of the
    worst rank) and TorchSim's Llama 70B FSDP tables (data/torchsim_memory.csv; one micro-batch
    per step; the global batch is micro_batch x dp)."""
    pub = validate()
    pub = pub[pub["measured_mem_gib"].notna()]
    a = pub[["id", "source", "framework", "label", "measured_mem_gib",
             "predicted_mem_gib"]].rename(
        columns={"id": "case"})
    ts = pd.read_csv(resources.files("sim_core").joinpath("data/torchsim_memory.csv"))
    runs = ts.drop(columns=["source", "table", "measured_mem_gib"]).assign(
        global_batch=lambda d: d["micro_batch"] * d["num_gpus"] // d["tp"],
        framework="torchtitan")  # eager torchtitan (its profile's defaults)
    pred = simulate_frame(runs)
    b = pd.DataFrame({"case": ts["table"] + " s=" + ts["seq_len"].astype(str),
                      "source": ts["source"], "framework": "torchtitan", "label": ts["model"],
                      "measured_mem_gib": ts["measured_mem_gib"],
                      "predicted_mem_gib": pred["peak_allocated_gib"]})
    out = pd.concat([a, b], ignore_index=True)
    out["mem_error"] = out["predicted_mem_gib"] / out["measured_mem_gib"] - 1
    return out


def summary(table: pd.DataFrame, by: str = "family") -> pd.DataFrame:
    """Median / p90 absolute error, bias and count per group, plus an 'all' row."""
    def agg(g):
        e = g["step_error"].dropna()
        me = g["mem_error"].dropna()
        return pd.Series({
            "rows": len(e), "median_abs_err": e.abs().median(), "p90_abs_err": e.abs().quantile(0.9),
            "max_abs_err": e.abs().max(), "bias": e.median(),
            "mem_rows": len(me), "mem_median_abs_err": me.abs().median() if len(me) else np.nan,
        })
    parts = [agg(g).rename(k) for k, g in table.groupby(by)]
    parts.append(agg(table).rename("all"))
    return pd.DataFrame(parts)


def main() -> None:  # python -m sim_core.accuracy.validation
    pd.set_option("display.width", 220)
    pd.set_option("display.max_rows", 500)
    t = validate()
    cols = ["id", "family", "label", "gpu", "num_gpus", "precision", "tp", "pp", "cp", "vpp",
            "micro_batch", "recompute", "zero", "measured_step_s", "predicted_step_s",
            "step_error", "measured_mem_gib", "predicted_mem_gib", "mem_error"]
    print(t[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print()
    print(summary(t).to_string(float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
