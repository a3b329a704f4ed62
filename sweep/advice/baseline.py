"""The baseline a recommendation is measured against: the rule-of-thumb layout, and a short
label of a layout. Below both recommend and report, which show the rule of thumb beside the
pick."""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import export


def short(d: dict) -> str:
    """A compact label of a configuration's parallel layout."""
    d = export.config_of(d) if not isinstance(d, dict) or "dp" not in d else d
    parts = [f"TP{d['tp']}", f"PP{d['pp']}"]
    if d.get("vpp", 1) > 1:
        parts[-1] += f"x{d['vpp']}"
    if d.get("cp", 1) > 1:
        parts.append(f"CP{d['cp']}")
    if d.get("ep", 1) > 1:
        parts.append(f"EP{d['ep']}")
    parts.append(f"DP{d['dp']}")
    parts.append(f"mb{d['micro_batch']}")
    if d.get("recompute", "none") != "none":
        parts.append({"full": "full-rc", "selective": "sel-rc"}[d["recompute"]])
    parts.append(f"z{d.get('zero', 1)}")
    return " ".join(parts)


def rule_of_thumb(df: pd.DataFrame, like: pd.Series) -> tuple[pd.Series | None, str]:
    """The rule-of-thumb configuration on the same cluster/model as `like`:
    TP = min(8, GPUs per node), no CP, micro-batch 1, no interleaving, the smallest PP that
    fits, recompute only if needed (none, else full, else selective), with sequence parallel
    and ZeRO-1 (distributed optimizer) where the results hold them; the fastest of what is
    left. Returns (row or None, description of the rule)."""
    tp = int(min(8, like.get("gpus_per_node", 8) or 8))
    rule = f"TP={tp} within a node, smallest PP that fits, no CP, micro-batch 1, " \
           "full recompute only if needed, sequence parallel, distributed optimizer"
    same = np.ones(len(df), dtype=bool)
    for c in ("model", "gpu", "num_gpus", "seq_len", "global_batch", "precision"):
        if c in df.columns:
            same &= (df[c] == like[c]).to_numpy()
    sub = df[same]
    cond = (sub["tp"] == tp) & (sub.get("cp", 1) == 1) & (sub["micro_batch"] == 1)
    if "vpp" in sub.columns:
        cond &= sub["vpp"] == 1
    sub = sub[cond]
    # Megatron's usual companions of TP: sequence parallel and the distributed optimizer
    for col, val in (("sequence_parallel", True), ("zero", 1)):
        if col in sub.columns and (sub[col] == val).any():
            sub = sub[sub[col] == val]
    sub = sub[sub["status"] == "ok"]
    if not len(sub):
        return None, rule
    pp = sub["pp"].min()
    sub = sub[sub["pp"] == pp]
    for rc in ("none", "full", "selective"):
        pick = sub[sub["recompute"] == rc]
        if len(pick):
            sub = pick
            break
    return sub.sort_values(["step_time_s", "config_id"]).iloc[0], rule

