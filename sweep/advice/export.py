"""Export one configuration (a row of results.parquet) as launchable settings.

* Megatron-LM command-line flags (names as in megatron/training/arguments.py of
  NVIDIA/Megatron-LM core_v0.15.3, the last release whose flags are all declared literally
  there; the declared list is sweep/advice/data/known_flags/megatron_lm.tsv),
* a torchtitan TOML job file (sections and keys of torchtitan/config/job_config.py at
  pytorch/torchtitan e347b1e, the last TOML-configured version; sweep/advice/data/known_flags/torchtitan.tsv),
* the run YAML that `sweep simulate` takes (round trip: simulating it gives the same step time).

Mapping of the simulator's vocabulary:

=================  =========================================  =========================================
sweep              Megatron-LM                                torchtitan
=================  =========================================  =========================================
tp / pp / cp / ep  --tensor/pipeline/context/expert-model-... parallelism.*_degree
vpp                --num-layers-per-virtual-pipeline-stage    pipeline_parallel_schedule Interleaved1F1B,
                   (or --num-virtual-stages-per-pipeline-rank  pipeline_parallel_layers_per_stage
                   when layers do not split evenly)
micro_batch        --micro-batch-size                         pipeline_parallel_microbatch_size (pp>1),
                                                              else training.local_batch_size
recompute full     --recompute-granularity full               activation_checkpoint.mode = "full"
                   --recompute-method uniform --recompute-num-layers 1
recompute selective --recompute-granularity selective          mode = "selective", selective_ac_option = "op"
zero 0             (plain DDP)                                data_parallel_replicate_degree = dp
zero 1             --use-distributed-optimizer                FSDP, fsdp_reshard_after_forward = "never"
zero 2             --use-megatron-fsdp                        FSDP, fsdp_reshard_after_forward = "never"
                   --data-parallel-sharding-strategy optim_grads
zero 3             --use-megatron-fsdp ... optim_grads_params FSDP, fsdp_reshard_after_forward = "always"
precision fp8      --fp8-format hybrid                        model.converters = ["quantize.linear.float8"]
=================  =========================================  =========================================
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import pandas as pd
import yaml

from sim_core import recompute
from sim_core.specs import CLUSTER_COLUMNS, MODEL_COLUMNS, PARALLEL_COLUMNS

KNOWN_FLAGS_DIR = Path(__file__).resolve().parent / "data" / "known_flags"
MEGATRON_SOURCE = "NVIDIA/Megatron-LM core_v0.15.3 (megatron/training/arguments.py)"
TORCHTITAN_SOURCE = "pytorch/torchtitan e347b1e (torchtitan/config/job_config.py)"

# sweep model id -> (torchtitan model name, flavor) where torchtitan ships that model
TORCHTITAN_FLAVORS = {
    "llama3-8b": ("llama3", "8B"), "llama3.1-8b": ("llama3", "8B"),
    "llama3-70b": ("llama3", "70B"), "llama3.1-70b": ("llama3", "70B"),
    "llama3.1-405b": ("llama3", "405B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
    "gpt-oss-120b": ("gpt_oss", "120b"),
}
# FlexAttention is a model arg (attn_type "flex", attn_mask_type "block_causal"), not a TOML
# key: a flavor sets it (torchtitan/models/*/__init__.py at e347b1e). sweep model id -> the
# flavor that runs flex; deepseek_v3 671B and gpt_oss 120b run flex in their only flavor.
TORCHTITAN_FLEX_FLAVORS = {"llama3-8b": "8B_flex", "llama3.1-8b": "8B_flex",
                           "deepseek-v3": "671B", "gpt-oss-120b": "120b"}


# ---------------------------------------------------------------------------------------------
# A row, as plain Python values
# ---------------------------------------------------------------------------------------------
def _py(v):
    if hasattr(v, "item"):
        v = v.item()
    if v is pd.NA or v is None:
        return None
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        if v.is_integer():
            return int(v)
    return v


def config_of(row) -> dict:
    """A results row (Series or dict) -> {column: python value}, defaults filled in."""
    d = {k: _py(v) for k, v in (row.items() if hasattr(row, "items") else dict(row).items())}
    for k, default in {**PARALLEL_COLUMNS, **CLUSTER_COLUMNS}.items():
        if d.get(k) is None and default is not None:
            d[k] = default
    if not d.get("dp"):
        d["dp"] = d["num_gpus"] // (d["tp"] * d["pp"] * d["cp"])
    d.update({k: v for k, v in model_shape(d).items() if d.get(k) is None})
    return d


def model_shape(d: dict) -> dict:
    """Model shape fields: the row's own (inline model) or the catalog's."""
    shape = {k: d.get(k) for k in MODEL_COLUMNS if k != "model"}
    if shape.get("layers") is not None:
        return {k: (MODEL_COLUMNS[k] if v is None else v) for k, v in shape.items()}
    from sim_core import catalog

    cols = catalog.get_model(d["model"]).columns()
    return {k: cols[k] for k in MODEL_COLUMNS if k != "model"}


def _is_catalog_model(d: dict) -> bool:
    try:
        from sim_core import catalog

        catalog.get_model(d.get("model") or "")
        return True
    except Exception:  # noqa: BLE001
        return False


def describe(d: dict) -> str:
    """One line naming a configuration: 'a100-80gb x1024 tp8 pp16 vpp6 mb1 ...'."""
    on = f" on {d['instance']}" if d.get("instance") else ""
    parts = [f"{d['gpu']} x{d['num_gpus']}{on}", f"tp{d['tp']}", f"pp{d['pp']}"]
    if d.get("framework") not in (None, "megatron-core"):
        parts.insert(0, str(d["framework"]))
    if d.get("vpp", 1) > 1:
        parts.append(f"vpp{d['vpp']}")
    if d.get("cp", 1) > 1:
        parts.append(f"cp{d['cp']}")
    if d.get("ep", 1) > 1:
        parts.append(f"ep{d['ep']}")
    parts.append(f"dp{d['dp']}")
    parts.append(f"mb{d['micro_batch']}")
    if d.get("recompute", "none") != "none":
        parts.append(f"rc-{d['recompute']}")
    if d.get("sequence_parallel"):
        parts.append("sp")
    parts.append(f"z{d.get('zero', 1)}")
    if d.get("precision") in ("fp8", "nvfp4", "mxfp4"):
        parts.append(d["precision"])
    return " ".join(parts)


def _pipeline_split(layers: int, pp: int, vpp: int) -> tuple[str, dict]:
    """How Megatron should split `layers` over pp ranks x vpp chunks.

    Returns (kind, values): ('even', {'per_chunk': n}), ('uneven', {'first': f, 'last': l}) or
    ('layout', {}) when only --pipeline-model-parallel-layout can express it.
    """
    chunks = pp * vpp
    if layers % chunks == 0:
        return "even", {"per_chunk": layers // chunks}
    k = math.ceil(layers / chunks) * vpp  # layers on the busiest rank (rules.py)
    if pp >= 2:
        rem = layers - (pp - 2) * k
        first, last = rem // 2, rem - rem // 2
        if 1 <= first <= k and 1 <= last <= k and (vpp == 1 or (first % vpp == 0
                                                               and last % vpp == 0)):
            return "uneven", {"first": first, "last": last}
    return "layout", {}


# ---------------------------------------------------------------------------------------------
# Megatron-LM
# ---------------------------------------------------------------------------------------------
def megatron_args(row) -> list[str]:
    """Megatron-LM (pretrain_gpt.py) arguments for a configuration, as argv tokens."""
    d = config_of(row)
    m = model_shape(d)
    a: list[str] = []

    def opt(flag, value=None):
        a.append(flag)
        if value is not None:
            if isinstance(value, (list, tuple)):
                a.extend(str(v) for v in value)
            else:
                a.append(str(value))

    # parallelism
    opt("--tensor-model-parallel-size", d["tp"])
    opt("--pipeline-model-parallel-size", d["pp"])
    if d["cp"] > 1:
        opt("--context-parallel-size", d["cp"])
        if d.get("cp_comm") == "a2a":  # Ulysses: TE AttnFuncWithCPAndQKVOA2A (core_v0.15.3)
            opt("--cp-comm-type", "a2a")
    if m["experts"] > 0:
        opt("--expert-model-parallel-size", d["ep"])
        if d.get("etp"):
            opt("--expert-tensor-parallel-size", d["etp"])
    if d["pp"] > 1:
        kind, v = _pipeline_split(m["layers"], d["pp"], d["vpp"])
        if kind == "even" and d["vpp"] > 1:
            opt("--num-layers-per-virtual-pipeline-stage", v["per_chunk"])
        elif kind != "even":
            if d["vpp"] > 1:
                opt("--num-virtual-stages-per-pipeline-rank", d["vpp"])
            if kind == "uneven":
                opt("--decoder-first-pipeline-num-layers", v["first"])
                opt("--decoder-last-pipeline-num-layers", v["last"])
    if d.get("sequence_parallel") and d["tp"] > 1:
        opt("--sequence-parallel")
    # batch
    opt("--micro-batch-size", d["micro_batch"])
    opt("--global-batch-size", d["global_batch"])
    opt("--seq-length", d["seq_len"])
    opt("--max-position-embeddings", d["seq_len"])
    # activation recomputation
    if d["recompute"] == "full":
        opt("--recompute-granularity", "full")
        opt("--recompute-method", "uniform")
        opt("--recompute-num-layers", 1)
    elif d["recompute"] == "selective":
        opt("--recompute-granularity", "selective")
        # the listed modules (sim_core/recompute.py), else op-level selective as core_attn
        v = d.get("recompute_modules")
        listed = recompute.names(0 if v is None or (isinstance(v, float) and math.isnan(v))
                                 else recompute.mask(v))
        opt("--recompute-modules", listed or ["core_attn"])
    elif d.get("moe_recompute", "none") != "none" and m["experts"] > 0:
        opt("--recompute-granularity", "selective")  # MoE recompute module (sim_core/moe.py)
        opt("--recompute-modules", [d["moe_recompute"]])
    # data-parallel sharding / optimizer
    zero = d.get("zero", 1)
    if zero == 1:
        opt("--use-distributed-optimizer")
    elif zero in (2, 3):
        opt("--use-megatron-fsdp")
        opt("--data-parallel-sharding-strategy",
            "optim_grads" if zero == 2 else "optim_grads_params")
    if d.get("adam_bf16_states"):
        # priced with bf16 Adam moments (memory.estimate: 8 B per parameter, not 12)
        opt("--use-precision-aware-optimizer")
        opt("--exp-avg-dtype", "bf16")
        opt("--exp-avg-sq-dtype", "bf16")
    if d.get("overlap_grad_reduce"):
        opt("--overlap-grad-reduce")
    if d.get("overlap_param_gather") and zero >= 1:
        opt("--overlap-param-gather")
    if d.get("tp_comm_overlap") and d["tp"] > 1 and d.get("sequence_parallel"):
        opt("--tp-comm-overlap")
    if m["experts"] > 0:
        _moe_args(d, opt)
    if not d.get("grad_reduce_fp32", True):
        opt("--grad-reduce-in-bf16")
    # precision and kernels
    opt("--bf16")
    if d.get("precision") == "fp8":
        opt("--fp8-format", "hybrid")
        opt("--fp8-recipe", d.get("fp8_recipe") or "delayed")  # tensorwise|delayed|mxfp8|blockwise
    elif d.get("precision") == "nvfp4":
        # TE NVFP4BlockScaling (Megatron-LM core_v0.19.0 transformer_config.py fp4 / fp4_recipe /
        # fp4_param; catalogs/fp4.yaml); every layer in FP4 (--first-last-layers-bf16 is off)
        opt("--fp4-format", "e2m1")
        opt("--fp4-recipe", "nvfp4")
        if d.get("fp8_param_gather"):
            opt("--fp4-param-gather")
    # the cross-entropy that was priced (workload.LOSS_TRAFFIC); vocab_parallel is the default
    if d.get("loss_impl") in ("fused", "te"):
        opt("--cross-entropy-loss-fusion")
        if d["loss_impl"] == "te":
            opt("--cross-entropy-fusion-impl", "te")
    # on ROCm, Transformer Engine's fused backend is the CK flash-attention (fa2 family) that
    # AMD's fork runs by default (ROCm/Megatron-LM examples/llama/train_llama3.sh @32d5d428)
    # fa3 (cuDNN) is TE's fused backend; the FlashAttention kernels (fa2, and the fa1 / triton
    # kernels Megatron-Core has no backend for, so such rows are invalid for it) map to flash
    fused = d.get("attention_kernel") not in ("fa2", "fa1", "triton") or is_rocm(d)
    if d.get("attention_kernel") == "unfused":
        # the unfused path's cost depends on the dropout it runs: write what was priced
        # (Megatron's own default is 0.1)
        opt("--attention-backend", "unfused")
        opt("--attention-dropout", d.get("attention_dropout") or 0.0)
    else:
        opt("--attention-backend", "fused" if fused else "flash")
    # model shape
    opt("--num-layers", m["layers"])
    opt("--hidden-size", m["hidden"])
    opt("--num-attention-heads", m["heads"])
    opt("--ffn-hidden-size", m["ffn"])
    if m.get("head_dim") and m["head_dim"] != m["hidden"] // m["heads"]:
        opt("--kv-channels", m["head_dim"])
    if m.get("kv_heads") and m["kv_heads"] != m["heads"]:
        opt("--group-query-attention")
        opt("--num-query-groups", m["kv_heads"])
    if m.get("activation") == "swiglu":
        opt("--swiglu")
    elif m.get("activation") == "relu2":
        opt("--squared-relu")
    if not m.get("tied_embeddings"):
        opt("--untie-embeddings-and-output-weights")
    if m["experts"] > 0:
        opt("--num-experts", m["experts"])
        opt("--moe-router-topk", m["top_k"])
        opt("--moe-ffn-hidden-size", m["expert_ffn"])
        if m.get("shared_experts"):
            opt("--moe-shared-expert-intermediate-size", m["shared_experts"] * m["expert_ffn"])
        if m.get("first_dense_layers"):
            k = m["first_dense_layers"]
            opt("--moe-layer-freq", f"([0]*{k}+[1]*{m['layers'] - k})")
    if m.get("sliding_window"):
        # TE's window (left, right) spans keys [i - left, i + right]: a window of w keys, the
        # query included, is (w - 1, 0) (Megatron-Bridge v0.4.0 gpt_oss_bridge.py does the same)
        opt("--window-size", f"{int(m['sliding_window']) - 1},0")
        if m.get("window_attn_skip_freq"):
            opt("--window-attn-skip-freq", int(m["window_attn_skip_freq"]))
    if m.get("kv_lora_rank"):
        opt("--multi-latent-attention")
        if m.get("q_lora_rank"):
            opt("--q-lora-rank", m["q_lora_rank"])
        opt("--kv-lora-rank", m["kv_lora_rank"])
        opt("--qk-head-dim", m["qk_nope_head_dim"])
        opt("--qk-pos-emb-head-dim", m["qk_rope_head_dim"])
        opt("--v-head-dim", m["v_head_dim"])
    return a


def _moe_args(d: dict, opt) -> None:
    """The MoE dispatch path (sim_core/moe.py) as Megatron-Core core_v0.15.3 flags: the token
    dispatcher (flex = DeepEP), grouped GEMM (what the compute model prices), fused permutation
    and router, capacity factor, and the overlaps (combined 1F1B EP overlap with delayed wgrad,
    shared-expert overlap)."""
    disp = d.get("moe_dispatcher") or "alltoall"
    opt("--moe-token-dispatcher-type", disp)
    if disp == "flex":
        opt("--moe-enable-deepep")
    opt("--moe-grouped-gemm")
    if d.get("moe_permute_fusion"):
        opt("--moe-permute-fusion")
    if d.get("moe_router_fusion"):
        opt("--moe-router-fusion")
    if d.get("moe_dropless") is False:
        opt("--moe-expert-capacity-factor", d.get("capacity_factor", 1.0))
    if d.get("moe_a2a_overlap"):
        opt("--overlap-moe-expert-parallel-comm")
        if d.get("moe_delay_wgrad"):
            opt("--delay-wgrad-compute")
    if d.get("moe_shared_expert_overlap"):
        opt("--moe-shared-expert-overlap")


def is_rocm(d: dict) -> bool:
    """The configuration's GPU is an AMD part (ROCm, RCCL)."""
    try:
        from sim_core import catalog

        return catalog.get_gpu(str(d.get("gpu"))).vendor == "amd"
    except Exception:  # noqa: BLE001  (an inline or unknown GPU: not ROCm)
        return False


def rocm_lines(d: dict, framework: str, comment: str) -> list[str]:
    """What differs on ROCm, for an AMD configuration (else nothing): the environment
    `framework`'s ROCm launcher sets (catalogs/frameworks.yaml `rocm`, each cited), as shell
    exports (comment "") or as comment lines (comment "# "), and the kernels it runs."""
    if not is_rocm(d):
        return []
    from sim_core import frameworks

    r = frameworks.profiles()[framework].get("rocm") or {}
    if not r.get("runs"):
        return [f"{comment or '# '}ROCm: this framework has no ROCm profile in sweep"]
    c = comment or "# "
    out = [f"{c}ROCm (AMD {d.get('gpu')}): {r['code']}; RCCL replaces NCCL under the same "
           "NCCL_* names",
           f"{c}attention: CK flash-attention (fa2 family; no FA3/cuDNN on ROCm)"]
    out += [f"{comment}export {k}={v}" for k, v in r.get("env", {}).items()]
    if d.get("precision") == "mxfp4":
        # AMD-AGI/Primus: MXFP4 is a Primus config, not a flag of upstream Megatron-LM (its
        # --fp4-recipe is nvfp4 only): examples/megatron/configs/MI355X/
        # llama3.1_8B-MXFP4-pretrain.yaml @fd1eeabb sets these three; primus_turbo.py
        # primus_turbo_fp4_autocast runs the Primus-Turbo MXFP4 GEMMs (catalogs/fp4.yaml)
        out.append(f"{c}MXFP4 (Primus config, not a pretrain_gpt.py flag): fp4: e2m1, "
                   "fp4_recipe: mxfp4, enable_primus_turbo: true")
    if r.get("env_not_set"):
        out.append(f"{c}not set here: {r['env_not_set']}")
    return out


def _prediction_lines(d: dict) -> list[str]:
    out = []
    if d.get("step_time_s") is not None:
        out.append(f"predicted: step {d['step_time_s']:.3f} s, "
                   f"{d.get('tokens_per_s_per_gpu') or 0:,.0f} tokens/s/GPU, "
                   f"MFU {d.get('mfu') or 0:.1%}, peak memory {d.get('peak_memory_gib') or 0:.1f} GiB"
                   + (f", ${d['cost_per_mtok_usd']:.3f}/Mtok" if d.get("cost_per_mtok_usd")
                      is not None else ""))
    return out


def megatron_text(row) -> str:
    """A shell snippet: comments + MEGATRON_ARGS=( ... ) one flag per line."""
    d = config_of(row)
    args = megatron_args(row)
    nodes = math.ceil(d["num_gpus"] / d["gpus_per_node"])
    lines = [f"# Megatron-LM flags for {d['model']}: {describe(d)}",
             f"# flag names: {MEGATRON_SOURCE}",
             f"# world size {d['num_gpus']} = {nodes} nodes x {d['gpus_per_node']} GPUs; "
             f"data-parallel size {d['dp']} is derived by Megatron",
             *[f"# {x}" for x in _prediction_lines(d)]]
    m = model_shape(d)
    if d["pp"] > 1 and _pipeline_split(m["layers"], d["pp"], d["vpp"])[0] == "layout":
        lines.append("# uneven pipeline split: give --pipeline-model-parallel-layout instead of "
                     "the virtual-stage flag")
    if d.get("zero") in (2, 3):
        lines.append("# ZeRO-2/3 maps to Megatron FSDP (--use-megatron-fsdp); it may need "
                     "--ckpt-format fsdp_dtensor")
    # NeMo / Megatron-Bridge rows run Megatron-Core too; on ROCm through their own port
    lines += rocm_lines(d, "nemo" if d.get("framework") == "nemo" else "megatron-core", "")
    lines.append("# add your data/tokenizer/optimizer flags (--data-path, --tokenizer-type, "
                 "--lr, --train-iters, ...)")
    lines.append("MEGATRON_ARGS=(")
    i = 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        lines.append("    " + " ".join(shlex.quote(t) for t in args[i:j]))
        i = j
    lines.append(")")
    lines.append('# torchrun --nproc-per-node 8 --nnodes ' + str(nodes)
                 + ' ... pretrain_gpt.py "${MEGATRON_ARGS[@]}"')
    # a comment never ends early: no value from a results file can start a shell line
    lines = [re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", " ", ln) for ln in lines]
    return "\n".join(lines) + "\n"


def parse_megatron_text(text: str) -> list[str]:
    """The argv tokens inside MEGATRON_ARGS=( ... ) of megatron_text()."""
    body = text.split("MEGATRON_ARGS=(", 1)[1].split("\n)", 1)[0]
    return shlex.split(body, comments=True)


# ---------------------------------------------------------------------------------------------
# torchtitan
# ---------------------------------------------------------------------------------------------
def torchtitan_config(row) -> dict:
    """{section: {key: value}} of a torchtitan job file (nested sections as dotted names)."""
    d = config_of(row)
    m = model_shape(d)
    dp, zero = d["dp"], d.get("zero", 1)
    name, flavor = TORCHTITAN_FLAVORS.get(str(d.get("model")), (None, None))
    if flavor and d.get("attention_kernel") == "flex":
        flavor = TORCHTITAN_FLEX_FLAVORS.get(str(d.get("model")), flavor)
    model = {"name": name or str(d.get("model")), "flavor": flavor or "custom"}
    recipe = d.get("fp8_recipe") or "tensorwise"
    if d.get("precision") == "fp8":  # MXFP8 is torchtitan's mx converter, the rest float8's
        model["converters"] = ["quantize.linear.mx" if recipe == "mxfp8"
                               else "quantize.linear.float8"]
    if d["pp"] > 1:  # one optimizer step = one pipeline schedule over all microbatches
        local = d["global_batch"] // dp
    else:  # gradient accumulation over micro-batches
        local = d["micro_batch"]
    training = {"local_batch_size": local, "global_batch_size": d["global_batch"],
                "seq_len": d["seq_len"], "mixed_precision_param": "bfloat16",
                "mixed_precision_reduce": "float32"}  # the only value torchtitan accepts
    par = {"data_parallel_replicate_degree": dp if zero == 0 else 1,
           "data_parallel_shard_degree": 1 if zero == 0 else dp,
           "fsdp_reshard_after_forward": "always" if zero == 3 else "never",
           "tensor_parallel_degree": d["tp"],
           "pipeline_parallel_degree": d["pp"],
           "context_parallel_degree": d["cp"]}
    if d["tp"] > 1 and d.get("tp_comm_overlap"):
        par["enable_async_tensor_parallel"] = True
    if d["pp"] > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if d["vpp"] > 1 else "1F1B"
        par["pipeline_parallel_microbatch_size"] = d["micro_batch"]
        if m["layers"] % (d["pp"] * d["vpp"]) == 0:
            par["pipeline_parallel_layers_per_stage"] = m["layers"] // (d["pp"] * d["vpp"])
        par["pipeline_parallel_first_stage_less_layers"] = 0
        par["pipeline_parallel_last_stage_less_layers"] = 0
    if m["experts"] > 0:
        par["expert_parallel_degree"] = d["ep"]
        par["expert_tensor_parallel_degree"] = d.get("etp") or d["tp"]
    ac = {"mode": d["recompute"]}
    if d["recompute"] == "selective":
        ac["selective_ac_option"] = "op"
    # torch.compile fuses the elementwise ops (and AsyncTP needs it); the loss is compiled only
    # where the configuration was simulated with the compiled cross-entropy
    compile_ = {"enable": bool(d.get("fused_elementwise", True) or par.get(
        "enable_async_tensor_parallel") or d.get("loss_impl") == "compiled"),
        "components": ["model"] + (["loss"] if d.get("loss_impl") == "compiled" else [])}
    out = {"job": {"description": f"{d.get('model')}: {describe(d)} (exported by sweep)"},
           "model": model, "training": training, "parallelism": par,
           "activation_checkpoint": ac, "compile": compile_}
    if d.get("precision") == "fp8" and recipe == "mxfp8":
        out["quantize.linear.mx"] = {"filter_fqns": ["output"]}
    elif d.get("precision") == "fp8":
        # the float8 all-gather of FSDP weights exists for tensorwise scales only (torchao
        # float8 fsdp_utils); rowwise recipes communicate in bf16
        tensorwise = recipe not in ("rowwise", "rowwise_with_gw_hp")
        out["quantize.linear.float8"] = {
            "enable_fsdp_float8_all_gather": zero == 3 and tensorwise,
            "precompute_float8_dynamic_scale_for_fsdp": zero == 3 and tensorwise,
            "filter_fqns": ["output"]}
        if not tensorwise:  # unset = tensorwise (torchtitan e347b1e)
            out["quantize.linear.float8"]["recipe_name"] = recipe
    return out


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def torchtitan_toml(row) -> str:
    d = config_of(row)
    cfg = torchtitan_config(row)
    lines = [f"# torchtitan job file for {d.get('model')}: {describe(d)}",
             f"# keys: {TORCHTITAN_SOURCE}",
             f"# run: NGPU={d['num_gpus']} CONFIG_FILE=this.toml ./run_train.sh "
             f"(across {math.ceil(d['num_gpus'] / d['gpus_per_node'])} nodes)",
             *[f"# {x}" for x in _prediction_lines(d)]]
    if cfg["model"]["flavor"] == "custom":
        lines.append(f"# torchtitan ships no flavor of {d.get('model')}: register one with "
                     f"layers={model_shape(d)['layers']}, hidden={model_shape(d)['hidden']}")
    flex_flavor = TORCHTITAN_FLEX_FLAVORS.get(str(d.get("model")))
    if d.get("attention_kernel") == "flex" and cfg["model"]["flavor"] != flex_flavor:
        lines.append(f"# FlexAttention: torchtitan ships no flex flavor of {d.get('model')}: "
                     "register one with attn_type=\"flex\", attn_mask_type=\"block_causal\" "
                     f"(torchtitan/models/{cfg['model']['name']}/__init__.py)")
    elif d.get("attention_kernel") != "flex" and flex_flavor == cfg["model"]["flavor"]:
        lines.append(f"# flavor {flex_flavor} runs FlexAttention (attn_type \"flex\"), not the "
                     f"simulated {d.get('attention_kernel')}: attention_kernel flex prices what it "
                     "runs")
    lines += rocm_lines(d, "torchtitan", "# ")
    lines.append("# add [optimizer], [lr_scheduler], [training] dataset/steps, [checkpoint]")
    for section, body in cfg.items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# nanotron
# ---------------------------------------------------------------------------------------------
NANOTRON_SOURCE = "huggingface/nanotron 2411b022 (src/nanotron/config/*.py dataclasses)"


def nanotron_config(row) -> dict:
    """The parallelism, tokens, optimizer and model sections of a nanotron YAML config (keys
    as in sweep/advice/data/known_flags/nanotron.tsv)."""
    d = config_of(row)
    m = model_shape(d)
    dp = d["dp"]
    accum = d["global_batch"] // (dp * d["micro_batch"])
    par = {"dp": dp, "tp": d["tp"], "pp": d["pp"],
           "pp_engine": d.get("pp_schedule") or "1f1b",
           # nanotron's sequence parallelism is its REDUCE_SCATTER TP mode
           "tp_mode": "REDUCE_SCATTER" if d.get("sequence_parallel") and d["tp"] > 1
           else "ALL_REDUCE",
           "tp_linear_async_communication": bool(d.get("tp_comm_overlap")) and d["tp"] > 1,
           "recompute_layer": d["recompute"] == "full",
           "expert_parallel_size": d.get("ep", 1)}
    if d["cp"] > 1:
        par["context_parallel_size"] = d["cp"]
    kv = m["kv_heads"] or m["heads"]
    model_cfg = {"hidden_size": m["hidden"], "intermediate_size": m["ffn"],
                 "num_hidden_layers": m["layers"], "num_attention_heads": m["heads"],
                 "num_key_value_heads": kv, "vocab_size": m["vocab"],
                 "max_position_embeddings": d["seq_len"],
                 "hidden_act": "silu" if m["activation"] == "swiglu" else "gelu",
                 "tie_word_embeddings": bool(m["tied_embeddings"]), "is_llama_config": True}
    return {
        "general": {"project": "sweep", "run": str(d.get("model"))},
        "parallelism": par,
        "tokens": {"sequence_length": d["seq_len"], "micro_batch_size": d["micro_batch"],
                   "batch_accumulation_per_replica": accum},
        "optimizer": {"zero_stage": d.get("zero", 0),
                      "accumulate_grad_in_fp32": bool(d.get("grad_reduce_fp32", True))},
        "model": {"dtype": "bfloat16", "model_config": model_cfg},
    }


def flatten(cfg: dict, prefix: str = "") -> dict:
    """{section: {key: v}} -> {"section.key": v}, at any depth."""
    out = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def nanotron_yaml(row) -> str:
    d = config_of(row)
    head = [f"# nanotron config (sections to merge into your config) for {d.get('model')}: "
            f"{describe(d)}", f"# keys: {NANOTRON_SOURCE}",
            f"# run: torchrun --nproc-per-node {d['gpus_per_node']} --nnodes "
            f"{math.ceil(d['num_gpus'] / d['gpus_per_node'])} run_train.py --config-file this.yaml",
            *[f"# {x}" for x in _prediction_lines(d)],
            "# add data_stages, tokenizer, checkpoints, optimizer learning_rate_scheduler and "
            "optimizer_factory"]
    return "\n".join(head) + "\n" + yaml.safe_dump(nanotron_config(row), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------------------------
DEEPSPEED_SOURCE = "microsoft/DeepSpeed 38327e07f (runtime/constants.py, zero/config.py)"


def deepspeed_config(row) -> dict:
    """A DeepSpeed config (JSON) for the configuration: batch sizes, bf16, the ZeRO stage with
    its default buckets, AutoTP size (keys as in sweep/advice/data/known_flags/deepspeed.tsv). Pipeline
    stages are set in code (deepspeed.pipe.PipelineModule(num_stages=pp)), not in the JSON, and so
    is Ulysses sequence parallelism (cp > 1, cp_comm a2a: deepspeed/sequence/layer.py
    DistributedAttention wraps the attention with a sequence process group of cp ranks)."""
    d = config_of(row)
    dp, zero = d["dp"], d.get("zero", 0)
    accum = d["global_batch"] // (dp * d["micro_batch"])
    zero_cfg = {"stage": zero, "contiguous_gradients": True, "reduce_bucket_size": 500000000,
                "overlap_comm": bool(d.get("overlap_grad_reduce", False))}
    if zero == 3:
        zero_cfg["stage3_prefetch_bucket_size"] = 50000000
    cfg = {"train_batch_size": d["global_batch"],
           "train_micro_batch_size_per_gpu": d["micro_batch"],
           "gradient_accumulation_steps": accum,
           "gradient_clipping": 1.0,
           "bf16": {"enabled": True},
           "zero_optimization": zero_cfg}
    if d["tp"] > 1:
        cfg["tensor_parallel"] = {"autotp_size": d["tp"]}
    if d["recompute"] == "full" and d["pp"] > 1:
        # DeepSpeed's own checkpointing API (deepspeed.checkpointing), used by PipelineModule
        cfg["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False}
    return cfg


def deepspeed_json(row) -> str:
    import json

    return json.dumps(deepspeed_config(row), indent=2) + "\n"


# ---------------------------------------------------------------------------------------------
# llm-foundry
# ---------------------------------------------------------------------------------------------
LLMFOUNDRY_SOURCE = ("mosaicml/llm-foundry 8c8dd48 (llmfoundry/utils/config_utils.py, "
                     "models/mpt/configuration_mpt.py, models/layers/attention.py)")
# attention kernel family -> model.attn_config.attn_impl. llm-foundry registers `flash`
# (flash_attn_fn) and `torch` (attention.py at 8c8dd48); `triton` (triton_flash_attn_fn) exists
# from v0.1.1 to v0.6.0. `flash` is FlashAttention-1 where setup.py pins flash-attn 1.x (v0.1.1:
# 1.0.3.post0 ... v0.5.0's `gpu` extra: 1.0.9), FlashAttention-2 otherwise; llm-foundry has no
# FlashAttention-3/cuDNN path, so fa3 is written as flash (its nearest kernel) with a note.
LLMFOUNDRY_ATTN_IMPL = {"fa2": "flash", "fa1": "flash", "fa3": "flash", "triton": "triton"}
LLMFOUNDRY_SHARDING = {0: "NO_SHARD", 1: "SHARD_GRAD_OP", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}


def llmfoundry_config(row) -> dict:
    """The model, batch, precision and FSDP keys of an llm-foundry train YAML (MPT model; keys
    as in sweep/advice/data/known_flags/llmfoundry.tsv)."""
    d = config_of(row)
    m = model_shape(d)
    kernel = d.get("attention_kernel") or "fa2"
    attn = {"attn_impl": LLMFOUNDRY_ATTN_IMPL[kernel]}
    kv = m["kv_heads"] or m["heads"]
    if kv < m["heads"]:
        attn.update(attn_type="grouped_query_attention", kv_n_heads=kv)
    ratio = m["ffn"] / m["hidden"]
    return {
        "max_seq_len": d["seq_len"],
        "model": {"name": "mpt_causal_lm", "d_model": m["hidden"], "n_heads": m["heads"],
                  "n_layers": m["layers"],
                  "expansion_ratio": int(ratio) if float(ratio).is_integer() else ratio,
                  "max_seq_len": d["seq_len"], "vocab_size": m["vocab"], "attn_config": attn,
                  # SwiGLU: layers/ffn.py registers mptglu; ffn_act_fn names a torch.nn.functional
                  **({"ffn_config": {"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}}}
                     if m["activation"] == "swiglu" else {})},
        "global_train_batch_size": d["global_batch"],
        "device_train_microbatch_size": d["micro_batch"],
        "precision": "amp_fp8" if d.get("precision") == "fp8" else "amp_bf16",
        "fsdp_config": {"sharding_strategy": LLMFOUNDRY_SHARDING[int(d.get("zero", 3))],
                        "mixed_precision": "PURE",
                        "activation_checkpointing": d["recompute"] == "full"},
    }


def llmfoundry_yaml(row) -> str:
    d = config_of(row)
    kernel = d.get("attention_kernel") or "fa2"
    note = {"fa1": "attn_impl: flash runs FlashAttention-1 with llm-foundry <= v0.5.0 and "
                   "flash-attn 1.0.x installed (setup.py `gpu` extra)",
            "triton": "attn_impl: triton needs llm-foundry v0.1.1-v0.6.0 (removed in v0.7.0)",
            "fa3": "llm-foundry has no FlashAttention-3/cuDNN attention: attn_impl: flash "
                   "(FlashAttention-2) is the nearest"}.get(kernel)
    head = [f"# llm-foundry train YAML (keys to merge into your config) for {d.get('model')}: "
            f"{describe(d)}", f"# keys: {LLMFOUNDRY_SOURCE}",
            f"# run: composer scripts/train/train.py this.yaml (on {d['num_gpus']} GPUs)",
            *[f"# {x}" for x in _prediction_lines(d)],
            *([f"# {note}"] if note else []),
            "# add tokenizer, train_loader, optimizer, scheduler and max_duration"]
    return "\n".join(head) + "\n" + yaml.safe_dump(llmfoundry_config(row), sort_keys=False)


def known_keys(name: str) -> set[str]:
    """Dotted keys of sweep/advice/data/known_flags/{nanotron,deepspeed,llmfoundry}.tsv."""
    text = (KNOWN_FLAGS_DIR / f"{name}.tsv").read_text()
    return {ln.split("\t")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


def unknown_keys(cfg: dict, name: str) -> list[str]:
    """Keys of an exported config that the framework's code does not declare."""
    return sorted(set(flatten(cfg)) - known_keys(name))


# ---------------------------------------------------------------------------------------------
# run YAML for `sweep simulate`
# ---------------------------------------------------------------------------------------------
def _run_parallel_fields() -> list[str]:
    """Parallel fields a run file accepts (those of the simulator that config.py knows)."""
    from ..config import ParallelConfig

    known = set(ParallelConfig.model_fields) - {"dp", "fsdp"}
    return [k for k in PARALLEL_COLUMNS if k in known]


def run_dict(row) -> dict:
    d = config_of(row)
    if _is_catalog_model(d) and not _inline_differs(d):
        model = d["model"]
    else:
        model = {"name": str(d.get("model") or "custom"), **model_shape(d)}
    if d.get("instance"):  # the instance type sets the GPU, the node and the network
        return _instance_run_dict(d, model, describe(d))
    cluster = {"gpu": d["gpu"], "num_gpus": d["num_gpus"], "gpus_per_node": d["gpus_per_node"]}
    if d.get("nics_per_node"):
        cluster["nics_per_node"] = d["nics_per_node"]
    if d.get("nic_bw_gbs"):
        cluster["nic_bw_gbs"] = float(d["nic_bw_gbs"])
    if d.get("power_limit_w"):
        cluster["power_limit_w"] = float(d["power_limit_w"])
    if d.get("price_per_hour") is not None and _price_overridden(d):
        cluster["price_per_hour"] = float(d["price_per_hour"])
    for k in ("mtbf_node_hours", "storage_gbs", "restart_min"):  # set by the run (0 = default)
        if d.get(k):
            cluster[k] = float(d[k])
    parallel = {k: d[k] for k in _run_parallel_fields() if d.get(k) is not None}
    if "recompute_modules" in parallel:  # the names of the core's bit mask; none: left out
        names = recompute.names(recompute.mask(parallel.pop("recompute_modules")))
        if names:
            parallel["recompute_modules"] = names
    out = {"model": model, "seq_len": d["seq_len"], "global_batch": d["global_batch"],
           "precision": d.get("precision", "bf16"),
           "framework": d.get("framework") or "megatron-core", "cluster": cluster,
           "parallel": parallel}
    checkpoint = {}
    if d.get("ckpt_async") in (0, 1):
        checkpoint["async_save"] = bool(d["ckpt_async"])
    if d.get("ckpt_interval_steps"):
        checkpoint["interval_steps"] = int(d["ckpt_interval_steps"])
    if checkpoint:
        out["checkpoint"] = checkpoint
    out.update(_finetune_run_fields(d))
    out["description"] = f"exported by sweep: {describe(d)}"
    return out


def _finetune_run_fields(d: dict) -> dict:
    """task, peft and data of a run file (sim_core/tasks.py); nothing for pre-training."""
    from sim_core import tasks

    task = str(d.get("task") or "pretrain")
    out: dict = {}
    if task != "pretrain":
        out["task"] = task
    if tasks.TASK_TRAITS.get(task, {}).get("frozen_base"):
        peft = {"rank": d.get("lora_rank"), "alpha": d.get("lora_alpha"),
                "dropout": d.get("lora_dropout")}
        peft = {k: v for k, v in peft.items() if v is not None}
        if d.get("lora_targets") is not None:
            peft["targets"] = tasks.targets_names(int(d["lora_targets"]))
        out["peft"] = peft
    data = {}
    if d.get("packing") is not None and task != "pretrain":
        data["packing"] = bool(d["packing"])
    if d.get("mean_seq_len"):
        data["mean_seq_len"] = int(d["mean_seq_len"])
    if data:
        out["data"] = data
    return out


def _instance_run_dict(d: dict, model, text: str) -> dict:
    from sim_core import catalog

    inst = catalog.get_instance(d["instance"])
    cluster = {"instance": inst.name, "nodes": int(d["num_gpus"]) // inst.gpus_per_node}
    price = d.get("price_per_hour")
    if price is not None and (inst.price_per_gpu_hour is None
                              or abs(inst.price_per_gpu_hour - float(price)) > 1e-9):
        cluster["price_per_hour"] = float(price)
    parallel = {k: d[k] for k in _run_parallel_fields() if d.get(k) is not None}
    return {"model": model, "seq_len": d["seq_len"], "global_batch": d["global_batch"],
            "precision": d.get("precision", "bf16"),
            "framework": d.get("framework") or "megatron-core", "cluster": cluster,
            "parallel": parallel, **_finetune_run_fields(d),
            "description": f"exported by sweep: {text}"}


def _inline_differs(d: dict) -> bool:
    """True when the row carries a model shape other than the catalog's (inline model)."""
    if d.get("layers") is None:
        return False
    from sim_core import catalog

    cols = catalog.get_model(d["model"]).columns()
    return any(d.get(k) is not None and d[k] != cols[k] for k in ("layers", "hidden", "heads",
                                                                    "ffn", "vocab"))


def _price_overridden(d: dict) -> bool:
    try:
        from sim_core import catalog

        return abs(catalog.get_gpu(d["gpu"]).price_per_hour - float(d["price_per_hour"])) > 1e-9
    except Exception:  # noqa: BLE001
        return False


def run_yaml(row) -> str:
    d = config_of(row)
    head = [f"# run file for `sweep simulate`: {describe(d)}",
            *[f"# {x}" for x in _prediction_lines(d)]]
    body = yaml.safe_dump(run_dict(row), sort_keys=False, default_flow_style=False)
    return "\n".join(head) + "\n" + body


FORMATS = {"megatron": megatron_text, "torchtitan": torchtitan_toml, "yaml": run_yaml,
           "deepspeed": deepspeed_json, "nanotron": nanotron_yaml, "llmfoundry": llmfoundry_yaml}
FILES = {"megatron": "megatron_args.sh", "torchtitan": "torchtitan.toml", "yaml": "run.yaml",
         "deepspeed": "deepspeed_config.json", "nanotron": "nanotron.yaml",
         "llmfoundry": "llmfoundry.yaml"}
# the recipe each framework launches from (besides run.yaml); Megatron flags and the torchtitan
# TOML are always written, as before
FRAMEWORK_FORMATS = {"deepspeed": "deepspeed", "nanotron": "nanotron", "llm-foundry": "llmfoundry"}


def export(row, fmt: str) -> str:
    return FORMATS[fmt](row)


# ---------------------------------------------------------------------------------------------
# Declared known flags (tests and `check_*` use them)
# ---------------------------------------------------------------------------------------------
def known_megatron_flags() -> dict[str, tuple[str, list[str]]]:
    """{flag: (kind, choices)} from sweep/advice/data/known_flags/megatron_lm.tsv."""
    out = {}
    for line in (KNOWN_FLAGS_DIR / "megatron_lm.tsv").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        flag, kind, choices, _dest = (line.split("\t") + ["", "", ""])[:4]
        out[flag] = (kind, [c for c in choices.split(",") if c])
    return out


def known_torchtitan_keys() -> dict[str, tuple[str, list[str]]]:
    """{section.key: (type, choices)} from sweep/advice/data/known_flags/torchtitan.tsv."""
    out = {}
    for line in (KNOWN_FLAGS_DIR / "torchtitan.tsv").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, typ, choices = (line.split("\t") + ["", ""])[:3]
        out[key] = (typ, [c for c in choices.split(",") if c])
    return out


def megatron_parser():
    """An argparse parser with every declared Megatron-LM flag (kinds and choices)."""
    import argparse

    p = argparse.ArgumentParser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False)
    dests = {}
    for flag, (kind, choices) in known_megatron_flags().items():
        dest = flag.lstrip("-").replace("-", "_")
        if dest in dests:  # aliases share argparse's dest by name; keep them distinct
            dest = f"{dest}__{len(dests)}"
        dests[dest] = flag
        kw = {"dest": dest}
        if kind == "flag":
            kw["action"] = "store_true"
        elif kind == "list":
            kw["nargs"] = "*"
        elif kind == "optional":
            kw["nargs"] = "?"
        if choices and kind != "flag":
            kw["choices"] = choices
        p.add_argument(flag, **kw)
    return p
