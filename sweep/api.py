"""The Python API for notebooks: the CLI's own functions behind a small surface.

    import sweep
    res = sweep.search("search_spaces/quickstart.yaml")      # Ray started or joined as the CLI does
    res.top(10)                                              # a DataFrame
    res.recommend(headroom="8GiB", max_gpus=16).best        # a pandas Series
    sweep.simulate({"model": "llama3.1-8b", ...})            # a one-row DataFrame

Every function raises the CLI's one-line `SweepError` on bad input (the message the CLI prints
after `error:`). Nothing here simulates, ranks or recommends by itself: it calls
`advice.simulation.simulate_rows`, `engine.execution.run_search`, `advice.recommend.recommend`,
`advice.report.write_report` and `sim_core.accuracy.published.compare`, and reads results
through `advice.recommend.load_run` (`results.read_results`).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pandas as pd

from .errors import SweepError

__all__ = ["simulate", "search", "rl_search", "validate", "open_results", "Results"]


def _one_line(fn):
    """Errors of the layers below become the CLI's one-line SweepError (a CatalogError is a
    ValueError; its first line is what the CLI prints)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SweepError:
            raise
        except ValueError as exc:
            line = " ".join(str(exc).strip().split("\n")[0].split()) or type(exc).__name__
            raise SweepError(line) from None

    return wrapper


def _activate(profile) -> object | None:
    """The simulate function for a calibration profile (None: the default model)."""
    if not profile:
        return None
    from .engine.evaluate import ProfiledSimulate

    return ProfiledSimulate(profile)


# ---------------------------------------------------------------------------------------------
# simulate
# ---------------------------------------------------------------------------------------------
@_one_line
def simulate(run, *, profile: str | None = None) -> pd.DataFrame:
    """Simulate configurations; returns one row per configuration (all simulator columns,
    `status`, costs).

    `run` is a run file's mapping (dict), the path of a run YAML, or a DataFrame whose columns
    are run-frame fields (model, seq_len, global_batch, gpu, num_gpus, tp, pp, micro_batch, ...;
    unset fields take their defaults; a results DataFrame from `Results.to_pandas()` works
    too). A dict or file that is invalid raises, as `sweep simulate` does; in a DataFrame an
    invalid row is kept with status `invalid` and its `invalid_reason`.
    """
    sim = _activate(profile)
    if isinstance(run, pd.DataFrame):
        return _simulate_frame(run, sim)
    from .advice.simulation import simulate_rows
    from .config import load_run, parse_run

    if isinstance(run, (str, Path)):
        cfg = load_run(run)
    elif isinstance(run, dict) and run.get("task") == "rl":
        from .config.rl import parse_rl

        cfg = parse_rl(run)
    elif isinstance(run, dict):
        if "space" in run or "search" in run:
            raise SweepError("run: this is a search space (it has space:/search:); use "
                             "sweep.search")
        cfg = parse_run(run)
    else:
        raise SweepError(f"run: expected a dict, a YAML path or a DataFrame, got "
                         f"{type(run).__name__}")
    if getattr(cfg, "task", None) == "rl":  # RL post-training: one row per configuration
        from .engine.rl import evaluate

        return evaluate(cfg)
    rows, _ = simulate_rows(cfg, sim)
    return rows.reset_index(drop=True)


def _simulate_frame(frame: pd.DataFrame, sim) -> pd.DataFrame:
    from .config import INSTANCE_COLUMNS, check_instance, did_you_mean, instance_columns
    from .engine.evaluate import evaluate
    from .results import add_costs, gpu_prices
    from .engine.space import COLUMN_ORDER, PSEUDO_COLUMNS, SIM_COLUMNS

    known = set(SIM_COLUMNS) | set(PSEUDO_COLUMNS) | {"config_id", "instance"}
    unknown = [c for c in frame.columns if c not in known]
    if unknown and "status" not in frame.columns:  # a results frame carries its outputs along
        c = str(unknown[0])
        raise SweepError(f"run: unknown column {c!r} (columns are the run-frame fields of "
                         f"sim_core/specs.py){did_you_mean(c, sorted(known))}")
    df = frame[[c for c in frame.columns if c in known]].reset_index(drop=True).copy()
    if not len(df):
        raise SweepError("run: the DataFrame has no rows")
    if "instance" in df.columns:  # each instance type sets its GPU, node and network columns
        names = df["instance"].astype(str)
        sets = {i: instance_columns(check_instance(i, "run: instance").name)
                for i in names.unique()}
        for c in INSTANCE_COLUMNS:
            if c not in df.columns:
                df[c] = names.map({i: v[c] for i, v in sets.items()}).to_numpy()
        df["instance"] = names.map({i: v["instance"] for i, v in sets.items()}).to_numpy()
    if "nodes" in df.columns and "num_gpus" not in df.columns:
        df["num_gpus"] = df["nodes"] * df.get("gpus_per_node", 8)
    if "global_batch_tokens" in df.columns and "global_batch" not in df.columns:
        df["global_batch"] = df["global_batch_tokens"] // df["seq_len"]
    if "config_id" not in df.columns:
        df.insert(0, "config_id", range(len(df)))
    df = df[[c for c in COLUMN_ORDER if c in df.columns] + (["instance"] if "instance" in df
                                                             else [])]
    out = evaluate(df, sim)
    inst = out["instance"].unique() if "instance" in out.columns else ()
    return add_costs(out, gpu_prices(out["gpu"].unique(), instances=inst))


# ---------------------------------------------------------------------------------------------
# search and its results
# ---------------------------------------------------------------------------------------------
@_one_line
def search(space, out: str | Path | None = None, *, workers: int | None = None,
           address: str | None = None, strategy: str | None = None,
           trials: int | None = None, top: int | None = None, fresh: bool = False,
           progress: bool | None = None, profile: str | None = None) -> "Results":
    """Run `sweep search` on a space (YAML path, dict or parsed SpaceConfig); returns its
    Results.

    The keywords are the CLI's options: results go to `out` (default results/<name>/), and a
    second call resumes (`fresh=True` starts over). Ray is joined when it is already running
    in this process, else started on `address` or locally for the call (`workers` tasks).
    """
    from .config import SpaceConfig, load_space, parse_space
    from .engine.execution import run_search

    if isinstance(space, (str, Path)):
        cfg = load_space(space)
    elif isinstance(space, dict):
        cfg = parse_space({"name": "space", **space})
    elif isinstance(space, SpaceConfig):
        cfg = space.model_copy(deep=True)
    else:
        raise SweepError(f"space: expected a YAML path, a dict or a SpaceConfig, got "
                         f"{type(space).__name__}")
    if strategy is not None:
        if strategy not in ("grid", "optuna"):
            raise SweepError(f"strategy: expected grid or optuna, got {strategy!r}")
        cfg.search.strategy = strategy
    for name, value in (("trials", trials), ("top", top), ("workers", workers)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise SweepError(f"{name}: expected a positive integer, got {value!r}")
    if trials:
        cfg.search.trials = trials
    if top:
        cfg.search.top = top
    if progress is None:
        progress = sys.stderr.isatty()
    outcome = run_search(cfg, out, workers=workers, address=address, progress=progress,
                         fresh=fresh, simulate=_activate(profile))
    return Results(outcome.out_dir, note=outcome.note)


@_one_line
def rl_search(space, out: str | Path | None = None) -> pd.DataFrame:
    """`sweep search` of a `task: rl` space (YAML path or dict): writes results.parquet/,
    ranking.csv and recipe/ (verl, NeMo RL, step timeline) to `out` (default
    results/<name>/) and returns the ranking (the best configurations that fit, best first,
    at most max(top, 1000))."""
    from .advice.rl import write_recipes, write_trace
    from .config import load_space
    from .config.rl import parse_rl
    from .engine.rl import search as _rl

    cfg = load_space(space) if isinstance(space, (str, Path)) else parse_rl(
        {"name": "rl", **space})
    if getattr(cfg, "task", None) != "rl":
        raise SweepError("space: not a task: rl space; use sweep.search")
    r = _rl(cfg, Path(out) if out else Path("results") / (cfg.name or "rl"))
    if not r["ranking"].empty:
        best = r["ranking"].iloc[0]
        write_recipes(best, r["out"] / "recipe")
        write_trace(best, r["out"] / "recipe" / "step_trace.json")
    return r["ranking"].reset_index(drop=True)


@_one_line
def open_results(path: str | Path) -> "Results":
    """The Results of a finished `sweep search` folder (results/<name>/)."""
    return Results(path)


CONSTRAINTS = ("headroom", "max_oom_risk", "max_gpus", "budget", "deadline", "tokens", "gpus",
               "num_gpus", "failures")


class Results:
    """A finished search: its table and what the CLI derives from it.

    Read through `results.read_results` once, on construction; every method works on that
    frame (`to_pandas()` hands out a copy).
    """

    def __init__(self, path: str | Path, note: str = ""):
        from .advice.recommend import load_run

        self.path = Path(path)
        self._df, self.meta = load_run(self.path)
        self.note = note

    @property
    def name(self) -> str:
        return str(self.meta.get("space") or self.path.name)

    @property
    def objectives(self) -> list[str]:
        return list(self.meta.get("objectives") or ["step_time"])

    def __len__(self) -> int:
        return len(self._df)

    @property
    def counts(self) -> dict:
        """What the search did: the streamed grid keeps its counters (invalid by rule,
        duplicates of a no-op setting, pruned by bound: `pruned_memory`, `pruned_time`) in the
        metadata and stores only simulated rows; an Optuna search stores every row it sampled."""
        from .results import counts

        c = dict(counts(self._df))
        stored = self.meta.get("counts") or {}
        for k, v in stored.items():
            c[k] = v
        return c

    def __repr__(self) -> str:
        c = self.counts
        return (f"<sweep.Results {self.name!r}: {len(self):,} configurations simulated, "
                f"{c.get('ok', 0):,} fit, {c.get('oom', 0):,} oom, {c.get('invalid', 0):,} "
                f"invalid, {c.get('pruned', 0):,} pruned by bound; objectives {', '.join(self.objectives)}; {self.path}>")

    def to_pandas(self) -> pd.DataFrame:
        """Every configuration with its status, predictions, costs, rank and pareto flag."""
        return self._df.copy()

    def top(self, k: int = 10) -> pd.DataFrame:
        """The k best configurations that fit, by the search's first objective (ranking.csv)."""
        from .results import best

        if not isinstance(k, int) or k <= 0:
            raise SweepError(f"k: expected a positive integer, got {k!r}")
        return best(self._df, k).reset_index(drop=True)

    def best(self) -> pd.Series:
        """The rank-1 configuration (a SweepError when none fits in memory)."""
        t = self.top(1)
        if not len(t):
            raise SweepError(f"{self.path}: no configuration fits in memory")
        return t.iloc[0]

    def frontier(self) -> pd.DataFrame:
        """The cost (USD per million tokens) vs cluster throughput Pareto frontier of the
        configurations that fit: the report's frontier, by throughput."""
        from .advice.recommend import derive
        from .advice.frontier import frontier

        d = derive(self._df)
        fits = d[(d["status"] == "ok") & d["cost_per_mtok_usd"].notna()
                 & d["tokens_per_s"].notna()]
        return frontier(fits).reset_index(drop=True)

    @_one_line
    def recommend(self, objective: str | None = None, *, within: float = 0.05,
                  runner_ups: int = 3, out: str | Path | None = None, **constraints):
        """`sweep recommend`: the best configuration under constraints and its robust
        runner-ups (a recommend.Recommendation; `str()` of it is the CLI's table).

        Constraints are the CLI's: headroom ("8GiB", "10%"), max_oom_risk, max_gpus, budget,
        deadline (days), tokens ("300B" or a number), gpus, num_gpus (lists), failures (False:
        the failure-free days and cost, as --no-failures). With `out`, the recipes are written
        there as the CLI writes RUN/recipe/.
        """
        from .advice.recommend import (Constraints, _default_objective, parse_headroom, parse_tokens,
                                recommend, write_recipe)
        from .config import did_you_mean

        for k in constraints:
            if k not in CONSTRAINTS:
                raise SweepError(f"recommend: unknown constraint {k!r}; allowed: "
                                 + ", ".join(CONSTRAINTS) + did_you_mean(k, CONSTRAINTS))
        c = dict(constraints)
        if c.get("tokens") is not None:
            c["tokens"] = parse_tokens(c["tokens"])
        if c.get("headroom") is not None:
            c["headroom"] = str(c["headroom"])
            parse_headroom(c["headroom"])
        for k in ("gpus", "num_gpus"):
            if k in c and not isinstance(c[k], (list, tuple)):
                c[k] = [c[k]]
        rec = recommend(self._df, objective or _default_objective(self.meta), Constraints(**c),
                        within, runner_ups, run_name=self.name)
        if out is not None and rec.found:
            write_recipe(rec, out)
        return rec

    @_one_line
    def report(self, path: str | Path | None = None, *, objective: str | None = None,
               tokens=None, top: int = 8) -> Path:
        """`sweep report`: write report.html (interactive, offline), report.md and the PNGs
        into `path` (default: the results folder); returns the HTML's path."""
        from .advice.recommend import Constraints, parse_tokens
        from .advice.report import write_report

        c = Constraints(tokens=parse_tokens(tokens) if tokens is not None else None)
        r = write_report(self.path, path, objective=objective, constraints=c, top=top)
        return Path(r["html"])

    @_one_line
    def trace(self, path: str | Path, which: str = "best") -> Path:
        """A Chrome/Perfetto trace of one step of the best configuration (`which="best"`) or
        of the rule of thumb (`which="rule_of_thumb"`), as `sweep recommend --trace` writes."""
        from .advice.trace import write_trace_for_row

        if which == "best":
            row = self.best()
        elif which == "rule_of_thumb":
            from .advice.recommend import derive
            from .advice.baseline import rule_of_thumb

            row, rule = rule_of_thumb(derive(self._df), self.best())
            if row is None:
                raise SweepError(f"{self.path}: no rule-of-thumb configuration fits ({rule})")
        else:
            raise SweepError(f"which: expected best or rule_of_thumb, got {which!r}")
        return write_trace_for_row(row, path)


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------
@_one_line
def validate(dataset: str | Path | None = None, subset: str = "all") -> pd.DataFrame:
    """`sweep validate`: predicted vs measured step time (and memory) of published runs, one
    row per run that can be compared (`step_error`, `mem_error` signed, fractions).

    `dataset` is a CSV in the published_runs format (default: the shipped dataset); `subset`
    one of all, dense, moe, long-context, blackwell-dense.
    """
    from sim_core.accuracy.published import SUBSETS, compare, load_dataset

    if subset not in SUBSETS:
        raise SweepError(f"subset: expected one of {', '.join(sorted(SUBSETS))}, got {subset!r}")
    table = compare(load_dataset(dataset))
    return table[SUBSETS[subset](table)].reset_index(drop=True)
