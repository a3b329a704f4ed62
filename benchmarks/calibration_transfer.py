"""Does a run calibration carry to a larger model? The user's flow of issue 35, end to end.

Calibrate on the runs of the smaller model(s) of a run table (`sweep calibrate runs --rows`),
then search a grid space of the larger model as a user of that cluster would (`sweep search
--profile`, no pruning) and compare each (model, GPU count) group's predictions with the runs
measured there: Spearman of tokens/s within the group, whether the top of the ranking and the
recommended pick (OOM risk <= 10%) ran, the pick's regret, tokens/s and peak-memory error, and
false prunes (ran, predicted OOM). The same for the default model (no profile).

    python benchmarks/calibration_transfer.py \
        --table ../shared/calibration/nanotron-1b-3b/runs.csv --fit "params_b < 2" \
        --target "nanotron 3B"

Prints one table (default model against calibrated) and the per-group figures with --groups.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

KEY = ["num_gpus", "tp", "pp", "micro_batch", "zero"]


def space_for(runs: pd.DataFrame, name: str) -> dict:
    """The grid a user of that cluster would search: the model's shape, the table's batch and
    sequence, the layouts the sweep ran."""
    r = runs.iloc[0]
    model = {"layers": int(r["layers"]), "hidden": int(r["hidden"]), "heads": int(r["heads"]),
             "kv_heads": int(r["kv_heads"]), "ffn": int(r["ffn"]), "vocab": int(r["vocab"]),
             "activation": "swiglu", "tied_embeddings": True}
    return {
        "name": name, "model": model, "seq_len": int(r["seq_len"]),
        "global_batch": int(r["gbs_seqs"]), "precision": "bf16", "framework": "nanotron",
        "cluster": {"gpu": "h100-sxm", "num_gpus": 8, "gpus_per_node": 8},
        "parallel": {"cp": 1, "ep": 1, "vpp": 1, "recompute": "none"},
        "space": {"num_gpus": sorted(int(x) for x in runs["num_gpus"].unique()),
                  "tp": sorted(int(x) for x in runs["tp"].unique()),
                  "pp": sorted(int(x) for x in runs["pp"].unique()),
                  "micro_batch": sorted(int(x) for x in runs["mbs"].unique()),
                  "zero": [0, 1], "sequence_parallel": [False, True]},
        "search": {"strategy": "grid", "prune": False},
    }


def run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")


def measured(runs: pd.DataFrame) -> pd.DataFrame:
    m = pd.DataFrame({"num_gpus": runs["num_gpus"].astype(int), "tp": runs["tp"].astype(int),
                      "pp": runs["pp"].astype(int), "micro_batch": runs["mbs"].astype(int),
                      "zero": runs["zero_fsdp"].str.contains("1").astype(int),
                      "measured_status": runs["status"], "tps": pd.to_numeric(
                          runs["tokens_per_s_per_gpu"], errors="coerce"),
                      "mem": pd.to_numeric(runs["peak_mem_gib"], errors="coerce")})
    return m.groupby(KEY, as_index=False).agg(measured_status=("measured_status", lambda s: "ok" if (
        s == "ok").any() else "failed"), tps=("tps", "median"), mem=("mem", "median"))


def evaluate(pred: pd.DataFrame, meas: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    # sequence parallel is how nanotron runs TP (reduce-scatter mode): on wherever tp > 1
    pred = pred[(pred["sequence_parallel"].astype(bool)) == (pred["tp"] > 1)]
    j = meas.merge(pred, on=KEY, how="inner")
    rows = []
    for n, g in j.groupby("num_gpus"):
        ok = g[g["measured_status"] == "ok"]
        rho = ok["tokens_per_s_per_gpu"].rank().corr(ok["tps"].rank()) if len(ok) >= 3 else np.nan
        fits = g[g["fits"].astype(bool)].sort_values("step_time_s")
        top = fits.iloc[0] if len(fits) else None
        safe = g[g["oom_risk"].fillna(1) <= 0.10]
        col = "step_time_hi_s" if "step_time_hi_s" in safe else "step_time_s"
        rec = safe.sort_values(col).iloc[0] if len(safe) else None
        best = ok["tps"].max()
        rows.append({
            "num_gpus": n, "measured": len(g), "ran": len(ok), "spearman": rho,
            "top_fails": top is not None and top["measured_status"] != "ok",
            "pick_fails": rec is None or rec["measured_status"] != "ok",
            "regret": (best / rec["tps"] - 1) if rec is not None and rec["measured_status"] == "ok"
            else np.nan,
            "tps_err": float(np.median(np.abs(ok["tokens_per_s_per_gpu"] / ok["tps"] - 1))),
            "mem_err": float(np.nanmedian(np.abs(ok["peak_reserved_gib"] / ok["mem"] - 1))),
            "false_prunes": float((~ok["fits"].astype(bool)).mean()) if len(ok) else np.nan})
    per = pd.DataFrame(rows)
    ok = j[j["measured_status"] == "ok"]
    return {"spearman (median of groups)": per["spearman"].median(),
            "top pick fails": f"{int(per['top_fails'].sum())} of {len(per)}",
            "recommend pick fails": f"{int(per['pick_fails'].sum())} of {len(per)}",
            "recommend median regret": per["regret"].median(),
            "median tokens/s error": float(np.median(np.abs(ok["tokens_per_s_per_gpu"]
                                                            / ok["tps"] - 1))),
            "median peak memory error": float(np.nanmedian(np.abs(
                ok["peak_reserved_gib"] / ok["mem"] - 1))),
            "false prunes": float((~ok["fits"].astype(bool)).mean())}, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--fit", required=True, help="pandas expression: the runs to calibrate on")
    ap.add_argument("--target", required=True, help="the model label to search and compare")
    ap.add_argument("--groups", action="store_true", help="print the per-group figures")
    args = ap.parse_args()
    runs = pd.read_csv(args.table)
    target = runs[runs["model"] == args.target]
    if target.empty:
        sys.exit(f"--target: no run of {args.target!r}")
    meas = measured(target)
    sweep = [sys.executable, "-m", "sweep"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # a unique folder name: a profile is found by its folder's name too
        prof = tmp / f"transfer-{os.getpid()}"
        run(sweep + ["calibrate", "runs", args.table, "--rows", args.fit, "--failed-as", "oom",
                     "--profile", str(prof)])
        space = tmp / "space.yaml"
        space.write_text(yaml.safe_dump(space_for(target, "transfer")))
        out = {}
        for label, extra in (("default model", []), ("calibrated", ["--profile", str(prof)])):
            d = tmp / label.replace(" ", "_")
            run(sweep + ["search", str(space), "--out", str(d), "--fresh"] + extra)
            pred = pd.read_parquet(d / "results.parquet")
            out[label] = evaluate(pred, meas)
    summary = pd.DataFrame({k: v[0] for k, v in out.items()})
    print(f"calibrated on {args.fit!r}, searched {args.target} ({len(meas)} measured "
          f"configurations in {meas['num_gpus'].nunique()} GPU counts)")
    print("| on " + args.target + " | default model | calibrated |")
    print("|---|---|---|")
    for k, row in summary.iterrows():
        cells = [f"{v:.3f}" if k.startswith("spearman") else
                 (f"{v:.1%}" if isinstance(v, float) else str(v)) for v in row]
        print(f"| {k} | " + " | ".join(cells) + " |")
    if args.groups:
        for label, (_, per) in out.items():
            print(f"\n{label}:")
            print(per.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
