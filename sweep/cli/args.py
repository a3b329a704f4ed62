"""Argument types and flags that several commands share."""

from __future__ import annotations

import argparse

from ..advice.recommend import Constraints, parse_headroom, parse_tokens
from sim_core.risk import DEFAULT_MAX_RISK


def constraint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--headroom", help="memory to leave free: GiB (8, 8GiB) or a fraction of HBM "
                   "(0.1, 10%%)")
    p.add_argument("--max-oom-risk", type=float, default=DEFAULT_MAX_RISK,
                   help="without --headroom: advise no configuration whose probability of "
                   f"running out of memory is above this (default {DEFAULT_MAX_RISK:g})")
    p.add_argument("--max-gpus", type=int, help="at most this many GPUs")
    p.add_argument("--tokens", help="token budget to train on (300B, 1.2T, 3e11)")
    p.add_argument("--budget", type=float, help="max total cost in USD for --tokens")
    p.add_argument("--deadline", type=float, help="max days to train on --tokens")
    p.add_argument("--gpu", action="append", default=[], help="only this GPU type (repeatable)")
    p.add_argument("--num-gpus", action="append", type=int, default=[],
                   help="only this cluster size (repeatable)")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD",
                   help="override a GPU's or an instance type's price per GPU-hour "
                        "(h100-sxm=2.2, aws-p5=4.1; repeatable)")
    p.add_argument("--no-failures", action="store_true",
                   help="days and cost as if no job were ever interrupted (default: divided by "
                        "the goodput, which counts failures, checkpoints and restarts)")


def constraints_from(args) -> Constraints:
    if args.headroom is not None:
        parse_headroom(args.headroom)
    return Constraints(headroom=args.headroom, max_oom_risk=args.max_oom_risk,
                       max_gpus=args.max_gpus, budget=args.budget,
                       deadline=args.deadline,
                       tokens=parse_tokens(args.tokens) if args.tokens else None,
                       gpus=list(args.gpu), num_gpus=list(args.num_gpus),
                       failures=not getattr(args, "no_failures", False))


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


PROFILE_HELP = ("calibration profile (name under $SWEEP_PROFILES or a folder) from "
                "`sweep calibrate`: learned kernel, overlap and NCCL models of your cluster")

