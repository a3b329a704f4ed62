"""`sweep` command line: the one place that wires commands to the engine.

Each command is a module of this package with NAME, HELP, `add_args(parser)` to declare its
arguments and `run(args) -> int` to do the work; COMMANDS lists them. Known errors
(bad input, impossible space, unwritable results dir) are caught here and printed as
`error: <one line>` on stderr with exit code 2; Ctrl-C exits 130 and keeps finished batches.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from ..errors import Interrupted, SweepError
from . import calibrate, catalog, check, recommend, report, search, simulate, validate

# one module per command, in the order `sweep --help` lists them; each has NAME, HELP,
# add_args(parser), run(args) -> int and optionally EPILOG
COMMANDS = [simulate, search, check, recommend, report, validate, calibrate, catalog]


# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep", description="Search LLM training parallelism settings with a simulator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.NAME, help=cmd.HELP, description=cmd.HELP,
                           epilog=getattr(cmd, "EPILOG", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.add_args(p)
        p.set_defaults(_run=cmd.run)
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
