"""The simulator's Batch and the stored frame of grid candidates straight from their config
ids' digits (issue 37).

A grid batch used to build a pandas frame for every candidate that passes the structural rules,
resolve the framework defaults in it, normalise it and turn it into a Batch, though about half
of those rows are then pruned by a bound and never stored. Every step of that way is row-wise:
a row's values depend on that row's values of a few axes only (a GPU field on `gpu` or
`instance`, a framework default on `framework`, `tp`, the GPU and the field itself, a model
shape on `model`, ...; `_reads`). So each column, of the Batch and of the resolved frame, is
computed the usual way once per combination of the values of the axes it reads (one probe
frame, the other axes at their first value) and each candidate takes its value by the
combination's index: the same bits as the frame's way (tests/test_direct_batch.py checks every
column on the bundled spaces). The frame is built only for the rows a part stores.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim_core.frameworks import profile_fields, resolve_frame

from .space import NOOPS, Space, combination_index, normalise, sim_frame

MAX_TABLE = 1 << 16  # rows of one column's table: beyond, the batch goes the frame's way

# frame columns derived from others (Space._build)
DERIVED = {"num_gpus": ("nodes", "gpus_per_node"), "global_batch": ("global_batch_tokens",
                                                                    "seq_len")}


def _reads(column: str) -> set[str]:
    """Frame columns the pipeline (resolve_frame, normalise, model shapes, frame_to_batch) reads
    to give Batch `column` its value: a superset is safe, a missing one is not."""
    from sim_core.columns import GPU_FIELDS, NET_DEFAULTS
    from sim_core.specs import MODEL_COLUMNS

    out = {column}
    for setting, size, _ in NOOPS:
        if column == setting:
            out.add(size)
    if column in profile_fields():  # the framework's default, at tp > 1, on ROCm
        out |= {"framework", "tp", "gpu"}
    if column in MODEL_COLUMNS:
        out |= set(MODEL_COLUMNS)
    if column in GPU_FIELDS or column in NET_DEFAULTS or column == "gpu_code":
        out.add("gpu")
    return out


class DirectBatch:
    """Per-column tables of a space's Batch and resolved frame: `batch(digits)` and
    `frame_columns(ids, digits)` gather them for candidates."""

    def __init__(self, space: Space, columns: dict, inputs: dict, rule: tuple | None):
        self.space = space
        self.columns = columns  # {Batch column: (axes, strides, values per combination)}
        self.inputs = inputs  # the same for the resolved frame's columns (config_id: None)
        self.rule = rule  # (axes, strides, reasons) of the sweep's token-budget rule, or None
        self.has_gpu = "gpu" in inputs
        self._prices = None  # (prices, strides, price per combination of gpu and instance)
        self._seen: dict = {}  # {(axes, combinations present): their frame's dtypes}

    @classmethod
    def of(cls, space: Space) -> "DirectBatch | None":
        """The tables of `space` (built once, kept on it), or None where the frame's way must
        be taken: an axis with a missing value (resolve_frame's output then depends on which
        rows a batch holds), or a column that reads too many combinations."""
        got = space.__dict__.get("_direct_batch", False)
        if got is False:
            got = space.__dict__["_direct_batch"] = cls._build(space)
        return got

    @classmethod
    def _build(cls, space: Space):
        names = space.axis_names
        if not names:
            return None
        for _, values in space.axes:
            if any(v is None or (isinstance(v, float) and v != v) for v in values):
                return None
        derived = space.instance_axis()

        def axes_of(col: str) -> set[str]:
            out = {col} & set(names)
            if col in derived:
                out.add("instance")
            for src in DERIVED.get(col, ()):
                out |= axes_of(src)
            return out

        # what each table is made of: the Batch, the resolved frame, the sweep's own rule
        makers = {"batch": (_batch_of, _reads),
                  "inputs": (lambda f: f.drop(columns="config_id"), _reads),
                  "rule": (_token_rule, lambda c: {"global_batch_tokens", "seq_len"})}
        first = _frame(space, [])
        plan: dict[str, dict] = {}  # {maker: {column: its axes}}
        for name, (make, reads) in makers.items():
            plan[name] = {c: tuple(k for k, n in enumerate(names)
                                   if n in set().union(*(axes_of(f) for f in reads(c))))
                          for c in make(first)}
        # one frame for every set of axes: the combinations of each set one after another
        # (every step is row-wise, so a row's values do not depend on its neighbours)
        sets = list(dict.fromkeys(a for cols in plan.values() for a in cols.values()))
        at, parts = {}, []
        for axes in sets:
            ids, strides = space.combinations(axes, MAX_TABLE)
            if ids is None:
                return None
            at[axes] = (sum(len(x) for x in parts), len(ids), strides)
            parts.append(ids)
        frame = _frame(space, np.concatenate(parts))
        made = {}
        for name, (make, _) in makers.items():
            got = make(frame)
            made[name] = {c: (axes, at[axes][2],
                              _values(got[c])[at[axes][0]:at[axes][0] + at[axes][1]])
                          for c, axes in plan[name].items()}
        columns, inputs, rule = made["batch"], made["inputs"], made["rule"]
        gpus = tuple(k for k, n in enumerate(names) if n in ("gpu", "instance"))
        if space.combinations(gpus, MAX_TABLE)[0] is None:  # the price table (`prices`)
            return None
        return cls(space, columns, {"config_id": None, **inputs}, rule.get("reason"))

    def batch(self, digits: list):
        """The Batch of the candidates with these digits (what frame_to_batch gives on their
        resolved, normalised frame with the model's shapes)."""
        from sim_core.columns import Batch

        keys: dict = {}
        return Batch({c: self._gather(t, digits, keys) for c, t in self.columns.items()})

    def _gather(self, table: tuple, digits: list, keys: dict | None = None):
        """A column's values for these digits: its table taken at each one's combination
        (`keys` keeps the combinations' indices per set of axes, for the next column)."""
        axes, strides, values = table
        n = len(digits[0])
        if not axes and isinstance(values, np.ndarray):
            return np.full(n, values[0], dtype=values.dtype)
        keys = {} if keys is None else keys
        if axes not in keys:
            keys[axes] = combination_index(digits, axes, strides) if axes else np.zeros(n, dtype=np.int64)
        return values[keys[axes]] if isinstance(values, np.ndarray) else \
            values.take(keys[axes])

    def reasons(self, digits: list) -> np.ndarray:
        """The sweep's own rule before sim_core's (`_rules_and_simulation`): '' or the reason."""
        if self.rule is None:
            return np.full(len(digits[0]), "", dtype=object)
        return self._gather(self.rule, digits)

    def prices(self, digits: list, prices: dict) -> np.ndarray:
        """Each candidate's USD per GPU-hour (`row_prices` of its frame), by GPU and instance
        (the table kept for the last `prices` given)."""
        from ..results import row_prices

        names = self.space.axis_names
        axes = tuple(k for k, n in enumerate(names) if n in ("gpu", "instance"))
        if self._prices is None or self._prices[0] != prices:
            ids, strides = self.space.combinations(axes, MAX_TABLE)
            table = row_prices(_frame(self.space, ids), prices).to_numpy(dtype=np.float64)
            self._prices = (dict(prices), strides, table)
        _, strides, table = self._prices
        n = len(digits[0])
        return table[combination_index(digits, axes, strides)] if axes else np.full(n, table[0])

    def frame(self, ids: np.ndarray, digits: list, batch: list | None = None) -> pd.DataFrame:
        """The resolved, normalised frame of these candidates (`_frame`): what a part stores."""
        return pd.DataFrame(self.frame_columns(ids, digits, batch))

    def frame_columns(self, ids: np.ndarray, digits: list, batch: list | None = None) -> dict:
        """`frame`'s columns, {name: values}, typed as pd.DataFrame types them in `frame`.
        batch: the digits of every candidate framed with them (default: these), whose
        resolved frame decides the type of a text column (resolve_frame sets
        attention_kernel as str where a batch has an AMD row, as object elsewhere)."""
        types = self._text_types(digits if batch is None else batch)
        keys: dict = {}
        cols = {}
        for c, t in self.inputs.items():
            v = ids if t is None else self._gather(t, digits, keys)
            cols[c] = pd.Series(v, dtype=types[c], copy=False) if c in types else v
        return cols

    def _text_types(self, digits: list) -> dict:
        """{framework field stored as text: its type in the resolved frame of these
        candidates}: that of the frame of one candidate per combination present of the axes
        the field reads (kept per set of combinations: batches mostly hold the same ones).
        Other columns are typed from their axis's or fixed value alone (Space._build)."""
        types, present = {}, {}
        fields = set(profile_fields())
        for c, t in self.inputs.items():
            if c not in fields or isinstance(t[2], np.ndarray) and t[2].dtype != object:
                continue
            axes, strides, _ = t
            if axes not in present:  # which combinations occur: one counting pass
                size = math.prod(len(self.space.axes[k][1]) for k in axes)
                key = combination_index(digits, axes, strides) if axes else np.zeros(1, dtype=np.int64)
                present[axes] = np.flatnonzero(np.bincount(key, minlength=size))
            memo = (axes, present[axes].tobytes())
            if memo not in self._seen:
                ids, _ = self.space.combinations(axes, MAX_TABLE)
                self._seen[memo] = _frame(self.space, ids[present[axes]]).dtypes
            types[c] = self._seen[memo][c]
        return types


def _batch_of(frame: pd.DataFrame):
    from sim_core.columns import frame_to_batch

    from .evaluate import _with_model_shapes

    return frame_to_batch(_with_model_shapes(sim_frame(frame)))


def _token_rule(frame: pd.DataFrame) -> dict:
    """The sweep's own rule (`_rules_and_simulation`), where the frame has a token budget."""
    if "global_batch_tokens" not in frame.columns:
        return {}
    bad = (frame["global_batch_tokens"] % frame["seq_len"] != 0).to_numpy()
    return {"reason": np.where(bad, "global_batch_tokens % seq_len != 0", "").astype(object)}


def _values(col):
    """A column as what `_gather` takes from: numpy, or the frame's own array (its dtype)."""
    return np.asarray(col) if isinstance(col.dtype, np.dtype) else col.array


def _frame(space: Space, ids) -> pd.DataFrame:
    """The resolved, normalised frame of config ids (at least the first one)."""
    ids = np.asarray(ids if len(ids) else [0], dtype=np.int64)
    return normalise(resolve_frame(space.frame_of_ids(ids)))
