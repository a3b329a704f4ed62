"""Regenerate the NeMo RL rows of tests/data/rl_recipes.csv from NeMo RL's own recipe configs.

Reads every `examples/configs/recipes/llm/performance/*.yaml` of NVIDIA-NeMo/RL at a tag, and
the GRPO/DAPO recipes its `tests/test_suites/{nightly,release}.txt` list (SUITE_SKIP says which
are left out), each with its `defaults:` chain merged as NeMo RL's `load_config` does (a recipe
overrides its parent key by key): one row per recipe, each field from the merged config;
nothing measured (the measured columns stay blank). The cluster: `*n8g` recipes are listed
under "H100" in `tests/test_suites/performance.txt`, `*n4g` under "GB200" in
`performance_gb200.txt`; the nightly/release suites run the n8g cluster and name no GPU.

    python tests/data/rl_recipes_build.py GIT_DIR [TAG] > rows.csv

GIT_DIR: a NeMo RL git directory (e.g. the `fetch github:NVIDIA-NeMo/RL` mirror). Not run by
the tests (it needs the mirror); the CSV it wrote is committed with the verl rows.
"""

from __future__ import annotations

import csv
import posixpath
import subprocess
import sys

import yaml

PERF = "examples/configs/recipes/llm/performance/"


def _show(git_dir, tag, path):
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{tag}:{path}"],
                          capture_output=True, text=True, check=True).stdout


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load(git_dir, tag, path):
    d = yaml.safe_load(_show(git_dir, tag, path)) or {}
    base = d.pop("defaults", None)
    if base:
        acc = {}
        for b in (base if isinstance(base, list) else [base]):
            acc = _merge(acc, load(git_dir, tag, posixpath.normpath(
                posixpath.join(posixpath.dirname(path), b))))
        d = _merge(acc, d)
    return d


def _get(d, path, default=None):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _ref(d, v):
    """Resolve a `${a.b}` interpolation of the merged config (one level, as the recipes use)."""
    if isinstance(v, str) and v.startswith("${") and v.endswith("}") and ":" not in v:
        return _get(d, v[2:-1])
    return v


def row(d, name, tag, suite="performance"):
    P, M = d["policy"], d["policy"]["megatron_cfg"]
    D = P.get("dtensor_cfg") or {}
    dt = not M.get("enabled", False)
    V = P["generation"]["vllm_cfg"]
    sg = P["generation"]["backend"] == "sglang"
    S = P["generation"].get("sglang_cfg") or {}
    kw = P["generation"].get("vllm_kwargs") or {}
    cl = d["cluster"]
    n = cl["num_nodes"] * cl["gpus_per_node"]
    colo = bool(_get(P, "generation.colocated.enabled", True))
    res = _get(P, "generation.colocated.resources") or {}
    rollout = 0 if colo else res["num_nodes"] * res["gpus_per_node"]
    asy = _get(d, "grpo.async_grpo.enabled", False)
    mtl = P["max_total_sequence_length"]
    notes = []
    model = P["model_name"]
    if "deepseek.md" in str(model):
        # the DeepSeek recipes name docs/guides/deepseek.md (a converted DeepSeek-V3 checkpoint)
        model = "deepseek-ai/DeepSeek-V3"
        notes.append("model_name points to docs/guides/deepseek.md: DeepSeek-V3")
    vprec = str(_ref(d, V.get("precision"))).lower()
    spec = _get(P, "generation.vllm_kwargs.speculative_config")
    if spec:
        notes.append(f"vLLM speculative decoding {spec} -> spec_tokens (acceptance: "
                     "catalogs/rl.yaml spec.acceptance)")
    dyn_s = bool(_get(d, "grpo.use_dynamic_sampling", False))
    if dyn_s:
        notes.append("use_dynamic_sampling true, dynamic_sampling_max_gen_batches "
                     f"{_get(d, 'grpo.dynamic_sampling_max_gen_batches')}: rounds per step not "
                     "stated (1 priced)")
    gpu = "h100-sxm" if cl["gpus_per_node"] == 8 else "gb200"
    cpu_off = _get(M, "optimizer.optimizer_cpu_offload", False) and not dt
    if dt and D.get("cpu_offload"):
        notes.append("dtensor_cfg.cpu_offload true (FSDP2 CPUOffloadPolicy: its per-pass host "
                     "moves are not priced for NeMo RL)")
    return {
        "algorithm": "dapo" if name.startswith("dapo") else "grpo",
        "model": model, "gpu": gpu, "num_gpus": n,
        "placement": "colocated" if colo else "split",
        "rollout_gpus": "" if colo else rollout, "train_gpus": "" if colo else n - rollout,
        "rollout_engine": P["generation"]["backend"],
        # SGLang: sglang_cfg tp_size and mem_fraction_static (its gpu_memory_utilization)
        "rollout_tp": S["tp_size"] if sg else V["tensor_parallel_size"],
        "rollout_pp": 1 if sg else V["pipeline_parallel_size"],
        "rollout_ep": 1 if sg else V.get("expert_parallel_size", 1),
        "gpu_memory_utilization": S["mem_fraction_static"] if sg else V["gpu_memory_utilization"],
        "kv_cache_bytes": 1 if str(V.get("kv_cache_dtype", "auto")).startswith("fp8") and not sg
        else 2,
        "train_backend": "dtensor" if dt else "megatron",
        "train_tp": D["tensor_parallel_size"] if dt else M["tensor_model_parallel_size"],
        "train_cp": D["context_parallel_size"] if dt else M["context_parallel_size"],
        "train_ep": 1 if dt else M["expert_model_parallel_size"],
        "train_pp": 1 if dt else M["pipeline_model_parallel_size"],
        "train_etp": 1 if dt else (M.get("expert_tensor_parallel_size") or 1),
        "train_sequence_parallel": bool((D if dt else M).get("sequence_parallel", False)),
        "prompts_per_step": d["grpo"]["num_prompts_per_step"],
        "responses_per_prompt": d["grpo"]["num_generations_per_prompt"],
        "rollout_batch_seqs": d["grpo"]["num_prompts_per_step"]
        * d["grpo"]["num_generations_per_prompt"],
        "train_gbs_seqs": P["train_global_batch_size"],
        "max_prompt_len": _ref(d, d["data"]["max_input_seq_length"]),
        "max_response_or_total_len": mtl,
        "mean_seq_len": "",
        "precision": "fp8" if vprec == "fp8" else "bf16",
        "train_precision": "fp8" if _get(M, "fp8_cfg.enabled", False) else "bf16",
        "policy_mode": (f"async (staleness {_get(d, 'grpo.async_grpo.max_trajectory_age_steps')})"
                        if asy else "sync"),
        # in-flight weight updates need the async vLLM engine too (trajectory_collector.py
        # prepare_for_refit: `is_async_engine and in_flight_weight_updates`)
        "partial_rollout": bool(_get(d, "grpo.async_grpo.in_flight_weight_updates", False)
                                and V.get("async_engine", False)) if asy else "",
        **{c: "" for c in ("step_time_s", "gen_time_s", "old_log_prob_time_s", "ref_time_s",
                           "update_actor_time_s", "weight_sync_time_s")},
        # colocated NeMo RL moves grads + optimizer states to the host before refit and the
        # weights after it (offload_before_refit / offload_after_refit): as rl_runs.csv
        "offload_params": colo, "offload_optimizer": colo,
        "train_recompute": "full" if (D if dt else M).get("activation_checkpointing") else "none",
        "optimizer_cpu_offload": (_get(M, "optimizer.optimizer_offload_fraction", 0.0)
                                  if cpu_off else 0.0),
        "train_grad_reduce_fp32": _get(M, "distributed_data_parallel_config.grad_reduce_in_fp32",
                                       True),
        "train_seq_len": mtl * P["train_micro_batch_size"],
        "rl_framework": "nemo_rl", "logprob_batch_size": P["logprob_batch_size"],
        "sequence_packing": P["sequence_packing"]["enabled"],
        "dynamic_batching": P["dynamic_batching"]["enabled"],
        "use_ref": float(d["loss_fn"].get("reference_policy_kl_penalty") or 0) > 0,
        "enforce_eager": V.get("enforce_eager", False),
        "max_num_seqs": kw.get("max_num_seqs", ""),
        "spec_tokens": (spec or {}).get("num_speculative_tokens", 0) if spec else 0,
        "source": f"NeMo RL {tag} {suite} recipes",
        "url": f"https://github.com/NVIDIA-NeMo/RL/blob/{tag}/{_dir(suite)}{name}.yaml",
        "notes": "; ".join([f"{_dir(suite)}{name}.yaml@{tag} (defaults chain merged)",
                            f"cluster {cl['num_nodes']}x{cl['gpus_per_node']} -> {gpu} "
                            + ("(tests/test_suites/performance*.txt)" if suite == "performance"
                               else f"(listed in tests/test_suites/{suite}.txt; the suite does "
                                    "not name its GPU: the n8g cluster performance.txt calls "
                                    "H100)")] + notes),
    }


# GRPO / DAPO recipes of the nightly and release suites, the same n8g cluster. Left out:
# data-plane variants (-tq_*: the same physics), LoRA, Eagle3 drafts, Megatron generation,
# AutoModel, and models the catalog has no entry for (Nemotron, Gemma, Moonlight, Qwen3.5, GLM,
# gpt-oss, MiniMax, Mistral)
SUITE_SKIP = ("tq_", "lora", "eagle3", "megatron_generation", "automodel", "nemotron", "gemma",
              "moonlight", "nano", "qwen3.5", "glm", "gptoss", "minimax", "mistral", "swe",
              "gym", "super-rl", "yarn", "nvfp4", "cispo",
              # Qwen2.5-Math-1.5B: no catalog entry (its tied head differs from the
              # DeepSeek-R1-Distill-Qwen-1.5B entry)
              "qwen2.5-math-1.5b")


def _dir(suite):
    return PERF if suite == "performance" else "examples/configs/recipes/llm/"


def suite_names(git_dir, tag):
    out = set()
    for suite in ("nightly", "release"):
        text = _show(git_dir, tag, f"tests/test_suites/{suite}.txt")
        for line in text.splitlines():
            m = line.strip()
            if not m.startswith("tests/test_suites/llm/"):
                continue
            name = posixpath.basename(m)[:-3]
            if name.startswith(("grpo-", "dapo-")) and not any(k in name for k in SUITE_SKIP):
                out.add((name, suite))
    names = {}
    for name, suite in sorted(out):
        names.setdefault(name, suite)  # nightly first
    return sorted(names.items())


def main(argv):
    git_dir = argv[1]
    tag = argv[2] if len(argv) > 2 else "v0.7.0"
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "--name-only", tag, PERF],
                           capture_output=True, text=True, check=True).stdout.split()
    rows = []
    for p in sorted(names):
        name = posixpath.basename(p)[:-5]
        d = load(git_dir, tag, p)
        if "nemotron" in name:  # a Mamba hybrid: no catalog entry (docs/rl.md)
            continue
        rows.append(row(d, name, tag))
    for name, suite in suite_names(git_dir, tag):
        d = load(git_dir, tag, f"{_dir(suite)}{name}.yaml")
        rows.append(row(d, name, tag, suite))
    w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)


if __name__ == "__main__":
    main(sys.argv)
