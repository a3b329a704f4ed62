"""Configurations per second the simulator core evaluates on one core.

Builds a batch of N random dense (and MoE) configurations as numeric arrays, then times
`sim_core.simulate.simulate` on it (best of several repeats, after one warm-up). Prints one
line per case and finally `configs_per_second: N` for the dense case.

    python benchmarks/core_throughput.py [--n 200000] [--repeats 5]
    python benchmarks/core_throughput.py --against dc2a035 [--rounds 3]

--against REV measures this checkout and revision REV in one run, on the same batch: REV's
tree is exported (git archive) to a temporary folder, and this script times each side in its
own child process (the same seed, the same batch; only `sim_core` differs), alternating
--rounds times, round r under PYTHONHASHSEED=r on both sides. It prints both rates (the best of each side), their ratio and the load average,
twice: as shipped (this checkout's sim_core sets glibc's malloc thresholds on import,
sim_core.arrays.keep_freed_memory; older ones do not), and with the same thresholds given to
both sides through the environment, the code's own ratio.
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

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: numpy must not spread out

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = [("dense", "gpt3-175b", "h100-sxm", False), ("moe", "mixtral-8x7b", "h100-sxm", True)]


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
    from sim_core.simulate import simulate

    simulate(batch)  # warm-up (catalog caches, imports)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(batch)
        best = min(best, time.perf_counter() - t0)
    return len(batch) / best


def measure(n: int, repeats: int) -> dict:
    """{case: configurations/s} on the sim_core this process imports."""
    from sim_core.columns import frame_to_batch

    rng = np.random.default_rng(0)
    rates = {}
    for label, model, gpu, moe in CASES:
        try:
            batch = frame_to_batch(random_frame(n, model, gpu, rng, moe))
        except ValueError as exc:  # e.g. a model missing from the catalog
            print(f"{label}: skipped ({exc})", file=sys.stderr)
            continue
        rates[label] = bench(batch, repeats)
    return rates


# glibc's malloc settings that sim_core.arrays.keep_freed_memory applies in-process since
# issue 37, as environment variables: --against also times both sides with them, so that one
# ratio is the code's alone
SAME_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def _child(tree: Path, n: int, repeats: int, same_allocator: bool = False,
           hash_seed: int = 0) -> dict:
    # the hash seed orders sets and dicts, hence where long-lived objects land in the heap,
    # which once decided whether glibc trimmed it between calls (sim_core/arrays.py): each
    # round runs both sides under the same, different seed, so a layout-dependent mode shows
    # up as rounds that disagree instead of as a lucky or unlucky side
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1",
               PYTHONHASHSEED=str(hash_seed))
    if same_allocator:
        env.update(SAME_ALLOCATOR)
    out = subprocess.run([sys.executable, __file__, "--child", "--n", str(n), "--repeats",
                          str(repeats)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def against(rev: str, n: int, repeats: int, rounds: int) -> None:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    here = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                          capture_output=True, text=True).stdout.strip()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    modes = (("as shipped", False), ("same allocator", True))
    best: dict = {(side, m): {} for side in ("this", "rev") for m, _ in modes}
    with tempfile.TemporaryDirectory(prefix="core-throughput-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "sim_core"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for r in range(rounds):
            for mode, same in modes:
                for side, tree in (("rev", Path(tmp)), ("this", ROOT)):
                    rates = _child(tree, n, repeats, same, hash_seed=r)
                    print(f"round {r + 1} {side:>4} ({mode}): " + ", ".join(
                        f"{k} {v:,.0f}/s" for k, v in rates.items()), flush=True)
                    for k, v in rates.items():
                        best[side, mode][k] = max(best[side, mode].get(k, 0.0), v)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for mode, _ in modes:
        for k, a in best["this", mode].items():
            b = best["rev", mode].get(k, float("nan"))
            print(f"{mode}, {k}: this ({here}) {a:,.0f} configurations/s, {sha} {b:,.0f}, "
                  f"ratio {a / b:.2f}")
    print(f"(n={n}, best of {rounds} rounds x {repeats} repeats, one core each)")
    print(f"configs_per_second: {best['this', 'as shipped']['dense']:.0f}")
    for mode, _ in modes:
        ratio = best["this", mode]["dense"] / best["rev", mode]["dense"]
        print(f"ratio_vs_{sha} ({mode}): {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--against", metavar="REV", help="also time git revision REV, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="alternations with --against")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.against:
        against(args.against, args.n, args.repeats, args.rounds)
        return
    if str(ROOT) not in sys.path and not os.environ.get("PYTHONPATH"):
        sys.path.insert(0, str(ROOT))
    rates = measure(args.n, args.repeats)
    if args.child:
        print(json.dumps(rates))
        return
    for label, rate in rates.items():
        print(f"{label}: {rate:,.0f} configurations/s on one core (n={args.n})")
    print(f"configs_per_second: {rates['dense']:.0f}")


if __name__ == "__main__":
    main()
