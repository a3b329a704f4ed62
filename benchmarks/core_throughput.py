"""Configurations per second the simulator core evaluates on one core.

Builds a batch of N random dense (and MoE) configurations as numeric arrays, then times
`sim_core.simulate.simulate` on it (best of several repeats, after one warm-up). Prints one
line per case and finally `configs_per_second: N` for the dense case.

    python benchmarks/core_throughput.py [--n 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: numpy must not spread out

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim_core.columns import frame_to_batch  # noqa: E402
from sim_core.simulate import simulate  # noqa: E402


def random_frame(n: int, model: str, gpu: str, rng: np.random.Generator, moe: bool) -> pd.DataFrame:
    pick = lambda vals: rng.choice(np.asarray(vals, dtype=object), n)  # noqa: E731
    df = pd.DataFrame({
        "model": model, "seq_len": 4096, "global_batch": 1024, "gpu": pick([gpu, "a100-80gb"]),
        "num_gpus": pick([256, 512, 1024]), "tp": pick([1, 2, 4, 8]), "pp": pick([1, 2, 4, 8]),
        "cp": pick([1, 2]), "vpp": pick([1, 2]), "micro_batch": pick([1, 2, 4]),
        "recompute": pick(["none", "selective", "full"]),
        "sequence_parallel": pick([False, True]), "zero": pick([0, 1, 2, 3]),
        "precision": pick(["bf16", "fp8"]), "tp_comm_overlap": pick([False, True]),
    })
    if moe:
        df["ep"] = pick([1, 2, 4, 8])
    return df


def bench(batch, repeats: int) -> float:
    simulate(batch)  # warm-up (catalog caches, imports)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(batch)
        best = min(best, time.perf_counter() - t0)
    return len(batch) / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = [("dense", "gpt3-175b", "h100-sxm", False), ("moe", "mixtral-8x7b", "h100-sxm", True)]
    rates = {}
    for label, model, gpu, moe in cases:
        try:
            batch = frame_to_batch(random_frame(args.n, model, gpu, rng, moe))
        except ValueError as exc:  # e.g. a model missing from the catalog
            print(f"{label}: skipped ({exc})")
            continue
        rates[label] = bench(batch, args.repeats)
        print(f"{label}: {rates[label]:,.0f} configurations/s on one core (n={args.n})")
    print(f"configs_per_second: {rates['dense']:.0f}")


if __name__ == "__main__":
    main()
