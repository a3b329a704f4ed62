"""The simulator against published, measured runs: what `sweep validate` prints.

Prints, per row, predicted vs measured step time (and peak memory where measured) with the
error, then a summary by source family and by GPU: median / p90 / max absolute error, bias
(median signed error: negative = we predict too fast) and Spearman rank correlation of
throughput within each family. Writes the table as CSV and a log-log plot when asked.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd


class DatasetError(ValueError):
    """A dataset that cannot be compared (one line; the CLI exits 2 on it)."""

TABLE_COLUMNS = ["id", "family", "label", "task", "gpu", "num_gpus", "precision", "tp", "pp", "cp", "vpp",
                 "micro_batch", "recompute", "zero", "imputed", "measured_step_s",
                 "predicted_step_s", "step_error", "measured_mem_gib", "predicted_mem_gib",
                 "mem_error"]


MODEL_FAMILIES = [("deepseek", r"deepseek"), ("qwen3", r"qwen"), ("gpt-oss", r"gpt.?oss"),
                  ("mixtral", r"mixtral"), ("llama", r"llama"), ("nemotron", r"nemotron"),
                  ("mpt", r"mpt"), ("gpt", r"gpt")]


def model_family(label: str) -> str:
    for fam, pat in MODEL_FAMILIES:
        if re.search(pat, label, re.I):
            return fam
    return "other"


SUBSETS = {
    "all": lambda t: pd.Series(True, index=t.index),
    "dense": lambda t: t["gpu"].str.match(r"^(a100|h100)") & ~t["is_moe"],
    "moe": lambda t: t["is_moe"],
    "long-context": lambda t: (t["seq_len"] >= 32768) | (t["cp"] > 1),
    "blackwell-dense": lambda t: t["gpu"].str.match(r"^(b200|gb200)") & ~t["is_moe"],
}


SEQ_BUCKETS = [(0, 768, "512"), (768, 1536, "1k"), (1536, 3072, "2k"), (3072, 6144, "4k"),
               (6144, 12288, "8k"), (12288, 24576, "16k"), (24576, 49152, "32k"),
               (49152, 98304, "64k"), (98304, np.inf, "128k+")]
SIZE_BUCKETS = [(0, 1, "<1B"), (1, 3, "1-3B"), (3, 10, "3-10B"), (10, 30, "10-30B"),
                (30, 100, "30-100B"), (100, 300, "100-300B"), (300, np.inf, "300B+")]


def _bucket(values: pd.Series, buckets) -> pd.Series:
    out = pd.Series("unknown", index=values.index, dtype=object)
    for lo, hi, name in buckets:
        out[(values >= lo) & (values < hi)] = name
    return out


def bucket_medians(table: pd.DataFrame) -> dict:
    """{'sequence length': frame, 'model size (total parameters)': frame, and the same two
    split by GPU ('sequence length, by GPU', ...)}: signed median step-time error
    (predicted / measured - 1; + = predicted too slow), median |error| and n per bucket, in
    bucket order; the buckets users sweep, where a bias at the edges shows. The GPU split
    has one row per (bucket, GPU), so that a trend on one GPU is not hidden by another's rows
    in the same bucket."""
    t = table[table["step_error"].notna()]
    out = {}
    split = {}
    for title, col, buckets in (("sequence length", "seq_len", SEQ_BUCKETS),
                                ("model size (total parameters)", "params_b", SIZE_BUCKETS)):
        key = _bucket(t[col].astype(float), buckets)
        rows, by_gpu = [], []
        for _, _, name in list(buckets) + [(0, 0, "unknown")]:
            sel = t[key == name]
            if len(sel):
                rows.append(_bucket_row(name, sel["step_error"]))
            for gpu, g in sel.groupby("gpu", sort=True):
                by_gpu.append({"gpu": gpu, **_bucket_row(name, g["step_error"])})
        out[title] = pd.DataFrame(rows)
        split[f"{title}, by GPU"] = pd.DataFrame(
            by_gpu, columns=["gpu", "bucket", "n", "signed_median", "median_abs_err"])
    return {**out, **split}


def _bucket_row(name: str, e: pd.Series) -> dict:
    return {"bucket": name, "n": len(e), "signed_median": e.median(),
            "median_abs_err": e.abs().median()}


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Rank correlation (ties averaged); NaN for fewer than three points."""
    if len(a) < 3:
        return float("nan")
    return float(np.corrcoef(a.rank().to_numpy(), b.rank().to_numpy())[0, 1])


def summarize(table: pd.DataFrame, by: str) -> pd.DataFrame:
    rows = {}
    groups = list(table.groupby(by)) + [("all", table)]
    for key, g in groups:
        e = g["step_error"].dropna()
        me = g["mem_error"].dropna()
        tput_pred = 1 / g["predicted_step_s"]
        tput_meas = 1 / g["measured_step_s"]
        rows[key] = {
            "rows": len(e),
            "median_abs_err": e.abs().median(),
            "p90_abs_err": e.abs().quantile(0.9),
            "max_abs_err": e.abs().max(),
            "bias": e.median(),
            "within_10pct": (e.abs() <= 0.10).mean(),
            "spearman": spearman(tput_pred, tput_meas) if key != "all" else np.nan,
            "mem_rows": len(me),
            "mem_median_abs_err": me.abs().median() if len(me) else np.nan,
        }
    return pd.DataFrame(rows).T


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for fam, g in table.groupby("family"):
        ax.scatter(g["measured_step_s"], g["predicted_step_s"], label=fam, s=18)
    lo = np.nanmin(table[["measured_step_s", "predicted_step_s"]].to_numpy()) / 1.5
    hi = np.nanmax(table[["measured_step_s", "predicted_step_s"]].to_numpy()) * 1.5
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.2, label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("sweep validate: predicted vs measured")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)




def markdown_summary(table: pd.DataFrame, held: dict | None = None) -> str:
    """Per-subset accuracy as a Markdown table (what the README shows). `held` (from
    held_out_medians) adds each row's held-out median error: the fitted constants refitted
    without that source family (dense) or that model (MoE)."""
    held = held or {}
    lines = ["| rows | n | median abs err | held out | p90 abs err | max abs err | bias "
             "| within 10% |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("dense", "moe", "long-context", "blackwell-dense"):
        sub = table[SUBSETS[name](table)]
        for fam, g in [(f"{name}: all", sub)] + [(f"{name}: {k}", v)
                                                  for k, v in sub.groupby("family")]:
            e = g["step_error"].dropna()
            out = f"{held[fam]:.1%}" if fam in held else "-"
            lines.append(f"| {fam} | {len(e)} | {e.abs().median():.1%} | {out} | "
                         f"{e.abs().quantile(0.9):.1%} | {e.abs().max():.1%} | "
                         f"{e.median():+.1%} | {(e.abs() <= 0.10).mean():.0%} |")
    mem = table["mem_error"].dropna()
    lines.append(f"| peak memory (torchtitan rows) | {len(mem)} | {mem.abs().median():.1%} | - | "
                 f"{mem.abs().quantile(0.9):.1%} | {mem.abs().max():.1%} | "
                 f"{mem.median():+.1%} | {(mem.abs() <= 0.10).mean():.0%} |")
    return "\n".join(lines)


def loso_table() -> pd.DataFrame:
    """Held-out error of the fitted dense constants, one source family left out at a time."""
    from . import fit

    return fit.leave_one_source_out(fit.dense_rows())


def held_out_medians() -> dict:
    """{README row: held-out median |error|}: dense constants refitted without each source
    family (and over all their held-out rows), the MoE constant without each model."""
    from . import fit

    rows: list = []
    dense = fit.leave_one_source_out(fit.dense_rows(), per_row=rows)
    held = {f"dense: {f}": v for f, v in zip(dense["held_out"], dense["median_abs_err"])}
    held["dense: all"] = pd.concat(rows).abs().median()
    moe = fit.moe_rows()
    rows = []
    fit.leave_one_source_out(moe.assign(model_id=moe["model"]), by="model_id",
                             params=fit.FITTED_MOE, per_row=rows)
    held["moe: all"] = pd.concat(rows).abs().median()
    return held


def load_dataset(dataset: str | Path | None) -> pd.DataFrame:
    """The published_runs CSV (the shipped one for None), with one-line errors."""
    from . import validation

    if dataset and not Path(dataset).is_file():
        raise DatasetError(f"dataset: no such file '{dataset}'")
    try:
        return validation.load_published(dataset)
    except (KeyError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DatasetError(f"dataset: not in the published_runs format ({exc})") from None


def compare(data: pd.DataFrame) -> pd.DataFrame:
    """Predicted vs measured for every row that can be compared (`sweep validate`'s table);
    a one-line error (each row's reason on stderr) when none can."""
    from . import validation

    skipped = data[data["skip"] != ""]
    if len(skipped) == len(data):
        for _, r in skipped.iterrows():
            print(f"row {r['id']} ({r['label']}): skipped: {r['skip']}", file=sys.stderr)
        raise DatasetError(f"dataset: none of its {len(data)} rows can be compared "
                         "(reasons above, one per row)")
    return validation.validate(data)



