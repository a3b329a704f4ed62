"""Grid against Optuna samplers on the bundled 3.3M and 1.3e10 spaces: time, memory, quality.

Each run is a fresh `python` process (so its peak RSS is the driver's alone) that calls
`sweep.engine.execution.run_search` as `sweep search` does (Optuna budgets up to
`optuna_search.IN_PROCESS_ROWS` rows evaluated in the driver, larger ones and the grid on a
local Ray) and reports: wall time end to end (start-up included), the driver's peak RSS
(with in-driver evaluation, the simulation's memory too), the driver's CPU seconds (its
threads included), the load average, configurations evaluated, the best step time found, the
number of trials until the best came within 1% of the grid's best, the final gap, and for the
objectives [step_time, cost] the hypervolume of the front as a fraction of the grid front's.

    python benchmarks/search_strategies.py                       # everything below
    python benchmarks/search_strategies.py --space wide --samplers tpe,random --seeds 0-4
    python benchmarks/search_strategies.py --space huge --samplers tpe --trials 5000

The grid of the 3.3M space is run once (its results give the reference best and front; it is
kept in --work/grid and reused). Prints one row per run and a Markdown table per space.
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

ROOT = Path(__file__).resolve().parents[1]
SPACES = {"wide": ROOT / "search_spaces" / "llama3.1-405b-wide.yaml",
          "huge": ROOT / "search_spaces" / "llama3.1-405b-huge.yaml"}


# ---------------------------------------------------------------------------------------------
# one run, in its own process
# ---------------------------------------------------------------------------------------------
def one_run(spec: dict) -> dict:
    import resource

    import numpy as np

    from sweep.config import load_space
    from sweep.engine.execution import run_search
    from sweep.results import read_results

    t0 = time.perf_counter()
    cfg = load_space(spec["space"])
    s = cfg.search
    s.strategy = spec["strategy"]
    s.objectives = spec["objectives"]
    if spec.get("sampler"):
        s.sampler = spec["sampler"]
    if spec.get("trials"):
        s.trials = spec["trials"]
    s.seed = spec.get("seed", 0)
    for key, value in (spec.get("extra") or {}).items():
        setattr(s, key, value)
    outcome = run_search(cfg, spec["out"], fresh=True, workers=spec.get("workers"))
    wall = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # Ray's processes, reaped at shutdown
    rss = me.ru_maxrss / 1024  # KiB -> MiB
    load = os.getloadavg()[0]
    cols = ["status", "step_time_s", "cost_usd"] + (["trial"] if s.strategy != "grid" else [])
    df = read_results(spec["out"], columns=cols)[0]
    ok = df[df["status"] == "ok"]
    out = {"wall_s": wall, "rss_mib": rss, "rows": int(len(df)),
           "driver_cpu_s": me.ru_utime + me.ru_stime,
           "total_cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
           "load": load,
           "best_step_s": float(ok["step_time_s"].min()) if len(ok) else float("nan"),
           "note": getattr(outcome, "note", "")}
    if "trial" in ok.columns and len(ok):
        per = ok.groupby("trial")["step_time_s"].min().sort_index()
        out["trace"] = [[int(t), float(v)] for t, v in zip(per.index, np.minimum.accumulate(
            per.to_numpy()))]
        out["trials"] = int(df["trial"].max()) + 1 if "trial" in df.columns else 0
    if len(spec["objectives"]) > 1 and len(ok):
        out["front"] = front(ok[["step_time_s", "cost_usd"]].to_numpy()).tolist()
    return out


def front(points):
    """The non-dominated points (both minimized), sorted by the first."""
    import numpy as np

    pts = np.asarray(points, dtype=float)
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    keep, best = [], np.inf
    for p in pts:
        if p[1] < best:
            keep.append(p)
            best = p[1]
    return np.array(keep)


def hypervolume(points, ref) -> float:
    """Area dominated by a 2-D front (both minimized) up to the reference point."""
    hv, last = 0.0, ref[1]
    for x, y in front(points):
        if x >= ref[0] or y >= last:
            continue
        hv += (ref[0] - x) * (last - y)
        last = y
    return hv


def launch(spec: dict, timeout: float) -> dict:
    """Run one spec in a fresh interpreter; {'error': ...} when it fails or times out."""
    try:
        p = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)],
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {p.returncode}: {tail}"}
    return json.loads(lines[-1][7:])


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------
def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def fmt_runs(rows: list[dict]) -> str:
    head = ("| space | strategy | objectives | seeds | wall s (max) | CPU s driver / all "
            "| driver MiB (max) | rows | trials to 1% (median) | final gap | within 0.1% "
            "| HV of grid |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append("| " + " | ".join(str(r[k]) for k in (
            "space", "strategy", "objectives", "seeds", "wall", "cpu", "rss", "rows", "to1",
            "gap", "hits", "hv")) + " |")
    return "\n".join(lines)


def summarize(space, label, objectives, runs, ref_best, ref_front, hv_ref):
    import numpy as np

    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"space": space, "strategy": label, "objectives": objectives, "seeds": len(runs),
                "wall": runs[0]["error"], "cpu": "", "rss": "", "rows": "", "to1": "", "gap": "",
                "hits": "", "hv": ""}
    walls = [r["wall_s"] for r in ok]
    rss = [r["rss_mib"] for r in ok]
    gaps, to1, hits, hvs = [], [], 0, []
    for r in ok:
        if ref_best:
            gap = r["best_step_s"] / ref_best - 1
            gaps.append(gap)
            hits += gap <= 1e-3
            reach = [t for t, v in r.get("trace", []) if v <= ref_best * 1.01]
            if reach:
                to1.append(reach[0] + 1)
        if ref_front is not None and "front" in r:
            hvs.append(hypervolume(r["front"], hv_ref) / hypervolume(ref_front, hv_ref))
    return {
        "space": space, "strategy": label, "objectives": objectives, "seeds": len(ok),
        "wall": f"{np.median(walls):.1f} ({max(walls):.1f})",
        "cpu": (f"{np.median([r['driver_cpu_s'] for r in ok]):.1f} / "
                f"{np.median([r['total_cpu_s'] for r in ok]):.1f}") if "total_cpu_s" in ok[0]
        else "-",
        "rss": f"{np.median(rss):.0f} ({max(rss):.0f})",
        "rows": f"{int(np.median([r['rows'] for r in ok])):,}",
        "to1": (f"{int(np.median(to1))}" if to1 else "-") + (f" ({len(to1)}/{len(ok)})"
                                                           if ref_best and "trace" in ok[0]
                                                           else ""),
        "gap": f"{100 * max(gaps):.2f}% max" if gaps else "-",
        "hits": f"{hits}/{len(ok)}" if gaps else "-",
        "hv": (f"{100 * min(hvs):.1f}% min" if hvs else "-"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--space", default="wide,huge")
    ap.add_argument("--samplers", default="tpe,random",
                    help="for several objectives `default` is nsga2")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--trials", type=int, help="default: 2000 (wide), 5000 (huge)")
    ap.add_argument("--objectives", default="single,both",
                    help="single = [step_time], both = [step_time, cost]")
    ap.add_argument("--no-grid", action="store_true", help="reuse the grid in --work only")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "sweep-bench"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--extra", default="{}", help="JSON of more search.* settings")
    ap.add_argument("--json", help="also write all runs to this file")
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_run(json.loads(args.one))), flush=True)
        return
    import numpy as np

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    objective_sets = {"single": ["step_time"], "both": ["step_time", "cost"]}
    table, everything = [], {}
    for space in args.space.split(","):
        path = str(SPACES[space])
        ref_best = ref_front = hv_ref = None
        if space == "wide":
            grid_file = work / "grid.json"
            if not args.no_grid or not grid_file.exists():
                g = launch({"space": path, "strategy": "grid", "objectives":
                            ["step_time", "cost"], "out": str(work / "grid")}, args.timeout)
                grid_file.write_text(json.dumps(g))
                print(f"grid {space}: {g}", flush=True)
            g = json.loads(grid_file.read_text())
            if "error" not in g:
                ref_best, ref_front = g["best_step_s"], np.array(g["front"])
                hv_ref = ref_front.max(axis=0) * 1.1
                table.append(summarize(space, "grid", "both", [g], ref_best, ref_front, hv_ref))
                table[-1]["to1"], table[-1]["seeds"] = "-", "-"
        trials = args.trials or (2000 if space == "wide" else 5000)
        for which in args.objectives.split(","):
            objectives = objective_sets[which]
            for sampler in args.samplers.split(","):
                runs = []
                for seed in seeds_arg(args.seeds):
                    spec = {"space": path, "strategy": "optuna", "sampler": sampler,
                            "objectives": objectives, "trials": trials, "seed": seed,
                            "out": str(work / f"{space}-{sampler}-{which}-{seed}"),
                            "extra": json.loads(args.extra)}
                    r = launch(spec, args.timeout)
                    short = {k: v for k, v in r.items() if k not in ("trace", "front")}
                    print(f"{space} {sampler} {which} seed {seed}: {short}", flush=True)
                    runs.append(r)
                everything[f"{space}-{sampler}-{which}"] = runs
                table.append(summarize(space, f"optuna {sampler}, {trials} trials", which,
                                       runs, ref_best, ref_front, hv_ref))
    print()
    print(fmt_runs(table))
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "runs": everything}))


if __name__ == "__main__":
    main()
