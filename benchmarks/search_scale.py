"""End-to-end `sweep search` on a space of more than 3M candidates (issue 16).

Builds a 12-axis Llama 3.1 405B space (4 GPU types x 6 cluster sizes x tp, pp, cp, vpp,
micro-batch, recompute, sequence parallelism, ZeRO, precision, TP-comm overlap), runs the grid
search on a local Ray in a child process (so that its peak RSS is the driver's alone) and
prints configurations/s, the driver's peak RSS and the bytes per result row on disk.

    python benchmarks/search_scale.py [--scale 1] [--workers N] [--out DIR] [--keep] [--no-prune]
    python benchmarks/search_scale.py --scaling   # 1 vs 2 workers, projection for N

--scale 10: 16 cluster sizes and 20 micro-batch sizes, a 29.5M-candidate space.
--no-prune: search.prune false (every valid configuration simulated and stored).
--single: one objective (step_time) instead of step_time and cost, so that the time bound
prunes too (it applies to single-objective searches).
--space FILE: a space file instead (e.g. search_spaces/llama3.1-405b-billion.yaml, 1.06e9
candidates); --progress shows the search's progress bar on stderr while it runs.
--against REV [--rounds N]: this checkout and revision REV (its `sim_core` and `sweep`
exported with git archive) run the same space alternating, each `sweep search` a fresh child
process with PYTHONPATH switched (this script drives both); prints each time, the best of each
side and their ratio (and of the children's CPU time), measured in one run.
The load average is printed before and after: other work on the machine slows the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUS = ["h100-sxm", "h200", "a100-80gb", "b200"]
PRUNE = True  # search.prune of the space (--no-prune)
SIZES = [512, 1024, 2048, 4096, 8192, 16384]


def space_doc(scale: int = 1, prune: bool = True, single: bool = False) -> dict:
    micro = [1, 2, 3, 4, 6, 8]
    sizes = list(SIZES)
    if scale > 1:  # ~9x (29.5M candidates): 16 cluster sizes and 20 micro-batch sizes
        sizes = [256 * k for k in range(2, 2 + 16)]
        micro = list(range(1, 17)) + [20, 24, 28, 32]
    return {
        "name": "llama3.1-405b-scale",
        "model": "llama3.1-405b",
        "seq_len": 8192,
        "global_batch_tokens": 16777216,
        "precision": "bf16",
        "cluster": {"gpu": "h100-sxm", "num_gpus": 1024, "gpus_per_node": 8},
        "space": {
            "gpu": GPUS,
            "num_gpus": sizes,
            "tp": [1, 2, 4, 8],
            "pp": [1, 2, 4, 8, 16],
            "cp": [1, 2, 4],
            "vpp": [1, 2, 3, 4],
            "micro_batch": micro,
            "recompute": ["none", "selective", "full"],
            "sequence_parallel": [False, True],
            "zero": [0, 1, 2, 3],
            "precision": ["bf16", "fp8"],
            "tp_comm_overlap": [False, True],
        },
        "search": {"strategy": "grid", "prune": prune,
                   "objectives": ["step_time"] if single else ["step_time", "cost"]},
    }


def child(doc: dict, out: str, workers: int | None, progress: bool = False) -> None:
    """The driver: `sweep search` as the command line runs it (search, summary, recommendation);
    prints a JSON line with the seconds and the peak RSS of this process."""
    import yaml

    from sweep.cli import main

    space_file = Path(out).parent / (Path(out).name + ".yaml")
    space_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = ["search", str(space_file), "--out", out, "--fresh"] + ([] if progress else
                                                                  ["--no-progress"])
    if workers:
        argv += ["--workers", str(workers)]
    t0 = time.perf_counter()
    rc = main(argv)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print("RESULT " + json.dumps({"rc": rc, "seconds": secs, "driver_peak_rss": rss}), flush=True)


def inspect(out: Path) -> dict:
    """Counts and best row of the finished run, read back from the results folder."""
    from sweep.config import parse_space
    from sweep.advice.recommend import load_run
    from sweep.results import counts

    show = ["config_id", "gpu", "num_gpus", "tp", "pp", "cp", "vpp", "micro_batch", "recompute",
            "sequence_parallel", "zero", "precision", "tp_comm_overlap", "step_time_s", "rank"]
    df, meta = load_run(out, columns=show + ["status"], filters={"status": "ok"})
    c = meta.get("counts") or counts(df)
    ranked = df[df["rank"].notna()].sort_values("rank") if "rank" in df else df.iloc[:0]
    best = ranked.iloc[0][["gpu", "num_gpus", "tp", "pp", "cp", "vpp", "micro_batch", "recompute",
                           "sequence_parallel", "zero", "precision", "tp_comm_overlap",
                           "step_time_s"]].astype(str).to_dict() if len(ranked) else {}
    return {"counts": c, "best": best}


def disk_bytes(out: Path) -> dict:
    """Bytes of the results dataset (results.parquet, file or folder) and of the whole folder."""
    res = out / "results.parquet"
    files = [res] if res.is_file() else [p for p in res.rglob("*") if p.is_file()]
    total = [p for p in out.rglob("*") if p.is_file()]
    # hard links (parts shared by parts/ and results.parquet/) are counted once
    seen, folder = set(), 0
    for p in total:
        st = p.stat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            folder += st.st_size
    return {"results": sum(p.stat().st_size for p in files), "folder": folder}


def _rows(out: Path) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(str(out / "results.parquet"), format="parquet").count_rows()


def _run_child(doc_scale: int, out: Path, workers: int | None, gpus: int | None = None,
               sizes: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--scale", str(doc_scale), "--child", str(out)]
    cmd += [] if PRUNE else ["--no-prune"]
    if workers:
        cmd += ["--workers", str(workers)]
    if gpus:
        cmd += ["--gpus", str(gpus)]
    if sizes:
        cmd += ["--sizes", str(sizes)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(1)
    return json.loads(line[len("RESULT "):])


def scaling(out: Path) -> int:
    """1 worker, then 2, on a quarter of the space (one GPU type): the scaling efficiency. The
    per-candidate worker cost comes from two 1-worker runs of different sizes (the difference
    cancels the fixed cost: Ray start, driver, finalisation, recommendation), and gives the
    time projected for N workers."""
    from sweep.config import parse_space
    from sweep.engine.space import Space

    def size_of(gpus, sizes=None):
        doc = space_doc(1)
        doc["space"]["gpu"] = GPUS[:gpus]
        if sizes:
            doc["space"]["num_gpus"] = SIZES[:sizes]
        return Space.from_config(parse_space(doc)).size

    size, small = size_of(1), size_of(1, 1)
    t = {w: _run_child(1, out / f"w{w}", w, gpus=1)["seconds"] for w in (1, 2)}
    t_small = _run_child(1, out / "small", 1, gpus=1, sizes=1)["seconds"]
    load = os.getloadavg()[0]
    for w in (1, 2):
        print(f"{w} worker{'s' if w > 1 else ''}: {size:,} candidates in {t[w]:.1f} s "
              f"({size / t[w]:,.0f}/s)")
    print(f"1 worker: {small:,} candidates in {t_small:.1f} s")
    print(f"scaling efficiency 1 -> 2 workers: {t[1] / (2 * t[2]):.0%} "
          f"(load average {load:.1f} on {os.cpu_count()} CPUs: other work shares them)")
    per = (t[1] - t_small) / (size - small)
    fixed = t_small - small * per
    if per <= 0:
        print("no per-candidate cost measurable (timings too noisy); no projection")
        return 0
    print(f"per candidate: {per * 1e6:.1f} us of worker time; fixed: {fixed:.1f} s; "
          f"per task of {grid_task(size):,}: {per * grid_task(size):.2f} s")
    for n in (16, 64, 256):
        print(f"projected, {n} workers: " + ", ".join(
            f"{cand:,} candidates {fixed + cand * per / n:.1f} s"
            for cand in (3_317_760, 29_491_200, 10**8)))
    return 0


def against(rev: str, args, doc_args: list) -> int:
    """Time `sweep search` of the same space at this checkout and at REV, alternating."""
    root = Path(__file__).resolve().parents[1]
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    here = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                          capture_output=True, text=True).stdout.strip()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)", flush=True)
    times: dict = {"this": [], "rev": []}
    rss: dict = {"this": [], "rev": []}
    cpu: dict = {"this": [], "rev": []}
    with tempfile.TemporaryDirectory(prefix="search-scale-") as tmp:
        tree = Path(tmp) / "rev"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(root), "archive", sha, "sim_core", "sweep"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for r in range(args.rounds):
            for side, path in (("rev", tree), ("this", root)):
                out = Path(tmp) / f"{side}-{r}"
                env = dict(os.environ, PYTHONPATH=str(path))
                cmd = [sys.executable, __file__, *doc_args, "--child", str(out)]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")),
                            None)
                if proc.returncode != 0 or line is None:
                    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                    return 1
                res = json.loads(line[len("RESULT "):])
                times[side].append(res["seconds"])
                rss[side].append(res["driver_peak_rss"] / 2**30)
                # CPU of the child process (start-up included; a local Ray's workers are not
                # its waited-for children: compare CPU only where both sides run in the driver)
                cpu[side].append(after.ru_utime - before.ru_utime
                                 + after.ru_stime - before.ru_stime)
                print(f"round {r + 1} {side:>4}: {res['seconds']:.1f} s, cpu {cpu[side][-1]:.1f}"
                      f" s, driver peak {rss[side][-1]:.2f} GiB (load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)
                shutil.rmtree(out, ignore_errors=True)
    a, b = min(times["this"]), min(times["rev"])
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"this ({here}): best {a:.1f} s, driver peak {max(rss['this']):.2f} GiB; "
          f"{sha}: best {b:.1f} s, driver peak {max(rss['rev']):.2f} GiB")
    print(f"time_ratio_vs_{sha}: {a / b:.2f}")
    c, d = min(cpu["this"]), min(cpu["rev"])
    print(f"cpu_ratio_vs_{sha}: {c / d:.2f} (best {c:.1f} s against {d:.1f} s)")
    return 0


def grid_task(size: int) -> int:
    from sweep.engine.grid import grid_batch_size

    return grid_batch_size(size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=1, help="1: 3.3M candidates; 10: 29.5M")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default=None, help="results folder (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the results folder")
    ap.add_argument("--scaling", action="store_true",
                    help="1 vs 2 workers on a quarter of the space; project N workers")
    ap.add_argument("--no-prune", action="store_true", help="search.prune: false")
    ap.add_argument("--single", action="store_true", help="one objective: step_time")
    ap.add_argument("--space", help="a space file instead of the generated 405B space")
    ap.add_argument("--progress", action="store_true", help="show the progress bar (stderr)")
    ap.add_argument("--against", metavar="REV", help="also time revision REV, alternating")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --against")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global PRUNE
    PRUNE = not args.no_prune
    if args.space:
        import yaml

        doc = yaml.safe_load(Path(args.space).read_text())
        doc.setdefault("search", {}).setdefault("prune", PRUNE)
        if args.single:
            doc["search"]["objectives"] = ["step_time"]
    else:
        doc = space_doc(args.scale, PRUNE, args.single)
    if args.gpus:
        doc["space"]["gpu"] = GPUS[: args.gpus]
    if args.sizes:
        doc["space"]["num_gpus"] = doc["space"]["num_gpus"][: args.sizes]
    if args.scaling:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="search_scale-"))
        try:
            return scaling(out)
        finally:
            if not args.keep and not args.out:
                shutil.rmtree(out, ignore_errors=True)
    if args.child:
        child(doc, args.child, args.workers, args.progress)
        return 0
    if args.against:
        doc_args = ["--scale", str(args.scale)] + (["--space", args.space] if args.space else [])
        doc_args += ([] if PRUNE else ["--no-prune"]) + (["--single"] if args.single else [])
        doc_args += ["--workers", str(args.workers)] if args.workers else []
        return against(args.against, args, doc_args)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="search_scale-"))
    cmd = [sys.executable, __file__, "--scale", str(args.scale), "--child", str(out)]
    cmd += (["--space", args.space] if args.space else []) + (
        ["--progress"] if args.progress else [])
    cmd += ([] if PRUNE else ["--no-prune"]) + (["--single"] if args.single else [])
    load_before = os.getloadavg()
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                          stderr=None if args.progress else subprocess.PIPE)
    wall = time.perf_counter() - t0
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-4000:] + (proc.stderr or "")[-4000:])
        return 1
    r = json.loads(line[len("RESULT "):])
    from sweep.config import parse_space
    from sweep.engine.space import Space

    r["candidates"] = Space.from_config(parse_space(doc)).size
    r.update(inspect(out))
    sizes = disk_bytes(out)
    rows = r["rows"] = _rows(out)
    load_after = os.getloadavg()
    c = r["counts"]
    what = args.space or f"scale {args.scale}"
    print(f"space: {r['candidates']:,} candidates, {len(doc['space'])} axes ({what}), "
          f"pruning {'on' if PRUNE else 'off'}, objectives {doc['search']['objectives']}")
    print("counts: " + ", ".join(f"{k} {v:,}" for k, v in c.items()))
    print(f"simulated: {c['simulated']:,}; pruned by bound: {c.get('pruned', 0):,} (memory "
          f"{c.get('pruned_memory', 0):,}, time {c.get('pruned_time', 0):,}); invalid "
          f"{c['invalid']:,}; out of memory {c['oom']:,}; no-op repeats {c.get('duplicate', 0):,}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
          f"{' '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs)")
    print(f"best: {r['best']}")
    print(f"sweep search exit {r['rc']}")
    print(f"search seconds (in driver): {r['seconds']:.1f}; process wall: {wall:.1f}")
    print(f"configurations_per_second: {r['candidates'] / r['seconds']:,.0f}")
    print(f"driver_peak_rss_gib: {r['driver_peak_rss'] / 2**30:.2f}")
    print(f"results_bytes: {sizes['results']:,} (folder {sizes['folder']:,})")
    print(f"results_rows: {rows:,}")
    print(f"bytes_per_row: {sizes['results'] / max(rows, 1):.1f} "
          f"(per candidate: {sizes['results'] / r['candidates']:.1f})")
    if not args.keep and not args.out:
        shutil.rmtree(out, ignore_errors=True)
        (out.parent / (out.name + ".yaml")).unlink(missing_ok=True)  # the child's space file
    return 0


if __name__ == "__main__":
    sys.exit(main())
