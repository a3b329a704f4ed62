"""End-to-end `sweep search` on a small bundled space, evaluated in the driver (the default for
a grid that `grid.runs_in_driver` keeps there without --address) and on a local Ray
(SWEEP_RAY=1), alternating, each a fresh process (CLI start-up, recommendation and recipes
included). Prints each run's wall time and peak RSS, the medians, the ratio measured in this
run, and the load average before and after (wall times follow the machine's load).

    python benchmarks/quick_path.py [--space search_spaces/gpt3-175b-1024xa100.yaml] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(space: Path, out: Path, ray: bool) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB of the sweep process) of one `sweep search`."""
    env = {**os.environ, "SWEEP_RAY": "1" if ray else "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sweep", "search", str(space), "--out",
                        str(out), "--fresh", "--no-progress"], env=env, capture_output=True,
                       text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"sweep search failed: {r.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--space", default=str(ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    times: dict[str, list[float]] = {"driver": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for mode in ("driver", "ray"):
                wall, rss = run(Path(args.space), Path(tmp) / mode, mode == "ray")
                times[mode].append(wall)
                print(f"run {i + 1} {mode:6s}: {wall:6.2f} s (children's peak RSS so far "
                      f"{rss:.0f} MiB)", flush=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"median: in the driver {med['driver']:.2f} s, on a local Ray {med['ray']:.2f} s, "
          f"ratio {med['ray'] / med['driver']:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(f"driver_seconds: {med['driver']:.2f}")


if __name__ == "__main__":
    main()
