"""`sweep simulate RUN.yaml`: one configuration's step time, breakdown, memory and cost."""

from __future__ import annotations

import argparse
import json
import sys

from ..advice.simulation import _simulate_text, cfg_name, report_of, simulate_rows
from ..config import load_run
from .args import PROFILE_HELP

NAME = "simulate"
HELP = "simulate one configuration (run file)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run file (YAML): model, seq_len, global_batch, cluster, parallel")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--profile", help=PROFILE_HELP)
    p.add_argument("--trace", metavar="STEP.json",
                   help="also write one simulated step as a Chrome/Perfetto trace (open it in "
                        "ui.perfetto.dev): a track per pipeline stage and stream")


def run(args) -> int:
    cfg = load_run(args.run)
    if getattr(cfg, "task", None) == "rl":  # RL post-training (sweep/cli/rl.py)
        from .rl import simulate_rl_run

        return simulate_rl_run(cfg, args)
    if args.profile:
        from sim_core import profiles

        profiles.activate(args.profile)
    row_df, space = simulate_rows(cfg)
    rep = report_of(row_df, space)
    if args.trace:
        from ..advice.trace import write_trace_for_row

        path = write_trace_for_row(row_df.iloc[0], args.trace, cfg_name(cfg))
        print(f"wrote {path} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(_simulate_text(rep))
    return 0

