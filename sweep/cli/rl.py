"""`sweep simulate` and `sweep search` for `task: rl` files (RL post-training): the phases of
one step, the search over placements and layouts, the recommendation with verl and NeMo RL
recipes and a Perfetto timeline of the step."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from sim_core.rl import phases

from ..advice.rl import write_recipes, write_trace
from ..engine.rl import OBJECTIVES, evaluate, search
from ..errors import SweepError

PHASES = ("gen_time_s", "prefill_time_s", "decode_time_s", "old_log_prob_time_s", "ref_time_s",
          "update_time_s", "weight_sync_time_s", "offload_time_s", "step_fixed_time_s")


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _describe(row) -> str:
    split = row["placement"] == "split"
    where = (f"split {int(row['rollout_gpus'])} rollout + {int(row['train_gpus'])} train GPUs"
             if split else f"colocated on {int(row['num_gpus'])} GPUs")
    def ep(col):  # expert parallelism, shown where the layout uses it
        v = row.get(col, 1)
        return f" ep{int(v)}" if v == v and v and int(v) > 1 else ""

    return (f"{where}, {row['asynchrony']}; rollout tp{int(row['rollout_tp'])} "
            f"pp{int(row['rollout_pp'])}{ep('rollout_ep')} x {int(row['replicas'])} replicas, "
            f"gpu_memory_utilization {row['gpu_memory_utilization']:.2f}; training "
            f"tp{int(row['train_tp'])} pp{int(row['train_pp'])} cp{int(row['train_cp'])}"
            f"{ep('train_ep')} "
            + (f"ulysses{int(row['train_ulysses'])} "
               if row.get("train_ulysses", 1) == row.get("train_ulysses", 1)
               and row.get("train_ulysses", 1) > 1 else "")
            + f"recompute {row['train_recompute']}")


def _text(row) -> str:
    lines = [f"RL step ({row['algorithm']}, {row['model']}, {int(row['num_gpus'])} x "
             f"{row['gpu']}): {_describe(row)}",
             f"  step time        {row['step_time_s']:10.1f} s   "
             f"(generation share {row['gen_share']:.0%})"]
    for k in PHASES:
        lines.append(f"  {k[:-7].replace('_', ' '):16s} {row[k]:10.1f} s")
    lines += [f"  samples/s/GPU    {row['samples_per_s_per_gpu']:10.4f}",
              f"  tokens/s/GPU     {row['tokens_per_s_per_gpu']:10.1f}",
              f"  cost / 1000 steps ${row['cost_per_1000_steps']:,.0f}",
              f"  KV cache {row['kv_cache_gib']:.1f} GiB/GPU, concurrency "
              f"{int(row['concurrency'])} per replica; rollout peak "
              f"{row['rollout_peak_gib']:.1f} GiB, training peak {row['train_peak_gib']:.1f} GiB",
              f"  fits: {bool(row['fits'])}" + (f" ({row['oom_reason']})"
                                                if row["oom_reason"] else "")]
    if row.get("rl_framework") == "nemo_rl" and phases.phase_scales() is None:
        k = phases.default_scales_values()
        lines.append(f"  (NeMo RL's log-prob passes and update include the shipped fitted scales "
                     f"x{k['log-probs']:.2f} / x{k['update']:.2f}: docs/rl.md)")
    return "\n".join(lines)


def _activate_profile(args) -> None:
    """`--profile` on an RL file: activate it in this process (the RL search runs here) and
    say what it changes (its RL phase scales; its other components reach the training
    passes too)."""
    name = getattr(args, "profile", None)
    if not name:
        return
    from sim_core import profiles

    man = profiles.activate(name)
    lines = profiles.rl_phases_summary(man)
    print(f"calibration profile {man['name']} version {man.get('version')} active"
          + (": " + "\n".join(lines) if lines else " (no rl_phases component: the RL phases "
             "stay white-box)"), file=sys.stderr if getattr(args, "json", False) else sys.stdout)


def simulate_rl_run(cfg, args) -> int:
    _activate_profile(args)
    res = evaluate(cfg)
    row = res.iloc[0]
    if not row["valid"]:
        raise SweepError(f"{cfg.name or 'run'}: configuration is invalid: "
                         f"{row['invalid_reason']}")
    if getattr(args, "trace", None):
        p = write_trace(row, args.trace)
        print(f"wrote {p} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.json:
        print(json.dumps({k: _plain(v) for k, v in row.to_dict().items()}, indent=2))
    else:
        print(_text(row))
    return 0


def search_rl(cfg, args) -> int:
    out = Path(args.out) if getattr(args, "out", None) else Path("results") / (cfg.name or "rl")
    if getattr(args, "top", None):
        cfg.search.top = args.top
    _activate_profile(args)
    progress = not getattr(args, "no_progress", False) and sys.stderr.isatty()
    r = search(cfg, out, workers=getattr(args, "workers", None),
               address=getattr(args, "address", None), progress=progress,
               fresh=getattr(args, "fresh", False))
    c, ranked = r["counts"], r["ranking"]
    print(f"{c['rows']} RL configurations: {c['fit']} fit, {c['invalid']} invalid, {c['oom']} "
          f"out of memory; results in {out}/")
    if ranked.empty:
        reasons = sorted(r["reasons"].items(), key=lambda kv: -kv[1])
        raise SweepError("no configuration fits" + (f" (most: {reasons[0][0]})"
                                                    if reasons else ""))
    col = OBJECTIVES[cfg.search.objective][0]
    print(f"top {min(cfg.search.top, len(ranked))} by {col}:")
    for _, row in ranked.head(cfg.search.top).iterrows():
        print(f"  {row['step_time_s']:8.1f} s  {row['samples_per_s_per_gpu']:.4f} samples/s/GPU"
              f"  ${row['cost_per_1000_steps']:,.0f}/1k steps  {_describe(row)}")
    front = r["pareto"]
    if len(front) > 1:
        print(f"cost-versus-throughput frontier ({len(front)} configurations, pareto.csv):")
        for _, row in front.head(8).iterrows():
            print(f"  {row['step_time_s']:8.1f} s  ${row['cost_per_1000_steps']:,.0f}/1k steps  "
                  f"{_describe(row)}")
    best = ranked.iloc[0]
    paths = write_recipes(best, out / "recipe")
    trace = write_trace(best, out / "recipe" / "step_trace.json")
    print("recommendation:\n" + _text(best))
    print(f"recipes: {', '.join(str(p) for p in paths)}; timeline: {trace}")
    return 0
