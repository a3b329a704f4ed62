"""RL post-training against published RL steps (`sweep validate --rl`).

Reads a run table with the columns of the issue (RL_TABLE_COLUMNS; blank = not stated; any
spelling `rl_table.py` reads) and imputes each blank from the framework's defaults or, for the
mean prompt and response lengths, from the published priors of `data/rl/length_priors.csv`,
saying which (the `imputed` column). A row is left unpredicted only when it cannot be priced
(unknown model or GPU, no GPU count), with that reason. Nothing of the RL model is fitted on
these runs (its two decode constants come from inference benchmarks, sim_core/rl/calibrate.py),
and the length priors come from other published runs than these, so every row is out of
sample: the leave-one-source-out error is the plain error.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import pandas as pd

from .. import catalog
from ..rl import generation
from ..rl import inputs as rl_inputs
from ..rl.phases import simulate_rl
from . import rl_logprob_timer, rl_table

RL_TABLE_COLUMNS = (
    "algorithm", "model", "gpu", "num_gpus", "placement", "rollout_gpus", "train_gpus",
    "rollout_engine", "rollout_tp", "rollout_pp", "gpu_memory_utilization", "train_backend",
    "train_tp", "train_cp", "train_ep", "train_pp", "prompts_per_step", "responses_per_prompt",
    "rollout_batch_seqs", "train_gbs_seqs", "max_prompt_len", "max_response_or_total_len",
    "mean_seq_len", "precision", "policy_mode", "step_time_s", "gen_time_s",
    "old_log_prob_time_s", "ref_time_s", "update_actor_time_s", "weight_sync_time_s")

# verl v0.7.0 defaults (verl/trainer/config/rollout/rollout.yaml: gpu_memory_utilization 0.5,
# tensor_model_parallel_size 2; _generated_ppo_megatron_trainer.yaml: actor megatron tp/pp/cp/ep
# 1, rollout n 1; data/legacy_data.yaml: train_batch_size 1024, max_prompt_length 512,
# max_response_length 512)
DEFAULTS = {"rollout_tp": 2, "rollout_pp": 1, "gpu_memory_utilization": 0.5, "train_tp": 1,
            "train_pp": 1, "train_cp": 1, "train_ep": 1, "responses_per_prompt": 1,
            "rollout_engine": "vllm", "placement": "colocated", "policy_mode": "sync",
            "algorithm": "grpo", "prompts_per_step": 1024, "max_prompt_len": 512,
            "max_response_or_total_len": 512}


@functools.lru_cache(maxsize=1)
def length_priors() -> dict:
    """Published mean lengths of other RL runs than the validation table's
    (`data/rl/length_priors.csv`, a URL per row): each run's cap and the fraction of it its
    mean response fills (the dataset and the cap set the length more than the architecture),
    the runs of each released checkpoint (keyed by `rl_table.release_name`: a Base, an
    Instruct and a Thinking release of one architecture write different lengths), and the
    median published mean prompt. Derived from those rows alone, nothing fitted on
    rl_runs.csv."""
    p = pd.read_csv(resources.files("sim_core").joinpath("data/rl/length_priors.csv"))
    frac = p.mean_response_len / p.max_response_len
    by_ckpt = {}
    for ck, g in p[p.model.notna()].groupby(p.model.map(rl_table.release_name)):
        by_ckpt[ck] = list(zip(g.mean_response_len, g.max_response_len, g.source))
    return {"fraction": float(np.median(frac)), "by_checkpoint": by_ckpt,
            "prompt_mean": float(np.median(p.mean_prompt_len.dropna())),
            "rows": len(p)}


def _checkpoint_prior(pri: dict, checkpoint: str, cap: float):
    """The published mean responses of this checkpoint under a comparable budget (a cap at
    least half the row's: a 1k-cap run says nothing of an 8k-cap one), or None. A published
    mean is the mean of lengths clipped at that run's cap; it is carried to the row's cap
    under the clipped exponential law the imputed clip ratios use (the scale theta solved at
    the published cap, then theta (1 - exp(-cap / theta))): DeepScaleR's 4,500 at 8k is 5,650
    at 16k, where responses cut at 8k run on; a mean far below both caps stays as it is."""
    runs = [(m, c, s) for m, c, s in pri["by_checkpoint"].get(checkpoint, []) if c >= cap / 2]
    if not runs:
        return None
    m, c = (np.array([r[i] for r in runs], dtype=float) for i in (0, 1))
    th = generation.length_scale(m, c)
    at_cap = np.where(c == cap, m, th * -np.expm1(-cap / th))
    return (float(np.median(at_cap)), sorted({s for *_, s in runs}),
            sorted(set(c.tolist())))


def load(path=None) -> pd.DataFrame:
    path = path or resources.files("sim_core").joinpath("data/rl/rl_runs.csv")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=True, skipinitialspace=True)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the RL table ({str(e).splitlines()[0]})")
    df.columns = [str(c).strip().lower().replace(" ", "_") for c in df.columns]
    missing = [c for c in ("model", "gpu", "step_time_s") if c not in df.columns]
    if "num_gpus" not in df.columns and not {"rollout_gpus", "train_gpus"} <= set(df.columns):
        missing.append("num_gpus")
    if missing:
        raise ValueError(f"{missing[0]}: required column is missing from the RL table")
    return df


def _imputed_lengths(t: pd.DataFrame, imputed: list[list[str]]):
    """Mean prompt and response lengths: stated, or from the published priors."""
    pri = length_priors()
    mx = t.max_response_or_total_len
    pmax = t.max_prompt_len
    mean = t.mean_seq_len.copy()
    ckpt = t.get("release", pd.Series("", index=t.index))
    # a stated share of responses at the cap (verl's response_length/clip_ratio) fixes the
    # mean under the RL model's own length law (rl/generation.py: an exponential clipped at
    # the cap, its mass at the cap exp(-cap/theta)): theta = -cap / ln(c), mean = theta (1 - c)
    clip = t.get("response_clip_ratio", pd.Series(np.nan, index=t.index))
    for i in np.flatnonzero((mean.isna() & (clip > 0) & (clip < 1)).to_numpy()):
        c = float(clip.iloc[i])
        mean.iloc[i] = -mx.iloc[i] / np.log(c) * (1 - c)
        imputed[i].append(f"response mean={mean.iloc[i]:.0f} (from {c:.0%} of responses at the "
                          f"{mx.iloc[i]:.0f} cap, clipped-exponential length law)")
    for i in np.flatnonzero(mean.isna().to_numpy()):
        own = _checkpoint_prior(pri, ckpt.iloc[i], mx.iloc[i])
        if own is not None:
            mean.iloc[i] = min(own[0], mx.iloc[i])
            carried = ("" if all(c == mx.iloc[i] for c in own[2]) else
                       f", carried to the {mx.iloc[i]:.0f} cap by the clipped exponential law")
            imputed[i].append(f"response mean={mean.iloc[i]:.0f} (published for "
                              f"{ckpt.iloc[i]}: {', '.join(own[1])}{carried}; "
                              "data/rl/length_priors.csv)")
            continue
        f = pri["fraction"]
        mean.iloc[i] = f * mx.iloc[i]
        imputed[i].append(f"response mean={mean.iloc[i]:.0f} ({f:.3f} x the {mx.iloc[i]:.0f} cap: "
                          f"median of {pri['rows']} published runs, data/rl/length_priors.csv)")
    stated_p = t["prompt_len"] if "prompt_len" in t.columns else pd.Series(np.nan, index=t.index)
    prompt = pd.to_numeric(stated_p, errors="coerce")
    for i in np.flatnonzero(prompt.isna().to_numpy()):
        prompt.iloc[i] = min(pri["prompt_mean"], pmax.iloc[i])
        imputed[i].append(f"prompt mean={prompt.iloc[i]:.0f} (median published prompt, "
                          "data/rl/length_priors.csv)")
    return prompt, mean, mx


def _use_ref(t: pd.DataFrame, algo: pd.Series) -> np.ndarray:
    """GRPO and PPO run a reference log-prob pass, DAPO none; a stated `use_ref` wins."""
    default = algo.isin(["grpo", "ppo"]).to_numpy()
    if "use_ref" not in t.columns:
        return default
    stated = t["use_ref"]
    return np.where(stated.notna(), stated.astype(object).eq(True), default)


# NeMo RL's own values for blank cells of its rows (the defaults above are verl's):
# colocated inference always offloads the trainer's states around the refit
# (rl/inputs.py framework_offloads); the base configs
# (examples/configs/grpo_math_1B.yaml and grpo_math_1B_megatron.yaml at v0.7.0) turn
# activation checkpointing off, keep Megatron's gradient reduction in bf16
# (`grad_reduce_in_fp32: false`; DTensor's FSDP2 reduces in fp32, verl's default) and run the
# log-prob passes at `logprob_batch_size: ${policy.train_micro_batch_size}` = 4; the reference
# pass runs unless `grpo.skip_reference_policy_logprobs_calculation` (grpo.py at v0.7.0), which
# only the PPO base config sets: a DAPO run without a KL term still computes it
NEMO_RL_BLANKS = ("offload_params", "offload_optimizer", "train_recompute",
                  "train_grad_reduce_fp32", "logprob_batch_size")


def _nemo_rl_blanks(t: pd.DataFrame, df: pd.DataFrame, imputed: list[list[str]]) -> None:
    nemo = df["rl_framework"].astype(str).eq("nemo_rl").to_numpy() \
        if "rl_framework" in df.columns else np.zeros(len(df), bool)
    if not nemo.any():
        return
    offloads = rl_inputs.framework_offloads(df["rl_framework"], df["placement"])
    megatron = df["train_zero"].to_numpy() < 3
    values = {"offload_params": (offloads, True), "offload_optimizer": (offloads, True),
              "train_recompute": (np.ones(len(df), bool), "none"),
              "train_grad_reduce_fp32": (megatron, False),
              "logprob_batch_size": (np.ones(len(df), bool), 4),
              "use_ref": (df["algorithm"].astype(str).isin(["grpo", "dapo"]).to_numpy(), True)}
    for col, (where, v) in values.items():
        blank = (t[col].isna().to_numpy() if col in t.columns else np.ones(len(t), bool))
        sel = nemo & where & blank
        if not sel.any():
            continue
        col_vals = np.array(df[col].tolist(), dtype=object)
        col_vals[sel] = v
        df[col] = col_vals
        for i in np.flatnonzero(sel):
            imputed[i].append(f"{col}={v} (NeMo RL's)")


def _impute_framework(t: pd.DataFrame, raw_backend, imputed: list[list[str]]) -> None:
    """A blank `rl_framework` read from the row's URL, source or backend
    (rl_table.infer_framework), else verl's, said either way: the framework decides which
    code's costs price the row (NeMo RL's refit and training passes, verl's workers, ...).
    Stated ones are spelled one way first (NeMo RL, nemo-rl, nemo_rl -> nemo_rl), so that
    every rule after this reads the same name."""
    if "rl_framework" not in t.columns:
        t["rl_framework"] = np.nan
    blank = t["rl_framework"].isna() | t["rl_framework"].astype(str).str.strip().eq("")
    t["rl_framework"] = t["rl_framework"].where(
        blank, t["rl_framework"].astype(str).str.strip().str.lower()
        .str.replace(r"[\s-]+", "_", regex=True))
    url = t["url"] if "url" in t.columns else pd.Series(np.nan, index=t.index)
    src = t["source"] if "source" in t.columns else pd.Series(np.nan, index=t.index)
    be = raw_backend if raw_backend is not None else pd.Series(np.nan, index=t.index)
    fws = np.array(t["rl_framework"].astype(object).tolist(), dtype=object)
    for i in np.flatnonzero(blank.to_numpy()):
        fw, where = rl_table.infer_framework(url.iloc[i], src.iloc[i], be.iloc[i])
        fws[i] = fw or "verl"
        imputed[i].append(f"rl_framework={fws[i]} (read from {where})" if fw else
                          "rl_framework=verl (not stated; the default)")
    t["rl_framework"] = fws


def to_frame(t: pd.DataFrame) -> tuple[pd.DataFrame, list[str], np.ndarray]:
    """The table's rows as RL configurations, per row the fields imputed, and per row why it
    cannot be predicted ('' where it can)."""
    raw_backend = t["train_backend"] if "train_backend" in t.columns else None
    t, notes, reason = rl_table.normalize(t)
    imputed = [list(x) for x in notes]
    _impute_framework(t, raw_backend, imputed)
    for col, d in DEFAULTS.items():
        if col not in t.columns:
            t[col] = np.nan
        for i in np.flatnonzero(pd.isna(t[col]).to_numpy()):
            imputed[i].append(f"{col}={d}")
        t[col] = t[col].where(t[col].notna(), d)
    # split without its rollout share: half the GPUs
    split = t.placement.eq("split")
    need = split & t.rollout_gpus.isna()
    from_train = need & t.train_gpus.notna()
    t.loc[from_train, "rollout_gpus"] = t.num_gpus[from_train] - t.train_gpus[from_train]
    for i in np.flatnonzero((need & ~from_train).to_numpy()):
        imputed[i].append("rollout_gpus=num_gpus/2")
    t.loc[need & ~from_train, "rollout_gpus"] = (t.num_gpus[need & ~from_train] / 2).round()
    stale = t.staleness
    for i in np.flatnonzero((t.policy_mode.eq("async") & stale.isna()).to_numpy()):
        if not any("staleness" in x for x in imputed[i]):
            imputed[i].append("staleness=1")
    # MoE with EP and no stated expert TP: 1, as the published MoE recipes set it (NeMo RL
    # v0.3.0 grpo_math_qwen30ba3b_megatron.yaml expert_tensor_parallel_size 1; verl
    # run_deepseek671b_math_megatron_96gb.sh expert_tensor_parallel_size 1)
    if "train_etp" not in t.columns:
        t["train_etp"] = np.nan
    no_etp = t.train_etp.isna() & (t.train_ep > 1)
    for i in np.flatnonzero(no_etp.to_numpy()):
        imputed[i].append("train_etp=1")
    t.loc[no_etp, "train_etp"] = 1
    prompt, mean, mx = _imputed_lengths(t, imputed)
    # vLLM's engine generation (V0's host cost per sequence, rl/generation.py): a row that
    # runs vLLM without saying which engine gets V1, the default from vLLM 0.8.0
    v0_col = t["rollout_vllm_v0"] if "rollout_vllm_v0" in t.columns \
        else pd.Series(np.nan, index=t.index)
    no_v0 = (v0_col.isna() & t.rollout_engine.astype(str).str.lower().eq("vllm")).to_numpy()
    for i in np.flatnonzero(no_v0):
        imputed[i].append("vLLM engine V1 (the default from vLLM 0.8.0; version not stated)")
    backend = t.get("train_backend", pd.Series(np.nan, index=t.index)).astype(str)
    sharded = backend.isin(["fsdp", "fsdp2", "deepspeed"])
    gbs = t.get("train_gbs_seqs", pd.Series(np.nan, index=t.index))
    prompts = t.prompts_per_step
    seqs = prompts * t.responses_per_prompt
    precision = t.get("precision", pd.Series(np.nan, index=t.index)).astype(str).str.lower()
    algo = t.algorithm.astype(str)
    df = pd.DataFrame({
        "algorithm": algo, "model": t.model.fillna("qwen2.5-7b"),
        "gpu": t.gpu.fillna("h100-sxm"), "num_gpus": t.num_gpus.fillna(8),
        "placement": t.placement, "rollout_gpus": t.rollout_gpus.fillna(0),
        "asynchrony": t.policy_mode, "staleness": stale.fillna(1),
        "rollout_engine": t.rollout_engine, "rollout_tp": t.rollout_tp,
        "rollout_pp": t.rollout_pp, "gpu_memory_utilization": t.gpu_memory_utilization,
        "rollout_precision": np.where(precision.str.contains("fp8"), "fp8", "bf16"),
        "prompts_per_step": prompts, "responses_per_prompt": t.responses_per_prompt,
        "prompt_len": prompt, "response_mean": np.minimum(mean, mx), "response_max": mx,
        # the prompt cap: what verl pads every prompt to without remove-padding (verl.py)
        "prompt_max": t.max_prompt_len,
        "mini_batches": (seqs / gbs).where(gbs.notna(), 1).round().clip(lower=1),
        # a reference pass unless the table says there is none (verl runs one only with a KL
        # term: `use_kl_loss` or `use_kl_in_reward`; optional column `use_ref`)
        "use_ref": _use_ref(t, algo),
        "train_tp": t.train_tp, "train_pp": t.train_pp, "train_cp": t.train_cp,
        "train_ep": t.train_ep, "train_recompute": "full",
        # FSDP / DeepSpeed ZeRO-3: weights, grads and optimizer sharded over every rank
        "train_zero": np.where(sharded, 3, 1),
    })
    # optional columns beyond the (a recipe's settings the table states)
    for col, d in (("train_etp", 0), ("offload_params", False), ("offload_optimizer", False),
                   # verl's Ulysses sequence parallel size (actor.ulysses_sequence_parallel_size;
                   # the training frame runs it as cp with cp_comm a2a: rl/training.py)
                   ("train_ulysses", 1),
                   ("ref_offload", False),
                   ("enforce_eager", False), ("rollout_logprobs", True),
                   ("rollout_vllm_v0", False), ("rollout_async_scheduling", False),
                   ("optimizer_cpu_offload", 0.0),
                   ("train_recompute", "full"), ("train_grad_reduce_fp32", True),
                   ("train_seq_len", np.nan), ("rl_framework", "verl"),
                   ("logprob_batch_size", 1), ("sequence_packing", True),
                   ("dynamic_batching", False),
                   # verl's FSDP workers (sim_core/rl/verl.py)
                   ("remove_padding", True), ("micro_batch_seqs", 1),
                   ("logprob_micro_batch_seqs", 0), ("critic_micro_batch_seqs", 0),
                   ("critic_remove_padding", False), ("critic_seq_len", 32768),
                   # verl's log-prob token budget (log_prob_max_token_len_per_gpu; blank: the
                   # update's train_seq_len, verl.py logprob_budget)
                   ("logprob_seq_len", np.nan),
                   # generation rounds a run states (DAPO dynamic sampling; phases.py)
                   ("gen_rounds", 1), ("max_num_batched_tokens", 0),
                   # the engine's concurrent-sequence cap a recipe sets (vLLM max_num_seqs,
                   # AReaL v0.1 actor.vllm.max_num_seqs); 0 = catalogs/rl.yaml's default
                   ("max_num_seqs", 0),
                   # a stated share of responses at the cap reaches the length law too
                   # (rl/generation.py truncated_fraction), not only the imputed mean
                   ("response_clip_ratio", np.nan),
                   # the rollout engine's expert parallelism, in-flight weight updates of an
                   # async run, GPUs per NVLink domain (blank: the GPU's cluster,
                   # inputs.to_batch), the training precision and its FP8 recipe
                   ("rollout_ep", 1), ("partial_rollout", True),
                   ("use_rollout_log_probs", False), ("reuse_log_probs", False), ("spec_tokens", 0), ("spec_max_running", 0),
                   ("spec_acceptance", np.nan), ("kv_cache_bytes", 2),
                   ("gpus_per_node", np.nan), ("train_precision", "bf16"),
                   ("train_fp8_recipe", np.nan),
                   # Megatron-Core's split counting the embedding / loss as a pipeline layer
                   # (verl override_transformer_config; sim_core/pp_split.py)
                   ("train_account_for_embedding_in_pipeline_split", False),
                   ("train_account_for_loss_in_pipeline_split", False),
                   # Megatron-Core MoE kernel settings (sim_core/rl/moe_host.py; blank: the
                   # rows' frameworks' grouped GEMM and permute fusion on, router fusion off)
                   ("train_moe_grouped_gemm", True), ("train_moe_permute_fusion", True),
                   ("train_moe_router_fusion", False),
                   # the experts' activation fused (Megatron bias_activation_fusion) and the
                   # router's dtype (sim_core/rl/moe_glu.py; blank: the framework's and model's)
                   ("train_moe_glu_fusion", np.nan), ("train_moe_router_dtype", np.nan),
                   # Megatron's apply_rope_fusion (sim_core/rl/mla_rope.py; blank: off, as
                   # SkyRL's DeepSeek-V3 provider builds MLA models)
                   ("train_apply_rope_fusion", False),
                   # validation and checkpoints inside the stated figure (rl/periodic.py;
                   # blank: not in the figure or not stated, nothing priced)
                   ("val_period", np.nan), ("val_samples", np.nan), ("val_batch", np.nan),
                   ("val_max_len", np.nan), ("save_period", np.nan),
                   ("save_hf_model", False), ("storage_gbs_per_node", np.nan),
                   # AReaL's time-based recovery checkpoints, weights through storage and
                   # re-prefill after an update (rl/periodic.py, disk_refit.py, generation.py)
                   ("save_period_s", np.nan), ("refit_via_disk", False),
                   # cann-recipes-train's AlltoAllV reshard (rl/alltoallv_reshard.py)
                   ("refit_alltoallv", False),
                   ("reprefill_on_update", False)):
        if col in t.columns:
            df[col] = t[col].where(t[col].notna(), d).to_numpy()
        elif col in NEMO_RL_BLANKS:
            df[col] = d
    _nemo_rl_blanks(t, df, imputed)
    # the framework's release (optional column; blank: its current one)
    if "rl_framework_version" in t.columns:
        df["rl_framework_version"] = [rl_table.parse_version(x) for x in t.rl_framework_version]
    if "rl_framework" in df.columns:  # spelled as _impute_framework reads it
        # miles (radixark/miles) is a fork of slime with the same Megatron actor; so is vime
        # (vllm-project/vime: a snapshot of slime 44d29ee with vLLM rollouts,
        # SLIME_GAP_ANALYSIS.md at 53a5cb64), which keeps slime's reuse of the training
        # forward's log-probs (bf9b1a3b, before 44d29ee): set unless the row says otherwise
        vime = df["rl_framework"].eq("vime").to_numpy()
        stated = t["reuse_log_probs"].notna().to_numpy() if "reuse_log_probs" in t.columns \
            else np.zeros(len(t), dtype=bool)
        for i in np.flatnonzero(vime & ~stated):
            imputed[i].append("reuse_log_probs=True (vime: slime 44d29ee's "
                              "can_reuse_log_probs_in_loss)")
        if "reuse_log_probs" not in df.columns:
            df["reuse_log_probs"] = False
        df["reuse_log_probs"] = np.where(vime & ~stated, True,
                                         df["reuse_log_probs"].to_numpy(dtype=object))
        df["rl_framework"] = df["rl_framework"].replace({"miles": "slime", "vime": "slime"})
    # Megatron sequence parallelism: stated, else verl's Megatron default (v0.7.0
    # _generated_ppo_megatron_trainer.yaml actor/ref `megatron.sequence_parallel: true`; it
    # acts only with TP > 1), else off (NeMo RL grpo_math_1B.yaml megatron_cfg
    # sequence_parallel false; its recipes set it with TP)
    sp = t["train_sequence_parallel"] if "train_sequence_parallel" in t.columns \
        else pd.Series(np.nan, index=t.index)
    fw = df["rl_framework"] if "rl_framework" in df.columns \
        else pd.Series("verl", index=t.index)
    # SkyRL's Megatron worker sets it whenever TP > 1 (NovaSky-AI/SkyRL f6bf2f91
    # skyrl/backends/skyrl_train/workers/megatron/megatron_worker.py L300
    # `provider.sequence_parallel = megatron_config.tensor_model_parallel_size > 1`)
    on_by_default = fw.isin(["verl", "skyrl"]).to_numpy() & backend.eq("megatron").to_numpy()
    # (Megatron turns it off at TP 1: megatron/training/arguments.py `if
    # args.tensor_model_parallel_size == 1: args.sequence_parallel = False`)
    df["train_sequence_parallel"] = np.where(sp.notna(), sp.astype(object).eq(True),
                                             on_by_default) \
        & (pd.to_numeric(df["train_tp"]).fillna(1).to_numpy() > 1)
    if "train_precision" in df.columns:  # "FP8", "bfloat16" -> the simulator's names
        df["train_precision"] = (df["train_precision"].astype(str).str.strip().str.lower()
                                 .replace({"bfloat16": "bf16", "float8": "fp8", "e4m3": "fp8"}))
    return df, ["; ".join(x) for x in imputed], np.array(reason, dtype=object)


def compare(t: pd.DataFrame, phase_scales=None) -> pd.DataFrame:
    """Each row predicted against what it measured. phase_scales: simulate_rl's (None: the
    installed profile's, else the shipped NeMo RL scales; {}: the white-box model). Rows are
    numbered from 0 in the result, whatever the table's index (a filtered table's rows kept
    theirs and were left unpredicted)."""
    t = t.reset_index(drop=True)
    df, imputed, reason = to_frame(t)
    norm, _, _ = rl_table.normalize(t)
    ok = reason == ""
    pred = pd.DataFrame(index=range(len(df)),
                        columns=["step_time_s", "gen_share", "fits", "oom_reason",
                                 "invalid_reason", "step_fixed_time_s", "rollout_peak_gib",
                                 "train_peak_gib"], dtype=object)
    phases = pred_phases(pd.DataFrame(), ok)
    if ok.any():
        p = simulate_rl(df[ok].reset_index(drop=True), phase_scales=phase_scales)
        for c in pred.columns:
            pred.loc[np.flatnonzero(ok), c] = p[c].to_numpy()
        phases = pred_phases(p, ok)
    raw = t.copy()
    raw.columns = [rl_table.column_name(c) for c in raw.columns]
    out = pd.DataFrame({"model": raw.model, "gpu": raw.gpu, "num_gpus": norm.num_gpus,
                        "placement": df.placement, "policy_mode": df.asynchrony,
                        "source": raw.get("source", pd.Series(None, index=t.index, dtype=object))
                        .astype(object).fillna("(no source)")})
    out["step_time_s"] = norm.step_time_s
    out["pred_step_s"] = pd.to_numeric(pred.step_time_s)
    out["step_err"] = out.pred_step_s / out.step_time_s - 1
    # the part of the predicted step that does not scale with the model (rl/step_fixed.py)
    out["pred_fixed_s"] = pd.to_numeric(pred.step_fixed_time_s)
    meas_share = norm.get("gen_time_s", pd.Series(np.nan, index=t.index)) / norm.step_time_s
    sync = df.asynchrony.eq("sync").to_numpy()
    out["gen_share"] = np.where(sync, meas_share, np.nan)
    out["pred_gen_share"] = pd.to_numeric(pred.gen_share)
    out["gen_share_err_pts"] = (out.pred_gen_share - out.gen_share) * 100
    fw = (df["rl_framework"].astype(str).to_numpy() if "rl_framework" in df.columns
          else np.full(len(df), ""))
    for c, v in _phase_pairs(norm, phases, sync, fw).items():
        out[c] = v
    out["fits"] = pred.fits.where(ok, "-")
    out["oom_reason"] = pred.oom_reason.fillna("")
    # the peaks behind the verdict (GiB per GPU: while generating, while training) and the
    # GPU's memory: how near a verdict was (accuracy/rl_memory.py)
    out["pred_rollout_peak_gib"] = pd.to_numeric(pred.rollout_peak_gib)
    out["pred_train_peak_gib"] = pd.to_numeric(pred.train_peak_gib)
    out["hbm_gib"] = [float(catalog.get_gpu(g).hbm_gib) if k else np.nan
                      for g, k in zip(df.gpu, ok)]
    out["invalid_reason"] = pred.invalid_reason.fillna("")
    out["imputed"] = imputed
    out["skipped"] = reason
    # the batch a step serves (sequences x response cap): what a sync / async pair must share
    out["batch_key"] = [f"{int(s)}x{int(r)}" if s == s and r == r else "" for s, r in
                        zip(df.prompts_per_step * df.responses_per_prompt, df.response_max)]
    return out


# the phases a run table may state, each against what the simulator prices for it: the
# log-prob column is the policy's (plus the reference's where a source states it apart or
# lumps it in, as NeMo RL's "Get logprobs" does), so it is compared with all the log-prob
# passes; rows with a critic are left out of log-probs and update (their tables split the
# critic's passes differently); generation on synchronous rows only, where the column is the
# rollout itself and not the wait for it
PHASES = {"generation": "gen_time_s", "log-probs": "log_prob_time_s",
          "update": "update_time_s",
          # slime's / vime's perf/train_time: the log-prob passes and the update under one
          # timer (megatron_utils/actor.py train_actor, timer("train"))
          "train": "train_time_s",
          # a table's refit / weight-sync column against what that framework's timer holds:
          # NeMo RL's colocated `prepare_for_generation` also holds the engine's wake, the
          # trainer's offload out and the cleaning around it (rl/refit_timer.py); elsewhere
          # the weight sync
          "refit": "refit_timer_s"}


def pred_phases(pred: pd.DataFrame, ok: np.ndarray) -> pd.DataFrame:
    """The predicted phase seconds of the priced rows, NaN for the others."""
    out = pd.DataFrame(np.nan, index=range(len(ok)),
                       columns=list(PHASES.values()) + ["values_time_s", "old_log_prob_time_s",
                                                        "ref_time_s"])
    for c in out.columns:
        if c in pred:
            out.loc[np.flatnonzero(ok), c] = pd.to_numeric(pred[c]).to_numpy()
    return out


def _phase_pairs(norm: pd.DataFrame, p: pd.DataFrame, sync: np.ndarray,
                 framework=None) -> dict:
    def col(c):
        return pd.to_numeric(norm.get(c, pd.Series(np.nan, index=norm.index)),
                             errors="coerce").to_numpy(dtype=float)

    no_critic = np.nan_to_num(p.values_time_s.to_numpy(dtype=float)) == 0
    olp, ref = col("old_log_prob_time_s"), col("ref_time_s")
    meas = {"generation": np.where(sync, col("gen_time_s"), np.nan),
            "log-probs": np.where(no_critic & np.isfinite(olp), olp + np.nan_to_num(ref),
                                  np.nan),
            "update": np.where(no_critic, col("update_actor_time_s"), np.nan),
            "train": np.where(no_critic, col("train_time_s"), np.nan),
            "refit": col("weight_sync_time_s")}
    out = {}
    for name, pc in PHASES.items():
        out[f"meas_{pc}"] = meas[name]
        out[f"pred_{pc}"] = p[pc].to_numpy(dtype=float)
    # the predicted log-probs: the passes the row's timer holds (rl_logprob_timer.py), not
    # every pass (a policy-only timer against policy + reference read 2x)
    fw = framework if framework is not None else np.full(len(norm), "")
    timer = rl_logprob_timer.held(norm.get("log_prob_timer", pd.Series(None, index=norm.index,
                                                                       dtype=object)),
                                  fw, np.isfinite(ref))
    out["log_prob_timer"] = np.where(np.isfinite(meas["log-probs"]), timer, "")
    out["pred_log_prob_time_s"] = rl_logprob_timer.predicted(
        timer, p.old_log_prob_time_s, p.ref_time_s, p.values_time_s)
    return out


def phase_summary(cmp: pd.DataFrame) -> dict:
    """Per phase, over the rows that state it: how many, the median predicted / measured
    ratio (below 1: predicted too short) and the median |error|. Says which part of the step
    the error of the step comes from."""
    out = {}
    for name, pc in PHASES.items():
        if f"meas_{pc}" not in cmp:
            continue
        r = (cmp[f"pred_{pc}"] / cmp[f"meas_{pc}"]).to_numpy(dtype=float)
        r = r[np.isfinite(r) & (cmp[f"meas_{pc}"].to_numpy(dtype=float) > 0)]
        if len(r):
            out[name] = {"rows": int(len(r)), "median_ratio": float(np.median(r)),
                         "median_abs_err": float(np.median(np.abs(r - 1)))}
    return out


def ranking(cmp: pd.DataFrame) -> list[dict]:
    """Colocated against split where the same source measured both for one model and GPU
    count: is the faster one predicted faster?"""
    out = []
    ok = cmp[cmp.pred_step_s.notna() & cmp.step_time_s.notna()]
    for key, g in ok.groupby(["source", "model", "num_gpus"]):
        if g.placement.nunique() < 2:
            continue
        best = g.groupby("placement")[["step_time_s", "pred_step_s"]].min()
        out.append({"source": key[0], "model": key[1], "num_gpus": key[2],
                    "measured_faster": best.step_time_s.idxmin(),
                    "predicted_faster": best.pred_step_s.idxmin()})
    return out


def mode_ranking(cmp: pd.DataFrame) -> list[dict]:
    """Sync against asynchronous (one step off, fully async, ...) where the same source
    measured both for one model, GPU count and batch (sequences per step and response cap),
    whatever the placements (an asynchronous run is split by construction; its synchronous
    twin may be colocated): is the faster one predicted faster, and by how much (sync /
    async step)? Where the source measured more than one synchronous run of the batch (the
    AReaL paper's Table 1: verl colocated and Sync.AReaL split), the twin is the one on the
    asynchronous run's placement, the run that differs from it only by its asynchrony."""
    out = []
    ok = cmp[cmp.pred_step_s.notna() & cmp.step_time_s.notna()]
    for key, g in ok.groupby(["source", "model", "num_gpus", "batch_key"]):
        if not (g.policy_mode.eq("sync").any() and g.policy_mode.ne("sync").any()):
            continue
        asyn = g[g.policy_mode.ne("sync")].iloc[0]
        syncs = g[g.policy_mode.eq("sync")]
        same = syncs[syncs.placement.eq(asyn.placement)]
        sync = (same if len(same) else syncs).iloc[0]
        out.append({"source": key[0], "model": key[1], "num_gpus": key[2],
                    "placement": f"{sync.placement} / {asyn.placement}", "batch": key[3],
                    "mode": asyn.policy_mode,
                    "measured_speedup": float(sync.step_time_s / asyn.step_time_s),
                    "predicted_speedup": float(sync.pred_step_s / asyn.pred_step_s)})
    return out


def summary(cmp: pd.DataFrame) -> dict:
    ok = cmp.step_err.notna()
    by_src = {s: float(np.median(np.abs(g.step_err))) for s, g in cmp[ok].groupby("source")}
    # in-sample figures: only NeMo RL's two training-pass scales are fitted on these rows
    # (calibration/rl_defaults.py gives their leave-one-source-out figures); every other
    # source's figure is its out-of-sample error
    share = cmp.gen_share_err_pts.dropna()
    return {"rows": int(ok.sum()), "median_abs_step_err": float(np.median(np.abs(
        cmp.step_err[ok]))) if ok.any() else float("nan"), "by_source": by_src,
        "median_abs_gen_share_pts": float(np.median(np.abs(share))) if len(share) else None,
        "gen_share_rows": int(len(share)), "skipped": int((cmp.skipped != "").sum()),
        # rows priced with or without a measured step (a table of recipes states none)
        "priced": int(cmp.pred_step_s.notna().sum()),
        "priced_fit": int((cmp.pred_step_s.notna() & cmp.fits.eq(True)).sum()),
        "ranking": ranking(cmp), "mode_ranking": mode_ranking(cmp),
        "phases": phase_summary(cmp)}
