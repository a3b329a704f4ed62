"""The probability that a configuration runs out of memory although the model says it fits.

A search engine's pick must really run, and the memory model has an error. Its error
distribution is measured per framework by `sweep validate` (validation.validate_memory: the
dataset rows that report peak memory and TorchSim's tables): log(measured / predicted) ~
Normal(mu, sigma), stored as data (data/memory_error.csv, written by
`python -m sim_core.accuracy.memory_error --write`; a test keeps it equal to what that computes).
A framework with fewer than MIN_ROWS measured rows gets mu = 0 and
UNMEASURED_SIGMA_FACTOR times the pooled sigma: the simulator's held-out error has been about
three times its in-sample error (DEVELOPERS.md), so where nothing was measured the spread is
taken that wide. Then

    oom_risk = P(measured peak > HBM) = 1 - Phi((ln(HBM / predicted peak) - mu) / sigma)

This module only reads the table: the simulator never imports the accuracy tooling.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import pandas as pd
from scipy.special import ndtr

from .specs import FRAMEWORK

MIN_ROWS = 5
UNMEASURED_SIGMA_FACTOR = 3.0
# sweep recommend and the end-of-search summary do not advise a configuration above this risk
DEFAULT_MAX_RISK = 0.10
TABLE = "data/memory_error.csv"




@functools.lru_cache(maxsize=1)
def _table() -> tuple[np.ndarray, np.ndarray]:
    t = pd.read_csv(resources.files("sim_core").joinpath(TABLE)).set_index("framework")
    t = t.loc[list(FRAMEWORK)]
    return t["mu"].to_numpy(dtype=np.float64), t["sigma"].to_numpy(dtype=np.float64)


_calibrated_sigma: float | None = None  # a run calibration's memory sigma (log units)


def set_calibrated_sigma(sigma_log: float | None) -> None:
    """A run calibration measured the memory model's spread on the user's cluster
    (sim_core.calibration.runs.interval): it replaces the per-framework table, mu 0, while the
    profile is active; None restores the table."""
    global _calibrated_sigma
    _calibrated_sigma = None if sigma_log is None else float(sigma_log)


def oom_risk(peak_gib, hbm_gib, framework_code) -> np.ndarray:
    """Probability, per configuration, that the measured peak exceeds the GPU's memory."""
    mu, sigma = _table()
    if _calibrated_sigma is not None:
        mu, sigma = np.zeros_like(mu), np.full_like(sigma, max(_calibrated_sigma, 1e-6))
    code = np.asarray(framework_code, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = ((np.log(np.asarray(hbm_gib) / np.asarray(peak_gib)) - mu.take(code))
             / sigma.take(code))
    return 1.0 - ndtr(z)
