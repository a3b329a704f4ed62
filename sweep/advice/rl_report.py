"""`sweep report` / `sweep recommend` on the results folder of an RL search.

An RL folder (`results.parquet/_sweep.json` strategy `rl-grid`, written by
sweep/engine/rl.py) holds `ranking.csv` (the best that fit), `pareto.csv` (the
cost-versus-throughput frontier) and the counters; the pre-training report's columns (MFU,
peak memory, TP x PP heatmaps) do not exist there. This module reads those files (nothing
is re-simulated) and writes what an RL user looks at: the recommendation with its phases,
the frontier of step time against cost per 1,000 steps (cluster sizes coloured), where each
of the best configurations spends its step, and the top table, as report.html (self-contained,
plots inlined) and report.md with report_plots/*.png.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..engine.rl import OBJECTIVES
from ..errors import SweepError
from ..results.store import DATASET_META, RESULTS_NAME
from .report import _plt, _png, html_table, md_table, save_report, stacked_bars
from .rl import describe, step_text

# phase column, label, colour: the serial parts of a step (an asynchronous step overlaps the
# generation with the training side: its bar is longer than its step, marked)
PHASE_PARTS = [("gen_time_s", "generation", "#4c78a8"),
               ("old_log_prob_time_s", "old log-probs", "#f58518"),
               ("ref_time_s", "reference", "#ffbf79"),
               ("values_time_s", "critic values", "#e45756"),
               ("update_time_s", "update", "#54a24b"),
               ("weight_sync_time_s", "weight sync", "#b279a2"),
               ("offload_time_s", "offload / reload", "#9d755d"),
               ("step_fixed_time_s", "fixed work", "#bab0ac")]


def is_rl_results(run_dir: str | Path) -> bool:
    """Whether the folder holds the results of an RL search (sweep/engine/rl.py)."""
    meta = Path(run_dir) / RESULTS_NAME / DATASET_META
    try:
        return json.loads(meta.read_text()).get("strategy") == "rl-grid"
    except (OSError, ValueError):
        return False


def load(run_dir: str | Path) -> dict:
    run = Path(run_dir)
    try:
        meta = json.loads((run / RESULTS_NAME / DATASET_META).read_text())
        ranking = pd.read_csv(run / "ranking.csv")
    except (OSError, ValueError) as exc:
        raise SweepError(f"{run}: not a finished RL search ({exc}); run `sweep search` on the "
                         "space again to finish it") from None
    front = pd.read_csv(run / "pareto.csv") if (run / "pareto.csv").exists() else ranking.head(0)
    if ranking.empty:
        raise SweepError(f"{run}: no configuration of the RL search fits")
    return {"run": run, "meta": meta, "ranking": ranking, "front": front}


# `sweep recommend --objective` on RL results: the ranking's column and direction (throughput
# is tokens per second per GPU, as for pre-training)
RL_OBJECTIVES = {"step_time": OBJECTIVES["step_time"], "cost": OBJECTIVES["cost"],
                 "throughput": OBJECTIVES["tokens_per_gpu"]}


def choose(ranking: pd.DataFrame, objective: str | None = None, max_gpus: int | None = None,
           num_gpus=(), gpus=()) -> pd.DataFrame:
    """The stored best rows that meet the constraints, best first by `objective` (the
    search's order where None). The ranking holds the search's best max(top, 1,000): a
    constraint that excludes all of them finds nothing here (search the narrower space)."""
    t = ranking
    if max_gpus:
        t = t[t["num_gpus"] <= max_gpus]
    if num_gpus:
        t = t[t["num_gpus"].isin(list(num_gpus))]
    if gpus:
        t = t[t["gpu"].astype(str).str.lower().isin([g.lower() for g in gpus])]
    if objective and objective != "step_time":
        if objective not in RL_OBJECTIVES:
            raise SweepError(f"--objective {objective}: RL results rank by "
                             f"{', '.join(RL_OBJECTIVES)}")
        col, asc = RL_OBJECTIVES[objective]
        t = t.sort_values([col, "step_time_s", "config_id"], ascending=[asc, True, True],
                          kind="stable")
    return t.reset_index(drop=True)


def plot_frontier(ranking: pd.DataFrame, front: pd.DataFrame) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    # the stored best rows and the frontier (whose cheap end may rank beyond them)
    ranking = pd.concat([d for d in (ranking, front) if len(d)], ignore_index=True) \
        .drop_duplicates("config_id")
    sizes = sorted(ranking["num_gpus"].unique())
    cmap = plt.get_cmap("viridis", max(len(sizes), 2))
    for i, n in enumerate(sizes):
        sub = ranking[ranking["num_gpus"] == n]
        ax.scatter(sub["step_time_s"], sub["cost_per_1000_steps"] / 1e3, s=10, alpha=0.5,
                   color=cmap(i), label=f"{int(n)} GPUs")
    if len(front):
        ax.plot(front["step_time_s"], front["cost_per_1000_steps"] / 1e3, "-o", color="black",
                ms=4, lw=1, label="frontier")
        for j, (_, r) in enumerate(front.iterrows()):
            ax.annotate(str(j + 1), (r["step_time_s"], r["cost_per_1000_steps"] / 1e3),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("cost per 1,000 steps (k$)")
    ax.legend(fontsize=8, frameon=False)
    return _png(fig)


def plot_phases(rows: pd.DataFrame, labels: list[str]) -> bytes:
    fig, ax, y, left = stacked_bars(rows, PHASE_PARTS)
    for yi, step in zip(y, rows["step_time_s"].to_numpy(float)):
        ax.plot([step, step], [yi - 0.4, yi + 0.4], color="black", lw=1.5)
        ax.text(max(step, 0), yi, f" {step:.0f} s", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("seconds (bars: the phases one after another; black tick: the step, shorter "
                  "where the generation overlaps the training)")
    ax.set_xlim(0, float(np.nanmax(np.maximum(left, rows["step_time_s"].to_numpy(float)))) * 1.15)
    ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return _png(fig)


def _rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    heads = ["#", "step (s)", "samples/s/GPU", "cost / 1k steps", "GPUs", "configuration"]
    rows = [[str(i + 1), f"{r['step_time_s']:.1f}", f"{r['samples_per_s_per_gpu']:.4f}",
             f"${r['cost_per_1000_steps']:,.0f}", str(int(r["num_gpus"])), describe(r)]
            for i, (_, r) in enumerate(table.iterrows())]
    return heads, rows


def build(run_dir: str | Path, top: int = 8) -> dict:
    d = load(run_dir)
    ranking, front = d["ranking"], d["front"]
    best = ranking.iloc[0]
    shown = ranking.head(top)
    c = d["meta"].get("counts", {})
    return {**d, "best": best, "text": step_text(best), "counts": c,
            "top": _rows(shown), "frontier": _rows(front),
            "png": {"frontier": plot_frontier(ranking, front),
                    "phases": plot_phases(shown, [f"#{i + 1}" for i in range(len(shown))])}}


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{html.escape(alt)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode()}">')


def _headline(r: dict) -> str:
    c, b = r["counts"], r["best"]
    return (f"{b['model']} {b['algorithm']} on {b['gpu']}: {c.get('rows', 0):,} configurations "
            f"({c.get('fit', 0):,} fit, {c.get('oom', 0):,} out of memory, "
            f"{c.get('invalid', 0):,} invalid); objective {r['meta'].get('objective')}")


def render_md(r: dict, plot_dir: str | None) -> str:
    out = [f"# sweep report (RL): {r['run']}", "", _headline(r), "", "## Recommendation", "",
           "```", r["text"], "```", "", "## Cost vs throughput: frontier", ""]
    if plot_dir:
        out += [f"![frontier]({plot_dir}/frontier.png)", ""]
    out += [md_table(*r["frontier"]), "", "## Where the best configurations spend the step", ""]
    if plot_dir:
        out += [f"![phases]({plot_dir}/phases.png)", ""]
    out += [md_table(*r["top"]), "",
            "Recipes for the best: recipe/verl.sh, recipe/nemo_rl.yaml (written by `sweep "
            "search`, or by `sweep recommend` on this folder).", ""]
    return "\n".join(out)


def render_html(r: dict) -> str:
    e = html.escape
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>sweep report (RL): {e(str(r['run']))}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 6px;text-align:left}pre{background:#f6f6f6;padding:8px}</style>",
        "</head><body>", f"<h1>sweep report (RL): {e(str(r['run']))}</h1>",
        f"<p>{e(_headline(r))}</p>", "<h2>Recommendation</h2>", f"<pre>{e(r['text'])}</pre>",
        "<h2>Cost vs throughput: frontier</h2>", _img(r["png"]["frontier"], "frontier"),
        html_table(*r["frontier"]), "<h2>Where the best configurations spend the step</h2>",
        _img(r["png"]["phases"], "phases"), html_table(*r["top"]),
        "<p>Recipes for the best: recipe/verl.sh, recipe/nemo_rl.yaml.</p>",
        "</body></html>"])


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, top: int = 8) -> dict:
    """report.html, report.md and report_plots/*.png of an RL results folder."""
    out = Path(out_dir) if out_dir else Path(run_dir)
    return save_report(build(run_dir, top), out, render_html, render_md)
