"""`sweep recommend RESULTS_DIR`: the best configuration under an objective and constraints,
robust runner-ups, and launchable recipes (Megatron-LM flags, torchtitan TOML, run YAML).

Constraints (all optional):
  --headroom 8 | 8GiB | 10% | 0.1   memory left free: peak_memory <= capacity - headroom
                                     (a number below 1 or a percentage is a fraction of HBM)
  --max-gpus N                       at most N GPUs
  --tokens 300B                      a token budget (needed by --budget and --deadline)
  --budget USD                       total cost of training on --tokens
  --deadline DAYS                    wall-clock days to train on --tokens
  --gpu ID, --num-gpus N             restrict to these GPU types / cluster sizes (repeatable)
Objectives: step_time (default), cost (USD per million tokens), throughput (tokens/s per GPU),
days (time to train on --tokens). Days and cost count failures, checkpoints and restarts (the
goodput of sim_core/goodput.py: useful time / wall time) unless --no-failures. Runner-ups:
configurations within --within percent (default 5) of the best objective value that leave more
memory headroom, most headroom first.
Recipes are written to RESULTS_DIR/recipe/ (recommendation.txt/json, megatron_args.sh,
torchtitan.toml, run.yaml, and deepspeed_config.json or nanotron.yaml for a run of that
framework) unless --no-write.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim_core.risk import DEFAULT_MAX_RISK

from . import export
from ..engine.evaluate import profile_line
from ..errors import SweepError

OBJECTIVES = {  # name -> (column, ascending, header)
    "step_time": ("step_time_s", True),
    "cost": ("cost_per_mtok_usd", True),  # cost_per_mtok_goodput_usd when failures count
    "throughput": ("tokens_per_s_per_gpu", False),
    "days": ("days", True),
}
CONFIG_COLS = ["framework", "gpu", "num_gpus", "tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch", "recompute",
               "sequence_parallel", "zero", "precision"]


# ---------------------------------------------------------------------------------------------
# Reading a run
# ---------------------------------------------------------------------------------------------
def load_run(run_dir: str | Path, columns: list[str] | None = None,
             filters: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Rows of a results folder (or of the file itself) and its sweep metadata, read through a
    pyarrow dataset: only `columns` (None: all), only rows matching `filters`
    ({column: value or values}, pushed down to the scan)."""
    from ..results import read_results

    # one-line errors: corrupt file, other schema version
    return read_results(_results_file(run_dir), columns=columns, filters=filters)


# What choosing a configuration reads of every row that fits; the rows shown and exported
# are read again in full (read_full).
SELECT_COLUMNS = ["config_id", "status", "model", "seq_len", "global_batch", "step_time_s",
                  "tokens_per_s_per_gpu", "mfu", "peak_memory_gib", "oom_risk", "price_per_hour",
                  "gpu_hours_per_step", "cost_per_step_usd", "cost_per_mtok_usd", "cost_usd",
                  "goodput", "interruptions_per_day", *CONFIG_COLS]


# read too where the results carry them: a run calibration's 10-90% step-time interval
OPTIONAL_COLUMNS = ["step_time_lo_s", "step_time_hi_s"]
READ_COLUMNS = SELECT_COLUMNS + OPTIONAL_COLUMNS

# What counting reads of every row that fits (recommend_chunks' first pass, `count_columns`):
# what `derive` needs and what the default constraint and the default objective use; the
# configuration's own columns are read only for the rows near the best. A third of the columns:
# about half the time of a scan that reads every row that fits.
COUNT_COLUMNS = ["status", "gpu", "peak_memory_gib", "global_batch", "seq_len", "step_time_s",
                 "oom_risk", "goodput", *OPTIONAL_COLUMNS]


def count_columns(objective: str, c: "Constraints", prices: dict | None = None) -> list[str]:
    """The columns the first pass of `recommend_chunks` reads: COUNT_COLUMNS and what the
    objective and the constraints use (every column a recommendation reads with prices, which
    reprice from the GPU count, the step time and the stored prices)."""
    if prices:
        return list(READ_COLUMNS)
    cols = list(COUNT_COLUMNS)
    if c.num_gpus or c.max_gpus:
        cols.append("num_gpus")
    if objective == "throughput":
        cols.append("tokens_per_s_per_gpu")
    if objective == "cost" or c.budget is not None:
        cols.append("cost_per_mtok_usd")
    return cols


def load_fits(run_dir: str | Path, c: "Constraints | None" = None,
              columns: list[str] | None = READ_COLUMNS) -> tuple[pd.DataFrame, dict]:
    """The rows that fit (status ok), with the columns a recommendation compares."""
    return load_run(run_dir, columns=columns, filters={"status": "ok"})


def fit_chunks(run_dir: str | Path, columns: list[str] | None = READ_COLUMNS):
    """(chunks, metadata): chunks(near, only) yields the rows that fit in pieces, with the
    columns a recommendation compares (`recommend_chunks` says what `near` and `only` are), so
    that the memory of a recommendation does not grow with the results. Every row that fits is
    read once (the count of those that fit is part of the answer); the constraints are applied
    to each piece."""
    from ..results import open_results, scan_results

    path = _results_file(run_dir)
    _, meta = open_results(path)  # one-line errors: corrupt file, other schema version
    filters = {"status": "ok"}
    def chunks(near=None, only=None):
        where = None
        if near is not None:
            import pyarrow.compute as pc

            col, lo, hi = near
            where = (pc.field(col) >= lo) & (pc.field(col) <= hi)
        cols = columns if only is None or columns is None else [c for c in columns if c in only]
        return scan_results(path, columns=cols, filters=filters, where=where)

    return chunks, meta


def _results_file(run_dir: str | Path) -> Path:
    """results.parquet of a results folder (or the path itself); one-line errors when none."""
    p = Path(run_dir)
    path = p / "results.parquet" if p.is_dir() else p
    if not path.exists():
        if p.is_dir() and (p / "parts").is_dir():
            raise SweepError(f"{p}: the sweep has not finished (no results.parquet yet); "
                             "re-run `sweep search` to resume it")
        raise SweepError(f"{p}: no results.parquet (expected a `sweep search` results folder)")
    return path


def read_rows(run_dir: str | Path, ids, tokens=None, prices: dict | None = None,
              failures: bool = True) -> pd.DataFrame:
    """The rows of `ids` with every column, repriced and derived, indexed by config_id."""
    full, _ = load_run(run_dir, filters={"config_id": sorted({int(i) for i in ids})})
    return derive(reprice(full, prices or {}), tokens, failures).set_index("config_id",
                                                                            drop=False)


def rec_ids(rec: "Recommendation") -> list[int]:
    """config_ids of the best and runner-up rows (best first)."""
    return [int(rec.best["config_id"])] + [int(i) for i in rec.runner_ups["config_id"]]


def read_full(run_dir: str | Path, rec: "Recommendation", tokens=None,
              prices: dict | None = None, rows: pd.DataFrame | None = None) -> "Recommendation":
    """The best and runner-up rows of `rec` with every column (read by config_id, or taken
    from `rows`, a read_rows frame that holds them)."""
    if not rec.found:
        return rec
    ids = rec_ids(rec)
    full = read_rows(run_dir, ids, tokens, prices, rec.constraints.failures) if rows is None \
        else rows
    best = full.loc[ids[0]]
    ups = full.loc[ids[1:]].reset_index(drop=True) if len(ids) > 1 else full.iloc[:0]
    for name in rec.best.index:  # derived columns (days, ...) as the selection computed them
        if name not in best.index:
            best[name] = rec.best[name]
    rec.best, rec.runner_ups = best, ups
    return rec


def parse_prices(items) -> dict:
    """['h100-sxm=2.5', 'aws-p5=4.1', ...] -> {'h100-sxm': 2.5, 'aws-p5': 4.1} (GPU or
    instance ids)."""
    out = {}
    for it in items or []:
        gpu, _, usd = str(it).partition("=")
        try:
            out[gpu.strip().lower()] = float(usd)
        except ValueError:
            raise SweepError(f"--price: expected GPU=USD_PER_HOUR or INSTANCE=USD_PER_HOUR, "
                             f"got {it!r}") from None
        if not gpu.strip() or out[gpu.strip().lower()] <= 0:
            raise SweepError(f"--price: expected GPU=USD_PER_HOUR, got {it!r}")
    return out


def reprice(df: pd.DataFrame, prices: dict) -> pd.DataFrame:
    """Recompute the cost columns with per-GPU price overrides (others keep their price)."""
    if not prices or not len(df):
        return df
    from ..results import add_costs

    current = df.groupby("gpu")["price_per_hour"].first().to_dict() \
        if "price_per_hour" in df.columns else {}
    table = {g: prices.get(str(g).lower(), current.get(g, float("nan")))
             for g in df["gpu"].unique()}
    if "instance" in df.columns:  # an instance's own price (catalog or --price INSTANCE=USD)
        own = df.groupby("instance")["price_per_hour"].first().to_dict() \
            if "price_per_hour" in df.columns else {}
        table.update({i: prices.get(str(i).lower(), own.get(i, float("nan")))
                      for i in df["instance"].dropna().unique() if str(i)})
    cost_unit = "step" if ("cost_usd" in df.columns and "cost_per_step_usd" in df.columns
                           and np.allclose(df["cost_usd"].fillna(0),
                                           df["cost_per_step_usd"].fillna(0))
                           and not np.allclose(df["cost_usd"].fillna(0),
                                               df["cost_per_mtok_usd"].fillna(0))) else "mtok"
    return add_costs(df.copy(), table, cost_unit)


def capacity_gib(gpus: pd.Series) -> pd.Series:
    from sim_core import catalog

    # each GPU looked up once, then taken by code (Series.map hashes every row's string)
    codes, uniq = pd.factorize(gpus, use_na_sentinel=True)
    caps = np.array([float(catalog.get_gpu(g).hbm_gib) for g in uniq] + [np.nan])
    return pd.Series(caps[codes], index=gpus.index, name=gpus.name)


DERIVED = ("capacity_gib", "headroom_gib", "headroom_frac", "tokens_per_s", "days",
           "total_cost_usd", "cost_per_mtok_goodput_usd", "interruptions", "step_time_pick_s")


def has_goodput(df: pd.DataFrame) -> bool:
    """Whether the rows carry the simulator's goodput (results written before it do not)."""
    return "goodput" in df.columns and bool(df["goodput"].notna().any())


def derive(df: pd.DataFrame, tokens: float | None = None, failures: bool = True) -> pd.DataFrame:
    """Add capacity_gib, headroom_gib, headroom_frac, tokens_per_s (cluster),
    cost_per_mtok_goodput_usd and, with a token budget, days, total_cost_usd and the expected
    interruptions. With `failures` (and rows that carry it) time and cost are divided by the
    goodput: a job interrupted, checkpointing and restarting takes longer to train the same
    tokens; without, the failure-free figures."""
    df = df.copy()
    if not len(df):
        for c in DERIVED:
            df[c] = pd.Series(dtype=float)
        return df
    df["capacity_gib"] = capacity_gib(df["gpu"])
    df["headroom_gib"] = df["capacity_gib"] - df["peak_memory_gib"]
    df["headroom_frac"] = df["headroom_gib"] / df["capacity_gib"]
    tok_step = df["global_batch"].astype(float) * df["seq_len"].astype(float)
    df["tokens_per_s"] = tok_step / df["step_time_s"]
    # what the step_time objective ranks by: a run calibration's 90% quantile where the rows
    # carry one (sweep calibrate runs: the pick that is fast even when the prediction is off),
    # the prediction itself otherwise
    df["step_time_pick_s"] = (df["step_time_hi_s"].astype(float).fillna(df["step_time_s"])
                              if "step_time_hi_s" in df.columns else df["step_time_s"])
    good = df["goodput"].astype(float) if failures and "goodput" in df.columns else 1.0
    cost = df["cost_per_mtok_usd"] if "cost_per_mtok_usd" in df.columns else np.nan
    df["cost_per_mtok_goodput_usd"] = cost / good
    if tokens:
        df["days"] = tokens / (df["tokens_per_s"] * good) / 86400.0
        df["total_cost_usd"] = df["cost_per_mtok_goodput_usd"] * tokens / 1e6
        df["interruptions"] = (df["interruptions_per_day"] * df["days"]
                               if "interruptions_per_day" in df.columns else np.nan)
    else:
        df["days"] = np.nan
        df["total_cost_usd"] = np.nan
        df["interruptions"] = np.nan
    return df


# ---------------------------------------------------------------------------------------------
# Constraints
# ---------------------------------------------------------------------------------------------
_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text) -> float:
    """'300B', '1.2T', '5e11', '500M' -> a number of tokens."""
    s = str(text).strip().lower().replace("_", "").replace(",", "")
    m = re.fullmatch(r"([0-9.]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*(?:tok(?:ens)?)?", s)
    if not m:
        raise SweepError(f"--tokens: expected a number like 300B, 1.2T or 3e11, got {text!r}")
    v = float(m.group(1)) * _UNITS.get(m.group(2), 1.0)
    if v <= 0:
        raise SweepError(f"--tokens: expected a positive number, got {text!r}")
    return v


def parse_headroom(text) -> tuple[float, str]:
    """'8' / '8GiB' -> (8, 'gib'); '10%' -> (0.1, 'frac'); '0.1' -> (0.1, 'frac')."""
    s = str(text).strip().lower().replace(" ", "")
    try:
        if s.endswith("%"):
            v, kind = float(s[:-1]) / 100.0, "frac"
        else:
            m = re.fullmatch(r"([0-9.]+)(gib|gb|g)?", s)
            if not m:
                raise ValueError
            v = float(m.group(1))
            kind = "gib" if (m.group(2) or v >= 1) else "frac"
    except ValueError:
        raise SweepError(f"--headroom: expected GiB (8, 8GiB) or a fraction (0.1, 10%), "
                         f"got {text!r}") from None
    if v < 0 or (kind == "frac" and v >= 1):
        raise SweepError(f"--headroom: out of range: {text!r}")
    return v, kind


@dataclass
class Constraints:
    # None: keep configurations whose OOM risk is at most max_oom_risk (the default margin);
    # a headroom (8GiB, 10%) replaces it; 0 gives the raw ranking
    headroom: str | None = None
    max_oom_risk: float = DEFAULT_MAX_RISK
    max_gpus: int | None = None
    budget: float | None = None
    deadline: float | None = None  # days
    tokens: float | None = None
    gpus: list = field(default_factory=list)
    num_gpus: list = field(default_factory=list)
    # count failures, checkpoints and restarts in days and cost (False: --no-failures)
    failures: bool = True

    def check(self) -> None:
        if (self.budget is not None or self.deadline is not None) and not self.tokens:
            raise SweepError("--budget and --deadline need --tokens (the token budget to train on)")

    def risk_filter(self) -> bool:
        """The default margin: no explicit headroom was asked for."""
        return self.headroom is None

    def describe(self) -> list[str]:
        out = []
        if self.risk_filter():
            out.append(f"OOM risk <= {self.max_oom_risk:.0%} (the memory model's measured error "
                       "for the framework; --headroom 0 for the raw ranking)")
        if self.headroom is not None:
            v, kind = parse_headroom(self.headroom)
            out.append(f"memory headroom >= {v:g} GiB" if kind == "gib"
                       else f"memory headroom >= {v:.0%} of HBM")
        if self.max_gpus:
            out.append(f"at most {self.max_gpus} GPUs")
        if self.gpus:
            out.append("GPU in " + ", ".join(self.gpus))
        if self.num_gpus:
            out.append("num_gpus in " + ", ".join(str(n) for n in self.num_gpus))
        if self.tokens:
            out.append(f"token budget {self.tokens:.3g}")
        if self.budget is not None:
            out.append(f"total cost <= ${self.budget:,.0f}")
        if self.deadline is not None:
            out.append(f"time to train <= {self.deadline:g} days")
        if not self.failures:
            out.append("failure-free (--no-failures)")
        return out


def feasible(df: pd.DataFrame, c: Constraints) -> tuple[pd.Series, list[tuple[str, int]]]:
    """Mask of configurations that fit and meet every constraint, and how many each
    constraint removed (applied in order, among those that fit)."""
    mask = (df["status"] == "ok") & df["step_time_s"].notna()
    dropped = []

    def apply(name, cond):
        nonlocal mask
        new = mask & cond
        dropped.append((name, int(mask.sum() - new.sum())))
        mask = new

    if c.gpus:
        want = {g.lower() for g in c.gpus}
        apply("gpu", df["gpu"].str.lower().isin(want))
    if c.num_gpus:
        apply("num_gpus", df["num_gpus"].isin([int(n) for n in c.num_gpus]))
    if c.max_gpus:
        apply("max_gpus", df["num_gpus"] <= c.max_gpus)
    if c.risk_filter() and "oom_risk" in df.columns:
        apply("oom_risk", df["oom_risk"].fillna(1.0) <= c.max_oom_risk)
    if c.headroom is not None:
        v, kind = parse_headroom(c.headroom)
        apply("headroom", (df["headroom_gib"] >= v) if kind == "gib"
              else (df["headroom_frac"] >= v))
    if c.budget is not None:
        apply("budget", df["total_cost_usd"] <= c.budget)
    if c.deadline is not None:
        apply("deadline", df["days"] <= c.deadline)
    return mask, dropped


# ---------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------
@dataclass
class Recommendation:
    best: pd.Series | None
    runner_ups: pd.DataFrame
    objective: str
    within: float
    constraints: Constraints
    candidates: int
    fits: int
    dropped: list
    run_name: str = ""
    profile: str = ""  # the calibration profile the results were simulated with

    @property
    def found(self) -> bool:
        return self.best is not None

    def __str__(self) -> str:  # what `sweep recommend` prints (print(rec) in a notebook)
        return render(self)


def recommend(df: pd.DataFrame, objective: str = "step_time", constraints: Constraints | None = None,
              within: float = 0.05, runner_ups: int = 3, run_name: str = "") -> Recommendation:
    """The recommendation among the rows of a frame (see `recommend_chunks`)."""
    return recommend_chunks(lambda near=None, only=None: iter([df]), objective, constraints,
                            within, runner_ups, run_name)


def recommend_chunks(chunks, objective: str = "step_time",
                     constraints: Constraints | None = None,
                     within: float = 0.05, runner_ups: int = 3, run_name: str = "",
                     prices: dict | None = None) -> Recommendation:
    """The best row that fits and meets the constraints (ties: more headroom, fewer GPUs, lower
    config_id), and the runner-ups within `within` of it with more headroom, most first.

    chunks(near, only) yields the rows piece by piece and is called twice, so only a piece and
    the rows kept are in memory at a time:
      1. only=count_columns(...): every row that fits, with only the columns that counting
         and the objective need (a reader may give more), for the counts of the answer (rows that fit,
         that meet the constraints, that each constraint removed) and the best objective value;
      2. near=(column, lowest, highest): the rows whose stored column can be within `within`
         of that value (a reader may give more: the rows are filtered here anyway), with every
         column, for the best row and the runner-ups. The best is among them (its value is the
         best value), so it is the one a sort of every row would give, and these rows are
         usually a small share of all (a scan that filters on the column skips the others).
         Where the objective is no stored column (days; cost divided by the goodput, repriced)
         `near` is None and every row is read again.
    `prices` reprices each piece (`reprice`)."""
    c = constraints or Constraints()
    c.check()
    if objective not in OBJECTIVES:
        raise SweepError(f"--objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "days" and not c.tokens:
        raise SweepError("--objective days needs --tokens")
    col, asc = objective_column(objective, c.failures)
    order = ([col, "headroom_gib", "num_gpus", "config_id"], [asc, False, True, True])

    def candidates(near=None, only=None):
        """(derived piece, its feasible rows with an objective value, what each constraint
        dropped, rows that fit) for every piece."""
        for piece in chunks(near, only):
            d = derive(reprice(piece, prices or {}), c.tokens, c.failures)
            mask, dropped = feasible(d, c)
            fit = int(((d["status"] == "ok") & d["step_time_s"].notna()).sum())
            yield d, d[mask & d[col].notna()], dropped, fit

    # 1. the counts and the best objective value
    b, fits, n, dropped, empty, picked = None, 0, 0, {}, None, False
    for d, cand, drops, fit in candidates(only=count_columns(objective, c, prices)):
        empty = d.iloc[:0] if empty is None else empty
        # a run calibration's 90% quantile is what the step time objective ranks by (derive)
        picked = picked or "step_time_hi_s" in d.columns
        fits += fit
        n += len(cand)
        for name, k in drops:
            dropped[name] = dropped.get(name, 0) + k
        if len(cand):
            v = float(cand[col].min() if asc else cand[col].max())
            b = v if b is None else (min(b, v) if asc else max(b, v))
    dropped = list(dropped.items())
    if b is None:
        return Recommendation(None, empty, objective, within, c, 0, fits, dropped, run_name)

    # 2. the rows near the best value: the best, and the runner-ups (most headroom first, then
    # the selection's order) among them
    r_order = (["headroom_gib", col, "num_gpus", "config_id"], [False, asc, True, True])
    stored = col in SELECT_COLUMNS and not (prices and col.startswith("cost"))
    if col == "step_time_pick_s" and not picked:
        col_stored = "step_time_s"  # the pick is the step time itself (derive)
    else:
        col_stored = col if stored else None
    span = (b, b * (1 + within)) if asc else (b * (1 - within), b)
    near = None if col_stored is None else \
        (col_stored, span[0] - 1e-9 * abs(span[0]), span[1] + 1e-9 * abs(span[1]))
    best, pool = None, None
    for _, cand, _, _ in candidates(near):
        close = cand[cand[col] <= b * (1 + within)] if asc else cand[cand[col] >= b * (1 - within)]
        ties = close[close[col] == b]
        if len(ties):
            both = ties if best is None else pd.concat([best, ties])
            best = both.sort_values(order[0], ascending=order[1], kind="stable").head(1)
        # the first `runner_ups` of each piece in the runner-ups' order hold the runner-ups:
        # a row ranked above one of them has at least its headroom, more than the best's, so
        # is one of them too (config_id makes the order total)
        both = close if pool is None else pd.concat([pool, close])
        pool = both.sort_values(r_order[0], ascending=r_order[1], kind="stable") \
            .head(runner_ups)
    best = best.iloc[0]
    room = float(best["headroom_gib"])
    robust = pool[(pool["headroom_gib"] > room + 1e-9) & (pool["config_id"] != best["config_id"])]
    return Recommendation(best, robust.reset_index(drop=True), objective, within, c, n, fits,
                          dropped, run_name)


def objective_column(objective: str, failures: bool = True) -> tuple[str, bool]:
    """(column, ascending) an objective ranks by: cost per million tokens is divided by the
    goodput when failures count (derive), days always come from derive."""
    col, asc = OBJECTIVES[objective]
    if objective == "step_time":
        col = "step_time_pick_s"
    if objective == "cost" and failures:
        col = "cost_per_mtok_goodput_usd"
    return col, asc


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------
def _cell(col, v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or v is pd.NA:
        return "-"
    fmt = {"step_time_s": "{:.3f}", "step_time_lo_s": "{:.3f}", "step_time_hi_s": "{:.3f}", "tokens_per_s_per_gpu": "{:,.0f}", "mfu": "{:.1%}",
           "peak_memory_gib": "{:.1f}", "oom_risk": "{:.0%}", "headroom_gib": "{:.1f}",
           "cost_per_mtok_usd": "{:.3f}", "cost_per_mtok_goodput_usd": "{:.3f}",
           "goodput": "{:.1%}", "interruptions_per_day": "{:.2f}", "interruptions": "{:,.0f}",
           "days": "{:.1f}", "total_cost_usd": "{:,.0f}", "vs_best": "{:+.1%}"}.get(col)
    if fmt:
        return fmt.format(v)
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


HEADS = {"step_time_s": "step s", "step_time_lo_s": "step 10%", "step_time_hi_s": "step 90%",
         "tokens_per_s_per_gpu": "tok/s/gpu", "mfu": "MFU",
         "peak_memory_gib": "mem GiB", "oom_risk": "OOM risk", "headroom_gib": "free GiB", "cost_per_mtok_usd": "$/Mtok",
         "days": "days", "total_cost_usd": "total $", "vs_best": "vs best",
         "goodput": "goodput", "interruptions_per_day": "intr/day",
         "cost_per_mtok_goodput_usd": "$/Mtok eff", "interruptions": "interruptions",
         "sequence_parallel": "sp", "micro_batch": "mb", "recompute": "recompute",
         "num_gpus": "gpus"}


def table_rows(rows: pd.DataFrame, roles: list[str], objective_col: str, best_val: float,
               with_tokens: bool, failures: bool = False) -> str:
    rows = rows.copy()
    rows["vs_best"] = rows[objective_col] / best_val - 1 if best_val else np.nan
    # the instance type, when the rows name one, next to the framework (rows are read whole)
    shown = CONFIG_COLS[:1] + ["instance"] + CONFIG_COLS[1:]
    cols = [c for c in shown if c in rows.columns]
    cols += ["step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "mfu",
             "peak_memory_gib", "oom_risk",
             "headroom_gib", "cost_per_mtok_usd"]
    if failures:
        cols += ["cost_per_mtok_goodput_usd", "goodput", "interruptions_per_day"]
    cols = [c for c in cols if c in rows.columns or c == "vs_best"]
    if with_tokens:
        cols += ["days", "total_cost_usd"] + (["interruptions"] if failures else [])
    cols += ["vs_best"]
    heads = ["role"] + [HEADS.get(c, c) for c in cols]
    body = [[r] + [_cell(c, row[c]) for c in cols] for r, (_, row) in zip(roles, rows.iterrows())]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(heads)]
    fmt = "  ".join(("{:<%d}" if i == 0 else "{:>%d}") % w for i, w in enumerate(widths))
    return "\n".join([fmt.format(*heads)] + [fmt.format(*b) for b in body])


def render(rec: Recommendation) -> str:
    c = rec.constraints
    col, _ = objective_column(rec.objective, c.failures)
    lines = [f"recommendation{' for ' + rec.run_name if rec.run_name else ''} "
             f"(objective: {rec.objective}"
             + (", " + "; ".join(c.describe()) if c.describe() else "") + ")"]
    if rec.profile:
        lines.append(rec.profile)
    if rec.found and col == "step_time_pick_s" and "step_time_hi_s" in rec.best.index \
            and pd.notna(rec.best["step_time_hi_s"]):
        lines.append("ranked by the calibrated step time's 90% quantile (step 90%): the pick "
                     "that stays fast when the prediction is off")
    if not rec.found:
        lines.append(f"no configuration meets the constraints ({rec.fits:,} fit in memory)")
        for name, n in rec.dropped:
            if n:
                lines.append(f"  {name}: removed {n:,}")
        return "\n".join(lines)
    rows = pd.concat([rec.best.to_frame().T, rec.runner_ups])
    roles = ["best"] + [f"robust {i + 1}" for i in range(len(rec.runner_ups))]
    failures = c.failures and has_goodput(rows)
    lines.append(table_rows(rows, roles, col, float(rec.best[col]), bool(c.tokens), failures))
    if not len(rec.runner_ups):
        lines.append(f"(no configuration within {rec.within:.0%} of the best leaves more memory "
                     "headroom)")
    else:
        lines.append(f"robust runner-ups: within {rec.within:.0%} of the best {rec.objective}, "
                     "more memory headroom, most headroom first")
    lines.append(f"{rec.candidates:,} of {rec.fits:,} configurations that fit meet the constraints")
    lines.append(f"best: {export.describe(export.config_of(rec.best))}")
    lines += failure_summary(rec.best, c)
    return "\n".join(lines)


def failure_summary(best: pd.Series, c: Constraints) -> list[str]:
    """Lines on what failures, checkpoints and restarts cost the best configuration."""
    from .simulation import GOODPUT_KEYS, failure_lines

    f = {k: (float(best[k]) if k in best.index and pd.notna(best[k]) else None)
         for k in GOODPUT_KEYS}
    if f.get("goodput") is None:
        return ["(these results carry no goodput: re-run the search to count failures, "
                "checkpoints and restarts)"] if c.failures else []
    rows = [r for r in failure_lines(f) if None not in r]
    head = "failures, checkpoints, restarts of the best" + (
        "" if c.failures else " (not counted in days and cost: --no-failures)")
    return [head + ":"] + [f"  {k}: {v}" for k, v in rows]


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
def _jsonable(row: pd.Series) -> dict:
    return {k: export._py(v) for k, v in row.items()}


def write_recipe(rec: Recommendation, out_dir: str | Path) -> list[Path]:
    """recipe/: recommendation.txt + .json, megatron_args.sh, torchtitan.toml, run.yaml,
    deepspeed_config.json or nanotron.yaml when the best runs on that framework, and the launch
    files launch.sbatch (Slurm) and skypilot.yaml (SkyPilot task)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    text = render(rec)
    (d / "recommendation.txt").write_text(text + "\n")
    paths.append(d / "recommendation.txt")
    doc = {"objective": rec.objective, "within": rec.within,
           "constraints": {k: v for k, v in vars(rec.constraints).items() if v not in (None, [])},
           "candidates": rec.candidates, "fits": rec.fits,
           "best": _jsonable(rec.best) if rec.found else None,
           "runner_ups": [_jsonable(r) for _, r in rec.runner_ups.iterrows()]}
    (d / "recommendation.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths.append(d / "recommendation.json")
    if rec.found:
        own = export.FRAMEWORK_FORMATS.get(str(rec.best.get("framework", "")))
        for fmt, name in export.FILES.items():
            if fmt in export.FRAMEWORK_FORMATS.values() and fmt != own:
                continue  # a DeepSpeed / nanotron / llm-foundry recipe only for a run of it
            (d / name).write_text(export.export(rec.best, fmt))
            paths.append(d / name)
        from . import finetune_recipes  # torchtune / TRL + Accelerate / Megatron-Bridge PEFT

        for name, text in finetune_recipes.files_for(rec.best):
            (d / name).write_text(text)
            paths.append(d / name)
        from . import launch  # Slurm and SkyPilot files that start the recipe above

        for name, make in launch.FILES.values():
            (d / name).write_text(make(rec.best))
            paths.append(d / name)
    return paths


def recommend_after_search(out_dir: str | Path, objective: str | None = None) -> str:
    """Called at the end of `sweep search`: recommend with no constraints, write
    OUT_DIR/recipe/, and return the text to print (never raises for a run with no fit)."""
    try:
        chunks, meta = fit_chunks(out_dir)
        obj = objective or _default_objective(meta)
        rec = read_full(out_dir, recommend_chunks(chunks, obj,
                                                  run_name=str(meta.get("space", ""))))
        rec.profile = profile_line(meta) or ""
        if rec.found:
            write_recipe(rec, Path(out_dir) / "recipe")
        text = render(rec)
    except Exception as exc:  # noqa: BLE001 - a finished search must not fail here
        return f"(no recommendation: {type(exc).__name__}: {exc})"
    if rec.found:
        own = {"deepspeed": "DeepSpeed JSON, ", "nanotron": "nanotron YAML, ",
               "llm-foundry": "llm-foundry YAML, "}.get(
            str(rec.best.get("framework", "")), "")
        text += (f"\nrecipes ({own}Megatron-LM, torchtitan, run YAML, Slurm, SkyPilot): "
                 f"{Path(out_dir) / 'recipe'}/")
    return text


def write_traces(df: pd.DataFrame, rec: Recommendation, out_dir: str | Path) -> list[Path]:
    """DIR/best.json and DIR/rule_of_thumb.json: one simulated step of each as a trace (the
    rule of thumb as the report finds it in the same results; skipped when none fits)."""
    from .baseline import rule_of_thumb, short
    from .trace import write_trace_for_row

    d = Path(out_dir)
    paths = [write_trace_for_row(rec.best, d / "best.json",
                                 f"best {short(export.config_of(rec.best))}")]
    rot, rule = rule_of_thumb(derive(df), rec.best)
    if rot is None:
        print(f"no rule-of-thumb configuration fits ({rule}): no rule_of_thumb.json",
              file=sys.stderr)
    else:
        paths.append(write_trace_for_row(rot, d / "rule_of_thumb.json",
                                         f"rule of thumb {short(export.config_of(rot))}"))
    return paths


def _default_objective(meta: dict) -> str:
    objs = meta.get("objectives") or ["step_time"]
    first = objs[0]
    return first if first in OBJECTIVES else {"mfu": "throughput"}.get(first, "step_time")


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------










