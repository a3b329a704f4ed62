"""`sweep check SPACE.yaml`: validate a space and count the candidates its rules keep."""

from __future__ import annotations

import argparse

from ..config import load_space
from ..engine.space import Space, count, require_valid
from .search import SPACE_HELP as EPILOG  # noqa: F401 (sweep check --help)

NAME = "check"
HELP = "validate a search space and count its valid configurations"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search-space file (YAML)")


def run(args) -> int:
    cfg = load_space(args.space)
    if getattr(cfg, "task", None) == "rl":  # RL post-training (sweep/engine/rl.py)
        from ..engine.rl import census

        c = census(cfg)
        print(f"RL space {cfg.name}: " + ", ".join(f"{k} ({len(v)})" for k, v in
                                                   cfg.axes().items()))
        print(f"{c['rows']} configurations: {c['rows'] - c['invalid']} valid, {c['fit']} fit")
        return 0
    space = Space.from_config(cfg)
    print(f"space {space.name}: " + ", ".join(f"{n} ({len(v)})" for n, v in space.axes),
          flush=True)
    c = count(space)  # computed: axes no rule reads factored out, a sample past a size
    print("\n".join(c.lines()))
    require_valid(c.census, space.name)
    return 0

