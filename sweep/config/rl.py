"""Run and space files with `task: rl`: RL post-training (GRPO, DAPO, PPO) -> RLConfig.

```yaml
task: rl
model: qwen3-32b
cluster: {gpu: h100-sxm, num_gpus: 64, gpus_per_node: 8}
algorithm: grpo                     # grpo | dapo | ppo
prompts_per_step: 512
responses_per_prompt: 16
prompt_len: 1024                    # mean prompt tokens
response_len: {mean: 4000, max: 8192}   # optional clip_ratio: fraction truncated at max
rollout: {engine: vllm, tp: 4, pp: 1, ep: 1, gpu_memory_utilization: 0.6}
parallel: {tp: 8, pp: 2, recompute: full}    # the training layout, as in a pre-training run
train: {mini_batches: 4, ppo_epochs: 1, use_ref: true}
placement: colocated                # or {mode: split, rollout_gpus: 32}
asynchrony: sync                    # or one_step_off, or {mode: async, staleness: 2}
validation: {period: 10, samples: 256, batch: 256}   # optional, inside the run's wall time
checkpoint: {period: 10, storage_gbs_per_node: 1.0}  # optional (sim_core/rl/periodic.py)
```

A space adds `space:` (any of SPACE_AXES as lists) and `search: {objective: ...}`. Every error
is one line naming the field and what is allowed.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError

PosInt = Field(gt=0)


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RLCluster(_S):
    gpu: str
    num_gpus: int = Field(gt=0)
    gpus_per_node: int = Field(8, gt=0)


class Lengths(_S):
    mean: float = Field(gt=0)
    max: float | None = Field(None, gt=0)
    # responses only: the fraction truncated at max (NeMo RL truncation_rate, verl
    # response_length/clip_ratio); unset = sim_core catalogs/rl.yaml length.truncated_fraction
    clip_ratio: float | None = Field(None, ge=0, lt=1)


class Rollout(_S):
    engine: Literal["vllm", "sglang"] = "vllm"
    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    replicas: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    max_num_seqs: int | None = Field(None, gt=0)
    # vLLM max_num_batched_tokens (profiling peak, prefill chunk); None = catalogs/rl.yaml
    max_num_batched_tokens: int | None = Field(None, gt=0)
    precision: Literal["bf16", "fp8"] = "bf16"
    enforce_eager: bool = False  # vLLM without CUDA graphs (a per-layer launch cost per step)
    # the sampled tokens' log-probabilities asked of the engine (verl, NeMo RL, AReaL do): a
    # float32 log-softmax over the vocabulary per running sequence per step
    logprobs: bool = True
    # vLLM's V0 engine (vLLM <= 0.7.x, or 0.8.x with VLLM_USE_V1=0): Python host work per running
    # sequence per decode step, serial with the GPU (catalogs/rl.yaml vllm.v0_host_per_seq_s)
    vllm_v0: bool = False
    # vLLM V1's asynchronous scheduling (vLLM >= 0.10.0 `async_scheduling`): the host work per
    # running sequence overlaps the GPU step instead of adding to it (sim_core/rl/engine_host.py)
    async_scheduling: bool = False

    @field_validator("vllm_v0")
    @classmethod
    def _v0_is_vllm(cls, v, info):
        if v and info.data.get("engine") != "vllm":
            raise ValueError("vllm_v0 applies to engine vllm only")
        return v

    @field_validator("async_scheduling")
    @classmethod
    def _async_is_vllm_v1(cls, v, info):
        if v and (info.data.get("engine") != "vllm" or info.data.get("vllm_v0")):
            raise ValueError("async_scheduling applies to engine vllm's V1 only (SGLang "
                             "overlaps its scheduling already; V0 has no such option)")
        return v


class Train(_S):
    framework: str = "megatron-core"
    mini_batches: int = Field(1, gt=0)
    ppo_epochs: int = Field(1, gt=0)
    seq_len: int | None = Field(None, gt=0)
    use_ref: bool = True
    # none: the framework's (NeMo RL offloads both around every colocated refit, in code;
    # verl only when its recipe sets param_offload / optimizer_offload)
    offload_params: bool | None = None
    offload_optimizer: bool | None = None
    # the reference model on the host between its passes (verl ref param_offload)
    ref_offload: bool = False
    # fraction of the optimizer states on the host through the update (Megatron
    # optimizer_cpu_offload + optimizer_offload_fraction)
    optimizer_cpu_offload: float = Field(0.0, ge=0, le=1)
    # whose RL-specific training costs apply (sim_core/rl/nemo_rl.py): nemo_rl swaps the
    # reference weights in from the host and runs fp32 log-softmaxes over the vocabulary
    # skyrl: SkyRL's FSDP2 workers (sim_core/rl/skyrl.py)
    # slime: none of its own beyond the colocated round trip (sim_core/rl/inputs.py)
    rl_framework: Literal["verl", "nemo_rl", "skyrl", "slime"] = "verl"
    # the framework's release as major.minor (e.g. 0.3); none: its current one (NeMo RL's
    # colocated refit streams from 0.4: sim_core/rl/refit_host.py)
    rl_framework_version: float | None = Field(None, gt=0)
    # log-prob micro-batch in training micro-batches (NeMo RL logprob_batch_size)
    logprob_batch_size: int = Field(1, gt=0)
    # false: micro-batches of one sequence padded to the batch's longest
    sequence_packing: bool = True
    # NeMo RL dynamic batching (no padding of packed micro-batches to the budget)
    dynamic_batching: bool = False
    # verl's FSDP workers (sim_core/rl/verl.py): model.use_remove_padding; sequences per
    # micro-batch without use_dynamic_bsz (sequence_packing false): actor
    # ppo_micro_batch_size_per_gpu, log_prob_micro_batch_size_per_gpu and the critic's (0 =
    # the actor's); the PPO critic's use_remove_padding and ppo_max_token_len_per_gpu
    remove_padding: bool = True
    micro_batch_seqs: int = Field(1, gt=0)
    logprob_micro_batch_seqs: int = Field(0, ge=0)
    critic_micro_batch_seqs: int = Field(0, ge=0)
    critic_remove_padding: bool = False
    critic_seq_len: int = Field(32768, gt=0)
    # verl's log-prob token budget per GPU (rollout/ref log_prob_max_token_len_per_gpu;
    # blank: seq_len, the update's, as verl defaults it)
    logprob_seq_len: int | None = Field(None, gt=0)


class Parallel(_S):
    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    cp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    etp: int = Field(0, ge=0)  # expert tensor parallel; 0 = same as tp (Megatron's default)
    micro_batch: int = Field(1, gt=0)
    recompute: Literal["none", "selective", "full"] = "full"
    zero: int = Field(1, ge=0, le=3)
    sequence_parallel: bool = True
    # verl's FSDP workers: Ulysses sequence parallelism (actor/ref
    # ulysses_sequence_parallel_size); the training layout's cp with cp_comm a2a
    ulysses: int = Field(1, gt=0)


class Placement(_S):
    mode: Literal["colocated", "split"] = "colocated"
    rollout_gpus: int | None = Field(None, gt=0)
    train_gpus: int | None = Field(None, gt=0)


class Asynchrony(_S):
    mode: Literal["sync", "one_step_off", "async"] = "sync"
    staleness: int = Field(1, ge=0)
    # async: in-flight requests continue across a weight sync (verl fully_async
    # partial_rollout, NeMo RL in_flight_weight_updates); false: each sync drains them first
    partial_rollout: bool = True


class Validation(_S):
    """A validation every `period` steps inside the run's wall time (sim_core/rl/periodic.py):
    `samples` sequences (one response each) generated in calls of `batch` run one after another
    (NeMo RL val_batch_size; none: all at once, as verl sends them), at `max_len` (none: the
    training's response cap)."""
    period: float = Field(gt=0)
    samples: int = Field(gt=0)
    batch: int | None = Field(None, gt=0)
    max_len: float | None = Field(None, gt=0)


class Checkpoint(_S):
    """A checkpoint every `period` steps inside the run's wall time (sim_core/rl/periodic.py):
    the trainer's sharded states written at `storage_gbs_per_node` (none: catalogs/rl.yaml
    periodic.storage_gbs_per_node); `hf_export`: rank 0 also writes the gathered model."""
    period: float = Field(gt=0)
    storage_gbs_per_node: float | None = Field(None, gt=0)
    hf_export: bool = False


class RLSearch(_S):
    objective: Literal["step_time", "samples_per_gpu", "tokens_per_gpu", "cost"] = "step_time"
    top: int = Field(10, gt=0)


# fields a space may vary, and the run-file place each one comes from
SPACE_AXES = ("num_gpus", "placement", "rollout_gpus", "asynchrony", "staleness",
              "rollout_tp", "rollout_pp", "rollout_ep",
              "gpu_memory_utilization", "max_num_seqs", "train_tp", "train_pp", "train_cp",
              "train_ep", "train_etp", "train_micro_batch", "train_recompute",
              "offload_optimizer", "mini_batches", "train_ulysses",
              # validation and checkpoints (validation: / checkpoint: give the rest)
              "val_period", "save_period", "storage_gbs_per_node")


class RLConfig(_S):
    task: Literal["rl"]
    name: str | None = None
    model: str
    cluster: RLCluster
    algorithm: Literal["grpo", "dapo", "ppo"] = "grpo"
    prompts_per_step: int = Field(gt=0)
    responses_per_prompt: int = Field(1, gt=0)
    prompt_len: float | Lengths
    response_len: Lengths
    rollout: Rollout = Rollout()
    parallel: Parallel = Parallel()
    train: Train = Train()
    placement: Literal["colocated", "split"] | Placement = "colocated"
    asynchrony: Literal["sync", "one_step_off", "async"] | Asynchrony = "sync"
    validation: Validation | None = None
    checkpoint: Checkpoint | None = None
    space: dict[str, list] | None = None
    search: RLSearch = RLSearch()

    @field_validator("space")
    @classmethod
    def _axes(cls, v):
        for k, vals in (v or {}).items():
            if k not in SPACE_AXES:
                raise ValueError(f"unknown axis '{k}'; allowed: {', '.join(SPACE_AXES)}")
            if not isinstance(vals, list) or not vals:
                raise ValueError(f"{k}: expected a non-empty list")
        return v

    # ---- the table of configurations -----------------------------------------------------
    def base_row(self) -> dict:
        pl = self.placement if isinstance(self.placement, Placement) else Placement(
            mode=self.placement)
        asy = self.asynchrony if isinstance(self.asynchrony, Asynchrony) else Asynchrony(
            mode=self.asynchrony)
        pmean = self.prompt_len.mean if isinstance(self.prompt_len, Lengths) else self.prompt_len
        r = self.rollout
        rollout_gpus = pl.rollout_gpus or 0
        if pl.mode == "split" and not rollout_gpus and pl.train_gpus:
            rollout_gpus = self.cluster.num_gpus - pl.train_gpus
        if r.replicas and not rollout_gpus and pl.mode == "split":
            rollout_gpus = r.replicas * r.tp * r.pp
        row = {
            "algorithm": self.algorithm, "model": self.model, "gpu": self.cluster.gpu,
            "num_gpus": self.cluster.num_gpus, "gpus_per_node": self.cluster.gpus_per_node,
            "placement": pl.mode, "rollout_gpus": rollout_gpus, "asynchrony": asy.mode,
            "staleness": asy.staleness, "partial_rollout": asy.partial_rollout,
            "rollout_engine": r.engine, "rollout_tp": r.tp,
            "rollout_pp": r.pp, "rollout_ep": r.ep,
            "gpu_memory_utilization": r.gpu_memory_utilization,
            "max_num_seqs": r.max_num_seqs or 0,
            "max_num_batched_tokens": r.max_num_batched_tokens or 0, "rollout_precision": r.precision,
            "prompts_per_step": self.prompts_per_step,
            "responses_per_prompt": self.responses_per_prompt, "prompt_len": pmean,
            "response_mean": self.response_len.mean,
            "response_max": self.response_len.max or self.response_len.mean,
            "response_clip_ratio": (float("nan") if self.response_len.clip_ratio is None
                                    else self.response_len.clip_ratio),
            "mini_batches": self.train.mini_batches, "ppo_epochs": self.train.ppo_epochs,
            "use_ref": self.train.use_ref, "offload_params": self.train.offload_params,
            "offload_optimizer": self.train.offload_optimizer,
            "ref_offload": self.train.ref_offload,
            "enforce_eager": r.enforce_eager, "rollout_logprobs": r.logprobs,
            "rollout_vllm_v0": r.vllm_v0, "rollout_async_scheduling": r.async_scheduling,
            "optimizer_cpu_offload": self.train.optimizer_cpu_offload,
            "train_framework": self.train.framework,
            "train_seq_len": self.train.seq_len or float("nan"),
            "logprob_seq_len": self.train.logprob_seq_len or float("nan"),
            "rl_framework": self.train.rl_framework,
            "rl_framework_version": (self.train.rl_framework_version
                                     if self.train.rl_framework_version is not None
                                     else float("nan")),
            "logprob_batch_size": self.train.logprob_batch_size,
            "sequence_packing": self.train.sequence_packing,
            "dynamic_batching": self.train.dynamic_batching,
            # the prompt cap verl pads to without remove-padding (sim_core/rl/verl.py)
            "prompt_max": (self.prompt_len.max or pmean) if isinstance(self.prompt_len, Lengths)
            else pmean,
        }
        nan = float("nan")
        v, c = self.validation, self.checkpoint
        row.update({
            "val_period": v.period if v else nan, "val_samples": v.samples if v else nan,
            "val_batch": (v.batch or nan) if v else nan,
            "val_max_len": (v.max_len or nan) if v else nan,
            "save_period": c.period if c else nan,
            "save_hf_model": bool(c.hf_export) if c else False,
            "storage_gbs_per_node": (c.storage_gbs_per_node or nan) if c else nan})
        for f in ("remove_padding", "micro_batch_seqs", "logprob_micro_batch_seqs",
                  "critic_micro_batch_seqs", "critic_remove_padding", "critic_seq_len"):
            row[f] = getattr(self.train, f)
        for f in ("tp", "pp", "cp", "ep", "etp", "micro_batch", "recompute", "zero",
                  "sequence_parallel", "ulysses"):
            row[f"train_{f}"] = getattr(self.parallel, f)
        return row

    def axes(self) -> dict[str, list]:
        """The space's axes, each value once (a value listed twice is one configuration)."""
        return {k: list(dict.fromkeys(v)) for k, v in (self.space or {}).items()}

    def space_size(self) -> int:
        """Combinations of the axes, before the rules below drop repeats (the chunks' range)."""
        n = 1
        for v in self.axes().values():
            n *= len(v)
        return n

    def frame(self, start: int = 0, stop: int | None = None) -> pd.DataFrame:
        """The configurations of combinations [start, stop) of the space (all by default; just
        the run's when there is no space), in the axes' product order (`config_id`: the
        combination's index), built column by column
        from the combinations' digits (no Python object per configuration), so that a large
        space can be evaluated in chunks of bounded memory (sweep/engine/rl.py).

        Repeats are dropped by rule, which keeps the first of each group in product order: a
        colocated row ignores the GPU split (kept for the first `rollout_gpus` value only, with
        rollout_gpus 0), a split row keeps its training states on its own GPUs (no offload: kept
        for the first `offload_optimizer` value only); Ulysses (verl FSDP) and Megatron's cp are
        two trainers' layouts, never both."""
        base = self.base_row()
        axes = self.axes()
        names = list(axes)
        size = self.space_size()
        stop = size if stop is None else min(stop, size)
        ids = np.arange(max(start, 0), stop, dtype=np.int64)
        digits = (np.unravel_index(ids, [len(axes[k]) for k in names]) if names
                  else ())
        n = len(ids)
        cols = {}
        for k, v in base.items():
            if k in axes:
                vals = np.empty(len(axes[k]), dtype=object)
                vals[:] = axes[k]
                cols[k] = pd.Series(vals[digits[names.index(k)]]).infer_objects()
            else:
                cols[k] = pd.Series([v] * n, dtype=object).infer_objects() if n else \
                    pd.Series([], dtype=object)
        df = pd.DataFrame({"config_id": ids, **cols})
        if not n:
            return df
        digit = {k: digits[i] for i, k in enumerate(names)}
        keep = np.ones(n, dtype=bool)
        colocated = (df["placement"] == "colocated").to_numpy()
        if "rollout_gpus" in digit:
            keep &= ~(colocated & (digit["rollout_gpus"] > 0))
        if "offload_optimizer" in digit:
            keep &= ~(~colocated & (digit["offload_optimizer"] > 0))
        keep &= ~((df["train_ulysses"] > 1) & (df["train_cp"] > 1)).to_numpy()
        df = df[keep].reset_index(drop=True)
        df["train_sequence_parallel"] = df["train_sequence_parallel"].astype(bool) & (
            df["train_tp"] > 1)
        df.loc[df["placement"] == "colocated", "rollout_gpus"] = 0
        # unset offloads: the framework's (NeMo RL's colocated refit offloads both)
        from sim_core.rl import inputs

        offloads = pd.Series(inputs.framework_offloads(df["rl_framework"], df["placement"]),
                             index=df.index)
        for col in ("offload_params", "offload_optimizer"):
            df[col] = df[col].where(df[col].notna(), offloads).astype(bool)
        # split rows keep their training states on their own GPUs: nothing to offload
        df.loc[df["placement"] == "split", ["offload_params", "offload_optimizer"]] = False
        # what the rules cannot see (an axis listing null beside the value it resolves to)
        return df.drop_duplicates(subset=[c for c in df.columns if c != "config_id"],
                                  ignore_index=True)


def parse_rl(data: dict, path=None) -> RLConfig:
    """A `task: rl` mapping -> RLConfig, or a one-line ConfigError."""
    from sim_core import catalog

    try:
        cfg = RLConfig.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-",
                                                                          "literal[")))
        msg = e["msg"].replace("Value error, ", "")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        raise ConfigError(f"{where or 'file'}: {msg}") from None
    try:
        catalog.get_model(cfg.model)
        catalog.get_gpu(cfg.cluster.gpu)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    if cfg.response_len.max is not None and cfg.response_len.max < cfg.response_len.mean:
        raise ConfigError("response_len: max must be >= mean")
    ulysses = max([cfg.parallel.ulysses, *(cfg.space or {}).get("train_ulysses", [1])])
    if ulysses > 1 and (cfg.train.rl_framework != "verl" or cfg.parallel.zero < 3):
        raise ConfigError("parallel.ulysses: Ulysses sequence parallelism is verl's FSDP "
                          "workers' (needs train.rl_framework verl and parallel.zero 3)")
    if cfg.parallel.ulysses > 1 and cfg.parallel.cp > 1:
        raise ConfigError("parallel.ulysses: set ulysses (verl FSDP) or cp (Megatron), not both")
    space = cfg.space or {}
    for axis in ("val_period", "save_period", "storage_gbs_per_node"):
        bad = [x for x in space.get(axis, []) if not isinstance(x, (int, float))
               or isinstance(x, bool) or not x > 0]
        if bad:
            raise ConfigError(f"space.{axis}: {bad[0]!r} is not a positive number")
    if "val_period" in space and cfg.validation is None:
        raise ConfigError("space.val_period: needs validation: {period, samples} (what a "
                          "validation generates)")
    if "storage_gbs_per_node" in space and cfg.checkpoint is None and "save_period" not in space:
        raise ConfigError("space.storage_gbs_per_node: needs checkpoint: {period} or a "
                          "save_period axis (no checkpoint is priced without a period)")
    if cfg.name is None and path is not None:
        from pathlib import Path

        cfg.name = Path(path).stem
    return cfg
