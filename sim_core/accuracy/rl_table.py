"""Tolerant reading of published RL run tables (the issue's column set), before prediction.

Published RL tables are written by hand: "8k", "16K", "~1960", "1,024", "1.2e3", "60%",
"19h18m", placements spelled as each framework does (verl `hybrid_engine`, "colocate",
"standalone", "disaggregated"), policy modes such as "one-step-overlap async" or
"async (staleness 2)", model ids with the hub organisation ("Qwen/Qwen2.5-Math-7B") and GPUs
as products ("NVIDIA H100 80GB HBM3"). This module turns every cell into the value the RL
model reads, or into a blank with a note; a row it cannot predict (unknown model or GPU, no GPU
count) gets a one-line reason instead of an exception. Column names are matched case- and
space-insensitively. Nothing here is a number of the model: only spellings and units.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .. import catalog, model_names

# token counts: "8k" is 8 x 1024 as the frameworks write their caps ($((1024 * 8)))
LENGTH_COLUMNS = ("max_prompt_len", "max_response_or_total_len", "mean_seq_len", "val_max_len",
                  "train_seq_len", "critic_seq_len")
TIME_COLUMNS = ("step_time_s", "gen_time_s", "old_log_prob_time_s", "ref_time_s",
                "update_actor_time_s", "weight_sync_time_s",
                # one timer around the log-prob passes and the update (slime's and vime's
                # perf/train_time: megatron_utils/actor.py train_actor, timer("train"))
                "train_time_s")
COUNT_COLUMNS = ("num_gpus", "rollout_gpus", "train_gpus", "rollout_tp", "rollout_pp",
                 "train_tp", "train_cp", "train_ep", "train_pp", "train_etp",
                 # verl FSDP workers' Ulysses sequence parallel size (sim_core/rl/training.py)
                 "train_ulysses",
                 "prompts_per_step", "responses_per_prompt", "rollout_batch_seqs",
                 "train_gbs_seqs", "optimizer_cpu_offload", "logprob_batch_size",
                 # verl's micro-batch sizes per GPU (sim_core/rl/verl.py)
                 "micro_batch_seqs", "logprob_micro_batch_seqs", "critic_micro_batch_seqs",
                 # generation rounds per step (DAPO dynamic sampling); vLLM tokens per step
                 "gen_rounds", "max_num_batched_tokens",
                 # the rollout engine's expert parallelism (vLLM `expert_parallel_size`) and
                 # `max_num_seqs` (NeMo RL vllm_kwargs); GPUs per NVLink domain (inputs.py)
                 "rollout_ep", "max_num_seqs", "gpus_per_node",
                 # speculative decoding: drafted tokens per step (vLLM num_speculative_tokens)
                 # and the running requests above which drafting stops (0: never stops)
                 "spec_tokens", "spec_max_running",
                 # bytes per cached KV element (vLLM kv_cache_dtype: 2 auto/bf16, 1 fp8)
                 "kv_cache_bytes",
                 # validation and checkpoints inside the figure (sim_core/rl/periodic.py)
                 "val_period", "val_samples", "val_batch", "save_period",
                 "storage_gbs_per_node",
                 # a time-based checkpoint period, seconds (AReaL exp_ctrl.ckpt_freq_secs)
                 "save_period_s")
BOOL_COLUMNS = ("offload_params", "offload_optimizer", "ref_offload", "enforce_eager",
                "train_grad_reduce_fp32", "sequence_packing", "dynamic_batching", "use_ref",
                "remove_padding", "critic_remove_padding",
                # in-flight requests survive a weight sync (NeMo RL async_grpo
                # `in_flight_weight_updates`, verl fully_async `partial_rollout`)
                "partial_rollout", "use_rollout_log_probs", "train_sequence_parallel",
                # the loss reuses the training forward's log-probs (rl/slime_train.py)
                "reuse_log_probs",
                # AReaL v0.3: weights through shared storage (rl/disk_refit.py); in-flight
                # requests prefilled again after each update (rl/generation.py)
                "refit_via_disk", "reprefill_on_update",
                # cann-recipes-train's AlltoAllV reshard (rl/alltoallv_reshard.py)
                "refit_alltoallv",
                # the engine returns the sampled tokens' log-probabilities (sampler cost)
                "rollout_logprobs",
                # the rollout engine is vLLM's V0 engine (host cost per running sequence)
                "rollout_vllm_v0",
                # vLLM V1 schedules one step ahead (its host work overlaps the GPU step)
                "rollout_async_scheduling",
                # rank 0 writes the gathered HF model with each checkpoint (rl/periodic.py)
                "save_hf_model")

PLACEMENTS = {
    "colocated": ("colocated", "colocate", "co-located", "co-locate", "hybrid", "hybrid_engine",
                  "hybrid engine", "hybridengine", "shared", "collocated", "colocate sync"),
    "split": ("split", "disaggregated", "disaggregate", "standalone", "separate", "separated",
              "decoupled", "non-colocated", "noncolocated", "non_colocated", "dedicated",
              "separate_async"),
}
# verl names PPO by its advantage estimator: `algorithm.adv_estimator=gae` (a critic)
ALGORITHMS = {"grpo": ("grpo",), "dapo": ("dapo",), "ppo": ("ppo", "gae")}
# critic-free GRPO relatives: the same phases as GRPO (no value model), priced as GRPO
GRPO_LIKE = ("gspo", "dr_grpo", "dr.grpo", "drgrpo", "rloo", "reinforce++",
             "reinforce_plus_plus", "reinforce++-baseline", "remax", "cispo", "gpg", "opo")
BACKENDS = {"fsdp2": ("fsdp2",), "fsdp": ("fsdp", "dtensor", "pytorch dtensor", "fsdp1"),
            "deepspeed": ("deepspeed", "ds", "zero3", "zero-3", "deepspeed zero3"),
            "megatron": ("megatron", "mcore", "megatron-core", "megatron core", "megatron-lm")}

_NUM = re.compile(r"^([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)\s*([a-z%]*)$")
_DUR = re.compile(r"^(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?:in)?)?\s*"
                  r"(?:(\d+(?:\.\d+)?)\s*s(?:ec)?)?$")


def _clean(cell) -> str:
    s = str(cell).strip().lower()
    s = re.sub(r"[~≈≃]|\bapprox\.?|\babout\b", "", s)     # "~1960", "≈ 7 s"
    s = re.sub(r"\(.*?\)|（.*?）", "", s)                   # "15h34m (+23%)"
    # markdown emphasis around a cell or its number: "*2124.429*s" (AReaL v0.1's log),
    # "**445 s**"; an inner "*" stays a product ("1204*8")
    s = re.sub(r"^\*+\s*(.*?)\s*\*+\s*([a-z%]*)$", r"\1\2", s.strip())
    s = s.replace(",", "").replace("_", "").strip()
    return s


def parse_number(cell, kind: str = "count"):
    """One published cell -> float, or (nan, why) where it is not a number of this kind.

    kind: 'length' (k = 1024), 'time' (seconds; '7.5 min', '1h2m', '445 s', '0.3 ms'),
    'fraction' ('60%' or 60 -> 0.6), 'count' (k = 1000)."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return np.nan, ""
    if isinstance(cell, (int, float, np.integer, np.floating)) and not isinstance(cell, bool):
        return _fraction(float(cell)) if kind == "fraction" else (float(cell), "")
    sh = re.match(r"^\s*\$\(\((.*)\)\)\s*$", str(cell))     # shell arithmetic
    s = _clean(sh.group(1) if sh else cell)
    if s in ("", "-", "n/a", "na", "none", "null", "?", "nan", "—", "–"):
        return np.nan, ""
    if kind == "time":
        m = _DUR.match(s.replace(" ", ""))
        if m and any(m.groups()):
            h, mi, sec = (float(x) if x else 0.0 for x in m.groups())
            return h * 3600 + mi * 60 + sec, ""
    # shell arithmetic and products as recipes write them: "$((1024 * 2))", "1204*8",
    # "16 nodes x 8"
    e = re.sub(r"^\$\(\((.*)\)\)$", r"\1", s)
    e = re.sub(r"\b(nodes?|gpus?|cards?|per)\b", "", e).strip()
    parts = re.split(r"\s*[*×]\s*|\s+x\s+|(?<=\d)x(?=\d)", e)
    if len(parts) > 1:
        vals = [parse_number(x, kind)[0] for x in parts]
        if all(np.isfinite(vals)):
            return float(np.prod(vals)), ""
    # a range ("3–4 min"): its middle
    r = re.match(r"^(\d+(?:\.\d+)?)\s*[–—-]\s*(\d+(?:\.\d+)?)\s*([a-z%]*)$", s)
    if r:
        lo, _ = parse_number(r.group(1) + r.group(3), kind)
        hi, _ = parse_number(r.group(2) + r.group(3), kind)
        return (lo + hi) / 2, ""
    m = _NUM.match(s)
    if not m:
        return np.nan, f"unreadable {s!r}"
    v, unit = float(m.group(1)), m.group(2)
    scale = {"": 1.0, "k": 1024.0 if kind == "length" else 1000.0,
             "m": 1024.0 ** 2 if kind == "length" else 1e6}
    if kind == "time":
        scale = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0,
                 "h": 3600.0, "hr": 3600.0}
    if kind == "fraction":
        scale = {"": 1.0, "%": 0.01}
    if unit in ("tok", "tokens", "gpus", "gpu", "x") and kind in ("length", "count"):
        unit = ""
    if unit not in scale:
        return np.nan, f"unreadable unit {unit!r} in {s!r}"
    v *= scale[unit]
    if kind == "fraction" and unit == "":
        return _fraction(v)
    return v, ""


def _fraction(v: float):
    """A share: 0-1 as is, 10-100 read as percent ("60" = 60%), anything else unreadable."""
    if 0 <= v <= 1:
        return v, ""
    if 10 <= v <= 100:
        return v / 100, ""
    return np.nan, f"{v:g} is not a fraction (0-1 or a percent)"


def parse_bool(cell):
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return np.nan
    if isinstance(cell, (bool, np.bool_)):
        return bool(cell)
    s = _clean(cell)
    if s in ("true", "yes", "y", "1", "on", "t"):
        return True
    if s in ("false", "no", "n", "0", "off", "f"):
        return False
    return np.nan


def _match(cell, table: dict):
    s = _clean(cell)
    for key, spellings in table.items():
        if s in spellings:
            return key
    return None


def parse_placement(cell):
    """-> ('colocated' | 'split' | nan, note)."""
    if pd.isna(cell) or _clean(cell) == "":
        return np.nan, ""
    p = _match(cell, PLACEMENTS)
    if p is None:
        s = _clean(cell)
        if any(w in s for w in ("coloc", "hybrid", "colloc")):
            p = "colocated"
        elif any(w in s for w in ("split", "disagg", "standalone", "separat", "decoupl")):
            p = "split"
        elif any(w in s for w in ("one-step", "one step", "overlap", "async")):
            # verl's one-step-off and fully async recipes and NeMo RL's async GRPO run the
            # rollout on GPUs of its own
            return "split", f"placement {cell!r} read as split (an overlapped mode)"
    return (p, "") if p else (np.nan, f"placement {cell!r} not understood")


def _dmp(s: str):
    """AReaL's parallel string 'd16p1m4' (in any order of d, p, m): data, pipeline and model
    (tensor) parallel degrees, or None."""
    m = re.fullmatch(r"([dpm])(\d+)([dpm])(\d+)([dpm])(\d+)", s)
    if not m or {m.group(1), m.group(3), m.group(5)} != {"d", "p", "m"}:
        return None
    return {m.group(k): int(m.group(k + 1)) for k in (1, 3, 5)}


def parse_allocation(cell):
    """AReaL's decoupled `allocation_mode` ('vllm.d16p1m4+d32p2m1', either order; 'sglang.'
    likewise) -> the columns it fixes, or None. d = data, p = pipeline, m = model (tensor)
    parallel, as realhf reads them (inclusionAI/AReaL 2963a673
    realhf/experiments/common/utils.py extract_decoupled_vllm_train_allocation /
    extract_symmetric_allocation): the engine's part runs on GPUs of its own (split)."""
    if pd.isna(cell):
        return None
    s = str(cell).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(vllm|sglang)\.(\w+?)\+(\w+)", s)
    if m:
        engine, gen, train = m.group(1), _dmp(m.group(2)), _dmp(m.group(3))
    else:
        m = re.fullmatch(r"(\w+?)\+(vllm|sglang)\.(\w+)", s)
        if not m:
            return None
        engine, gen, train = m.group(2), _dmp(m.group(3)), _dmp(m.group(1))
    if gen is None or train is None:
        return None
    return {"placement": "split", "rollout_engine": engine,
            "rollout_gpus": float(gen["d"] * gen["p"] * gen["m"]),
            "rollout_tp": float(gen["m"]), "rollout_pp": float(gen["p"]),
            "train_gpus": float(train["d"] * train["p"] * train["m"]),
            "train_tp": float(train["m"]), "train_pp": float(train["p"])}


def parse_policy_mode(cell):
    """-> (asynchrony, staleness or nan, note). 'async (staleness 2)', 'async-2',
    'fully_async', 'one-step-overlap async', 'on-policy'."""
    if pd.isna(cell) or _clean(cell) == "":
        return np.nan, np.nan, ""
    raw = str(cell).strip().lower()
    s = raw.replace("_", " ").replace("-", " ")
    if re.search(r"one step|1 step|onestep|step off|overlap", s):
        return "one_step_off", np.nan, ""
    if "async" in s and not re.search(r"\bsync\b", s.replace("async", "")):
        n = re.search(r"(\d+)", s)
        if n:
            return "async", float(n.group(1)), ""
        note = ("fully async: staleness not stated, 1 imputed" if "fully" in s
                else "async: staleness not stated, 1 imputed")
        return "async", np.nan, note
    if re.search(r"\bsync\b|synchronous|on policy|onpolicy|colocate sync", s):
        return "sync", np.nan, ""
    return np.nan, np.nan, f"policy_mode {cell!r} not understood"


def parse_algorithm(cell):
    if pd.isna(cell) or _clean(cell) == "":
        return np.nan, ""
    a = _match(cell, ALGORITHMS)
    if a:
        return a, ""
    s = _clean(cell).replace(" ", "")
    if any(s.startswith(g.replace("_", "")) for g in GRPO_LIKE):
        return "grpo", f"algorithm {cell!r} priced as GRPO (critic-free, same phases)"
    if "grpo" in s:
        return "grpo", ""
    if "dapo" in s:
        return "dapo", ""
    if "ppo" in s:
        return "ppo", ""
    return np.nan, f"algorithm {cell!r} not understood"


def parse_backend(cell):
    if pd.isna(cell) or _clean(cell) == "":
        return np.nan
    b = _match(cell, BACKENDS)
    if b:
        return b
    s = _clean(cell)
    for key in ("megatron", "fsdp2", "fsdp", "deepspeed"):
        if key in s:
            return key
    if "dtensor" in s:
        return "fsdp"
    return np.nan


def parse_engine(cell):
    if pd.isna(cell) or _clean(cell) == "":
        return np.nan
    s = _clean(cell)
    for key in ("sglang", "vllm"):
        if key in s:
            return key
    if "trt" in s or "tensorrt" in s:
        return "tensorrt-llm"
    return np.nan


# the framework a run used, read from where the row says it comes from when its
# `rl_framework` cell is blank: the repository of its URL (the framework's own repository,
# issues and docs), its source's name, or a training backend only one framework names.
# First match wins, in this order; a row that names none stays verl's (the default) and says so
FRAMEWORK_REPOS = (("nvidia-nemo/rl", "nemo_rl"), ("nvidia-nemo.github.io", "nemo_rl"),
                   ("volcengine/verl", "verl"), ("verl-project/verl", "verl"),
                   ("thudm/slime", "slime"), ("radixark/miles", "miles"),
                   ("vllm-project/vime", "vime"), ("novasky-ai/skyrl", "skyrl"))
FRAMEWORK_NAMES = ((r"\bnemo[\s_-]?rl\b", "nemo_rl"), (r"\bskyrl\b", "skyrl"),
                   (r"\bslime\b", "slime"), (r"\bmiles\b", "miles"), (r"\bvime\b", "vime"),
                   (r"\bverl\b", "verl"))


def parse_version(cell) -> float:
    """A framework release as major.minor ('v0.3.1' -> 0.3, '0.5' -> 0.5); NaN when blank or
    without a version number."""
    if pd.isna(cell):
        return np.nan
    m = re.search(r"(\d+)\.(\d+)", str(cell))
    return float(f"{m.group(1)}.{m.group(2)}") if m else np.nan


def infer_framework(url, source, backend) -> tuple[str | None, str]:
    """(framework or None, where it was read) for a row whose `rl_framework` is blank: the
    URL's repository or site, else the source's name, else a DTensor training backend (NeMo
    RL's name for its FSDP2 worker; verl, SkyRL and slime say fsdp / fsdp2 / megatron)."""
    u = "" if pd.isna(url) else str(url).lower()
    for key, fw in FRAMEWORK_REPOS:
        if key in u:
            return fw, f"its URL, {key}"
    src = "" if pd.isna(source) else str(source).lower()
    for pat, fw in FRAMEWORK_NAMES:
        if re.search(pat, src):
            return fw, "its source's name"
    if not pd.isna(backend) and "dtensor" in str(backend).lower():
        return "nemo_rl", "its DTensor training backend"
    return None, ""


# hub spellings -> catalog ids: one resolver for every table (sim_core/model_names.py)
def checkpoint_name(cell) -> str:
    """A hub model id as one lower-case spelling ('' for a blank cell)."""
    return "" if pd.isna(cell) else model_names.checkpoint_name(cell)


def release_name(cell) -> str:
    """A checkpoint as released, for what its post-training decides (the lengths it writes):
    the hub id's last part, lower-case, separators as '-' ('Qwen/Qwen3-4B-Instruct-2507' ->
    'qwen3-4b-instruct-2507'). Unlike `checkpoint_name` it keeps the Base / Instruct /
    Thinking / date suffixes: one architecture, different behaviour ('' for a blank cell)."""
    if pd.isna(cell):
        return ""
    return re.sub(r"[\s_]+", "-", str(cell).strip().split("/")[-1].lower())


def resolve_model(cell):
    """-> (catalog id or None, note)."""
    if pd.isna(cell) or str(cell).strip() == "":
        return None, "model: not stated"
    raw = str(cell).strip()
    mid, how = catalog.resolve_model(raw)
    if mid is None:
        return None, f"unknown model {raw!r} (not in the catalog: `sweep catalog models`)"
    if how == "same architecture":
        return mid, f"model {raw!r} priced as {mid} (same architecture)"
    return mid, ("" if mid == raw else f"model {raw!r} read as {mid}")


def resolve_gpu(cell):
    if pd.isna(cell) or str(cell).strip() == "":
        return None, "gpu: not stated"
    gid = catalog.resolve_gpu(str(cell).strip())
    if gid is None:
        return None, f"unknown gpu {str(cell).strip()!r} (not in the catalog: `sweep catalog gpus`)"
    return gid, ""


def column_name(c) -> str:
    return re.sub(r"\s+", "_", str(c).strip().lower())


def normalize(t: pd.DataFrame) -> tuple[pd.DataFrame, list[list[str]], list[str]]:
    """The table with every cell read: numbers as floats, enumerations as the model's
    spellings, model and GPU as catalog ids. Returns (table, notes per row, reason per row:
    '' where the row can be predicted, else why not)."""
    t = t.copy()
    t.columns = [column_name(c) for c in t.columns]
    # every column of the set is read; one the table lacks is blank
    for c in (LENGTH_COLUMNS + TIME_COLUMNS + COUNT_COLUMNS
              + ("gpu_memory_utilization", "precision", "train_backend", "rollout_engine")):
        if c not in t.columns and c not in ("train_seq_len", "train_etp",
                                            "optimizer_cpu_offload", "gpus_per_node"):
            t[c] = np.nan
    n = len(t)
    notes: list[list[str]] = [[] for _ in range(n)]
    reason = [""] * n

    def num(col, kind):
        if col not in t.columns:
            return
        vals = []
        for i, cell in enumerate(t[col].tolist()):
            v, why = parse_number(cell, kind)
            if why:
                notes[i].append(f"{col}: {why}, left blank")
            vals.append(v)
        t[col] = np.array(vals, dtype=float)

    for c in LENGTH_COLUMNS:
        num(c, "length")
    for c in TIME_COLUMNS:
        num(c, "time")
    for c in COUNT_COLUMNS:
        num(c, "count")
    num("gpu_memory_utilization", "fraction")
    num("response_clip_ratio", "fraction")
    num("spec_acceptance", "fraction")
    for c in BOOL_COLUMNS:
        if c in t.columns:
            t[c] = [parse_bool(x) for x in t[c].tolist()]

    def enum(col, fn):
        if col not in t.columns:
            t[col] = np.nan
            return
        out = []
        for i, cell in enumerate(t[col].tolist()):
            v, why = fn(cell)
            if why:
                notes[i].append(why)
            out.append(v)
        t[col] = out

    # AReaL's allocation_mode (its own column, or where a table puts it in placement) fixes
    # the placement, engine and both sides' GPUs and parallel degrees; stated cells win
    alloc_cells = (t["allocation_mode"] if "allocation_mode" in t.columns
                   else t.get("placement", pd.Series([np.nan] * n, index=t.index))).tolist()
    for i, cell in enumerate(alloc_cells):
        a = parse_allocation(cell)
        if a is None:
            continue
        for col, v in a.items():
            if col not in t.columns:
                t[col] = np.nan
            if col == "placement" or pd.isna(t[col].iloc[i]) or str(t[col].iloc[i]).strip() == "":
                if isinstance(v, str):
                    t[col] = t[col].astype(object)
                t.loc[t.index[i], col] = v
        notes[i].append(f"allocation_mode {str(cell).strip()!r} read as split: "
                        f"{a['rollout_engine']} on {a['rollout_gpus']:g} GPUs (tp "
                        f"{a['rollout_tp']:g}), training on {a['train_gpus']:g} (tp "
                        f"{a['train_tp']:g}, pp {a['train_pp']:g})")
    enum("placement", parse_placement)
    enum("algorithm", parse_algorithm)
    if "policy_mode" not in t.columns:
        t["policy_mode"] = np.nan
    modes, stale = [], []
    for i, cell in enumerate(t.policy_mode.tolist()):
        m, st, why = parse_policy_mode(cell)
        if why:
            notes[i].append(why)
        modes.append(m)
        stale.append(st)
    t["policy_mode"] = modes
    t["staleness"] = stale
    for col, fn in (("train_backend", parse_backend), ("rollout_engine", parse_engine)):
        if col in t.columns:
            raw = t[col].tolist()
            t[col] = [fn(x) for x in raw]
            for i, (x, v) in enumerate(zip(raw, t[col])):
                if not pd.isna(x) and str(x).strip() and pd.isna(v):
                    notes[i].append(f"{col} {x!r} not understood, left blank")
    t["checkpoint"] = [checkpoint_name(x) for x in t.model.tolist()] if "model" in t.columns \
        else ""
    t["release"] = [release_name(x) for x in t.model.tolist()] if "model" in t.columns else ""
    gpu_cells = t["gpu"].tolist() if "gpu" in t.columns else [np.nan] * n
    for col, fn in (("model", resolve_model), ("gpu", resolve_gpu)):
        if col not in t.columns:
            t[col] = np.nan
        ids = []
        for i, cell in enumerate(t[col].tolist()):
            gid, why = fn(cell)
            if gid is None:
                reason[i] = reason[i] or why
            elif why:
                notes[i].append(why)
            ids.append(gid)
        t[col] = ids

    # the GPU count: stated, or rollout + training GPUs of a split run, or the count in the
    # GPU cell as setups are written ("8×H100", "8*H800")
    for c in ("num_gpus", "rollout_gpus", "train_gpus", "step_time_s"):
        if c not in t.columns:
            t[c] = np.nan
    for i, cell in enumerate(gpu_cells):
        m = re.match(r"^\s*(\d+)\s*[x×*]\s*\S", str(cell), re.I) if not pd.isna(cell) else None
        if m and pd.isna(t.num_gpus.iloc[i]) and pd.isna(t.rollout_gpus.iloc[i]):
            t.loc[t.index[i], "num_gpus"] = float(m.group(1))
            notes[i].append(f"num_gpus = {m.group(1)} from the gpu cell {str(cell).strip()!r}")
    both = t.num_gpus.isna() & t.rollout_gpus.notna() & t.train_gpus.notna()
    for i in np.flatnonzero(both.to_numpy()):
        notes[i].append("num_gpus = rollout_gpus + train_gpus")
    t.loc[both, "num_gpus"] = t.rollout_gpus[both] + t.train_gpus[both]
    for i in np.flatnonzero(t.num_gpus.isna().to_numpy()):
        bad = [x for x in notes[i] if x.startswith("num_gpus:")]
        reason[i] = reason[i] or (bad[0] if bad else
                                  "num_gpus: not stated (nor rollout_gpus + train_gpus)")
    return t, notes, reason
