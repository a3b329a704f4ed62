"""Nested search: which axes the sampler chooses and which are enumerated inside each trial.

The sampler picks the axes that shape the layout (`LAYOUT_AXES`: GPU, cluster size, batch,
sequence length, framework, tp, pp, cp, ep, vpp, ...). Every other axis (micro-batch,
recompute, sequence parallel, ZeRO, precision, the overlap and kernel switches) is cheap to
vary: all its values are simulated together, vectorized, inside each trial, so one trial is
one `simulate` call over a sub-grid. Rule: the inner axes are the non-layout ones, while
their product stays within `search.inner_max` rows (default 1024); past that the largest
inner axes move to the sampler. `search.inner: [axis, ...]` sets the inner axes instead.

Config ids stay those of the whole space (`Space`: mixed radix, last axis fastest), so a
trial's rows are `base(outer values) + offsets(inner sub-grid)` and agree with a grid's rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SweepError
from .space import Space

LAYOUT_AXES = frozenset({
    "model", "gpu", "num_gpus", "nodes", "gpus_per_node", "nics_per_node", "nic_bw_gbs",
    "power_limit_w", "seq_len", "global_batch", "global_batch_tokens", "framework",
    "tp", "pp", "cp", "ep", "etp", "vpp", "pp_schedule",
})
DEFAULT_INNER_MAX = 1024  # rows simulated per trial, at most (the auto rule)


@dataclass(frozen=True)
class Nesting:
    """The outer (sampled) and inner (enumerated) axes of a space and the id arithmetic."""

    outer: tuple[str, ...]
    inner: tuple[str, ...]
    strides: dict  # axis -> stride of its digit in a config id
    offsets: np.ndarray  # config-id offsets of the inner sub-grid (int64), product order

    @property
    def rows_per_trial(self) -> int:
        return len(self.offsets)

    def base(self, space: Space, params: dict) -> int:
        """config id of the sub-grid's first row for the outer values in `params`."""
        values = dict(space.axes)
        return sum(values[a].index(params[a]) * self.strides[a] for a in self.outer)

    def ids(self, bases) -> np.ndarray:
        """All config ids of the sub-grids at these bases (trial-major)."""
        return (np.asarray(bases, dtype=np.int64)[:, None] + self.offsets[None, :]).ravel()

    def describe(self) -> str:
        inner = ", ".join(self.inner) or "none"
        return (f"nested search: the sampler picks {', '.join(self.outer)}; each trial "
                f"simulates all {self.rows_per_trial:,} combinations of {inner}")


def split_axes(space: Space, inner: list[str] | None = None,
               inner_max: int | None = None) -> Nesting:
    """Outer/inner axes by the rule (or `inner` as given), with the id strides."""
    names = space.axis_names
    sizes = {n: len(v) for n, v in space.axes}
    if inner is not None:
        unknown = [a for a in inner if a not in sizes]
        if unknown:
            raise SweepError(f"search.inner: '{unknown[0]}' is not a field of `space:` "
                             f"(its fields: {', '.join(names)})")
        chosen = [n for n in names if n in inner]
    else:
        cap = inner_max or DEFAULT_INNER_MAX
        chosen = [n for n in names if n not in LAYOUT_AXES]
        while chosen and math.prod(sizes[n] for n in chosen) > cap:
            chosen.remove(max(chosen, key=lambda n: (sizes[n], names.index(n))))
    outer = [n for n in names if n not in chosen]
    if not outer:  # the sampler needs something to choose: the largest inner axis
        big = max(chosen, key=lambda n: sizes[n])
        chosen.remove(big)
        outer = [n for n in names if n not in chosen]
    strides, s = {}, 1
    for n in reversed(names):
        strides[n] = s
        s *= sizes[n]
    offsets = np.zeros(1, dtype=np.int64)
    for n in chosen:
        step = np.arange(sizes[n], dtype=np.int64) * strides[n]
        offsets = (offsets[:, None] + step[None, :]).ravel()
    return Nesting(tuple(outer), tuple(chosen), strides, np.sort(offsets))
