"""Per-stack decode constants: the decode step's bandwidth fraction and fixed per-step time
of each accelerator vendor and inference engine (catalogs/rl.yaml `decode_stacks`).

Why: the two fitted constants of the decode step (generation.step_time) were fitted on
TensorRT-LLM on H100/H200 (CUDA graphs): 0.95 of HBM bandwidth and 7.5 ms per step. The
fixed per-step time is the host's (scheduler, sampler, graph launch) and the runtime's, so it
belongs to the software stack, not to the model: vllm-ascend's published TPOT on Ascend dies
leaves ~17-19 ms per step for a 4B and a 32B model alike (docs/ascend.md). A row of the
table names a vendor (catalog.VENDORS) and an engine (rl/inputs.ENGINE) and gives the
constants of that stack; a configuration that no row names keeps the global fitted values
(catalogs/rl.yaml `decode`), so the NVIDIA rows are priced as before to the last bit.

A fit that overrides the global constants (calibrate.py's grids) prices every row of its own
frame with the override: `generation.decode_constants(overrides)` drops the table then.
"""

from __future__ import annotations

import numpy as np

from .. import catalog
from ..columns import Batch
from . import inputs

KEYS = ("hbm_efficiency", "step_overhead_s")


def table(k: dict) -> list:
    """The stack rows the constants `k` carry (validated): a list of dicts with vendor,
    engine, hbm_efficiency and step_overhead_s."""
    rows = k.get("stacks") or []
    out = []
    for i, r in enumerate(rows):
        where = f"decode_stacks[{i}]"
        vendor = str(r.get("vendor", "")).lower()
        engine = str(r.get("engine", "")).lower()
        if vendor not in catalog.VENDORS:
            raise catalog.CatalogError(f"{where}.vendor: {r.get('vendor')!r} is not one of "
                                       f"{', '.join(catalog.VENDORS)}")
        if engine not in inputs.ENGINE:
            raise catalog.CatalogError(f"{where}.engine: {r.get('engine')!r} is not one of "
                                       f"{', '.join(inputs.ENGINE)}")
        vals = {}
        for key in KEYS:
            v = r.get(key, k[key])  # a row may set one constant and keep the global other
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise catalog.CatalogError(f"{where}.{key}: {v!r} is not a number") from None
            if not (v > 0 if key == "hbm_efficiency" else v >= 0) or not np.isfinite(v):
                raise catalog.CatalogError(f"{where}.{key}: {v} is out of range")
            vals[key] = v
        out.append({"vendor": vendor, "engine": engine, **vals})
    return out


def resolve(b: Batch, k: dict) -> tuple[np.ndarray, np.ndarray]:
    """(hbm_efficiency, step_overhead_s) of every configuration, shape (n,): its stack's row
    of the table where one matches its GPU's vendor and its rollout engine, else the global
    constants of `k`. Vectorised: one pass per table row, none per configuration."""
    n = len(b)
    eff = np.full(n, float(k["hbm_efficiency"]))
    ovh = np.full(n, float(k["step_overhead_s"]))
    rows = table(k)
    if not rows or "gpu_vendor" not in b:
        return eff, ovh
    vendor = np.asarray(b.gpu_vendor, dtype=np.int64)
    engine = np.asarray(b.rollout_engine, dtype=np.int64)
    for r in rows:
        m = (vendor == catalog.VENDORS.index(r["vendor"])) & (
            engine == inputs.ENGINE.index(r["engine"]))
        eff = np.where(m, r["hbm_efficiency"], eff)
        ovh = np.where(m, r["step_overhead_s"], ovh)
    return eff, ovh
