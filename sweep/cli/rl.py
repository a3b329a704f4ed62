"""`sweep simulate` and `sweep search` for `task: rl` files (RL post-training): the phases of
one step, the search over placements and layouts, the recommendation with verl and NeMo RL
recipes and a Perfetto timeline of the step."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from ..advice.rl import describe, step_text, write_recipes, write_trace
from ..engine.rl import OBJECTIVES, evaluate, search
from ..errors import SweepError


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


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
        print(step_text(row))
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
    periodic = cfg.validation is not None or cfg.checkpoint is not None or any(
        a in (cfg.space or {}) for a in ("val_period", "save_period"))
    if periodic:
        print("step and cost include validation and checkpoints (in brackets: the step "
              "without them)")
    for _, row in ranked.head(cfg.search.top).iterrows():
        bare = f" ({row['step_time_without_periodic_s']:.1f} s)" if periodic else ""
        print(f"  {row['step_time_s']:8.1f} s{bare}  {row['samples_per_s_per_gpu']:.4f} "
              f"samples/s/GPU  ${row['cost_per_1000_steps']:,.0f}/1k steps  {describe(row)}")
    front = r["pareto"]
    if len(front) > 1:
        print(f"cost-versus-throughput frontier ({len(front)} configurations, pareto.csv):")
        for _, row in front.head(8).iterrows():
            print(f"  {row['step_time_s']:8.1f} s  ${row['cost_per_1000_steps']:,.0f}/1k steps  "
                  f"{describe(row)}")
    best = ranked.iloc[0]
    paths = write_recipes(best, out / "recipe")
    trace = write_trace(best, out / "recipe" / "step_trace.json")
    print("recommendation:\n" + step_text(best))
    print(f"recipes: {', '.join(str(p) for p in paths)}; timeline: {trace}")
    return 0
