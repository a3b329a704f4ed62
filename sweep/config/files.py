"""Run files (`sweep simulate`) and search-space files (`sweep search`, `sweep check`).

A run file fixes one configuration::

    model: gpt3-175b            # a catalog id, or inline {layers: .., hidden: .., heads: .., ...}
    seq_len: 2048
    global_batch: 1536          # sequences per optimizer step (or global_batch_tokens: 3145728)
    precision: bf16             # bf16 | fp8 | nvfp4 | mxfp4
    cluster: {gpu: a100-80gb, num_gpus: 1024, gpus_per_node: 8}   # or nodes: 128
    # or a cloud instance type (catalogs/instances.yaml: GPU, node, network, price):
    # cluster: {instance: gcp-a3-mega, nodes: 16}    (`cluster: aws-p5` alone names it)
    parallel: {tp: 8, pp: 16, micro_batch: 1, recompute: full}    # dp is derived
    # fine-tuning (sim_core/tasks.py, sim_core/finetune.py); pretrain is the default:
    # task: lora                 # pretrain | sft | lora | qlora
    # peft: {rank: 16, alpha: 32, targets: all_linear, dropout: 0.05}   # lora / qlora only
    # data: {packing: false, mean_seq_len: 900}    # samples' mean length; padded when unpacked

A search-space file is a run file plus ``name``, ``space`` and ``search``::

    name: gpt3-175b-1024xa100
    space:                       # any run field, as a list; nested fields by their own name
      tp: [1, 2, 4, 8]           # a list of values
      pp: {pow2: [1, 32]}        # powers of two from 1 to 32: [1, 2, 4, 8, 16, 32]
      micro_batch: {range: [1, 8], step: 1}   # 1..8 inclusive (step defaults to 1)
      recompute: [none, selective, full]
      gpu: [a100-80gb, h100-sxm]
      num_gpus: [512, 1024]      # or nodes: [64, 128]
    search: {strategy: grid}     # or {strategy: optuna, trials: 2000, objectives: [step_time, cost]}

A scalar in ``space`` is a one-value list. A space value replaces the same field of the fixed
part. Every wrong field is reported as ONE line naming it (`ConfigError`).
"""

from __future__ import annotations

import difflib
import math
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from sim_core.specs import (ATTENTION_KERNEL, CATEGORICAL, CP_COMM, FP8_RECIPE, FRAMEWORK,
                            LOSS_IMPL, MOE_DISPATCHER, MOE_RECOMPUTE, PARALLEL_COLUMNS, PP_SCHEDULE)
from sim_core.recompute import MODULES as RECOMPUTE_MODULES
from sim_core.recompute import RecomputeModulesError
from sim_core.recompute import mask as recompute_mask
from sim_core.tasks import TASK_TRAITS, TASKS, TaskError, targets_mask

from ..errors import ConfigError

MAX_INT = 2**31 - 1  # no size is larger; keeps products of sizes inside int64
MAX_AXIS_VALUES = 100_000  # values of one `space:` field
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # space and inline model names
PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_INT)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]
ZeroStage = Annotated[int, Field(strict=True, ge=0, le=3)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]

# What a field expects, in words (singular, plural) -- used in every error message.
_POS = ("a positive integer", "positive integers")
_NONNEG = ("a non-negative integer", "non-negative integers")
_BOOL = ("true or false", "booleans (true/false)")
EXPECT: dict[str, tuple[str, str]] = {
    **{k: _POS for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "global_batch",
                         "global_batch_tokens", "num_gpus", "nodes", "gpus_per_node",
                         "nics_per_node", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "dp",
                         "trials", "batch_size", "top", "patience", "inner_max")},
    **{k: _NONNEG for k in ("kv_heads", "head_dim", "experts", "top_k", "expert_ffn", "etp",
                            "shared_experts", "first_dense_layers", "q_lora_rank",
                            "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                            "v_head_dim", "sliding_window", "window_attn_skip_freq",
                            "router_groups", "router_group_topk",
                            "mtp_layers", "pp_last_stage_layers")},
    **{k: _BOOL for k in ("sequence_parallel", "distributed_optimizer", "overlap_grad_reduce",
                          "overlap_param_gather", "tp_comm_overlap", "moe_a2a_overlap", "fsdp",
                          "tied_embeddings", "grad_reduce_fp32", "fused_elementwise", "fused_glu",
                          "fp8_param_gather", "fp8_weight_cache", "adam_bf16_states", "moe_dropless",
                          "moe_permute_fusion", "moe_router_fusion", "moe_delay_wgrad",
                          "moe_shared_expert_overlap", "account_for_embedding_in_pipeline_split",
                          "account_for_loss_in_pipeline_split")},
    "capacity_factor": ("a number >= 1", "numbers >= 1"),
    "expert_skew": ("a number >= 0 (Zipf exponent; 0 = balanced)", "numbers >= 0"),
    "attention_dropout": ("a probability in [0, 1)", "probabilities in [0, 1)"),
    "zero": ("an integer 0-3 (3 = FSDP)", "integers 0-3"),
    "nic_bw_gbs": ("a positive number", "positive numbers"),
    "power_limit_w": ("a positive number of watts (board power limit)", "positive numbers"),
    "price_per_hour": ("a positive number, or a mapping of GPU or instance ids to positive "
                       "numbers", "positive numbers"),
    "instance": ("an instance catalog id (`sweep catalog instances`)", "instance catalog ids"),
    "mtbf_node_hours": ("a positive number of server-hours between job-interrupting failures",
                        "positive numbers"),
    "storage_gbs": ("a positive number (checkpoint storage bandwidth of the job, GB/s)",
                    "positive numbers"),
    "restart_min": ("a positive number of minutes (detection + rescheduling + start)",
                    "positive numbers"),
    "async_save": ("true or false (asynchronous checkpoint save)", "booleans (true/false)"),
    "interval_steps": ("a positive integer (optimizer steps between checkpoints)",
                       "positive integers"),
    # the enumerated fields (specs.CATEGORICAL): recompute, precision, activation, ...
    **{k: ("one of " + ", ".join(v), "values among " + ", ".join(v))
       for k, v in CATEGORICAL.items()},
    "recompute_modules": ("a list of Megatron recompute modules among "
                          + ", ".join(RECOMPUTE_MODULES),
                          "lists of recompute modules among " + ", ".join(RECOMPUTE_MODULES)),
    "gpu": ("a GPU catalog id", "GPU catalog ids"),
    "model": ("a model catalog id or an inline model mapping", "model catalog ids"),
    "seed": ("an integer 0 to 2**32-1", "integers"),
    "improvement": ("a fraction from 0 to below 1 (0.001 = 0.1%)", "fractions"),
    "inner": ("a list of fields of `space:`", "fields of `space:`"),
    "name": ("a name of letters, digits, '.', '_' or '-'", ""),
    # fine-tuning (peft: and data: sections)
    "rank": ("a positive integer (the LoRA rank r)", "positive integers"),
    "lora_rank": ("a positive integer (the LoRA rank r)", "positive integers"),
    "alpha": ("a positive number (LoRA alpha; the adapter output is scaled by alpha / rank)",
              "positive numbers"),
    "dropout": ("a probability in [0, 1) (dropout on the adapters' input)",
                "probabilities in [0, 1)"),
    "targets": ("target modules among qkv, proj, fc1, fc2, or all_linear, attention, mlp",
                "target lists"),
    "packing": ("true or false (samples packed into seq_len, or each padded to it)",
                "booleans (true/false)"),
    "mean_seq_len": ("a positive integer (the samples' mean length in tokens, <= seq_len)",
                     "positive integers"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterConfig(_Strict):
    gpu: str | None = None  # required unless an instance type gives it
    instance: str | None = None  # a cloud instance type: sets gpu, gpus_per_node, network, price
    num_gpus: PosInt | None = None
    nodes: PosInt | None = None  # num_gpus = nodes * gpus_per_node
    gpus_per_node: PosInt = 8
    nics_per_node: PosInt | None = None  # default from the catalog
    nic_bw_gbs: PosFloat | None = None  # default from the catalog
    power_limit_w: PosFloat | None = None  # board power limit, W; default the GPU's tdp_w
    # USD per GPU-hour, for every GPU and instance or per id ({gcp-a3-mega: 9.5}); default: the
    # instance's catalog price, else the GPU's
    price_per_hour: PosFloat | dict[str, PosFloat] | None = None
    # failures, checkpoints, restarts (sim_core/goodput.py); defaults in catalogs/reliability.yaml
    mtbf_node_hours: PosFloat | None = None  # server-hours between interruptions; default by GPU
    storage_gbs: PosFloat | None = None  # checkpoint write/read GB/s; default 1 GB/s per server
    restart_min: PosFloat | None = None  # detection + rescheduling + start; default 10 min


class CheckpointConfig(_Strict):
    """How the run checkpoints: the framework's own save unless async_save is given, the
    Young/Daly interval unless interval_steps is."""

    async_save: StrictBool | None = None
    interval_steps: PosInt | None = None


class ParallelConfig(_Strict):
    tp: PosInt | None = None
    pp: PosInt | None = None
    cp: PosInt | None = None
    ep: PosInt | None = None
    etp: NonNegInt | None = None
    dp: PosInt | None = None  # derived when omitted
    vpp: PosInt | None = None
    micro_batch: PosInt | None = None
    pp_schedule: Literal[PP_SCHEDULE] | None = None  # type: ignore[valid-type]
    recompute: Literal["none", "selective", "full"] | None = None
    sequence_parallel: StrictBool | None = None
    zero: ZeroStage | None = None
    fsdp: StrictBool | None = None  # true = zero 3
    distributed_optimizer: StrictBool | None = None
    overlap_grad_reduce: StrictBool | None = None
    overlap_param_gather: StrictBool | None = None
    tp_comm_overlap: StrictBool | None = None
    moe_a2a_overlap: StrictBool | None = None
    grad_reduce_fp32: StrictBool | None = None
    attention_kernel: Literal[ATTENTION_KERNEL] | None = None  # type: ignore[valid-type]
    fused_elementwise: StrictBool | None = None
    fused_glu: StrictBool | None = None
    cp_comm: Literal[CP_COMM] | None = None  # type: ignore[valid-type]
    loss_impl: Literal[LOSS_IMPL] | None = None  # type: ignore[valid-type]
    fp8_param_gather: StrictBool | None = None
    fp8_weight_cache: StrictBool | None = None  # False: Megatron disable_parameter_transpose_cache
    adam_bf16_states: StrictBool | None = None  # Megatron-Core precision-aware optimizer, bf16 m, v
    fp8_recipe: Literal[FP8_RECIPE] | None = None  # type: ignore[valid-type]
    attention_dropout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = None
    moe_dropless: StrictBool | None = None
    capacity_factor: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    expert_skew: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    moe_dispatcher: Literal[MOE_DISPATCHER] | None = None  # type: ignore[valid-type]
    moe_permute_fusion: StrictBool | None = None
    moe_router_fusion: StrictBool | None = None
    moe_delay_wgrad: StrictBool | None = None
    moe_shared_expert_overlap: StrictBool | None = None
    moe_recompute: Literal[MOE_RECOMPUTE] | None = None  # type: ignore[valid-type]
    # Megatron-Core --recompute-modules (with recompute: selective; sim_core/recompute.py)
    recompute_modules: list[Literal[RECOMPUTE_MODULES]] | None = None  # type: ignore[valid-type]
    # Megatron-Core multi-token prediction layers (mtp_num_layers) and the last pipeline rank's
    # decoder layers under a pipeline layout (0 = the even split); sim_core/specs.py
    mtp_layers: NonNegInt | None = None
    pp_last_stage_layers: NonNegInt | None = None
    # Megatron-Core's split counting the embedding / loss as a layer; sim_core/pp_split.py
    account_for_embedding_in_pipeline_split: StrictBool | None = None
    account_for_loss_in_pipeline_split: StrictBool | None = None


OBJECTIVES = {
    # name: (result column, direction)
    "step_time": ("step_time_s", "minimize"),
    "cost": ("cost_usd", "minimize"),  # cost_per_mtok_usd or cost_per_step_usd (cost_unit)
    "mfu": ("mfu", "maximize"),
    "throughput": ("tokens_per_s_per_gpu", "maximize"),
}


class SearchConfig(_Strict):
    # auto: grid when it finishes in seconds on the CPUs at hand, optuna otherwise
    strategy: Literal["grid", "optuna", "auto"] = "grid"
    trials: PosInt | None = None  # optuna: sampler trials (layouts asked); default 2000
    objectives: list[Literal["step_time", "cost", "mfu", "throughput"]] = ["step_time"]
    # default tpe (any number of objectives); nsga2 for several; random is the floor; qmc Halton
    sampler: Literal["tpe", "nsga2", "random", "qmc"] | None = None
    # optuna: stop after this many trials that did not improve the best (first objective) by
    # more than `improvement` (a fraction); none: run the whole trial budget
    patience: PosInt | None = None
    improvement: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.001
    # optuna nested search (sweep/engine/nested.py): the axes enumerated inside each trial (default:
    # the non-layout axes, up to inner_max rows per trial)
    inner: list[str] | None = None
    inner_max: PosInt | None = None
    seed: Annotated[int, Field(strict=True, ge=0, lt=2**32)] = 0
    batch_size: PosInt | None = None  # configurations per Ray task (optuna: trials per ask)
    cost_unit: Literal["mtok", "step"] = "mtok"  # cost per million tokens or per optimizer step
    top: PosInt = 50  # rows in ranking.csv
    # grid: skip configurations a bound proves out of memory or out of the top K (sweep/engine/prune.py)
    prune: StrictBool = True


class PeftConfig(_Strict):
    """LoRA / QLoRA adapters (task lora or qlora): defaults in sim_core/tasks.py."""

    rank: PosInt | None = None
    alpha: PosFloat | None = None
    # a name, a group or a list: qkv, proj, fc1, fc2 | all_linear | attention | mlp (and the
    # frameworks' own names: linear_qkv, q_proj, down_proj, ...)
    targets: str | list[str] | None = None
    dropout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = None


class DataConfig(_Strict):
    """Fine-tuning samples: packed into seq_len, or each padded to seq_len."""

    packing: StrictBool | None = None
    mean_seq_len: PosInt | None = None


class RunConfig(_Strict):
    model: Any  # a catalog id or an InlineModel mapping (validated separately)
    seq_len: PosInt
    global_batch: PosInt | None = None  # sequences per optimizer step
    global_batch_tokens: PosInt | None = None  # tokens per step; global_batch = this / seq_len
    precision: Literal["bf16", "fp8", "nvfp4", "mxfp4"] = "bf16"
    # which framework runs the job: its profile sets the defaults of the parallel fields below
    framework: Literal[FRAMEWORK] = "megatron-core"  # type: ignore[valid-type]
    cluster: ClusterConfig
    parallel: ParallelConfig = ParallelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    # what the run trains (sim_core/tasks.py): pretrain | sft | lora | qlora
    task: Literal[TASKS] = "pretrain"  # type: ignore[valid-type]
    peft: PeftConfig | None = None
    data: DataConfig | None = None
    description: str = ""


class SpaceConfig(RunConfig):
    name: str | None = None  # default: the file name without .yaml
    space: dict[str, Any] = {}
    search: SearchConfig = SearchConfig()


# Fields that may vary in `space:` and what each value must be.
_INT_AXES = {"seq_len", "global_batch", "global_batch_tokens", "num_gpus", "nodes",
             "gpus_per_node", "nics_per_node", "tp", "pp", "cp", "ep", "vpp", "micro_batch",
             "lora_rank", "mean_seq_len"}
_BOOL_AXES = {k for k, v in PARALLEL_COLUMNS.items() if isinstance(v, bool)} | {"packing"}
# every enumerated field but the model's activation (set through `model`)
_ENUM_AXES = {k: v for k, v in CATEGORICAL.items() if k != "activation"}
_FLOAT_AXES = {"nic_bw_gbs": 0.0, "capacity_factor": 1.0, "expert_skew": 0.0,  # name: minimum
               "mtbf_node_hours": 0.0, "storage_gbs": 0.0, "restart_min": 0.0,
               "power_limit_w": 0.0}
_POSITIVE_AXES = {"nic_bw_gbs", "mtbf_node_hours", "storage_gbs", "restart_min",
                  "power_limit_w"}  # > minimum
AXES = sorted(_INT_AXES | _BOOL_AXES | set(_ENUM_AXES) | set(_FLOAT_AXES)
              | {"etp", "zero", "gpu", "model", "instance", "recompute_modules"})
# run-frame columns an instance type sets (INSTANCE_COLUMNS of the catalog entry)
INSTANCE_COLUMNS = ("gpu", "gpus_per_node", "nics_per_node", "nic_bw_gbs", "intra_latency_us",
                    "inter_latency_us")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def read_yaml(path: str | Path) -> dict:
    """Parse a YAML file into a mapping, with one-line errors for every way that can fail."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a UTF-8 text file (byte {exc.start}), "
                          "expected a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}: invalid YAML{where}: {problem}") from None
    if data is None:
        raise ConfigError(f"{p}: file is empty, expected a mapping of fields")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of fields at the top level, "
                          f"got {type(data).__name__}")
    return data


# what a file's `task:` may say: the training tasks (sim_core/tasks.py) and rl, whose runs
# have a schema of their own
FILE_TASKS = TASKS + ("rl",)


def _is_rl(data: dict) -> bool:
    task = data.get("task")
    if task is not None and task not in FILE_TASKS:
        raise ConfigError(f"task: expected one of {', '.join(FILE_TASKS)}, got {task!r}")
    return task == "rl"


def load_run(path: str | Path) -> RunConfig:
    data = read_yaml(path)
    if _is_rl(data):  # RL post-training: its own schema (sweep/config/rl.py)
        from .rl import parse_rl

        return parse_rl(data, path)
    if "space" in data or "search" in data:
        raise ConfigError(f"{path}: this is a search-space file; use `sweep search {path}`")
    return parse_run(data)


def load_space(path: str | Path) -> SpaceConfig:
    data = read_yaml(path)
    if _is_rl(data):  # RL post-training: its own schema (sweep/config/rl.py)
        from .rl import parse_rl

        return parse_rl(data, path)
    cfg = parse_space(data)
    if cfg.name is None:
        cfg.name = Path(path).stem
    return cfg


def _cluster_shorthand(data: dict) -> dict:
    """`cluster: aws-p5` is `cluster: {instance: aws-p5}`."""
    if isinstance(data.get("cluster"), str):
        data = {**data, "cluster": {"instance": data["cluster"]}}
    return data


def parse_run(data: dict) -> RunConfig:
    cfg = _validate(RunConfig, _cluster_shorthand(data))
    _check_fixed(cfg)
    _check_instances(cfg)
    return cfg


def parse_space(data: dict) -> SpaceConfig:
    cfg = _validate(SpaceConfig, _cluster_shorthand(data))
    _check_fixed(cfg)
    if cfg.name is not None and not NAME_RE.fullmatch(cfg.name):
        raise ConfigError(f"name: expected {EXPECT['name'][0]}, got {cfg.name!r}")
    cfg.space = {k: parse_axis(k, v) for k, v in cfg.space.items()}
    _check_axes(cfg)
    _check_instances(cfg)
    return cfg


def _validate(cls: type[BaseModel], data: dict) -> BaseModel:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, cls)) from None


def _fields_at(cls: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed at a location (for 'did you mean')."""
    for part in loc:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        sub = _model_in(field.annotation)
        if sub is None:
            return []
        cls = sub
    return list(cls.model_fields)


def _model_in(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def did_you_mean(word: str, allowed) -> str:
    close = difflib.get_close_matches(str(word), list(allowed), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _one_line(exc: ValidationError, cls: type[BaseModel]) -> str:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    where = ".".join(_key(p) for p in loc) or "(top level)"
    kind = err["type"]
    got = err.get("input")
    field = next((p for p in reversed(loc) if isinstance(p, str)), "")
    if kind == "missing":
        return f"{where}: required field is missing"
    if kind == "extra_forbidden":
        allowed = _fields_at(cls, loc[:-1])
        hint = did_you_mean(loc[-1], allowed)
        if not hint and allowed:
            hint = f"; allowed: {', '.join(allowed)}"
        return f"unknown field '{where}'{hint}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where}: expected a mapping of fields, got {_show(got)}"
    if kind == "list_type":
        return f"{where}: expected a list, got {_show(got)}"
    if kind in ("less_than_equal", "less_than") and field in EXPECT \
            and EXPECT[field] in (_POS, _NONNEG):
        return f"{where}: expected {EXPECT[field][0]} up to {MAX_INT}, got {_show(got)}"
    if kind == "literal_error":
        see = " (`sweep catalog frameworks` lists them)" if field == "framework" else ""
        choices = re.findall(r"'([^']*)'", str(err["ctx"]["expected"]))
        hint = did_you_mean(got, choices) if isinstance(got, str) else ""
        return f"{where}: expected one of {err['ctx']['expected']}, got {_show(got)}{hint}{see}"
    expect = EXPECT.get(field, (None, None))[0]
    if expect:
        return f"{where}: expected {expect}, got {_show(got)}"
    return f"{where}: {err['msg']}, got {_show(got)}"


def _show(value) -> str:
    text = _REPR.repr(value)  # bounded: a YAML alias bomb is not expanded
    return text if len(text) <= 60 else text[:57] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 60


def _key(part) -> str:
    """A user-given key as printable text on one line (escapes control characters)."""
    text = str(part)
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------
# Catalog checks (model and gpu names)
# ---------------------------------------------------------------------------------------------
def _check_name(kind: str, name: str, where: str) -> str:
    """The catalog id of `kind` (gpu | model) that `name` names, or a one-line error at
    `where` (did you mean). A GPU may be named as vendors print it ("AMD Instinct MI300X")."""
    from sim_core import catalog

    try:
        return (catalog.get_gpu if kind == "gpu" else catalog.get_model)(name).name
    except ValueError as exc:
        raise ConfigError(f"{where}: {_first_line(exc)}") from None


def check_gpu(name: str, where: str) -> str:
    """The catalog id of a GPU name (sim_core/gpu_names.py), or a one-line ConfigError."""
    return _check_name("gpu", name, where)


def check_model(name: str, where: str) -> None:
    _check_name("model", name, where)


def check_instance(name: str, where: str):
    """The catalog instance type `name`, or a one-line error at `where` (did you mean)."""
    from sim_core import catalog

    try:
        return catalog.get_instance(name)
    except ValueError as exc:
        raise ConfigError(f"{where}: {_first_line(exc)}") from None


def _check_instances(cfg: RunConfig) -> None:
    """An instance type sets the GPU and the node: a file that also gives them differently is
    refused; an instance without a sourced price needs cluster.price_per_hour."""
    c = cfg.cluster
    space = getattr(cfg, "space", {}) or {}
    if "instance" in space:
        if "gpu" in space or "gpus_per_node" in space:
            raise ConfigError("space: vary instance or gpu/gpus_per_node, not both (an instance "
                              "type sets its GPU and GPUs per node)")
        names, where = space["instance"], "space.instance"
    elif c.instance is not None:
        names, where = [c.instance], "cluster.instance"
    else:
        return
    given = c.model_fields_set
    for name in names:
        inst = check_instance(name, where)
        if c.gpu is not None and c.gpu.lower() != inst.gpu:
            raise ConfigError(f"cluster.gpu: {c.gpu!r} differs from instance {inst.name}'s gpu "
                              f"{inst.gpu!r}; drop cluster.gpu (the instance sets it)")
        if "gpus_per_node" in given and c.gpus_per_node != inst.gpus_per_node:
            raise ConfigError(f"cluster.gpus_per_node: {c.gpus_per_node} differs from instance "
                              f"{inst.name}'s {inst.gpus_per_node}; drop it (the instance sets it)")
        if inst.price_per_gpu_hour is None and not _price_given(c.price_per_hour, inst.name):
            raise ConfigError(f"{where}: instance {inst.name!r} has no on-demand price with a "
                              f"source in the catalog; give cluster.price_per_hour "
                              f"({{{inst.name}: USD_PER_GPU_HOUR}} or one number)")


def _price_given(price, name: str) -> bool:
    if isinstance(price, dict):
        return name in {str(k).lower() for k in price}
    return price is not None


def instance_columns(name: str) -> dict:
    """The run-frame columns (INSTANCE_COLUMNS) and `instance` an instance type sets."""
    from sim_core import catalog

    inst = catalog.get_instance(name)
    cl = catalog.instance_cluster(name)
    return {"instance": inst.name, "gpu": inst.gpu, "gpus_per_node": inst.gpus_per_node,
            "nics_per_node": inst.nics_per_node, "nic_bw_gbs": inst.nic_bw_gbs,
            "intra_latency_us": cl.intra_latency_us, "inter_latency_us": cl.inter_latency_us}


def _check_price_key(key: str) -> None:
    from sim_core import catalog

    names = set(catalog.gpu_names()) | set(catalog.instance_names())
    if key.lower().replace("_", "-") not in names:
        raise ConfigError(f"cluster.price_per_hour: {key!r} is neither a GPU nor an instance id"
                          f"{did_you_mean(key, sorted(names))} (`sweep catalog gpus|instances`)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def inline_model_columns(model: dict) -> dict:
    """Inline model mapping -> run-frame columns, validated by sim_core.catalog.model_from_dict."""
    d = dict(model)
    d.setdefault("name", "custom")
    # the name lands in exported recipes (shell comments, TOML, YAML) and reports: keep it plain
    if not isinstance(d["name"], str) or not NAME_RE.fullmatch(d["name"]):
        raise ConfigError(f"model.name: expected {EXPECT['name'][0]}, got {_show(d['name'])}")
    from sim_core import catalog

    try:
        spec = catalog.model_from_dict(d)
    except (ValueError, TypeError) as exc:
        msg = _first_line(exc)
        m = re.search(r"field '(\w+)': (.*)", msg)
        if m:
            raise ConfigError(f"model.{m.group(1)}: {m.group(2)}") from None
        m = re.search(r"unknown key '(\w+)'(?:: did you mean '(\w+)'\?)?", msg)
        if m:
            hint = f"; did you mean '{m.group(2)}'?" if m.group(2) else ""
            raise ConfigError(f"unknown field 'model.{m.group(1)}'{hint}") from None
        raise ConfigError(f"model: {msg}") from None
    cols = spec.columns()
    cols.pop("seq_len", None)  # the run's seq_len wins over the model's default
    return cols


def _check_fixed(cfg: RunConfig) -> None:
    m = cfg.model
    if isinstance(m, str):
        if not m.strip():
            raise ConfigError("model: expected a model catalog id or an inline model mapping, "
                              "got ''")
        check_model(m, "model")
    elif isinstance(m, dict):
        inline_model_columns(m)  # validates
    else:
        raise ConfigError(f"model: expected {EXPECT['model'][0]}, got {_show(m)}")
    space = getattr(cfg, "space", {}) or {}
    c = cfg.cluster
    if c.instance is not None and "instance" not in space:  # a wrong name first, then sizes
        check_instance(c.instance, "cluster.instance")
    if c.num_gpus is not None and c.nodes is not None:
        raise ConfigError("cluster: give num_gpus or nodes, not both")
    if c.num_gpus is None and c.nodes is None and not ({"num_gpus", "nodes"} & set(space)):
        raise ConfigError("cluster.num_gpus: required field is missing (or give cluster.nodes)")
    if c.gpu is None and c.instance is None and not ({"gpu", "instance"} & set(space)):
        raise ConfigError("cluster.gpu: required field is missing (or give cluster.instance, "
                          "a cloud instance type: `sweep catalog instances`)")
    if c.gpu is not None and "gpu" not in space:
        c.gpu = check_gpu(c.gpu, "cluster.gpu")  # a product name -> its catalog id
    if isinstance(c.price_per_hour, dict):
        for key in c.price_per_hour:
            _check_price_key(str(key))
    if cfg.global_batch is not None and cfg.global_batch_tokens is not None:
        raise ConfigError("global_batch: give global_batch or global_batch_tokens, not both")
    if (cfg.global_batch is None and cfg.global_batch_tokens is None
            and not ({"global_batch", "global_batch_tokens"} & set(space))):
        raise ConfigError("global_batch: required field is missing "
                          "(or give global_batch_tokens, a token budget per step)")
    _check_finetune(cfg, space)
    p = cfg.parallel
    if p.fsdp and p.zero not in (None, 3):
        raise ConfigError(f"parallel.fsdp: fsdp: true means zero 3, but parallel.zero is {p.zero}")


def _check_finetune(cfg: RunConfig, space: dict) -> None:
    """The fine-tuning sections agree with the task (sim_core/tasks.py)."""
    varies = "task" in space
    if cfg.peft is not None and not varies and not TASK_TRAITS[cfg.task]["frozen_base"]:
        raise ConfigError(f"peft: adapters need task lora or qlora, but task is '{cfg.task}'")
    if cfg.peft is not None and cfg.peft.targets is not None:
        try:
            targets_mask(cfg.peft.targets, "peft.targets")
        except TaskError as exc:
            raise ConfigError(str(exc)) from None
    d = cfg.data
    if d is not None and d.mean_seq_len is not None and "seq_len" not in space \
            and d.mean_seq_len > cfg.seq_len:
        raise ConfigError(f"data.mean_seq_len: expected at most seq_len ({cfg.seq_len}), the "
                          f"length samples are packed or padded to, got {d.mean_seq_len}")


# ---------------------------------------------------------------------------------------------
# Space axes
# ---------------------------------------------------------------------------------------------
def parse_axis(name: str, spec) -> list:
    """One `space:` entry -> the list of its values (validated, duplicates dropped)."""
    where = f"space.{_key(name)}"
    if name not in AXES:
        hint = did_you_mean(name, AXES)
        if name == "fsdp":
            hint = "; use zero: [.., 3] (zero 3 is FSDP)"
        elif name == "dp":
            hint = "; dp is derived from num_gpus / (tp*pp*cp)"
        raise ConfigError(f"unknown field '{where}'{hint or '; allowed: ' + ', '.join(AXES)}")
    if isinstance(spec, dict):
        values = _expand_form(where, spec)
    elif isinstance(spec, list):
        values = spec
    elif spec is None:
        raise ConfigError(f"{where}: expected a list of {_plural(name)}, got None")
    else:
        values = [spec]
    if not values:
        raise ConfigError(f"{where}: expected a non-empty list of {_plural(name)}")
    out = []
    for v in values:
        v = _check_value(name, v, where)
        if v not in out:
            out.append(v)
    return out


def _plural(name: str) -> str:
    return EXPECT.get(name, ("", "values"))[1] or "values"


def _expand_form(where: str, spec: dict) -> list:
    keys = set(spec)
    if keys <= {"range", "step"} and "range" in keys:
        lo_hi, step = spec["range"], spec.get("step", 1)
        if not (isinstance(lo_hi, list) and len(lo_hi) == 2
                and all(_is_int(x) for x in lo_hi)):
            raise ConfigError(f"{where}.range: expected [low, high] integers, got {_show(lo_hi)}")
        if not _is_int(step) or step <= 0:
            raise ConfigError(f"{where}.step: expected a positive integer, got {_show(step)}")
        lo, hi = lo_hi
        if lo > hi:
            raise ConfigError(f"{where}.range: low {lo} is above high {hi}")
        if (hi - lo) // step + 1 > MAX_AXIS_VALUES:
            raise ConfigError(f"{where}.range: {(hi - lo) // step + 1:,} values; at most "
                              f"{MAX_AXIS_VALUES:,} per field (raise step)")
        return list(range(lo, hi + 1, step))
    if keys == {"pow2"}:
        lo_hi = spec["pow2"]
        if not (isinstance(lo_hi, list) and len(lo_hi) == 2
                and all(_is_int(x) and x > 0 for x in lo_hi)):
            raise ConfigError(f"{where}.pow2: expected [low, high] positive integers, "
                              f"got {_show(lo_hi)}")
        lo, hi = lo_hi
        vals, v = [], 1
        while v <= hi:
            if v >= lo:
                vals.append(v)
            v *= 2
        if not vals:
            raise ConfigError(f"{where}.pow2: no power of two between {lo} and {hi}")
        return vals
    if keys == {"values"}:
        vals = spec["values"]
        if not isinstance(vals, list):
            raise ConfigError(f"{where}.values: expected a list, got {_show(vals)}")
        return vals
    raise ConfigError(f"{where}: expected a list, {{range: [low, high], step: n}}, "
                      f"{{pow2: [low, high]}} or {{values: [...]}}, got {_show(spec)}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_value(name: str, v, where: str):
    bad = f"{where}: expected a list of {_plural(name)}, got {_show(v)}"
    if name in _INT_AXES:
        if not _is_int(v) or v <= 0 or v > MAX_INT:
            raise ConfigError(bad)
        return int(v)
    if name == "etp":
        if not _is_int(v) or v < 0 or v > MAX_INT:
            raise ConfigError(bad)
        return int(v)
    if name == "zero":
        if not _is_int(v) or not 0 <= v <= 3:
            raise ConfigError(bad)
        return int(v)
    if name in _BOOL_AXES:
        if not isinstance(v, bool):
            raise ConfigError(bad)
        return v
    if name in _FLOAT_AXES:
        low = _FLOAT_AXES[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(bad)
        try:
            f = float(v)
        except OverflowError:
            raise ConfigError(bad) from None
        if not math.isfinite(f) or f < low or (name in _POSITIVE_AXES and f <= 0):
            raise ConfigError(bad)
        return f
    if name in _ENUM_AXES:
        allowed = _ENUM_AXES[name]
        if not isinstance(v, str) or v.lower() not in allowed:
            raise ConfigError(bad)
        return v.lower()
    if name == "recompute_modules":  # each value a list of module names ([] = none)
        if not isinstance(v, (list, str)):
            raise ConfigError(bad)
        try:
            return recompute_mask(v, where)
        except RecomputeModulesError as exc:
            raise ConfigError(str(exc)) from None
    if name in ("gpu", "model"):
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(bad)
        if name == "gpu":
            return check_gpu(v, where)  # a product name -> its catalog id
        check_model(v, where)
        return v
    if name == "instance":
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(bad)
        return check_instance(v, where).name
    raise ConfigError(bad)  # pragma: no cover


def _check_axes(cfg: SpaceConfig) -> None:
    s = cfg.space
    if "num_gpus" in s and "nodes" in s:
        raise ConfigError("space: vary num_gpus or nodes, not both")
    if "global_batch" in s and "global_batch_tokens" in s:
        raise ConfigError("space: vary global_batch or global_batch_tokens, not both")
    if "model" in s and not isinstance(cfg.model, str):
        raise ConfigError("space.model: an inline model cannot be varied; use catalog ids")
    if cfg.search.strategy == "optuna" and len(cfg.search.objectives) > 1 \
            and cfg.search.sampler == "tpe":
        pass  # TPE handles several objectives too (MOTPE)
    for name in cfg.search.inner or []:
        if name not in s:
            hint = did_you_mean(name, s)
            raise ConfigError(f"search.inner: '{_key(name)}' is not a field of `space:`"
                              f"{hint or '; its fields: ' + ', '.join(s)}")
    if len(set(cfg.search.objectives)) != len(cfg.search.objectives):
        raise ConfigError(f"search.objectives: duplicate objective in {cfg.search.objectives}")


# ---------------------------------------------------------------------------------------------
# Flattening into run-frame columns (names of sim_core.specs.ALL_COLUMNS)
# ---------------------------------------------------------------------------------------------
def fixed_columns(cfg: RunConfig) -> dict:
    """The fixed part of a run/space file as one row of run-frame columns.

    `nodes` and `global_batch_tokens` stay as pseudo-columns; `space.Space` derives num_gpus and
    global_batch from them per configuration.
    """
    row: dict = {}
    if isinstance(cfg.model, dict):
        row.update(inline_model_columns(cfg.model))
    else:
        row["model"] = cfg.model
    row["seq_len"] = cfg.seq_len
    if cfg.global_batch is not None:
        row["global_batch"] = cfg.global_batch
    if cfg.global_batch_tokens is not None:
        row["global_batch_tokens"] = cfg.global_batch_tokens
    row["precision"] = cfg.precision
    row["framework"] = cfg.framework
    c = cfg.cluster
    if c.instance is not None:
        row.update(instance_columns(c.instance))
    elif c.gpu is not None:
        row["gpu"] = c.gpu
    if c.num_gpus is not None:
        row["num_gpus"] = c.num_gpus
    if c.nodes is not None:
        row["nodes"] = c.nodes
    row.setdefault("gpus_per_node", c.gpus_per_node)
    if c.nics_per_node is not None:
        row["nics_per_node"] = c.nics_per_node
    if c.nic_bw_gbs is not None:
        row["nic_bw_gbs"] = c.nic_bw_gbs
    for k in ("mtbf_node_hours", "storage_gbs", "restart_min"):
        if getattr(c, k) is not None:
            row[k] = float(getattr(c, k))
    ck = cfg.checkpoint
    if ck.async_save is not None:
        row["ckpt_async"] = 1 if ck.async_save else 0
    if ck.interval_steps is not None:
        row["ckpt_interval_steps"] = ck.interval_steps
    if c.power_limit_w is not None:
        row["power_limit_w"] = c.power_limit_w
    # fields whose default comes from the framework stay unset here: frameworks.resolve_frame
    # fills them per configuration (a space may vary the framework)
    from sim_core.frameworks import profile_fields

    for k, default in PARALLEL_COLUMNS.items():
        if k != "dp" and k not in profile_fields():
            row[k] = default
    row["task"] = cfg.task
    if cfg.peft is not None:
        for k, col in (("rank", "lora_rank"), ("alpha", "lora_alpha"), ("dropout", "lora_dropout")):
            if getattr(cfg.peft, k) is not None:
                row[col] = getattr(cfg.peft, k)
        if cfg.peft.targets is not None:
            row["lora_targets"] = targets_mask(cfg.peft.targets)
    if cfg.data is not None:
        if cfg.data.packing is not None:
            row["packing"] = cfg.data.packing
        if cfg.data.mean_seq_len is not None:
            row["mean_seq_len"] = cfg.data.mean_seq_len
    given = cfg.parallel.model_dump(exclude_none=True)
    fsdp = given.pop("fsdp", None)
    if "recompute_modules" in given:  # the bit mask the core reads (sim_core/recompute.py)
        given["recompute_modules"] = recompute_mask(given["recompute_modules"])
    row.update(given)
    if fsdp:
        row["zero"] = 3
    return row
