"""The RL search: every configuration of a `task: rl` space in one vectorised call of
`sim_core.rl.phases.simulate_rl`, ranked by the space's objective.

RL spaces are small (GPU split x rollout layout x training layout x placement: thousands of
rows), so they are evaluated in the process, without Ray or Optuna; the results folder holds
`results.csv` (every configuration with its prediction), `ranking.csv` (those that fit, best
first) and `recipe/` (verl and NeMo RL for the best).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim_core.rl.phases import simulate_rl

from ..errors import SweepError

OBJECTIVES = {"step_time": ("step_time_s", True),
              "samples_per_gpu": ("samples_per_s_per_gpu", False),
              "tokens_per_gpu": ("tokens_per_s_per_gpu", False),
              "cost": ("cost_per_1000_steps", True)}


def evaluate(cfg) -> pd.DataFrame:
    """Configurations of the RL config (its space, or the run alone) with their predictions."""
    df = cfg.frame()
    try:
        pred = simulate_rl(df)
    except ValueError as exc:  # sim_core.catalog.CatalogError: one line naming the field
        raise SweepError(str(exc).splitlines()[0]) from None
    # a prediction that resolves an input (rollout_gpus, the packing budget train_seq_len)
    # replaces it: one column each in results and ranking
    return pd.concat([df.drop(columns=[c for c in pred if c in df]), pred], axis=1)


def rank(res: pd.DataFrame, objective: str) -> pd.DataFrame:
    col, asc = OBJECTIVES[objective]
    # ties (a one-step-off pipeline bound by its training side) go to the faster generation,
    # then the smaller rollout footprint
    return res[res["fits"]].sort_values([col, "gen_time_s", "rollout_peak_gib"],
                                        ascending=[asc, True, True], kind="stable")


def search(cfg, out: str | Path) -> dict:
    res = evaluate(cfg)
    ranked = rank(res, cfg.search.objective)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res.to_csv(out / "results.csv", index=False)
    ranked.to_csv(out / "ranking.csv", index=False)
    return {"results": res, "ranking": ranked, "out": out}
