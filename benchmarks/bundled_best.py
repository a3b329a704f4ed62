"""The best configuration of every bundled search space (search_spaces/*.yaml), as JSON lines.

Run it on two versions of the code and compare the outputs, to check that a change to the
search engine keeps the bundled spaces' best configurations:

    python benchmarks/bundled_best.py > after.jsonl
    PYTHONPATH=/path/to/old/checkout python benchmarks/bundled_best.py > before.jsonl
    python benchmarks/bundled_best.py --compare before.jsonl after.jsonl

One local Ray for all spaces; each result folder is a temp folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def best_rows(paths: list[Path], workers: int | None) -> None:
    import ray

    from sweep.config import load_space
    from sweep.engine.execution import run_search
    from sweep.engine.space import Space

    ray.init(address="local", num_cpus=workers or None, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    try:
        for p in paths:
            cfg = load_space(p)
            cols = Space.from_config(cfg).axis_names
            with tempfile.TemporaryDirectory() as out:
                o = run_search(cfg, out, fresh=True)
                b = o.best
            row = b.iloc[0] if len(b) else None
            c = o.counts
            rec = {"space": p.name, "objectives": cfg.search.objectives,
                   "strategy": o.strategy, "seconds": round(o.seconds, 2),
                   "counts": {k: c[k] for k in ("total", "simulated", "pruned_memory",
                                                "pruned_time", "invalid", "oom", "ok")
                              if k in c},
                   "best": None if row is None else {
                       **{c: _py(row[c]) for c in ["config_id", *cols] if c in row.index},
                       "step_time_s": float(row["step_time_s"])}}
            print(json.dumps(rec), flush=True)
    finally:
        ray.shutdown()


def _py(v):
    return v.item() if hasattr(v, "item") else v


def compare(before: Path, after: Path) -> int:
    a = {r["space"]: r for r in map(json.loads, before.read_text().splitlines())}
    b = {r["space"]: r for r in map(json.loads, after.read_text().splitlines())}
    bad = 0
    for name in sorted(set(a) | set(b)):
        x, y = (a.get(name) or {}).get("best"), (b.get(name) or {}).get("best")
        same = x is not None and y is not None and \
            {k: v for k, v in x.items() if k != "step_time_s"} == \
            {k: v for k, v in y.items() if k != "step_time_s"} and \
            abs(x["step_time_s"] - y["step_time_s"]) <= 1e-9 * abs(x["step_time_s"])
        bad += not same
        counts = (b.get(name) or {}).get("counts") or {}
        pruned = (f"; after: {counts.get('simulated', 0):,} simulated, "
                  f"{counts.get('pruned_memory', 0):,} + {counts.get('pruned_time', 0):,} "
                  "pruned (memory + time bound)") if counts else ""
        print(f"{'same' if same else 'DIFFERENT':9} {name}: {x} -> {y}" if not same
              else f"same      {name}: config {x['config_id']}, {x['step_time_s']:.4f} s{pruned}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spaces", nargs="*", help="space files (default: search_spaces/*.yaml)")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    paths = [Path(p) for p in args.spaces] or sorted((ROOT / "search_spaces").glob("*.yaml"))
    best_rows(paths, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
