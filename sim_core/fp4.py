"""FP4 training (precision nvfp4 | mxfp4): which configurations run it and what it costs.

FP4 pre-training is no longer a research setting: Transformer Engine's NVFP4 recipe on Blackwell
(Megatron-Core / Megatron-Bridge `bf16_with_nvfp4_mixed`) and AMD's MXFP4 path on CDNA4 (Primus
with Primus-Turbo's hipBLASLt/AITER FP4 GEMMs) run every transformer-layer GEMM (fprop, dgrad,
wgrad) in E2M1 with block scales. The recipes differ in what the quantizer moves (NVFP4's
per-tensor amax pass and amax all-reduce; MXFP4's block-local E8M0 scales), in what the backward
keeps, and in which GPUs and framework builds have them. Those facts, each read from the code,
are in catalogs/fp4.yaml; this module turns them into per-configuration arrays for the compute
model (sim_core/compute.py), the memory model (sim_core/memory.py), the parameter all-gather
(sim_core/workload.py) and the validity rules (sim_core/rules.py).
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

from . import catalog_yaml
from .specs import PRECISION

FORMATS = ("nvfp4", "mxfp4")
_CODE = {f: PRECISION.index(f) for f in FORMATS}
_FIELDS = ("extra_cast_bytes", "saved_bytes", "weight_cache_bytes", "gather_bytes",
           "gemm_time")


@functools.lru_cache(maxsize=1)
def recipes() -> dict:
    """catalogs/fp4.yaml `recipes`, one entry per FP4 precision."""
    text = resources.files("sim_core").joinpath("catalogs/fp4.yaml").read_text()
    table = catalog_yaml.read(text)["recipes"]
    assert set(table) == set(FORMATS), f"catalogs/fp4.yaml: expected recipes {FORMATS}"
    return table


def formats(b) -> dict[str, np.ndarray]:
    """{format: rows that ask for it} (precision nvfp4 / mxfp4)."""
    prec = np.asarray(b.precision)
    return {f: prec == code for f, code in _CODE.items()}


def requested(b) -> np.ndarray:
    """Rows whose precision is an FP4 format (whether or not the GPU has it)."""
    return np.isin(np.asarray(b.precision), list(_CODE.values()))


def peak(b) -> np.ndarray:
    """Dense FP4 TFLOP/s of each row's format on its GPU (0 where the GPU lacks the format or
    the row is not FP4)."""
    fm = formats(b)
    out = np.zeros(np.shape(b.precision), dtype=np.float64)
    for f, rows in fm.items():
        if rows.any():
            out = np.where(rows, np.asarray(b[f"peak_{f}"], dtype=np.float64), out)
    return out


def active(b) -> np.ndarray:
    """Rows that run their layer GEMMs in FP4: an FP4 precision on a GPU that has the format
    (the rules make the others invalid)."""
    if not requested(b).any():
        return np.zeros(np.shape(b.precision), dtype=bool)
    return peak(b) > 0


def arrays(b) -> dict[str, np.ndarray]:
    """The recipe's numbers per row (0 / 'none' where the row is not FP4)."""
    fm = formats(b)
    table = recipes()
    shape = np.shape(b.precision)
    out = {k: np.zeros(shape, dtype=np.float64) for k in _FIELDS}
    out["amax_reduce"] = np.full(shape, "none", dtype=object)
    for f, rows in fm.items():
        if rows.any():
            for k in _FIELDS:
                out[k] = np.where(rows, float(table[f][k]), out[k])
            out["amax_reduce"] = np.where(rows, table[f]["amax_reduce"], out["amax_reduce"])
    return out


def apply_to_recipe(recipe: dict, b, fp4: np.ndarray) -> dict:
    """The FP8 recipe arrays (compute.fp8_recipe_arrays) with FP4 rows' own quantisation:
    their cast traffic, amax reduction and GEMM time; wgrad runs in FP4 and no amax is fused
    into the norm (NVFP4's columnwise amax is taken after the Hadamard transform)."""
    if not fp4.any():
        return recipe
    a = arrays(b)
    out = dict(recipe)
    out["extra_cast_bytes"] = np.where(fp4, a["extra_cast_bytes"], recipe["extra_cast_bytes"])
    out["gemm_time"] = np.where(fp4, a["gemm_time"], recipe["gemm_time"])
    out["wgrad_fp8"] = np.where(fp4, True, recipe["wgrad_fp8"])
    out["amax_in_norm"] = np.where(fp4, False, recipe["amax_in_norm"])
    out["amax_reduce"] = np.where(fp4, a["amax_reduce"], recipe["amax_reduce"])
    return out


def rules(b) -> list[tuple[str, np.ndarray]]:
    """An FP4 precision needs a GPU whose tensor cores have that format (catalog peak_tflops
    nvfp4 / mxfp4, from the datasheets). The GPU is read only where a row asks for FP4, so a
    space without FP4 keeps the GPU out of the rules' axes."""
    if not requested(b).any():
        return []
    fm = formats(b)
    return [
        ("precision nvfp4 needs a GPU with NVFP4 tensor cores and a datasheet peak in the "
         "catalog (b200, gb200, gb300; b300's dense figure is not sourced)",
         fm["nvfp4"] & (np.asarray(b.peak_nvfp4) <= 0)),
        ("precision mxfp4 needs a GPU with MXFP4 tensor cores (CDNA4: mi350x, mi355x; "
         "Blackwell: b200, gb200, gb300)", fm["mxfp4"] & (np.asarray(b.peak_mxfp4) <= 0)),
    ]
