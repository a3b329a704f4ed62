"""Running a search: the space file's strategy (grid, optuna, or auto) on the space, written to
its results folder. The strategies plug in through strategy.py's one interface (a function
`run(SearchJob) -> Outcome`) and are named in STRATEGIES; execution imports none of them.

`strategy: auto` picks one by the size of the space and the CPUs at hand (`choose_strategy`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..config import SpaceConfig
from .runtime import ray_session
from .space import Space
from .strategy import Outcome, SearchJob

# name -> "module:function" of the strategy (imported when chosen)
STRATEGIES = {"grid": "sweep.engine.grid:run_grid",
              "optuna": "sweep.engine.optuna_strategy:run_optuna"}

# strategy auto: the grid's rate per CPU (benchmarks/search_strategies.py, 3.3M space on two
# cores: about 20,000 configurations/s per CPU) and how long a grid may take before Optuna wins
GRID_RATE_PER_CPU = 20_000
GRID_AUTO_SECONDS = 10


def run_search(cfg: SpaceConfig, out_dir: str | Path | None = None, *, workers: int | None = None,
               address: str | None = None, simulate=None, check=None, progress: bool = False,
               fresh: bool = False, on_batch=None) -> Outcome:
    """Run the sweep a space file describes; returns the assembled results.

    on_batch(batch_id, batches_done) is called after each batch is stored (tests use it to
    interrupt a sweep).
    """
    out = Path(out_dir) if out_dir else Path("results") / cfg.name
    job = SearchJob(cfg, Space.from_config(cfg), out, workers, address, simulate, check,
                    progress, fresh, on_batch)
    if cfg.search.strategy != "auto":
        return strategy(cfg.search.strategy)(job)
    with ray_session(workers, address) as cap:
        name, job.chosen = choose_strategy(job.space, cap)
        return strategy(name)(job)


def strategy(name: str):
    """The run function of a strategy named in STRATEGIES."""
    module, fn = STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), fn)


def choose_strategy(space: Space, cpus: int) -> tuple[str, str]:
    """`strategy: auto`: the grid when it finishes within GRID_AUTO_SECONDS on `cpus` CPUs
    at the measured grid rate (benchmarks/search_strategies.py), Optuna otherwise."""
    limit = GRID_RATE_PER_CPU * GRID_AUTO_SECONDS * cpus
    est = space.size / (GRID_RATE_PER_CPU * cpus)
    if space.size <= limit:
        return "grid", (f"strategy auto: grid, since the {space.size:,} candidates take about "
                        f"{est:,.0f} s on {cpus} CPUs (grid up to {limit:,.0f})")
    return "optuna", (f"strategy auto: optuna, since a grid of the {space.size:,} candidates "
                      f"would take about {est:,.0f} s on {cpus} CPUs (grid up to {limit:,.0f})")
