"""`sweep` command line: a thin layer over config/space/execution/results.

Each subcommand is two functions, registered with `register(name, help, add_args, run)`:
`add_args(parser)` declares its arguments and `run(args) -> int` does the work. Known errors
(bad input, impossible space, unwritable results dir) are caught here and printed as
`error: <one line>` on stderr with exit code 2; Ctrl-C exits 130 and keeps finished batches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback

from .errors import Interrupted, SweepError

SUBCOMMANDS: list[tuple[str, str, callable, callable, str | None]] = []


def register(name: str, help: str, add_args, run, epilog: str | None = None) -> None:
    """Add a subcommand (later ones: validate, report, recommend)."""
    SUBCOMMANDS.append((name, help, add_args, run, epilog))


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


# ---------------------------------------------------------------------------------------------
# sweep simulate RUN.yaml [--json]
# ---------------------------------------------------------------------------------------------
PROFILE_HELP = ("calibration profile (name under $SWEEP_PROFILES or a folder) from "
                "`sweep calibrate`: learned kernel, overlap and NCCL models of your cluster")


def _simulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run file (YAML): model, seq_len, global_batch, cluster, parallel")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--profile", help=PROFILE_HELP)
    p.add_argument("--trace", metavar="STEP.json",
                   help="also write one simulated step as a Chrome/Perfetto trace (open it in "
                        "ui.perfetto.dev): a track per pipeline stage and stream")


def plain_value(v):
    """A JSON-safe Python scalar: numpy scalars unwrapped, NaN/inf as None."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def simulate_rows(cfg, simulate=None):
    """One run configuration -> (its simulated row as a one-row DataFrame with costs, the
    Space it came from); a one-line SweepError when the configuration is invalid."""
    from .execution import evaluate
    from .results import add_costs, gpu_prices
    from .space import Space

    space = Space.from_config(cfg)
    row_df = evaluate(space.frame(0, 1), simulate)
    row_df = add_costs(row_df, gpu_prices(row_df["gpu"], space.price_per_hour))
    if row_df["status"].iloc[0] == "invalid":
        raise SweepError(f"{cfg_name(cfg)}: configuration is invalid: "
                         f"{row_df['invalid_reason'].iloc[0]}")
    return row_df, space


def simulate_run(cfg, simulate=None) -> dict:
    """One configuration -> the JSON-able report of `sweep simulate`."""
    row_df, space = simulate_rows(cfg, simulate)
    return report_of(row_df, space)


def report_of(row_df, space) -> dict:
    """The JSON-able report of `sweep simulate` for a one-row simulated frame."""
    row = {k: plain_value(v) for k, v in row_df.iloc[0].to_dict().items()}
    from sim_core.frameworks import profile_fields

    config_keys = [c for c in row_df.columns
                   if (c in space.fixed or c in profile_fields()) and c != "config_id"]
    out = {k: row.get(k) for k in (
        "status", "step_time_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_gib",
        "peak_reserved_gib", "peak_allocated_gib", "oom_risk", "fits", "dp", "num_microbatches",
        "cost_per_step_usd", "cost_per_mtok_usd", "gpu_hours_per_step", "price_per_hour")}
    out["fits"] = bool(out["fits"])
    out["breakdown"] = {k[5:]: row[k] for k in row_df.columns if k.startswith("time_")}
    out["memory"] = {k[4:]: row[k] for k in row_df.columns if k.startswith("mem_")}
    out["config"] = {k: row[k] for k in config_keys}
    return out


def cfg_name(cfg) -> str:
    return cfg.model if isinstance(cfg.model, str) else "inline model"


def _simulate_text(rep: dict) -> str:
    c = rep["config"]
    lines = [f"{c.get('model')} on {c.get('num_gpus')} x {c.get('gpu')} ({c.get('framework')}): "
             f"tp {c.get('tp')} pp {c.get('pp')} dp {_fmt(rep['dp'])} cp {c.get('cp')} "
             f"ep {c.get('ep')} vpp {c.get('vpp')} mb {c.get('micro_batch')} "
             f"recompute {c.get('recompute')} zero {c.get('zero')}",
             ""]
    rows = [("step time", f"{rep['step_time_s']:.3f} s"),
            ("tokens/s per GPU", f"{rep['tokens_per_s_per_gpu']:,.0f}"),
            ("MFU", f"{rep['mfu']:.1%}"),
            ("HFU", f"{rep['hfu']:.1%}" if rep.get("hfu") is not None else "-"),
            ("microbatches", _fmt(rep["num_microbatches"])),
            ("peak memory", f"{rep['peak_memory_gib']:.1f} GiB"
             + ("" if rep["fits"] else "  DOES NOT FIT (oom)")),
            ("OOM risk", f"{rep['oom_risk']:.0%}" if rep.get("oom_risk") is not None else "-"),
            ("cost", f"${rep['cost_per_step_usd']:.3f}/step, ${rep['cost_per_mtok_usd']:.3f}/Mtok"
             if rep.get("cost_per_step_usd") is not None else "-")]
    w = max(len(k) for k, _ in rows)
    lines += [f"{k:<{w}}  {v}" for k, v in rows]
    for title, d, unit in (("time breakdown", rep["breakdown"], "s"),
                           ("memory", rep["memory"], "GiB")):
        if not d:
            continue
        lines += ["", f"{title} ({unit}):"]
        kw = max(len(k) for k in d)
        for k, v in d.items():
            lines.append(f"  {k:<{kw}}  {'-' if v is None else format(v, '.4f' if unit == 's' else '.2f')}")
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def cmd_simulate(args) -> int:
    from .config import load_run

    cfg = load_run(args.run)
    if args.profile:
        from sim_core import profiles

        profiles.activate(args.profile)
    row_df, space = simulate_rows(cfg)
    rep = report_of(row_df, space)
    if args.trace:
        from .trace import write_trace_for_row

        path = write_trace_for_row(row_df.iloc[0], args.trace, cfg_name(cfg))
        print(f"wrote {path} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(_simulate_text(rep))
    return 0


# ---------------------------------------------------------------------------------------------
# sweep search SPACE.yaml
# ---------------------------------------------------------------------------------------------
SPACE_HELP = """\
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
gpus_per_node, nics_per_node, nic_bw_gbs, tp, pp, cp, ep, etp, vpp, micro_batch, recompute,
sequence_parallel, zero (3 = FSDP), and the overlap switches. dp is derived as
num_gpus / (tp*pp*cp); the global batch is kept fixed, so a configuration whose global batch
does not divide into dp*micro_batch is invalid (the reason is recorded).
Statuses: ok (fits), oom (does not fit; kept with its memory figure), invalid (breaks a
divisibility rule; reason in invalid_reason). Objectives: step_time, cost (USD per million
tokens, or per step with cost_unit: step; price from the GPU catalog or
cluster.price_per_hour), mfu, throughput.
Re-running the same command resumes: finished batches are skipped.
"""


def _search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search-space file (YAML)")
    p.add_argument("--out", help="results folder (default results/<space-name>/)")
    p.add_argument("--workers", type=_positive_int,
                   help="parallel Ray tasks (default: all CPUs of the Ray cluster)")
    p.add_argument("--address",
                   help="Ray cluster to run on ('auto' or host:port); default: a local Ray")
    p.add_argument("--strategy", choices=["grid", "optuna", "auto"], help="override search.strategy")
    p.add_argument("--trials", type=_positive_int, help="override search.trials (optuna)")
    p.add_argument("--top", type=_positive_int, help="rows in ranking.csv (search.top)")
    p.add_argument("--fresh", action="store_true",
                   help="discard earlier results in the folder instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--profile", help=PROFILE_HELP)


def cmd_search(args) -> int:
    from .config import load_space
    from .execution import run_search

    cfg = load_space(args.space)
    if args.strategy:
        cfg.search.strategy = args.strategy
    if args.trials:
        cfg.search.trials = args.trials
    if args.top:
        cfg.search.top = args.top
    progress = not args.no_progress and sys.stderr.isatty()
    simulate = None
    if args.profile:
        from .execution import ProfiledSimulate

        simulate = ProfiledSimulate(args.profile)
    outcome = run_search(cfg, args.out, workers=args.workers, address=args.address,
                         progress=progress, fresh=args.fresh, simulate=simulate)
    print(outcome.summary())
    from .recommend import recommend_after_search
    print(recommend_after_search(outcome.out_dir))
    return 0


# ---------------------------------------------------------------------------------------------
# sweep check SPACE.yaml
# ---------------------------------------------------------------------------------------------
def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search-space file (YAML)")


def cmd_check(args) -> int:
    from .config import load_space
    from .space import Space, count, require_valid

    cfg = load_space(args.space)
    space = Space.from_config(cfg)
    print(f"space {space.name}: " + ", ".join(f"{n} ({len(v)})" for n, v in space.axes),
          flush=True)
    c = count(space)  # computed: axes no rule reads factored out, a sample past a size
    print("\n".join(c.lines()))
    require_valid(c.census, space.name)
    return 0


register("simulate", "simulate one configuration (run file)", _simulate_args, cmd_simulate)
register("search", "sweep a search space on Ray (grid or Optuna)", _search_args, cmd_search,
         SPACE_HELP)
register("check", "validate a search space and count its valid configurations",
         _check_args, cmd_check, SPACE_HELP)




def _load_plugins() -> None:
    """Subcommands that live in their own modules register themselves on import."""
    from . import accuracy  # noqa: F401  (sweep validate)
    from . import calibrate  # noqa: F401
    from . import recommend, report  # noqa: F401


# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(
        prog="sweep", description="Search LLM training parallelism settings with a simulator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help, add_args, run, epilog in SUBCOMMANDS:
        p = sub.add_parser(name, help=help, description=help, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_args(p)
        p.set_defaults(_run=run)
    return parser


def _error(msg: str) -> None:
    line = " ".join(str(msg).strip().split("\n")[0].split()) or "unknown error"
    print(f"error: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args._run(args)
    except Interrupted as exc:
        _error(str(exc))
        return 130
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except (SweepError, ValueError) as exc:  # ValueError: sim_core.catalog.CatalogError
        if os.environ.get("SWEEP_DEBUG"):
            traceback.print_exc()
        _error(str(exc))
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        _error(f"{where}{exc.strerror or exc}")
        return 2
    except Exception as exc:  # noqa: BLE001 - never a traceback at the CLI boundary
        if os.environ.get("SWEEP_DEBUG"):
            traceback.print_exc()
        _error(f"internal error: {type(exc).__name__}: {exc} (SWEEP_DEBUG=1 shows the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
