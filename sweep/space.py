"""A search space as a lazily enumerable product of axes, with vectorized rule pruning.

Configuration number `i` (its `config_id`) is the i-th element of
``itertools.product(*axis_values)`` -- the last axis varies fastest. A range of ids is decoded
into a DataFrame with numpy (mixed-radix digits), so any chunk of the product can be built in
any process without enumerating what comes before it; that is what makes batches
deterministic, resumable and cheap to ship to Ray workers (only `start, stop` travel).

Rules: a configuration is `invalid` (with a reason) when it breaks a divisibility rule
(`sim_core.check_rules`, plus the sweep's own derivations: a token budget that seq_len does not
divide). Global batch is kept fixed, so a configuration whose global batch does not divide
into dp * micro_batch is invalid ("global_batch % (dp*micro_batch) != 0").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim_core.specs import ALL_COLUMNS

from .config import RunConfig, SpaceConfig, fixed_columns
from .errors import SweepError

# Columns the simulator understands; everything else in a frame is bookkeeping.
SIM_COLUMNS = tuple(ALL_COLUMNS)
PSEUDO_COLUMNS = ("nodes", "global_batch_tokens")
COLUMN_ORDER = ("config_id",) + SIM_COLUMNS + PSEUDO_COLUMNS


@dataclass
class Space:
    name: str
    fixed: dict
    axes: list  # [(column, [values...]), ...] in product order
    price_per_hour: float | None = None
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: RunConfig) -> "Space":
        fixed = fixed_columns(cfg)
        axes = list((getattr(cfg, "space", None) or {}).items())
        for name, _ in axes:
            fixed.pop(name, None)
            # a varied cluster size / batch replaces the other way of giving it
            other = {"num_gpus": "nodes", "nodes": "num_gpus",
                     "global_batch": "global_batch_tokens",
                     "global_batch_tokens": "global_batch"}.get(name)
            if other:
                fixed.pop(other, None)
        return cls(name=getattr(cfg, "name", None) or "run", fixed=fixed, axes=axes,
                   price_per_hour=cfg.cluster.price_per_hour)

    @property
    def size(self) -> int:
        return math.prod(len(v) for _, v in self.axes) if self.axes else 1

    @property
    def axis_names(self) -> list[str]:
        return [n for n, _ in self.axes]

    def fingerprint(self, **extra) -> str:
        """A hash of everything that decides which rows a batch holds (for resume)."""
        blob = json.dumps({"fixed": self.fixed, "axes": self.axes, **extra}, sort_keys=True,
                          default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ enumeration
    def batches(self, batch_size: int) -> list[tuple[int, int, int]]:
        """[(batch_id, start, stop), ...] covering config ids 0..size-1."""
        n = self.size
        return [(i, s, min(s + batch_size, n)) for i, s in enumerate(range(0, n, batch_size))]

    def digits(self, ids: np.ndarray) -> list[np.ndarray]:
        """Mixed-radix digits of config ids: one index array per axis (itertools.product order)."""
        rest = np.asarray(ids, dtype=np.int64).copy()
        out = [None] * len(self.axes)
        for k in range(len(self.axes) - 1, -1, -1):
            n = len(self.axes[k][1])
            out[k] = rest % n
            rest //= n
        return out

    def frame(self, start: int, stop: int) -> pd.DataFrame:
        """Candidate configurations start..stop-1 as a run frame (with `config_id`)."""
        ids = np.arange(start, stop, dtype=np.int64)
        return self._build(ids, self.digits(ids))

    def frame_of_ids(self, ids) -> pd.DataFrame:
        ids = np.asarray(ids, dtype=np.int64)
        return self._build(ids, self.digits(ids))

    def index_of(self, params: dict) -> int:
        """config_id of one point given as {axis: value}."""
        cid = 0
        for name, values in self.axes:
            cid = cid * len(values) + values.index(params[name])
        return cid

    def _build(self, ids: np.ndarray, digits: list[np.ndarray]) -> pd.DataFrame:
        n = len(ids)
        cols: dict = {"config_id": ids}
        for k, (name, values) in enumerate(self.axes):
            cols[name] = _typed(values)[digits[k]]
        for name, value in self.fixed.items():
            cols[name] = np.full(n, value, dtype=_typed([value]).dtype)
        if "nodes" in cols:
            cols["num_gpus"] = cols["nodes"] * cols["gpus_per_node"]
        if "global_batch_tokens" in cols:
            cols["global_batch"] = cols["global_batch_tokens"] // cols["seq_len"]
        order = [c for c in COLUMN_ORDER if c in cols] + [c for c in cols if c not in COLUMN_ORDER]
        return pd.DataFrame({c: cols[c] for c in order})


def _typed(values: list) -> np.ndarray:
    if all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=bool)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.float64)
    return np.array(values, dtype=object)


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------
def default_check():
    import sim_core

    return sim_core.check_rules


def sim_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The columns of a frame that the simulator understands."""
    return frame[[c for c in frame.columns if c in ALL_COLUMNS]]


def rule_reasons(frame: pd.DataFrame, check=None) -> np.ndarray:
    """Reason each configuration breaks a rule ('' = valid), vectorized."""
    check = check or default_check()
    reasons = np.full(len(frame), "", dtype=object)
    if "global_batch_tokens" in frame.columns:
        bad = (frame["global_batch_tokens"] % frame["seq_len"] != 0).to_numpy()
        reasons[bad] = "global_batch_tokens % seq_len != 0"
    todo = reasons == ""
    if todo.any():
        sub = sim_frame(frame.loc[todo])
        got = check(sub)
        reasons[todo] = np.asarray(got, dtype=object)
    return reasons


@dataclass
class Census:
    total: int
    valid: int
    reasons: Counter

    def lines(self) -> list[str]:
        out = [f"configurations: {self.total:,}",
               f"valid (pass the rules): {self.valid:,}",
               f"invalid: {self.total - self.valid:,}"]
        for reason, n in self.reasons.most_common(8):
            out.append(f"  {n:>10,}  {reason}")
        return out


def census(space: Space, check=None, chunk: int = 200_000) -> Census:
    """Count the candidates of a space and how many pass the rules (no simulation)."""
    valid, reasons = 0, Counter()
    for start in range(0, space.size, chunk):
        r = rule_reasons(space.frame(start, min(start + chunk, space.size)), check)
        ok = r == ""
        valid += int(ok.sum())
        reasons.update(r[~ok].tolist())
    return Census(space.size, valid, reasons)


def require_valid(c: Census, name: str) -> None:
    if c.valid == 0:
        top = ", ".join(f"'{r}' ({n:,})" for r, n in c.reasons.most_common(3))
        raise SweepError(f"space '{name}' has no valid configuration: all {c.total:,} "
                         f"candidates break the rules (most common: {top})")
