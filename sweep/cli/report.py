"""`sweep report RUN_DIR`: the HTML + Markdown report (sweep/advice/report.py)."""

from __future__ import annotations

import argparse

from ..advice.recommend import OBJECTIVES, parse_prices
from ..advice.report import screenshot, write_report
from .args import constraint_args, constraints_from

NAME = "report"
HELP = ("HTML + Markdown report: cost-vs-throughput frontier, breakdowns, TP x PP heatmap, "
        "memory, why the best beats the rule of thumb")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="results folder of `sweep search`")
    p.add_argument("--out", help="folder for report.html / report.md (default: the run folder)")
    p.add_argument("--objective", choices=list(OBJECTIVES),
                   help="objective of the recommendation and the top list (default step_time)")
    constraint_args(p)
    p.add_argument("--top", type=int, default=8, help="configurations in the breakdown (8)")
    p.add_argument("--screenshot", metavar="PNG",
                   help="also render the HTML with headless Chromium into this PNG")


def run(args) -> int:
    from ..advice import rl_report

    if rl_report.is_rl_results(args.run):  # an RL search's folder (sweep/engine/rl.py)
        r = rl_report.write_report(args.run, args.out, top=args.top)
        print(f"wrote {r['html']} and {r['md']} ({len(r['front'])} frontier points, "
              f"{r['counts'].get('fit', 0):,} configurations that fit)")
        print(r["text"].splitlines()[0])
        if args.screenshot:
            print(f"wrote {screenshot(r['html'], args.screenshot)}")
        return 0
    r = write_report(args.run, args.out, objective=args.objective,
                     constraints=constraints_from(args), prices=parse_prices(args.price),
                     top=args.top)
    print(f"wrote {r['html']} and {r['md']} ({len(r['front'])} frontier points, "
          f"{len(r['fits']):,} configurations that fit)")
    for s in r["why"][:1]:
        print(s)
    if args.screenshot:
        print(f"wrote {screenshot(r['html'], args.screenshot)}")
    return 0

