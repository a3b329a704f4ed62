"""`sweep recommend RUN_DIR`: the best configuration under constraints and its recipes
(sweep/advice/recommend.py, sweep/advice/export.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..advice import export
from ..advice.recommend import (OBJECTIVES, _default_objective, _jsonable, fit_chunks, load_fits,
                                read_full, recommend_chunks, render, reprice, parse_prices,
                                write_recipe, write_traces)
from ..engine.evaluate import profile_line
from .args import constraint_args, constraints_from

NAME = "recommend"
HELP = ("best configuration under constraints, robust runner-ups, and Megatron-LM / torchtitan / "
        "run-YAML recipes")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="results folder of `sweep search` (results/<space-name>/)")
    p.add_argument("--objective", choices=list(OBJECTIVES),
                   help="what to optimize (default: the search's first objective, else step_time)")
    constraint_args(p)
    p.add_argument("--within", type=float, default=5.0,
                   help="runner-ups: percent of the best objective value (default 5)")
    p.add_argument("--runner-ups", type=int, default=3, help="how many runner-ups (default 3)")
    p.add_argument("--format", choices=["table", "megatron", "torchtitan", "deepspeed",
                                        "nanotron", "llmfoundry", "yaml", "json"],
                   default="table", help="what to print (default: the table)")
    p.add_argument("--out", help="where to write the recipe files (default RUN/recipe/)")
    p.add_argument("--no-write", action="store_true", help="write no recipe files")
    p.add_argument("--trace", metavar="DIR",
                   help="write one simulated step of the best configuration (DIR/best.json) "
                        "and of the rule of thumb (DIR/rule_of_thumb.json) as Chrome/Perfetto "
                        "traces, to compare side by side")


def run_rl(args) -> int:
    """The same command on an RL search's folder (sweep/advice/rl_report.py): the best stored
    configuration under --max-gpus / --num-gpus / --gpu, its phases, runner-ups and its verl and
    NeMo RL recipes."""
    from ..advice import rl_report
    from ..advice.rl import describe, step_text, write_recipes, write_trace
    from ..errors import SweepError

    for flag, v in (("--headroom", args.headroom), ("--tokens", args.tokens),
                    ("--budget", args.budget), ("--deadline", args.deadline),
                    ("--price", args.price), ("--trace", args.trace)):
        if v:
            raise SweepError(f"{flag}: not for RL results (they take --objective, --max-gpus, "
                             "--num-gpus, --gpu, --within, --runner-ups, --format table|json)")
    if args.format not in ("table", "json"):
        raise SweepError(f"--format {args.format}: RL results print a table or json; their "
                         "recipes are recipe/verl.sh and recipe/nemo_rl.yaml")
    table = rl_report.choose(rl_report.load(args.run)["ranking"], args.objective,
                             args.max_gpus, args.num_gpus, args.gpu)
    if table.empty:
        print("no stored configuration meets the constraints (the folder keeps the search's "
              "best 1,000: search a space narrowed to them)")
        return 1
    best = table.iloc[0]
    if not args.no_write:
        folder = Path(args.out) if args.out else Path(args.run) / "recipe"
        write_recipes(best, folder)
        write_trace(best, folder / "step_trace.json")
    if args.format == "json":
        print(json.dumps(_jsonable(best), indent=1, default=str))
        return 0
    print(step_text(best))
    col = rl_report.RL_OBJECTIVES.get(args.objective or "step_time")[0]
    near = table.iloc[1:][(table[col].iloc[1:] - best[col]).abs()
                          <= abs(best[col]) * args.within / 100.0].head(args.runner_ups)
    if len(near):
        print(f"runner-ups within {args.within:g}% of the best {col}:")
        for _, r in near.iterrows():
            print(f"  {r['step_time_s']:8.1f} s  ${r['cost_per_1000_steps']:,.0f}/1k steps  "
                  f"{describe(r)}")
    return 0


def run(args) -> int:
    from ..advice.rl_report import is_rl_results

    if is_rl_results(args.run):
        return run_rl(args)
    prices = parse_prices(args.price)
    c = constraints_from(args)
    chunks, meta = fit_chunks(args.run)
    objective = args.objective or _default_objective(meta)
    rec = recommend_chunks(chunks, objective, c, args.within / 100.0, args.runner_ups,
                           run_name=str(meta.get("space", "")), prices=prices)
    rec = read_full(args.run, rec, c.tokens, prices)
    rec.profile = profile_line(meta) or ""
    if not args.no_write and rec.found:
        write_recipe(rec, args.out or Path(args.run) / "recipe")
    if args.trace and rec.found:  # the rule of thumb is looked up among all the rows that fit
        df = reprice(load_fits(args.run)[0], prices)
        for path in write_traces(df, rec, args.trace):
            print(f"wrote {path}", file=sys.stderr)
    if args.format == "table":
        print(render(rec))
    elif not rec.found:
        print(render(rec))
        return 1
    elif args.format == "json":
        print(json.dumps(_jsonable(rec.best), indent=1, default=str))
    else:
        print(export.export(rec.best, args.format), end="")
    return 0 if rec.found else 1

