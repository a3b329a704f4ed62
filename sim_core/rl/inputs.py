"""A table of RL configurations -> the arrays the RL phases compute with.

One row per configuration; model and GPU ids are resolved once per distinct id (as
`sim_core.columns` does for pre-training) and broadcast. Enumerations become small integer
codes. The training layout's own columns (tp, pp, cp, ep, micro_batch, recompute, zero,
framework, precision) pass through untouched to `training.py`, which hands them to the
pre-training simulator.
"""

from __future__ import annotations

import re

import functools
from importlib import resources

import numpy as np
import pandas as pd

from .. import catalog, catalog_yaml
from . import mla_decode
from ..columns import Batch

PLACEMENT = ("colocated", "split")
# sync: generation waits for the update and the update for generation (verl's RayPPOTrainer);
# one_step_off: generation of step k+1 runs during the update of step k (verl
# recipe one_step_off_policy); async: streaming rollouts with bounded staleness (verl
# fully_async_policy, NeMo RL async GRPO max_trajectory_age_steps)
ASYNC = ("sync", "one_step_off", "async")
ALGORITHM = ("grpo", "dapo", "ppo")
# tensorrt-llm: only for its published benchmarks (calibrate.py); its default capacity scheduler
# (GUARANTEED_NO_EVICT) admits a request only when the cache can hold its prompt + maximum
# output, where vLLM and SGLang allocate blocks as tokens come (and preempt when full)
ENGINE = ("vllm", "sglang", "tensorrt-llm")
ROLLOUT_PRECISION = ("bf16", "fp8")
# whose RL-specific training costs apply (nemo_rl.py; verl.py: verl's FSDP workers; skyrl.py:
# SkyRL's FSDP2 workers). slime (and its fork miles) adds none of its own: colocated, it pauses
# the whole Megatron state once around the rollout and resumes it after (THUDM/slime 624b824a
# slime/utils/arguments.py: `--colocate` sets offload_train; megatron_utils/actor.py sleep /
# wake_up: torch_memory_saver.pause / resume), the one round trip phases.py prices for every
# colocated offload, and does not move the parameters again per phase as verl's Megatron
# workers do (verl_megatron.py)
RL_FRAMEWORK = ("verl", "nemo_rl", "skyrl", "slime")

# column -> default (None = required). Lengths are tokens.
RL_COLUMNS = {
    "algorithm": "grpo",
    "model": None,
    "gpu": None,
    "num_gpus": None,
    # GPUs per node as the NCCL model counts them (one NVLink domain); NaN = the GPU's default
    # cluster (catalogs/clusters.yaml: 8 for HGX/DGX, 72 for GB200 NVL72, whose rack is one
    # NVLink domain, 16 for Atlas 800T A3), as the pre-training frame takes it
    "gpus_per_node": float("nan"),
    "placement": "colocated",
    "rollout_gpus": 0,          # split: GPUs that generate (colocated: all of them)
    "asynchrony": "sync",
    "staleness": 1,
    # async: in-flight requests survive a weight sync (verl fully_async `partial_rollout`,
    # NeMo RL `in_flight_weight_updates`); false: every sync drains them first
    "partial_rollout": True,
    # the old policy's log-probs taken from the rollout engine, no trainer pass (verl v0.7.0
    # recipe/fully_async_policy `async_training.use_rollout_log_probs: True`, its default:
    # ray_trainer.py `_process_batch_common` sets old_log_probs = rollout_log_probs unless
    # compute_prox_log_prob)
    "use_rollout_log_probs": False,
    # the loss reuses the training forward's log-probs when one optimizer step takes the whole
    # rollout: no old-policy pass (slime bf9b1a3b `can_reuse_log_probs_in_loss`, which vime
    # carries; rl/slime_train.py reuses_log_probs)
    "reuse_log_probs": False,
    "rollout_engine": "vllm",
    "rollout_tp": 1,
    "rollout_pp": 1,
    "rollout_ep": 1,
    "gpu_memory_utilization": 0.5,
    "max_num_seqs": 0,          # 0 = the engine default (catalogs/rl.yaml)
    "rollout_precision": "bf16",
    "kv_cache_bytes": 2,        # bytes per cached element (bf16; 1 with an fp8 KV cache)
    "prompts_per_step": None,
    "responses_per_prompt": 1,
    "prompt_len": None,         # mean prompt length
    "response_mean": None,
    "response_max": None,
    # fraction of responses truncated at response_max (no EOS; NeMo RL `truncation_rate`,
    # verl `response_length/clip_ratio`); NaN = catalogs/rl.yaml length.truncated_fraction
    "response_clip_ratio": float("nan"),
    "mini_batches": 1,          # optimizer steps per RL step (train batch / mini batch)
    "ppo_epochs": 1,
    "use_ref": True,            # a reference-policy forward for the KL term
    # generation rounds per step: DAPO's dynamic-sampling filter regenerates a whole batch
    # until enough groups have a reward spread (SkyRL a9564572 trainer_utils.py
    # handle_dynamic_sampling; verl recipe/dapo max_num_gen_batches); 1 = one round
    "gen_rounds": 1,
    # vLLM max_num_batched_tokens of the run (0 = catalogs/rl.yaml vllm.max_num_batched_tokens)
    "max_num_batched_tokens": 0,
    "offload_params": False,    # colocated: training weights to host during generation
    "offload_optimizer": False,  # colocated: optimizer state to host during generation
    # the reference model's parameters kept on the host, loaded for each reference pass (verl
    # `ref.megatron.param_offload` / `ref.fsdp_config.param_offload`; verl_megatron.py)
    "ref_offload": False,
    "enforce_eager": False,     # the rollout engine without CUDA graphs (vLLM enforce_eager)
    # the rollout asks the engine for the sampled tokens' log-probabilities (verl v0.4.0
    # vllm_rollout_spmd.py SamplingParams logprobs=0): a float32 log-softmax over the vocabulary
    # of every running sequence at every decode step (catalogs/rl.yaml sampler_bytes_per_logit)
    "rollout_logprobs": True,
    # the rollout engine is vLLM's V0 engine (vLLM <= 0.7.x by default; 0.8.x falls back to it
    # with VLLM_USE_V1=0 or VLLM_ATTENTION_BACKEND=XFORMERS): a host cost per running sequence
    # per decode step, serial with the GPU (catalogs/rl.yaml vllm.v0_host_per_seq_s); false =
    # V1 (the default from vLLM 0.8.0), SGLang or TensorRT-LLM
    "rollout_vllm_v0": False,
    # vLLM V1's asynchronous scheduling (`async_scheduling`, from vLLM 0.10.0, PR 19970; on by
    # default in later releases, PR 27614): the engine schedules step N+1 while step N runs,
    # so its host work per running sequence overlaps the GPU step (engine_host.py); false =
    # schedule, execute and update one after the other, as vLLM 0.8-0.10 do by default
    "rollout_async_scheduling": False,
    # speculative decoding: drafted tokens per step (vLLM speculative_config
    # num_speculative_tokens; NeMo RL's DeepSeek-V3 recipes: deepseek_mtp, 1) and the chance
    # a drafted token is accepted (NaN = catalogs/rl.yaml spec.acceptance)
    "spec_tokens": 0,
    "spec_acceptance": float("nan"),
    # drafting only while at most this many requests run on the engine (0 = always): vLLM
    # speculative_config `disable_by_batch_size` (V0 `speculative_disable_by_batch_size`: "disable
    # speculative decoding for new incoming requests when the number of enqueued requests is
    # larger than this value"); vLLM-Ascend's SAM "adaptive switch" (hicann/cann-recipes-train
    # v0.1.0 docs/llm_rl/sam_decoding.md: drafts while at most 8 requests run)
    "spec_max_running": 0,
    # fraction of the optimizer states kept on the host through the update, the optimizer
    # step run there (Megatron optimizer_cpu_offload + optimizer_offload_fraction)
    "optimizer_cpu_offload": 0.0,
    # the framework whose RL-specific costs apply (sim_core/rl/nemo_rl.py: NeMo RL swaps the
    # reference weights in from the host and computes fp32 log-softmaxes over the vocabulary)
    "rl_framework": "verl",
    # the framework's release as major.minor (0.3 for NeMo RL v0.3.x); NaN = its current one.
    # NeMo RL's colocated refit changed at v0.4.0 (sim_core/rl/refit_host.py)
    "rl_framework_version": float("nan"),
    # log-prob micro-batch in training micro-batches (NeMo RL logprob_batch_size with
    # train_micro_batch_size 1; verl log_prob_micro_batch_size / ppo_micro_batch_size)
    "logprob_batch_size": 1,
    # sequences packed into micro-batches up to train_seq_len tokens (verl use_dynamic_bsz,
    # NeMo RL sequence_packing / dynamic_batching); false: micro-batches of one sequence padded
    # to the batch's longest (NeMo RL v0.3.0 `make_microbatch_iterator`: input_ids are padded
    # to the longest sequence of the batch)
    "sequence_packing": True,
    # packed micro-batches formed by NeMo RL's dynamic batching (sorted by length, each padded
    # to its own longest) instead of its sequence packing (padded up to train_mb_tokens on
    # DTensor: nemo_rl.py)
    "dynamic_batching": False,
    # verl's FSDP workers (sim_core/rl/verl.py; defaults as verl v0.7.0's config): the prompt
    # cap every sequence is padded to without remove-padding (NaN = the mean prompt)
    "prompt_max": float("nan"),
    # actor/ref `model.use_remove_padding` (v0.7.0 hf_model.yaml: true)
    "remove_padding": True,
    # sequences per micro-batch without `use_dynamic_bsz` (`sequence_packing` false): actor
    # `ppo_micro_batch_size_per_gpu`, rollout/ref `log_prob_micro_batch_size_per_gpu` (0 = the
    # actor's), critic `ppo_micro_batch_size_per_gpu` (0 = the actor's)
    "micro_batch_seqs": 1,
    "logprob_micro_batch_seqs": 0,
    "critic_micro_batch_seqs": 0,
    # the PPO critic: `critic.model.use_remove_padding` (v0.7.0 critic/dp_critic.yaml: false)
    # and `critic.ppo_max_token_len_per_gpu` (critic/critic.yaml: 32768)
    "critic_remove_padding": False,
    "critic_seq_len": 32768,
    # verl's log-prob token budget per GPU (`rollout.` / `ref.log_prob_max_token_len_per_gpu`,
    # dynamic batching): NaN = the update's (`train_seq_len`, actor
    # `ppo_max_token_len_per_gpu`), as verl v0.7.0's config defaults it
    # (`${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}`)
    "logprob_seq_len": float("nan"),
    # validation and checkpoints inside the run's wall time (rl/periodic.py; NaN / 0 = none
    # priced): steps per validation, sequences per validation (one response each), sequences
    # per generation call run one after another (NaN = all at once), the validation's response
    # cap (NaN = the training's); steps per checkpoint, rank 0 also writing the gathered HF
    # model, the storage's write GB/s per node (NaN = catalogs/rl.yaml periodic)
    "val_period": float("nan"),
    "val_samples": float("nan"),
    "val_batch": float("nan"),
    "val_max_len": float("nan"),
    "save_period": float("nan"),
    "save_hf_model": False,
    "storage_gbs_per_node": float("nan"),
    # a time-based checkpoint period: a checkpoint after the first step that ends this many
    # seconds after the last one (AReaL exp_ctrl.ckpt_freq_secs; rl/periodic.py)
    "save_period_s": float("nan"),
    # the new weights reach the engines through shared storage, not NCCL (AReaL v0.3:
    # rl/disk_refit.py)
    "refit_via_disk": False,
    # cann-recipes-train's zero-redundancy reshard (rl/alltoallv_reshard.py) in place of
    # verl's per-key Megatron walk
    "refit_alltoallv": False,
    # async: every weight update interrupts the running requests, which drop their KV cache
    # and prefill it again on the new weights (AReaL's interruptible rollout workers:
    # rl/generation.py reprefill_time)
    "reprefill_on_update": False,
}


@functools.lru_cache(maxsize=1)
def constants() -> dict:
    text = resources.files("sim_core").joinpath("catalogs/rl.yaml").read_text()
    return catalog_yaml.read(text)


def store_constants(values: dict, path=None) -> None:
    """Write fitted values into catalogs/rl.yaml (or `path`) in place (`key: value`, the line's
    comment kept), for the fits that own them (`calibrate.py`, `refit_fit.py`); keys are
    unique there."""
    path = path or resources.files("sim_core").joinpath("catalogs/rl.yaml")
    text = path.read_text()
    for key, value in values.items():
        # YAML 1.1 reads '7e-06' as a string: give the mantissa a dot
        value = re.sub(r"^(-?\d+)(e[-+]?\d+)$", r"\1.0\2", str(value))
        text = re.sub(rf"(\n\s*{key}: )[^\s#]*", rf"\g<1>{value}", text, count=1)
    with open(str(path), "w") as f:
        f.write(text)
    constants.cache_clear()


def framework_offloads(rl_framework, placement) -> np.ndarray:
    """Rows whose framework offloads the trainer's states around every refit whatever its
    settings say: NeMo RL when colocated (grpo.py refit_policy_generation calls
    `offload_before_refit` / `offload_after_refit` whenever inference is colocated, v0.3.0 to
    v0.7.0: code, not a setting); the others only when their recipe sets it. The default of a
    blank offload, in run tables and run files alike."""
    fw = np.asarray(pd.Series(rl_framework).astype(str))
    pl = np.asarray(pd.Series(placement).astype(str))
    return (fw == "nemo_rl") & (pl == "colocated")


def stated_flag(df: pd.DataFrame, col: str, default) -> np.ndarray:
    """A true/false column of a run table per row: what the row states, `default` (a bool or
    a bool array, the framework's behaviour) where the cell is blank or the column absent; a
    cell that is not true/false is a one-line error naming the column."""
    default = np.broadcast_to(np.asarray(default, dtype=bool), (len(df),))
    if col not in df.columns:
        return default.copy()
    s = df[col].astype(object).where(df[col].notna(), "").astype(str).str.strip().str.lower()
    bad = ~s.isin(["", "true", "false", "1", "0", "1.0", "0.0"])
    if bad.any():
        raise catalog.CatalogError(f"{col}: '{df[col][bad].iloc[0]}' is not true/false")
    return np.where(s.eq("").to_numpy(), default, s.isin(["true", "1", "1.0"]).to_numpy())


def network(b) -> dict:
    """The NCCL model's network of each configuration (as sim_core.step.network): what the
    rollout's TP all-reduces, the weight sync and SkyRL's collectives are priced on."""
    return {"sm_arch": b.sm_arch, "nvlink_bw_gbs": b.nvlink_bw_gbs, "nvls": b.nvls > 0,
            "mesh_links": b.mesh_links,
            "nic_bw_gbs": b.nic_bw_gbs * b.nics_per_node / b.gpus_per_node,
            "intra_latency_us": b.intra_latency_us, "inter_latency_us": b.inter_latency_us}


def forward_seconds(sim: pd.DataFrame) -> np.ndarray:
    """A forward-only pass priced from a pre-training step's breakdown: a third of the
    compute, half the exposed model-parallel transfers, the bubble in proportion (the FSDP
    all-gathers a forward issues are the caller's: they depend on how often it gathers)."""
    comm = sum(sim[c].to_numpy() for c in ("time_tp", "time_cp", "time_ep", "time_pp"))
    return sim["time_compute"].to_numpy() / 3 + comm / 2 + sim["time_bubble"].to_numpy() / 3


def train_col(tf: pd.DataFrame, name: str) -> np.ndarray:
    """A layout column of the training frame (tp, pp, cp, zero) as floats; 1 where the frame
    leaves it out (the pre-training defaults). Every RL module reads the layout this way."""
    return tf[name].to_numpy(float) if name in tf else np.ones(len(tf))


def recompute_mode(tf: pd.DataFrame) -> np.ndarray:
    """The training frame's activation recompute per row, lower-case ("full", "selective",
    ...; "none" where the frame leaves it out): the host rules that a full recompute replays
    read it this way."""
    if "recompute" not in tf:
        return np.full(len(tf), "none")
    return tf["recompute"].astype(str).str.lower().to_numpy()


def train_dp(tf: pd.DataFrame, b) -> np.ndarray:
    """Data-parallel ranks of the training frame: its GPUs over tp x pp x cp (at least 1)."""
    mp = train_col(tf, "tp") * train_col(tf, "pp") * train_col(tf, "cp")
    return np.maximum(np.floor(b.train_gpus / mp), 1.0)


def fsdp(tf: pd.DataFrame) -> np.ndarray:
    """Rows of the training frame sharded with ZeRO-3 / FSDP (NaN, unknown: not)."""
    return train_col(tf, "zero") >= 3


def _codes(name: str, values: pd.Series, allowed: tuple) -> np.ndarray:
    low = values.astype(str).str.lower()
    bad = ~low.isin(allowed)
    if bad.any():
        raise catalog.CatalogError(
            f"{name}: unknown value '{low[bad].iloc[0]}'; allowed: {', '.join(allowed)}")
    return low.map({v: i for i, v in enumerate(allowed)}).to_numpy(dtype=np.int64)


def model_arrays(models: pd.Series) -> dict:
    """Per row: the model's shape, parameter counts split into dense and routed-expert parts,
    and the KV cache bytes per token per layer per element (MLA caches its latent)."""
    codes, uniq = pd.factorize(models.astype(str))
    rows = []
    for mid in uniq:
        m = catalog.get_model(mid)
        hd = m.head_dim or m.hidden // m.heads
        moe_layers = (m.layers - m.first_dense_layers) if m.experts else 0
        glu = 3 if m.activation == "swiglu" else 2
        routed = moe_layers * m.experts * glu * m.hidden * m.expert_ffn
        total = catalog.param_count(m)
        active = catalog.active_param_count(m)
        mla = m.kv_lora_rank > 0
        # elements cached per token per layer: K and V of each KV head, or MLA's latent + rope
        # key (vLLM caches the compressed latent for MLA: vllm/attention/backends/mla)
        kv_elems = (m.kv_lora_rank + m.qk_rope_head_dim) if mla else 2 * m.kv_heads * hd
        # attention FLOPs per query token per key per layer: QK^T and PV (absorbed MLA: over the
        # latent of each head)
        attn_dim = m.heads * ((m.kv_lora_rank + m.qk_rope_head_dim) if mla else hd)
        # weights every TP rank holds whole: MLA's down-projections (vLLM deepseek_v2.py
        # DeepSeekV2FusedQkvAProjLinear, `disable_tp=True`: q_lora_rank + kv_lora_rank + rope
        # columns) and the router (GateLinear / ReplicatedLinear gate, hidden x experts)
        replicated = (m.layers * m.hidden * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
                      if mla else 0) + moe_layers * m.hidden * m.experts
        rows.append(dict(layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads,
                         head_dim=hd, ffn=m.ffn, vocab=m.vocab, experts=m.experts,
                         top_k=m.top_k, expert_ffn=m.expert_ffn, params=total,
                         active_params=active, routed_params=routed, moe_layers=moe_layers,
                         dense_params=total - routed, kv_elems=kv_elems, mla=float(mla),
                         kv_lora_rank=float(m.kv_lora_rank if mla else 0),
                         attn_dim=attn_dim, replicated_params=replicated,
                         tied_embeddings=float(bool(m.tied_embeddings)),
                         shared_experts=float(m.shared_experts or 0)))
    table = pd.DataFrame(rows)
    return {c: table[c].to_numpy(dtype=np.float64)[codes] for c in table.columns}


def gpu_arrays(gpus: pd.Series) -> dict:
    table = catalog.gpu_table()
    codes, uniq = pd.factorize(gpus.astype(str).str.lower())
    names = [catalog.get_gpu(u).name for u in uniq]
    cols = ("peak_bf16", "peak_fp8", "hbm_gib", "hbm_bw_gbs", "sm_count", "sm_arch",
            "nvlink_bw_gbs", "nvls", "mesh_links", "gemm_max_bf16", "gemm_max_fp8",
            "price_per_hour", "nics_per_node", "nic_bw_gbs", "intra_latency_us",
            "inter_latency_us")
    out = {c: table.loc[names, c].to_numpy(dtype=np.float64)[codes] for c in cols}
    out["cluster_gpus_per_node"] = table.loc[names, "gpus_per_node"].to_numpy(
        dtype=np.float64)[codes]
    # the vendor (index into catalog.VENDORS): the decode step's per-stack constants
    # (catalogs/rl.yaml decode_stacks, rl/decode_stacks.py) are keyed by it
    out["gpu_vendor"] = np.array([catalog.VENDORS.index(catalog.get_gpu(u).vendor)
                                  for u in uniq], dtype=np.float64)[codes]
    # FlashMLA's published compute level on the GPU (rl/mla_decode.py; 0: not a Hopper part)
    out["mla_decode_level"] = mla_decode.level_of(names)[codes]
    return out


def check_frame(df: pd.DataFrame) -> None:
    for name, default in RL_COLUMNS.items():
        if default is None and (name not in df.columns or df[name].isna().any()):
            raise catalog.CatalogError(f"{name}: required field is missing")


def to_batch(df: pd.DataFrame) -> Batch:
    """Resolve an RL frame into arrays (numeric columns float64, enums as codes)."""
    check_frame(df)
    n = len(df)
    b = Batch()
    enums = {"placement": PLACEMENT, "asynchrony": ASYNC, "algorithm": ALGORITHM,
             "rollout_engine": ENGINE, "rollout_precision": ROLLOUT_PRECISION,
             "rl_framework": RL_FRAMEWORK}
    for name, default in RL_COLUMNS.items():
        if name in ("model", "gpu"):
            continue
        col = df[name] if name in df.columns else pd.Series([default] * n, index=df.index)
        if default is not None:
            col = col.where(col.notna(), default)
        if name in enums:
            b[name] = _codes(name, col, enums[name])
        else:
            num = pd.to_numeric(col, errors="coerce")
            bad = num.isna() & col.notna() & ~col.astype(str).str.lower().isin(["nan", ""])
            if bad.any():
                raise catalog.CatalogError(
                    f"{name}: '{col[bad].iloc[0]}' is not a number or true/false")
            b[name] = num.to_numpy(dtype=np.float64)
    b.update(model_arrays(df["model"]))
    b.update(gpu_arrays(df["gpu"]))
    # gpus_per_node not stated: the GPU's default cluster (gpu_arrays' NIC counts are that
    # cluster's, so the NIC bandwidth per GPU, nics x bw / gpus_per_node, stays its own)
    b["gpus_per_node"] = np.where(np.isnan(b.gpus_per_node), b.cluster_gpus_per_node,
                                  b.gpus_per_node)
    k = constants()["vllm"]
    b["max_num_seqs"] = np.where(b.max_num_seqs > 0, b.max_num_seqs, k["max_num_seqs"])
    split = b.placement == 1
    b["rollout_gpus"] = np.where(split, b.rollout_gpus, b.num_gpus)
    b["train_gpus"] = np.where(split, b.num_gpus - b.rollout_gpus, b.num_gpus)
    b["replicas"] = np.floor(b.rollout_gpus / (b.rollout_tp * b.rollout_pp))
    b["sequences"] = b.prompts_per_step * b.responses_per_prompt
    b["prompt_max"] = np.where(np.isnan(b.prompt_max), b.prompt_len, b.prompt_max)
    return b
