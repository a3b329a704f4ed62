"""The measured error of the memory model, per framework: what sim_core/risk.py reads.

`python -m sim_core.accuracy.memory_error [--write]` measures log(measured / predicted peak) on
the rows that report peak memory (validation.validate_memory) and writes
sim_core/data/memory_error.csv; a test keeps the shipped file equal to what this computes.
"""

from __future__ import annotations

import sys
from importlib import resources

import numpy as np
import pandas as pd

from ..risk import MIN_ROWS, TABLE, UNMEASURED_SIGMA_FACTOR
from ..specs import FRAMEWORK


def measure() -> pd.DataFrame:
    """Per-framework error distribution of the memory model, from the measured rows."""
    from . import validation

    m = validation.validate_memory()
    m = m[m["measured_mem_gib"].notna() & m["predicted_mem_gib"].notna()]
    err = np.log(m["measured_mem_gib"] / m["predicted_mem_gib"])
    pooled = float(err.std(ddof=1))
    rows = []
    for fw in FRAMEWORK:
        e = err[m["framework"] == fw]
        if len(e) >= MIN_ROWS:
            rows.append((fw, len(e), float(e.mean()), float(e.std(ddof=1)), "measured"))
        else:
            rows.append((fw, len(e), 0.0, UNMEASURED_SIGMA_FACTOR * pooled,
                         f"unmeasured: {UNMEASURED_SIGMA_FACTOR:g} x pooled sigma"))
    return pd.DataFrame(rows, columns=["framework", "rows", "mu", "sigma", "basis"]).round(4)


def main(argv=None) -> None:  # python -m sim_core.accuracy.memory_error [--write]
    argv = sys.argv[1:] if argv is None else argv
    table = measure()
    print(table.to_string(index=False))
    if argv == ["--write"]:
        path = resources.files("sim_core").joinpath(TABLE)
        table.to_csv(path, index=False)
        print(f"wrote {path}")



if __name__ == "__main__":
    main()
