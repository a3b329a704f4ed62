"""What a search strategy receives and returns: the one small interface between execution
(sweep/engine/execution.py) and the strategies (grid.py, optuna_strategy.py).

A strategy is a function `run(job: SearchJob) -> Outcome`. Execution picks it by name from
`execution.STRATEGIES` and never reaches into its module; a strategy uses the shared pieces
below it (evaluate, runtime, the results store) and never execution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..config import SpaceConfig
from ..results import best, read_results, summary_text
from .space import Space


@dataclass
class SearchJob:
    """Everything a strategy needs to run one search."""

    cfg: SpaceConfig
    space: Space
    out: Path
    workers: int | None = None
    address: str | None = None
    simulate: object = None  # None: the default simulator
    check: object = None  # None: the default rules
    progress: bool = False
    fresh: bool = False
    on_batch: object = None  # on_batch(batch_id, batches_done) after each stored batch
    chosen: str = ""  # why `strategy: auto` chose this strategy ('' when named)


@dataclass
class Outcome:
    """What a search returns. `top` and `pareto` are the ranked rows the driver kept; the
    results themselves stay on disk (`results` reads them back, whole: for small runs)."""

    out_dir: Path
    seconds: float
    evaluated: int  # configurations evaluated by this run (not resumed ones)
    objectives: list
    config_cols: list
    strategy: str
    top: pd.DataFrame
    pareto: pd.DataFrame = field(default_factory=pd.DataFrame)
    counts: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    note: str = ""

    @property
    def results(self) -> pd.DataFrame:
        return read_results(self.out_dir)[0]

    @property
    def best(self) -> pd.DataFrame:
        return best(self.top, 1)

    def summary(self) -> str:
        text = summary_text(self.top, self.counts, self.config_cols, self.seconds,
                            self.objectives, self.out_dir, self.evaluated)
        if len(self.objectives) > 1:
            text += f"\npareto set: {len(self.pareto)} configurations (pareto.csv)"
        if self.note:
            text += "\n" + self.note
        return text


def config_cols(space: Space) -> list[str]:
    return space.axis_names or ["tp", "pp", "micro_batch"]

