"""`sweep search SPACE.yaml`: run the space's strategy, then print the recommendation."""

from __future__ import annotations

import argparse
import sys

from ..advice.recommend import recommend_after_search
from ..config import load_space
from ..engine.evaluate import ProfiledSimulate, profile_line
from ..engine.execution import run_search
from .args import PROFILE_HELP, positive_int

NAME = "search"
HELP = "sweep a search space on Ray (grid or Optuna)"


SPACE_HELP = EPILOG = """\
search-space file: a run file (model, seq_len, global_batch or global_batch_tokens,
precision, cluster, parallel) plus
  name: my-space                      results go to results/<name>/ (or --out)
  space:                              fields that vary; the product is searched
    tp: [1, 2, 4, 8]                  a list of values (a scalar is a one-value list)
    pp: {pow2: [1, 32]}               powers of two from 1 to 32
    micro_batch: {range: [1, 8], step: 1}   1..8 inclusive (step defaults to 1)
    vpp: {values: [1, 2, 3]}          the same as a list
    recompute: [none, selective, full]
    gpu: [a100-80gb, h100-sxm]        cluster fields too: num_gpus or nodes, gpus_per_node
  search: {strategy: grid}            or {strategy: optuna, trials: 2000, sampler: tpe|nsga2,
                                          objectives: [step_time, cost], seed: 0}
                                      or {strategy: auto}: grid if it takes ~10 s, else optuna
  optuna: each trial is a layout (gpu, num_gpus, seq_len, batch, framework, tp, pp, cp, ep,
  vpp) picked by the sampler; the other fields are all simulated inside the trial (up to
  inner_max: 1024 rows; inner: [..] sets them). patience: N stops after N trials that did not
  improve the best by more than improvement (default 0.001 = 0.1%).
Varying fields: model, seq_len, global_batch(_tokens), precision, gpu, num_gpus, nodes,
gpus_per_node, nics_per_node, nic_bw_gbs, power_limit_w, tp, pp, cp, ep, etp, vpp,
micro_batch, recompute, sequence_parallel, zero (3 = FSDP), and the overlap switches. dp is derived as
num_gpus / (tp*pp*cp); the global batch is kept fixed, so a configuration whose global batch
does not divide into dp*micro_batch is invalid (the reason is recorded).
Statuses: ok (fits), oom (does not fit; kept with its memory figure), invalid (breaks a
divisibility rule; reason in invalid_reason). Objectives: step_time, cost (USD per million
tokens, or per step with cost_unit: step; price from the GPU catalog or
cluster.price_per_hour), mfu, throughput.
Re-running the same command resumes: finished batches are skipped.
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search-space file (YAML)")
    p.add_argument("--out", help="results folder (default results/<space-name>/)")
    p.add_argument("--workers", type=positive_int,
                   help="parallel Ray tasks (default: all CPUs of the Ray cluster)")
    p.add_argument("--address",
                   help="Ray cluster to run on ('auto' or host:port); default: a local Ray")
    p.add_argument("--strategy", choices=["grid", "optuna", "auto"], help="override search.strategy")
    p.add_argument("--trials", type=positive_int, help="override search.trials (optuna)")
    p.add_argument("--top", type=positive_int, help="rows in ranking.csv (search.top)")
    p.add_argument("--fresh", action="store_true",
                   help="discard earlier results in the folder instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--profile", help=PROFILE_HELP)


def run(args) -> int:
    cfg = load_space(args.space)
    if getattr(cfg, "task", None) == "rl":  # RL post-training (sweep/cli/rl.py)
        from .rl import search_rl

        return search_rl(cfg, args)
    if args.strategy:
        cfg.search.strategy = args.strategy
    if args.trials:
        cfg.search.trials = args.trials
    if args.top:
        cfg.search.top = args.top
    progress = not args.no_progress and sys.stderr.isatty()
    simulate = None
    if args.profile:
        simulate = ProfiledSimulate(args.profile)
        print(profile_line({"profile": simulate.info}))
        note = profile_instance_note(args.profile, cfg)
        if note:
            print(note, flush=True)
    outcome = run_search(cfg, args.out, workers=args.workers, address=args.address,
                         progress=progress, fresh=args.fresh, simulate=simulate)
    print(outcome.summary())
    print(recommend_after_search(outcome.out_dir))
    return 0


def profile_instance_note(profile: str, cfg) -> str:
    """A profile whose NCCL scales were fitted on an instance type's logs
    (`sweep calibrate nccl --cluster aws-p5`) holds them relative to that type's network; say
    so when the space runs on other types (the scales apply to every row)."""
    from sim_core import catalog, profiles

    fitted = str(profiles.load_manifest(profile).get("components", {}).get("nccl", {})
                 .get("cluster") or "")
    if fitted not in catalog.instance_names():
        return ""
    used = set((getattr(cfg, "space", None) or {}).get("instance") or
               ([cfg.cluster.instance] if cfg.cluster.instance else []))
    others = sorted(used - {fitted})
    if not others:
        return ""
    return (f"note: profile {profile!r} has NCCL scales fitted on {fitted}; they are applied to "
            f"{', '.join(others)} too (fit one profile per instance type for those)")
