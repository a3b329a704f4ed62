"""Driver memory and time of an RL search as its space grows.

Builds `task: rl` spaces from the bundled one (search_spaces/rl-grpo-qwen3-32b-64xh100.yaml,
on 256 GPUs) with more and more values on its axes, runs `sweep search` on each in a child
process and prints, per space: its combinations, the configurations priced, the wall time,
the rate and the driver's peak resident memory (the child's own ru_maxrss: with Ray the
workers are other processes, and what must not grow is the driver).

    python benchmarks/rl_search_scale.py [--sizes small,medium,large] [--against REV]

--against REV also runs REV's `sweep` (git archive of sweep/ and sim_core/) on the spaces
up to `--against-max` combinations (an older driver may hold the whole space in memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "search_spaces" / "rl-grpo-qwen3-32b-64xh100.yaml"

# axes per size (combinations in brackets)
SPACES = {
    "small": {"placement": ["colocated", "split"], "asynchrony": ["sync", "one_step_off"],
              "rollout_gpus": [64, 128], "rollout_tp": [2, 4, 8],
              "gpu_memory_utilization": [0.6, 0.8], "train_tp": [4, 8], "train_pp": [1, 2, 4],
              "train_recompute": ["full"]},
    "medium": {"placement": ["colocated", "split"],
               "asynchrony": ["sync", "one_step_off", "async"],
               "rollout_gpus": list(range(32, 256, 16)), "rollout_tp": [1, 2, 4, 8],
               "gpu_memory_utilization": [0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
               "train_tp": [1, 2, 4, 8], "train_pp": [1, 2, 4, 8], "train_cp": [1, 2],
               "train_recompute": ["selective", "full"], "offload_optimizer": [False, True],
               "mini_batches": [1, 2, 4]},
}
SPACES["large"] = {**SPACES["medium"], "rollout_gpus": list(range(16, 256, 8)),
                   "staleness": [1, 2], "mini_batches": [1, 2, 4, 8]}


def space_file(name: str, folder: Path) -> Path:
    d = yaml.safe_load(BASE.read_text())
    d["name"] = f"rl-scale-{name}"
    d["cluster"]["num_gpus"] = 256
    d["space"] = SPACES[name]
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


CHILD = r"""
import json, resource, sys, time
from sweep.cli.main import main
t0 = time.perf_counter()
rc = main(["search", sys.argv[1], "--out", sys.argv[2], "--fresh", "--no-progress"])
wall = time.perf_counter() - t0
print(json.dumps({"rc": rc, "wall_s": wall,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(tree: Path, space: Path, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    # run outside the checkout: `python -c` puts the working folder first on sys.path
    p = subprocess.run([sys.executable, "-c", CHILD, str(space), str(out)], env=env,
                       capture_output=True, text=True, cwd=space.parent)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    lines = p.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    first = next((x for x in lines if "RL configurations" in x), "")
    res["rows"] = int(first.split()[0]) if first else 0
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="small,medium,large")
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--against-max", type=int, default=300_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rl-scale-") as tmp:
        tmp = Path(tmp)
        trees = [("this", ROOT)]
        if args.against:
            rev = tmp / "rev"
            rev.mkdir()
            arc = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "sweep",
                                  "sim_core"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(rev)], input=arc, check=True)
            trees.append((args.against, rev))
        print(f"{'space':8s} {'tree':>8s} {'combinations':>13s} {'rows':>10s} {'wall s':>8s} "
              f"{'rows/s':>9s} {'driver peak MiB':>16s}")
        for name in args.sizes.split(","):
            sp = space_file(name, tmp)
            from sweep.config import load_space  # noqa: PLC0415

            combos = load_space(sp).space_size() if hasattr(load_space(sp), "space_size") \
                else 0
            for label, tree in trees:
                if label != "this" and combos > args.against_max:
                    print(f"{name:8s} {label:>8s} {combos:13,d}   (skipped: over --against-max)")
                    continue
                t0 = time.perf_counter()
                r = run(tree, sp, tmp / f"out-{name}-{label}")
                if "error" in r:
                    print(f"{name:8s} {label:>8s} {combos:13,d}   error: {r['error']}")
                    continue
                wall = r["wall_s"] or (time.perf_counter() - t0)
                print(f"{name:8s} {label:>8s} {combos:13,d} {r['rows']:10,d} {wall:8.1f} "
                      f"{r['rows'] / wall:9,.0f} {r['peak_mib']:16,.0f}", flush=True)


if __name__ == "__main__":
    main()
