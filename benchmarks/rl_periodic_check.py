"""Out-of-sample check of sim_core/rl/periodic.py against published validation and checkpoint
timers (sim_core/data/rl/periodic_published.csv): verl's timing_s/testing and
timing_s/save_checkpoint, NeMo RL's checkpointing timer. Nothing is fitted on them; the
storage bandwidth is catalogs/rl.yaml's default. Each timer is priced on its run's row of
rl_runs.csv (matched by source and stated step) with one validation / checkpoint per step.

    python benchmarks/rl_periodic_check.py
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

from sim_core.accuracy import rl as arl
from sim_core.rl.phases import simulate_rl


def check() -> pd.DataFrame:
    pub = pd.read_csv(resources.files("sim_core").joinpath("data/rl/periodic_published.csv"))
    runs = arl.load()
    key = runs.source.astype(str) + "|" + runs.step_time_s.astype(str)
    out = []
    for _, p in pub.iterrows():
        hit = np.flatnonzero(key == f"{p.source}|{p.step_time_s}")
        if len(hit) != 1:
            raise ValueError(f"{p.source} {p.step_time_s}: {len(hit)} rows of rl_runs.csv")
        df, _, reason = arl.to_frame(runs.iloc[hit].reset_index(drop=True))
        if reason[0]:
            raise ValueError(f"{p.source}: {reason[0]}")
        if p.kind == "validation":
            df["val_period"], df["val_samples"] = 1.0, float(p.val_samples)
            df["val_batch"] = float(p.val_batch) if p.val_batch == p.val_batch else np.nan
            pred = float(simulate_rl(df).validation_run_s[0])
        else:
            df["save_period"] = 1.0
            pred = float(simulate_rl(df).checkpoint_write_s[0])
        out.append({"source": p.source, "row_step": p.step_time_s, "kind": p.kind,
                    "measured_s": p.measured_s, "predicted_s": pred,
                    "ratio": pred / p.measured_s})
    return pd.DataFrame(out)


def main() -> None:
    r = check()
    pd.set_option("display.width", 160)
    print(r.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    for kind, g in r.groupby("kind"):
        print(f"{kind}: median predicted / measured {np.median(g.ratio):.2f}, median |error| "
              f"{np.median(np.abs(g.ratio - 1)):.0%} over {len(g)} published timers")


if __name__ == "__main__":
    main()
