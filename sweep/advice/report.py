"""`sweep report RESULTS_DIR [--out DIR] [--screenshot report.png]`: a self-contained HTML
report (opens offline: plotly.js inlined, plots embedded as PNG data URIs, nothing fetched) and
a Markdown summary with static PNGs.

In the HTML, the frontier and the configuration scatter (step time vs memory) are interactive
(plotly): hover shows a point's whole configuration and step-time breakdown, GPU types and
cluster sizes toggle (check boxes, or the legend), and a click puts the point's run YAML under
the plots, with a copy button.

Sections: the recommendation; the cost-vs-throughput Pareto frontier across GPU types and
cluster sizes (USD per million tokens against cluster tokens/s; with --tokens also total cost
and days), frontier points numbered and listed by configuration; the step-time breakdown of
the top configurations as stacked bars; a TP x PP heatmap of the best step time (fits only) on
the winner's cluster; memory per category for the winner; and why the winner beats the rule
of thumb (TP = GPUs per node, smallest PP that fits, no CP, micro-batch 1, full recompute only
if needed), found in the same results.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from ..engine.evaluate import profile_line
from ..errors import SweepError
from . import export
from .baseline import rule_of_thumb, short
from .frontier import failure_frontier, frontier
from .recommend import (OPTIONAL_COLUMNS, SELECT_COLUMNS, Constraints, derive, feasible, has_goodput, load_run,
                        objective_column, recommend, reprice)

# What the report reads of every row that fits (choice, frontier, heatmap, rule of thumb, the
# points' sample); the rows it shows are read again with every column
# instance: the frontier groups points by instance type (missing in older results: skipped)
REPORT_COLUMNS = [*SELECT_COLUMNS, *OPTIONAL_COLUMNS, "gpus_per_node", "ckpt_interval_min", "instance"]

TIME_PARTS = [  # column, label, colour
    ("time_compute", "compute", "#4c78a8"),
    ("time_recompute", "recompute", "#9ecae9"),
    ("time_tp", "TP comm (exposed)", "#f58518"),
    ("time_cp", "CP comm (exposed)", "#ffbf79"),
    ("time_ep", "EP comm (exposed)", "#e45756"),
    ("time_dp", "DP comm (exposed)", "#54a24b"),
    ("time_pp", "PP p2p (exposed)", "#b279a2"),
    ("time_bubble", "pipeline bubble", "#bab0ac"),
    ("time_optimizer", "optimizer", "#72b7b2"),
    ("time_slowdown", "overlap slowdown", "#eeca3b"),
    ("time_host", "host overhead", "#72b7b2"),
    ("time_latency", "network latency (calls across nodes)", "#9d755d"),
    ("time_nodes", "node-count slowdown", "#ff9da6"),
]
MEM_LABELS = {"mem_weights": "weights", "mem_grads": "gradients", "mem_optimizer": "optimizer",
              "mem_activations": "activations", "mem_logits": "logits", "mem_working": "working",
              "mem_buffers": "comm buffers", "mem_dispatcher": "MoE dispatcher buffers",
              "mem_optimizer_temp": "optimizer temp",
              "mem_runtime": "runtime"}
GPU_COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#eeca3b",
               "#9d755d"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
E = html.escape


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------






# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg) -> PNG bytes
# ---------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def hardware(df: pd.DataFrame) -> pd.Series:
    """What each point runs on, as the plots group and label it: its cloud instance type with
    the GPU and the price it was costed at ("aws-p5 (h100-sxm, $4.92/GPU-h)") where the row
    names one, else its GPU id."""
    gpu = df["gpu"].astype(str)
    if "instance" not in df.columns:
        return gpu
    inst = df["instance"]
    has = (inst.notna() & (inst.astype(str) != "")).to_numpy()
    price = (pd.to_numeric(df["price_per_hour"], errors="coerce") if "price_per_hour" in df
             else pd.Series(np.nan, index=df.index))
    label = inst.astype(str) + " (" + gpu + ", $" + price.map("{:.2f}".format) + "/GPU-h)"
    return label.where(has, gpu)


# precision -> colour of its frontier (a run that searches bf16, fp8 and an FP4 format)
PRECISION_COLOURS = {"bf16": "#4c78a8", "fp8": "#f58518", "nvfp4": "#54a24b", "mxfp4": "#e45756"}


def precision_frontiers(fits: pd.DataFrame) -> pd.DataFrame:
    """Each training precision's own cost/throughput frontier (empty unless the run searched
    more than one precision): what FP8 or FP4 buys over BF16 on the same space."""
    if "precision" not in fits.columns or fits["precision"].nunique() < 2:
        return fits.iloc[:0]
    return pd.concat([frontier(g) for _, g in fits.groupby("precision", sort=True)])


def precision_rows(pfront: pd.DataFrame, tokens: float | None):
    """frontier_rows with each row's precision first (the per-precision frontier table)."""
    heads, rows = frontier_rows(pfront, tokens)
    return ["precision"] + heads, [[str(p)] + r for p, r in zip(pfront["precision"], rows)]


def plot_precision_frontiers(fits: pd.DataFrame, pfront: pd.DataFrame) -> bytes:
    """BF16, FP8 and FP4 on one plot: every fitting configuration coloured by its precision,
    and each precision's frontier as a step line of the same colour."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 5.6))
    for i, (prec, pts) in enumerate(fits.groupby("precision", sort=True)):
        colour = PRECISION_COLOURS.get(str(prec), GPU_COLOURS[i % len(GPU_COLOURS)])
        ax.scatter(pts["tokens_per_s"], pts["cost_per_mtok_usd"], s=8, alpha=0.25,
                   color=colour, linewidths=0, rasterized=True)
        f = pfront[pfront["precision"] == prec].sort_values("tokens_per_s")
        ax.plot(f["tokens_per_s"], f["cost_per_mtok_usd"], "-", color=colour, lw=1.6,
                drawstyle="steps-post", label=f"{prec} frontier ({len(pts):,} fit)")
        ax.scatter(f["tokens_per_s"], f["cost_per_mtok_usd"], s=30, facecolors="white",
                   edgecolors=colour, zorder=4)
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (tokens/s, whole cluster)")
    ax.set_ylabel("cost (USD per million tokens)")
    ax.set_title("Pareto frontier per training precision", fontsize=10)
    return _png(fig)


def plot_frontier(fits: pd.DataFrame, front: pd.DataFrame, tokens: float | None,
                  front_fail: pd.DataFrame | None = None) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 5.6))
    hw = hardware(fits)
    gpus = sorted(hw.unique())
    sizes = sorted(fits["num_gpus"].unique())
    for gi, g in enumerate(gpus):
        for si, n in enumerate(sizes):
            pts = fits[((hw == g) & (fits["num_gpus"] == n)).to_numpy()]
            if not len(pts):
                continue
            ax.scatter(pts["tokens_per_s"], pts["cost_per_mtok_usd"], s=9, alpha=0.35,
                       color=GPU_COLOURS[gi % len(GPU_COLOURS)], marker=MARKERS[si % len(MARKERS)],
                       linewidths=0, rasterized=True)
    f = front.sort_values("tokens_per_s")
    ax.plot(f["tokens_per_s"], f["cost_per_mtok_usd"], "-", color="black", lw=1.2, zorder=3,
            drawstyle="steps-post", label="Pareto frontier")
    ax.scatter(f["tokens_per_s"], f["cost_per_mtok_usd"], s=34, facecolors="white",
               edgecolors="black", zorder=4)
    for k, (_, r) in enumerate(f.iterrows(), start=1):
        ax.annotate(str(k), (r["tokens_per_s"], r["cost_per_mtok_usd"]), xytext=(4, 4),
                    textcoords="offset points", fontsize=8, fontweight="bold", zorder=5)
    failing = front_fail is not None and len(front_fail)
    if failing:  # the same frontier once failures, checkpoints and restarts are counted
        ff = front_fail.sort_values("tokens_per_s_goodput")
        ax.plot(ff["tokens_per_s_goodput"], ff["cost_per_mtok_goodput_usd"], "--",
                color="#d62728", lw=1.2, zorder=3, drawstyle="steps-post")
        ax.scatter(ff["tokens_per_s_goodput"], ff["cost_per_mtok_goodput_usd"], s=22,
                   color="#d62728", zorder=4)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=GPU_COLOURS[i % len(GPU_COLOURS)], marker="o", ls="",
                      label=g) for i, g in enumerate(gpus)]
    handles += [Line2D([], [], color="grey", marker=MARKERS[i % len(MARKERS)], ls="",
                       label=f"{n} GPUs") for i, n in enumerate(sizes)]
    handles.append(Line2D([], [], color="black", marker="o", mfc="white", label="frontier"))
    if failing:
        handles.append(Line2D([], [], color="#d62728", marker="o", ls="--",
                              label="frontier with failures (goodput)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", ncol=2, frameon=False)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (tokens/s, whole cluster)")
    ax.set_ylabel("cost (USD per million tokens)")
    if tokens:
        sec = ax.secondary_yaxis("right", functions=(lambda y: y * tokens / 1e6 / 1e3,
                                                     lambda y: y * 1e3 * 1e6 / tokens))
        sec.set_ylabel(f"total cost for {tokens:.3g} tokens (thousand USD)")
        top = ax.secondary_xaxis("top", functions=(lambda x: tokens / np.maximum(x, 1e-9) / 86400,
                                                   lambda d: tokens / np.maximum(d, 1e-9) / 86400))
        top.set_xlabel(f"days to train on {tokens:.3g} tokens")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.grid(True, which="both", alpha=0.2)
    return _png(fig)


def stacked_bars(rows: pd.DataFrame, parts) -> tuple:
    """A horizontal bar per row, its `parts` (column, label, colour; those with any non-zero
    value) stacked left to right: (fig, ax, bar positions, bar ends)."""
    plt = _plt()
    parts = [p for p in parts if p[0] in rows.columns and rows[p[0]].fillna(0).abs().sum() > 0]
    fig, ax = plt.subplots(figsize=(9.5, 0.45 * len(rows) + 1.6))
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for col, label, colour in parts:
        v = rows[col].fillna(0).to_numpy(float)
        ax.barh(y, v, left=left, color=colour, label=label, height=0.7)
        left += v
    return fig, ax, y, left


def plot_breakdown(rows: pd.DataFrame, labels: list[str]) -> bytes:
    fig, ax, y, _ = stacked_bars(rows, TIME_PARTS)
    for yi, total in zip(y, rows["step_time_s"].to_numpy(float)):
        ax.text(total, yi, f" {total:.2f} s", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("step time (s)")
    ax.set_xlim(0, float(np.nanmax(rows["step_time_s"])) * 1.15)
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.5 / len(rows)),
              frameon=False)
    return _png(fig)


def heatmap_table(df: pd.DataFrame, like: pd.Series) -> pd.DataFrame:
    """Best step time over everything else, per (TP, PP), on the winner's cluster; NaN where
    nothing fits."""
    same = np.ones(len(df), dtype=bool)
    for c in ("model", "gpu", "num_gpus", "seq_len", "global_batch", "precision"):
        if c in df.columns:
            same &= (df[c] == like[c]).to_numpy()
    sub = df[same]
    tps = sorted(sub["tp"].unique())
    pps = sorted(sub["pp"].unique())
    fits = sub[sub["status"] == "ok"]
    t = fits.groupby(["pp", "tp"])["step_time_s"].min().unstack("tp")
    return t.reindex(index=pps, columns=tps)


def plot_heatmap(t: pd.DataFrame, best: pd.Series) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.1 * len(t.columns) + 2.4, 0.55 * len(t.index) + 1.6))
    data = t.to_numpy(float)
    masked = np.ma.masked_invalid(data)
    cmap = plt.get_cmap("viridis_r").with_extremes(bad="#eeeeee")
    im = ax.imshow(masked, cmap=cmap, aspect="auto")
    ax.set_xticks(range(len(t.columns)))
    ax.set_xticklabels([str(c) for c in t.columns])
    ax.set_yticks(range(len(t.index)))
    ax.set_yticklabels([str(i) for i in t.index])
    ax.set_xlabel("TP")
    ax.set_ylabel("PP")
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            v = data[i, j]
            txt = "—" if not np.isfinite(v) else f"{v:.2f}"
            is_best = (t.index[i] == best["pp"] and t.columns[j] == best["tp"])
            ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                    fontweight="bold" if is_best else "normal",
                    color="white" if np.isfinite(v) and v < np.nanmedian(data) else "black")
            if is_best:
                ax.add_patch(_plt().Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2,
                                              ec="red"))
    fig.colorbar(im, ax=ax, label="best step time (s)")
    ax.set_title("best step time per TP x PP (fits only; — = nothing fits or invalid)",
                 fontsize=9)
    return _png(fig)


def plot_memory(best: pd.Series, capacity: float, other: pd.Series | None = None,
                other_label: str = "") -> bytes:
    plt = _plt()
    cols = [c for c in MEM_LABELS if c in best.index]
    rows = [("winner", best)] + ([(other_label, other)] if other is not None else [])
    fig, ax = plt.subplots(figsize=(9.5, 0.7 * len(rows) + 1.7))
    colours = plt.get_cmap("tab10").colors
    for yi, (_, r) in enumerate(rows):
        left = 0.0
        for ci, c in enumerate(cols):
            v = float(r[c]) if pd.notna(r[c]) else 0.0
            if v <= 0:
                continue
            ax.barh(len(rows) - 1 - yi, v, left=left, color=colours[ci % 10], height=0.6,
                    label=MEM_LABELS[c] if yi == 0 else None)
            if v > capacity * 0.06:
                ax.text(left + v / 2, len(rows) - 1 - yi, f"{v:.1f}", ha="center", va="center",
                        fontsize=7, color="white")
            left += v
    ax.axvline(capacity, color="red", ls="--", lw=1.2)
    ax.text(capacity, len(rows) - 0.45, f" HBM {capacity:.0f} GiB", color="red", fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([lab for lab, _ in rows][::-1])
    ax.set_xlabel("GiB per GPU (worst rank)")
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False)
    return _png(fig)


# ---------------------------------------------------------------------------------------------
# Why the best beats the rule of thumb
# ---------------------------------------------------------------------------------------------
def why(best: pd.Series, rot: pd.Series | None, rule: str) -> list[str]:
    """Sentences (plain text) comparing the winner with the rule-of-thumb configuration."""
    if rot is None:
        return [f"The rule of thumb ({rule}) has no configuration that fits in these results "
                f"on {best['num_gpus']} x {best['gpu']}, so the search is the only way to a "
                "working layout here."]
    b, r = export.config_of(best), export.config_of(rot)
    if int(best["config_id"]) == int(rot["config_id"]):
        return [f"The winner is the rule-of-thumb configuration itself ({rule})."]
    gain = r["step_time_s"] / b["step_time_s"] - 1
    out = [f"Rule of thumb ({rule}) on the same {b['num_gpus']} x {b['gpu']}: {short(r)} at "
           f"{r['step_time_s']:.3f} s/step; the winner {short(b)} takes {b['step_time_s']:.3f} "
           f"s/step: {gain:.0%} more throughput"
           + (f", ${b['cost_per_mtok_usd']:.3f} instead of ${r['cost_per_mtok_usd']:.3f} per "
              f"million tokens" if b.get("cost_per_mtok_usd") and r.get("cost_per_mtok_usd")
              else "") + "."]
    notes = {
        "time_bubble": lambda: (f"pipeline bubble: PP {r['pp']} -> {b['pp']}"
                                + (f", {b['vpp']} virtual stages per rank" if b.get("vpp", 1) > 1
                                   else "")
                                + f", {_int(b.get('num_microbatches'))} microbatches per step "
                                f"(was {_int(r.get('num_microbatches'))})"),
        "time_recompute": lambda: (f"recompute {r['recompute']} -> {b['recompute']}: the winner "
                                   f"fits at {b['peak_memory_gib']:.1f} GiB without replaying "
                                   "the forward pass" if b["recompute"] == "none" else
                                   f"recompute {r['recompute']} -> {b['recompute']}"),
        "time_tp": lambda: (f"TP {r['tp']} -> {b['tp']}: fewer/smaller exposed all-reduce or "
                            "reduce-scatter per layer"
                            + (" (sequence parallel)" if b.get("sequence_parallel") else "")),
        "time_compute": lambda: (f"compute: GEMMs of TP {b['tp']} x micro-batch "
                                 f"{b['micro_batch']} run closer to peak than TP {r['tp']} x "
                                 f"micro-batch {r['micro_batch']}"),
        "time_dp": lambda: f"data-parallel gradient sync: DP {r['dp']} -> {b['dp']}, ZeRO "
                           f"{r.get('zero')} -> {b.get('zero')}",
        "time_pp": lambda: f"pipeline p2p: PP {r['pp']} -> {b['pp']}",
        "time_cp": lambda: f"context parallel: CP {r['cp']} -> {b['cp']}",
        "time_ep": lambda: f"expert parallel: EP {r['ep']} -> {b['ep']}",
        "time_optimizer": lambda: "optimizer step",
        "time_slowdown": lambda: "compute slowed by overlapped communication",
        "time_host": lambda: (f"host overhead per micro-batch: {r.get('num_microbatches')} -> "
                              f"{b.get('num_microbatches')} micro-batches"),
        "time_latency": lambda: f"network calls across nodes: {r['num_gpus']} -> "
                                f"{b['num_gpus']} GPUs, TP {r['tp']} -> {b['tp']}",
        "time_nodes": lambda: f"node-count slowdown: {r['num_gpus']} -> {b['num_gpus']} GPUs",
    }
    diffs = []
    for col, label, _ in TIME_PARTS:
        if col in best.index and col in rot.index:
            d = float(rot[col] or 0) - float(best[col] or 0)
            diffs.append((d, col, label))
    diffs.sort(reverse=True)
    saved = [x for x in diffs if x[0] > 0.005 * r["step_time_s"]]
    lost = [x for x in diffs if x[0] < -0.005 * r["step_time_s"]]
    for d, col, label in saved[:4]:
        out.append(f"saves {d:.3f} s on {label} ({float(rot[col]):.3f} -> {float(best[col]):.3f} "
                   f"s): {notes[col]()}.")
    for d, col, label in lost[:2]:
        out.append(f"pays {-d:.3f} s more on {label} ({float(rot[col]):.3f} -> "
                   f"{float(best[col]):.3f} s): {notes[col]()}.")
    out.append(f"memory: {b['peak_memory_gib']:.1f} GiB for the winner vs "
               f"{r['peak_memory_gib']:.1f} GiB for the rule of thumb.")
    return out


def _int(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else str(int(v))


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def _fmt(col: str, v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    f = {"step_time_s": "{:.3f}", "tokens_per_s": "{:,.0f}", "tokens_per_s_per_gpu": "{:,.0f}",
         "mfu": "{:.1%}", "peak_memory_gib": "{:.1f}", "oom_risk": "{:.0%}",
         "headroom_gib": "{:.1f}",
         "cost_per_mtok_usd": "{:.3f}", "days": "{:.1f}", "total_cost_usd": "{:,.0f}",
         "price_per_hour": "{:.2f}"}.get(col)
    if f:
        return f.format(float(v))
    return str(export._py(v))


def frontier_rows(front: pd.DataFrame, tokens: float | None) -> tuple[list[str], list[list[str]]]:
    heads = ["#", "GPU", "GPUs", "configuration", "tokens/s", "$/Mtok", "MFU", "mem GiB",
             "OOM risk"]
    cols = ["tokens_per_s", "cost_per_mtok_usd", "mfu", "peak_memory_gib", "oom_risk"]
    if tokens:
        heads += ["days", "total $"]
        cols += ["days", "total_cost_usd"]
    rows = []
    for k, (_, r) in enumerate(front.iterrows(), start=1):
        rows.append([str(k), _hw_of(r), str(int(r["num_gpus"])), short(export.config_of(r))]
                    + [_fmt(c, r.get(c)) for c in cols])
    return heads, rows


def scaling_table(fits: pd.DataFrame, tokens: float | None) -> tuple[list[str], list[list[str]]]:
    """Per GPU type and cluster size: the fastest configuration without failures and the
    fastest with them (throughput x goodput), side by side: where the with-failures column
    stops growing, adding GPUs stops paying. Empty without goodput."""
    if not has_goodput(fits):
        return [], []
    d = fits.assign(eff=fits["tokens_per_s"] * fits["goodput"])
    heads = ["GPU", "GPUs", "tok/s failure-free", "tok/s with failures", "goodput",
             "intr/day", "ckpt every (min)", "$/Mtok failure-free", "$/Mtok with failures"]
    if tokens:
        heads += ["days failure-free", "days with failures"]
    rows = []
    for (g, n), grp in d.groupby(["gpu", "num_gpus"], sort=True):
        free = grp.loc[grp["tokens_per_s"].idxmax()]
        fail = grp.loc[grp["eff"].idxmax()]
        row = [str(g), f"{int(n):,}", f"{free['tokens_per_s']:,.0f}", f"{fail['eff']:,.0f}",
               f"{fail['goodput']:.1%}", f"{fail['interruptions_per_day']:.2f}",
               f"{fail['ckpt_interval_min']:.1f}" if "ckpt_interval_min" in fail.index else "-",
               f"{free['cost_per_mtok_usd']:.3f}",
               f"{fail['cost_per_mtok_usd'] / fail['goodput']:.3f}"]
        if tokens:
            row += [f"{tokens / free['tokens_per_s'] / 86400:.1f}",
                    f"{tokens / fail['eff'] / 86400:.1f}"]
        rows.append(row)
    return heads, rows


def top_rows(top: pd.DataFrame, labels: list[str], tokens) -> tuple[list[str], list[list[str]]]:
    heads = ["", "GPU", "GPUs", "configuration", "step s", "tokens/s/GPU", "MFU", "mem GiB",
             "OOM risk", "free GiB", "$/Mtok"]
    cols = ["step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_gib", "oom_risk",
            "headroom_gib", "cost_per_mtok_usd"]
    if "step_time_hi_s" in top.columns and top["step_time_hi_s"].notna().any():
        # a run calibration's 10-90% interval of the step time, next to it
        heads.insert(5, "step 10-90% s")
        cols.insert(1, "step_interval")
        top = top.assign(step_interval=[f"{a:.3f}-{b:.3f}" for a, b in
                                        zip(top["step_time_lo_s"], top["step_time_hi_s"])])
    if tokens:
        heads += ["days", "total $"]
        cols += ["days", "total_cost_usd"]
    rows = [[lab, _hw_of(r), str(int(r["num_gpus"])), short(export.config_of(r))]
            + [_fmt(c, r.get(c)) for c in cols] for lab, (_, r) in zip(labels, top.iterrows())]
    return heads, rows


def _hw_of(r: pd.Series) -> str:
    return str(hardware(r.to_frame().T).iloc[0])


def html_table(heads, rows) -> str:
    h = "".join(f"<th>{E(x)}</th>" for x in heads)
    b = "".join("<tr>" + "".join(f"<td>{E(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def md_table(heads, rows) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(esc(h) for h in heads) + " |",
           "|" + "|".join("---" for _ in heads) + "|"]
    out += ["| " + " | ".join(esc(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Interactive plots (plotly, offline)
# ---------------------------------------------------------------------------------------------
MAX_POINTS = 1000  # points in the interactive plots: the frontier plus an even sample
SYMBOLS = ["circle", "square", "triangle-up", "diamond", "triangle-down", "cross", "x", "star"]
HOVER_CONFIG = [("framework", "framework"), ("tp", "TP"), ("pp", "PP"), ("vpp", "VPP"),
                ("cp", "CP"), ("ep", "EP"), ("dp", "DP"), ("micro_batch", "micro-batch"),
                ("num_microbatches", "micro-batches"), ("recompute", "recompute"),
                ("sequence_parallel", "sequence parallel"), ("zero", "ZeRO"),
                ("precision", "precision")]
HOVER_RESULTS = [("step_time_s", "step time", "{:.3f} s"),
                 ("tokens_per_s", "throughput", "{:,.0f} tokens/s"),
                 ("mfu", "MFU", "{:.1%}"), ("peak_memory_gib", "peak memory", "{:.1f} GiB"),
                 ("oom_risk", "OOM risk", "{:.0%}"), ("cost_per_mtok_usd", "cost", "${:.3f}/Mtok")]


def shown_points(fits: pd.DataFrame, front: pd.DataFrame, cap: int = MAX_POINTS) -> pd.DataFrame:
    """What the interactive plots draw: every frontier point, and of the rest an even sample
    by throughput within each (GPU, cluster size), `cap` points in all (all when fewer)."""
    if len(fits) <= cap:
        return fits
    on = fits["config_id"].isin(front["config_id"])
    rest = fits[~on]
    groups = list(rest.groupby(["gpu", "num_gpus"], sort=True))
    per = max(1, (cap - int(on.sum())) // max(len(groups), 1))
    picks = [fits[on]]
    for _, g in groups:
        g = g.sort_values(["tokens_per_s", "config_id"])
        idx = np.unique(np.linspace(0, len(g) - 1, min(per, len(g))).round().astype(int))
        picks.append(g.iloc[idx])
    return pd.concat(picks)


def hover_text(r: pd.Series) -> str:
    """A point's whole configuration, predictions and step-time breakdown (plotly hover)."""
    head = f"<b>{E(_hw_of(r))} x {int(r['num_gpus'])}</b>: {E(short(export.config_of(r)))}"
    cfg = ", ".join(f"{lab} {E(str(export._py(r[c])))}" for c, lab in HOVER_CONFIG
                    if c in r.index and pd.notna(r[c]))
    res = ", ".join(f"{lab} {fmt.format(float(r[c]))}" for c, lab, fmt in HOVER_RESULTS
                    if c in r.index and pd.notna(r[c]))
    parts = [f"{lab} {float(r[c]):.3f} s" for c, lab, _ in TIME_PARTS
             if c in r.index and pd.notna(r[c]) and float(r[c]) > 0]
    lines = [head, _wrap(cfg), _wrap(res), "<b>step-time breakdown</b>"]
    lines += [_wrap(", ".join(parts[i:i + 3])) for i in range(0, len(parts), 3)]
    return "<br>".join(lines)


def _wrap(text: str, width: int = 90) -> str:
    import textwrap

    return "<br>".join(textwrap.wrap(text, width)) if text else ""


def _point_traces(pts: pd.DataFrame, front_ids: set, x: str, y: str, gpus: list, sizes: list):
    import plotly.graph_objects as go

    traces = []
    hw = hardware(pts)
    for gi, g in enumerate(gpus):
        for si, n in enumerate(sizes):
            sub = pts[((hw == g) & (pts["num_gpus"] == n)).to_numpy()]
            if not len(sub):
                continue
            traces.append(go.Scatter(
                x=sub[x], y=sub[y], mode="markers", name=f"{n} GPUs", legendgroup=str(g),
                legendgrouptitle_text=str(g), text=list(sub["_hover"]),
                customdata=list(sub["config_id"].astype(int)),
                hovertemplate="%{text}<extra></extra>",
                marker=dict(color=GPU_COLOURS[gi % len(GPU_COLOURS)],
                            symbol=SYMBOLS[si % len(SYMBOLS)], size=7, opacity=0.55,
                            line=dict(width=0)),
                meta={"gpu": str(g), "size": int(n)}))
    return traces


def interactive_plots(fits: pd.DataFrame, front: pd.DataFrame, best: pd.Series,
                      points: pd.DataFrame | None = None) -> dict:
    """{'frontier': html, 'scatter': html, 'controls': html, 'script': html, 'shown': n}: the two
    plotly figures (plotly.js inlined once), the GPU / cluster-size toggles, the YAML panel.
    `points`: the rows drawn with every column (default: shown_points of `fits`)."""
    import plotly.graph_objects as go

    pts = (shown_points(fits, front) if points is None else points).copy()
    pts["_hover"] = [hover_text(r) for _, r in pts.iterrows()]
    gpus = sorted(hardware(pts).unique())
    sizes = sorted(int(n) for n in pts["num_gpus"].unique())
    front_ids = set(front["config_id"].astype(int))
    f = pts[pts["config_id"].isin(front_ids)].sort_values("tokens_per_s")
    common = dict(template="plotly_white", height=560, hovermode="closest",
                  hoverlabel=dict(align="left", font_size=11), clickmode="event",
                  legend=dict(groupclick="toggleitem", font_size=11),
                  margin=dict(l=60, r=20, t=30, b=50))

    fig = go.Figure(_point_traces(pts[~pts["config_id"].isin(front_ids)], front_ids,
                                  "tokens_per_s", "cost_per_mtok_usd", gpus, sizes))
    fig.add_trace(go.Scatter(
        x=f["tokens_per_s"], y=f["cost_per_mtok_usd"], mode="lines+markers+text",
        name="Pareto frontier", line=dict(color="black", width=1.5, shape="hv"),
        marker=dict(color="white", size=9, line=dict(color="black", width=1.5)),
        text=[str(k) for k in range(1, len(f) + 1)], textposition="top right",
        hovertext=list(f["_hover"]), customdata=list(f["config_id"].astype(int)),
        hovertemplate="%{hovertext}<extra>frontier %{text}</extra>", meta={"frontier": True}))
    fig.update_layout(xaxis=dict(type="log", title="throughput (tokens/s, whole cluster)"),
                      yaxis=dict(type="log", title="cost (USD per million tokens)"), **common)

    sc = go.Figure(_point_traces(pts, front_ids, "peak_memory_gib", "step_time_s", gpus,
                                 sizes))
    b = pts[pts["config_id"] == best["config_id"]]
    if len(b):
        sc.add_trace(go.Scatter(
            x=b["peak_memory_gib"], y=b["step_time_s"], mode="markers", name="recommended",
            marker=dict(symbol="star", size=16, color="red", line=dict(color="black", width=1)),
            hovertext=list(b["_hover"]), customdata=list(b["config_id"].astype(int)),
            hovertemplate="%{hovertext}<extra>recommended</extra>", meta={"best": True}))
    sc.update_layout(xaxis=dict(title="peak memory per GPU (GiB, worst rank)"),
                     yaxis=dict(type="log", title="step time (s)"), **common)
    cfg = {"displaylogo": False, "responsive": True, "scrollZoom": True}
    yamls = {str(int(r["config_id"])): export.run_yaml(r) for _, r in pts.iterrows()}
    # JSON inside <script>: no "<", ">" or "&" of a user string reaches the HTML parser
    data = (json.dumps(yamls, separators=(",", ":")).replace("<", "\\u003c")
            .replace(">", "\\u003e").replace("&", "\\u0026"))
    boxes = lambda cls, values: "".join(  # noqa: E731
        f'<label><input type="checkbox" class="{cls}" value="{E(str(v))}" checked> '
        f"{E(str(v))}</label> " for v in values)
    controls = (f'<p class="toggles">GPU type: {boxes("tog-gpu", gpus)} &nbsp; cluster size: '
                f'{boxes("tog-size", sizes)}</p>')
    panel = ('<div class="yaml-panel"><p><b id="point-title">recommended configuration</b> '
             '<button id="copy-yaml" type="button">copy run YAML</button> '
             '<span id="copy-state" class="muted"></span></p>'
             f'<pre id="point-yaml">{E(export.run_yaml(best))}</pre></div>')
    return {"frontier": fig.to_html(full_html=False, include_plotlyjs=True,
                                    div_id="frontier-plot", config=cfg),
            "scatter": sc.to_html(full_html=False, include_plotlyjs=False,
                                  div_id="scatter-plot", config=cfg),
            "controls": controls, "panel": panel,
            "script": (f'<script type="application/json" id="point-yamls">{data}</script>'
                       f"<script>{TOGGLE_JS}</script>"),
            "shown": len(pts)}


TOGGLE_JS = r"""
(function () {
  var ids = ["frontier-plot", "scatter-plot"];
  function checked(cls) {
    var on = {};
    document.querySelectorAll("." + cls).forEach(function (c) { on[c.value] = c.checked; });
    return on;
  }
  function sync() {
    var g = checked("tog-gpu"), s = checked("tog-size");
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      if (!el || !el.data) return;
      var vis = el.data.map(function (t) {
        if (!t.meta || t.meta.gpu === undefined) return true;
        return g[t.meta.gpu] && s[String(t.meta.size)] ? true : "legendonly";
      });
      Plotly.restyle(el, {visible: vis});
    });
  }
  var yamls = JSON.parse(document.getElementById("point-yamls").textContent);
  function show(ev) {
    var p = ev && ev.points && ev.points[0];
    var text = p && yamls[String(p.customdata)];
    if (!text) return;
    document.getElementById("point-yaml").textContent = text;
    document.getElementById("point-title").textContent = "clicked: " +
      text.split("\n")[0].replace(/^# run file for `sweep simulate`: /, "");
    document.getElementById("copy-state").textContent = "";
  }
  function copy() {
    var pre = document.getElementById("point-yaml"), state = document.getElementById("copy-state");
    var text = pre.textContent;
    function fallback() {
      var r = document.createRange(); r.selectNodeContents(pre);
      var sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(r);
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      state.textContent = ok ? "copied" : "selected: press Ctrl+C";
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { state.textContent = "copied"; },
                                               fallback);
    } else { fallback(); }
  }
  document.querySelectorAll(".tog-gpu,.tog-size").forEach(function (c) {
    c.addEventListener("change", sync);
  });
  document.getElementById("copy-yaml").addEventListener("click", copy);
  ids.forEach(function (id) {
    var el = document.getElementById(id);
    if (el && el.on) el.on("plotly_click", show);
  });
})();
"""


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1100px;color:#222;line-height:1.4}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4}td:nth-child(-n+4){text-align:left}
img{max-width:100%;display:block;margin:8px 0}
.muted{color:#666;font-size:12px}pre{background:#f7f7f7;padding:8px;font-size:11px;overflow-x:auto}
.toggles{font-size:12px}.toggles label{margin-right:8px}
.yaml-panel pre{max-height:320px;overflow-y:auto}
"""


def build(run_dir: str | Path, *, objective: str | None = None,
          constraints: Constraints | None = None, prices: dict | None = None,
          top: int = 8) -> dict:
    """Everything the report shows: tables, texts and PNGs (bytes)."""
    # the report shows only configurations that fit: the others are counted, not read; of
    # those, only the columns that choose, rank and place them (REPORT_COLUMNS), and every
    # column of the few rows shown (read back by config_id below)
    df, meta = load_run(run_dir, columns=REPORT_COLUMNS, filters={"status": "ok"})
    df = reprice(df, prices or {})
    c = constraints or Constraints()
    from .recommend import _default_objective, read_full, read_rows, rec_ids

    obj = objective or _default_objective(meta)
    rec = recommend(df, obj, c, run_name=str(meta.get("space", "")))
    rec.profile = profile_line(meta) or ""
    d = derive(df, c.tokens, c.failures)
    del df
    mask, _ = feasible(d, c)
    fits = d[mask & d["cost_per_mtok_usd"].notna() & d["tokens_per_s"].notna()]
    if not rec.found or not len(fits):
        raise SweepError(f"{run_dir}: no configuration fits in memory and meets the constraints; "
                         "nothing to report")
    front = frontier(fits)
    front_fail = failure_frontier(fits) if c.failures and has_goodput(fits) else fits.iloc[:0]
    # each GPU type's own frontier: a type the overall frontier leaves out still shows what it
    # costs and how fast it goes (a buyer may not be able to rent the winner)
    gpu_front = pd.concat([frontier(g) for _, g in fits.groupby("gpu", sort=True)])
    prec_front = precision_frontiers(fits)
    best = d.loc[d["config_id"] == rec.best["config_id"]].iloc[0]
    col, asc = objective_column(obj, c.failures)
    topn = fits.sort_values([col, "config_id"], ascending=[asc, True]).head(top)
    rot, rule = rule_of_thumb(d, best)
    heat = heatmap_table(d, best)
    points = shown_points(fits, front)
    ids = {int(best["config_id"])} | set(topn["config_id"].astype(int)) \
        | set(front["config_id"].astype(int)) | set(points["config_id"].astype(int)) \
        | set(front_fail["config_id"].astype(int)) | set(gpu_front["config_id"].astype(int)) \
        | set(prec_front["config_id"].astype(int))
    if rot is not None:
        ids.add(int(rot["config_id"]))
    full = read_rows(run_dir, ids | set(rec_ids(rec)), c.tokens, prices, c.failures)

    def whole(rows: pd.DataFrame) -> pd.DataFrame:
        return full.loc[rows["config_id"].astype(int)].reset_index(drop=True)
    front, topn, points = whole(front), whole(topn), whole(points)
    gpu_front = whole(gpu_front)
    png_prec = plot_precision_frontiers(fits, prec_front) if len(prec_front) else None
    prec_front = whole(prec_front)
    best = full.loc[int(best["config_id"])]
    rot = full.loc[int(rot["config_id"])] if rot is not None else None
    rec = read_full(run_dir, rec, rows=full)
    bars = topn.copy()
    labels = [f"#{i + 1} {r['gpu']} x{int(r['num_gpus'])} {short(export.config_of(r))}"
              for i, (_, r) in enumerate(topn.iterrows())]
    if rot is not None and int(rot["config_id"]) not in set(topn["config_id"].astype(int)):
        bars = pd.concat([bars, rot.to_frame().T])
        labels.append(f"rule of thumb {short(export.config_of(rot))}")
    for c_ in [p[0] for p in TIME_PARTS] + ["step_time_s"]:
        if c_ in bars.columns:
            bars[c_] = pd.to_numeric(bars[c_], errors="coerce")
    cap = float(best["capacity_gib"])
    prices_used = (d.groupby("gpu")["price_per_hour"].first().sort_index()
                   if "price_per_hour" in d.columns else pd.Series(dtype=float))
    from sim_core import catalog

    price_rows = []
    if "instance" in d.columns and d["instance"].notna().any():
        for i, p in d.groupby("instance")["price_per_hour"].first().sort_index().items():
            if not str(i):
                continue
            inst = catalog.get_instance(str(i))
            cat = inst.price_per_gpu_hour
            src = (f"catalog {inst.price_kind} ({inst.price_date})"
                   if cat is not None and abs(cat - p) < 1e-9 else "given")
            price_rows.append([str(i), f"{p:.2f}", src])
        prices_used = prices_used[[g for g in prices_used.index
                                   if g not in set(d.loc[d["instance"].astype(str) != "", "gpu"])]]
    for g, p in prices_used.items():
        try:
            cat = catalog.get_gpu(g).price_per_hour
        except Exception:  # noqa: BLE001
            cat = float("nan")
        src = "catalog" if abs(cat - p) < 1e-9 else "override"
        price_rows.append([str(g), f"{p:.2f}", src])
    from ..results import result_counts

    return {
        "run": str(meta.get("space") or Path(run_dir).name), "meta": meta,
        "counts": result_counts(Path(run_dir)),
        "objective": obj, "constraints": c, "rec": rec, "best": best, "front": front,
        "gpu_front": gpu_front, "precision_front": prec_front,
        "fits": fits, "top": topn, "rot": rot, "rule": rule, "why": why(best, rot, rule),
        "model": str(best.get("model")), "gpus": sorted(d["gpu"].unique()),
        "sizes": sorted(int(x) for x in d["num_gpus"].unique()), "price_rows": price_rows,
        "scaling": scaling_table(fits, c.tokens) if c.failures else ([], []),
        "png": {"frontier": plot_frontier(fits, front, c.tokens, front_fail),
                "breakdown": plot_breakdown(bars, labels),
                "heatmap": plot_heatmap(heat, best),
                "memory": plot_memory(best, cap, rot, "rule of thumb"),
                **({"precision_frontier": png_prec} if png_prec is not None else {})},
        "megatron": export.megatron_text(best),
        "interactive": interactive_plots(fits, front, best, points),
    }


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{E(alt)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode()}">')


SCALING_NOTE = ("The fastest configuration of each cluster size without failures and with them "
                "counted (throughput x goodput: interruptions by the GPU generation's published "
                "rate, Young/Daly checkpoints, restarts; sim_core/goodput.py). Where the "
                "with-failures throughput stops growing, adding GPUs stops paying. The frontier "
                "plot draws both (dashed: with failures).")


def _scaling_html(r: dict) -> list[str]:
    heads, rows = r.get("scaling") or ([], [])
    if not heads:
        return []
    return ["<h2>Failures, checkpoints and restarts: adding GPUs</h2>",
            f"<p class=muted>{E(SCALING_NOTE)}</p>", html_table(heads, rows)]


def render_html(r: dict) -> str:
    cnt, rec, c = r["counts"], r["rec"], r["constraints"]
    from .recommend import render as rec_text

    rec_rows = pd.concat([rec.best.to_frame().T, rec.runner_ups])
    rec_rows = derive(rec_rows.reset_index(drop=True).infer_objects(), c.tokens, c.failures)
    labels = ["best"] + [f"robust {i + 1}" for i in range(len(rec.runner_ups))]
    th, tr = top_rows(rec_rows, labels, c.tokens)
    fh, fr = frontier_rows(r["front"], c.tokens)
    cons = "; ".join(c.describe()) or "none"
    ia = r["interactive"]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>sweep report: {E(r['run'])}</title>", f"<style>{CSS}</style></head><body>",
        f"<h1>sweep report: {E(r['run'])}</h1>",
        *([f"<p class=\"profile\"><b>{E(profile_line(r['meta']))}</b></p>"]
          if profile_line(r["meta"]) else
          ["<p class=\"profile\">default model (no calibration profile)</p>"]),
        f"<p class=muted>model {E(r['model'])}; GPU types {E(', '.join(r['gpus']))}; cluster "
        f"sizes {E(', '.join(str(s) for s in r['sizes']))}; {cnt['total']:,} configurations "
        f"({cnt['invalid']:,} invalid, {cnt['oom']:,} out of memory, {cnt['ok']:,} fit); "
        f"objective {E(r['objective'])}; constraints: {E(cons)}</p>",
        "<h2>Recommendation</h2>", html_table(th, tr),
        f"<p class=muted>robust runner-ups: within {rec.within:.0%} of the best "
        f"{E(rec.objective)} with more memory headroom. Recipes: <code>sweep recommend "
        f"RUN --format megatron|torchtitan|yaml</code>.</p>",
        "<h2>Cost vs throughput: Pareto frontier</h2>",
        f"<p class=muted>{len(r['fits']):,} configurations that fit; {len(r['front'])} on the "
        "frontier (no other configuration is both cheaper per token and faster). Hover a point "
        "for its configuration and step-time breakdown; click it for its run YAML (below the "
        "plots); "
        + (f"{ia['shown']:,} points drawn: the frontier and an even sample of each GPU type "
           "and cluster size; " if ia["shown"] < len(r["fits"]) else "")
        + "the legend or the boxes toggle GPU types and cluster sizes.</p>",
        ia["controls"], ia["frontier"], html_table(fh, fr),
        *_scaling_html(r),
        "<h3>Each GPU type's own frontier</h3>",
        html_table(*frontier_rows(r["gpu_front"], c.tokens)),
        *(["<h3>Each precision's own frontier (BF16, FP8, FP4)</h3>",
           _img(r["png"]["precision_frontier"], "frontier per precision"),
           html_table(*precision_rows(r["precision_front"], c.tokens))]
          if len(r.get("precision_front", ())) else []),
        "<h2>Configurations: step time vs memory</h2>", ia["scatter"], ia["panel"],
        "<h2>Step-time breakdown of the top configurations</h2>",
        _img(r["png"]["breakdown"], "step time breakdown"),
        f"<h2>TP x PP: best step time on {E(str(r['best']['num_gpus']))} x "
        f"{E(str(r['best']['gpu']))}</h2>", _img(r["png"]["heatmap"], "TP x PP heatmap"),
        "<h2>Memory per category (winner vs rule of thumb)</h2>",
        _img(r["png"]["memory"], "memory per category"),
        "<h2>Why the best beats the rule of thumb</h2>",
        "<ul>" + "".join(f"<li>{E(s)}</li>" for s in r["why"]) + "</ul>",
        "<h2>Prices</h2>", html_table(["GPU", "USD per GPU-hour", "source"], r["price_rows"]),
        "<h2>Megatron-LM flags for the winner</h2>", f"<pre>{E(r['megatron'])}</pre>",
        f"<pre class=muted>{E(rec_text(rec))}</pre>",
        ia["script"], "</body></html>"]
    return "\n".join(parts)


def render_md(r: dict, plot_dir: str | None) -> str:
    rec, c = r["rec"], r["constraints"]
    rec_rows = derive(pd.concat([rec.best.to_frame().T, rec.runner_ups]).reset_index(drop=True)
                      .infer_objects(), c.tokens, c.failures)
    labels = ["best"] + [f"robust {i + 1}" for i in range(len(rec.runner_ups))]
    cnt = r["counts"]
    out = [f"# sweep report: {r['run']}", "",
           f"model {r['model']}; GPU types {', '.join(r['gpus'])}; cluster sizes "
           f"{', '.join(str(s) for s in r['sizes'])}; {cnt['total']:,} configurations "
           f"({cnt['ok']:,} fit); objective {r['objective']}; constraints: "
           f"{'; '.join(c.describe()) or 'none'}", "",
           "## Recommendation", "", md_table(*top_rows(rec_rows, labels, c.tokens)), "",
           "## Cost vs throughput: Pareto frontier", ""]
    if plot_dir:
        out += [f"![frontier]({plot_dir}/frontier.png)", ""]
    out += [md_table(*frontier_rows(r["front"], c.tokens)), ""]
    if r.get("scaling") and r["scaling"][0]:
        out += ["## Failures, checkpoints and restarts: adding GPUs", "", SCALING_NOTE, "",
                md_table(*r["scaling"]), ""]
    out += ["### Each GPU type's own frontier", "",
            md_table(*frontier_rows(r["gpu_front"], c.tokens)), ""]
    if len(r.get("precision_front", ())):
        out += ["### Each precision's own frontier (BF16, FP8, FP4)", ""]
        if plot_dir:
            out += [f"![frontier per precision]({plot_dir}/precision_frontier.png)", ""]
        out += [md_table(*precision_rows(r["precision_front"], c.tokens)), ""]
    if plot_dir:
        out += ["## Step-time breakdown", "", f"![breakdown]({plot_dir}/breakdown.png)", "",
                "## TP x PP heatmap", "", f"![heatmap]({plot_dir}/heatmap.png)", "",
                "## Memory of the winner", "", f"![memory]({plot_dir}/memory.png)", ""]
    out += ["## Why the best beats the rule of thumb", ""] + [f"- {s}" for s in r["why"]]
    out += ["", "## Megatron-LM flags for the winner", "", "```bash", r["megatron"].rstrip(),
            "```", ""]
    return "\n".join(out)


def save_report(r: dict, out: Path, html_of, md_of) -> dict:
    """Write a built report: report_plots/*.png (its `png`), report.html and report.md (with
    the plots linked from report_plots/); returns it with the two paths."""
    plots = out / "report_plots"
    plots.mkdir(parents=True, exist_ok=True)
    for name, png in r["png"].items():
        (plots / f"{name}.png").write_bytes(png)
    (out / "report.html").write_text(html_of(r), encoding="utf-8")
    (out / "report.md").write_text(md_of(r, "report_plots"), encoding="utf-8")
    r["html"], r["md"] = out / "report.html", out / "report.md"
    return r


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, **kw) -> dict:
    """Write report.html, report.md and report_plots/*.png; returns the build dict + paths."""
    out = Path(out_dir) if out_dir else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    return save_report(build(run_dir, **kw), out, render_html, render_md)


# ---------------------------------------------------------------------------------------------
# Headless Chromium
# ---------------------------------------------------------------------------------------------
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("SWEEP_CHROMIUM")
    if env:
        return env if shutil.which(env) or Path(env).exists() else None
    for b in BROWSERS:
        p = shutil.which(b)
        if p:
            return p
    return None


def chromium_cmd(browser: str, profile: str) -> list[str]:
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
            "--mute-audio", f"--user-data-dir={profile}"]


def run_chromium(html_path: str | Path, *extra: str, timeout: float = 60) -> \
        subprocess.CompletedProcess:
    browser = find_chromium()
    if not browser:
        raise SweepError("no Chromium found (install chromium, or set SWEEP_CHROMIUM)")
    url = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="sweep-chromium-") as prof:
        return subprocess.run(chromium_cmd(browser, prof) + list(extra) + [url],
                              capture_output=True, text=True, timeout=timeout)


def page_height(html_text: str) -> int:
    """A generous estimate of the page height in CSS pixels (images at 110 dpi, tables)."""
    import re

    h = 400
    for b64 in re.findall(r'src="data:image/png;base64,([^"]+)"', html_text):
        png = base64.b64decode(b64[:64] + "=" * (-len(b64[:64]) % 4))
        w, hh = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        h += int(hh * min(1.0, 1052 / max(w, 1))) + 40
    h += 24 * html_text.count("<tr>") + 16 * html_text.count("\n", html_text.find("<pre>"))
    h += 60 * html_text.count("<h2>") + 40 * html_text.count("<li>")
    h += 600 * html_text.count('class="plotly-graph-div"') + 400  # plots + YAML panel
    return min(h, 16000)


def screenshot(html_path: str | Path, png_path: str | Path, width: int = 1200) -> Path:
    """Render the report with headless Chromium into a PNG (full page, estimated height)."""
    html_path, png_path = Path(html_path), Path(png_path).resolve()
    height = page_height(html_path.read_text(encoding="utf-8"))
    res = run_chromium(html_path, f"--window-size={width},{height}",
                       "--virtual-time-budget=10000", f"--screenshot={png_path}")
    if not png_path.exists():
        raise SweepError(f"chromium wrote no screenshot (exit {res.returncode}): "
                         f"{(res.stderr or '').strip().splitlines()[-1:]}")
    return png_path


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------






