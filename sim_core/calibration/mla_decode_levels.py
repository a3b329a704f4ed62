"""FlashMLA's published decode kernel rows against sim_core/rl/mla_decode.py's pricing.

Why here and not in the physics: it reads the published rows back and prices them with the
level of each row's GPU taken from its other rows (leave one row out), a check of the stored
levels that `benchmarks/h20_published_check.py` prints and the tests hold; the decode model
itself only reads the levels.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import catalog
from ..rl.mla_decode import DEFAULT_GPU, TILE_ROWS, levels, table


def check(eff: float) -> pd.DataFrame:
    """The published kernel rows (with a time) priced: max(cache read at the decode model's
    bandwidth fraction `eff`, padded FLOPs at the GPU's level), the level of the row's own GPU
    taken from its other rows (leave one row out); and the read alone, as the model priced it
    before."""
    t = table().dropna(subset=["time_ms"]).reset_index(drop=True)
    out = []
    for i, r in t.iterrows():
        g = catalog.get_gpu(r.gpu)
        peak = catalog.peak_tflops(g, "bf16") * 1e12
        seqlens = r.batch * r.mean_sk
        read = (seqlens * r.h_kv * r.d + r.batch * r.s_q * r.h_q * (r.d + r.dv)) * 2 / (
            g.hbm_bw_gbs * 1e9 * eff)
        rest = t[(t.gpu == r.gpu) & (t["use"] == "level") & (t.index != i)]
        lv = (np.median(rest.tflops) * 1e12 / peak if len(rest)
              else levels().get(g.name, levels()[DEFAULT_GPU]))
        # the published TFLOP/s counts the actual total of cached tokens (varlen rows draw it):
        # the row's own work is its published rate x its time
        flops = r.tflops * 1e12 * r.time_ms * 1e-3
        pad = np.ceil(r.s_q * r.h_q / r.h_kv / TILE_ROWS) * TILE_ROWS / (r.s_q * r.h_q / r.h_kv)
        comp = flops * pad / (peak * lv)
        pred = max(read, comp)
        out.append(dict(gpu=r.gpu, s_q=r.s_q, h_q=r.h_q, varlen=r.varlen,
                        meas_ms=r.time_ms, read_ms=read * 1e3, compute_ms=comp * 1e3,
                        level_left_out=lv, ratio=pred * 1e3 / r.time_ms,
                        ratio_read_only=read * 1e3 / r.time_ms))
    return pd.DataFrame(out)
