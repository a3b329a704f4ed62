"""A search space as a lazily enumerable product of axes, with vectorized rule pruning.

Configuration number `i` (its `config_id`) is the i-th element of
``itertools.product(*axis_values)`` -- the last axis varies fastest. A range of ids is decoded
into a DataFrame with numpy (mixed-radix digits), so any chunk of the product can be built in
any process without enumerating what comes before it; that is what makes batches
deterministic, resumable and cheap to ship to Ray workers (only `start, stop` travel).

No-op settings: a setting that does nothing in a configuration is normalised, not called
invalid (`NOOPS`): sequence parallelism at tp = 1 is off (Megatron turns it off silently), vpp at
pp = 1 is 1. When the setting is an axis, the configurations that differ from another only in
such a setting are duplicates (`Space.duplicates`): the grid evaluates the first and counts the
others.

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

from ..config import INSTANCE_COLUMNS, RunConfig, SpaceConfig, fixed_columns, instance_columns
from ..errors import SweepError

# Columns the simulator understands; everything else in a frame is bookkeeping.
SIM_COLUMNS = tuple(ALL_COLUMNS)
PSEUDO_COLUMNS = ("nodes", "global_batch_tokens")
COLUMN_ORDER = ("config_id",) + SIM_COLUMNS + PSEUDO_COLUMNS


# (setting, the parallel size it needs above 1, the value it takes when that size is 1)
NOOPS = (("sequence_parallel", "tp", False), ("vpp", "pp", 1))

# axes that Space.structural_columns reads besides the structural rules' own fields: what
# those are derived from (cluster size, batch, model shape, an instance's columns)
STRUCTURAL_SOURCES = frozenset(("nodes", "global_batch_tokens", "model", "instance"))
MAX_STRUCTURAL_TABLE = 1 << 21  # combinations of those axes' values checked up front


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """No-op settings set to what they amount to (see NOOPS); other rows untouched."""
    out = frame
    for setting, size, off in NOOPS:
        if setting not in frame.columns or size not in frame.columns:
            continue
        idle = (frame[size] == 1).to_numpy() & (frame[setting] != off).to_numpy()
        if idle.any():
            if out is frame:
                out = frame.copy()
            col = out[setting].to_numpy().copy()
            col[idle] = off
            out[setting] = col
    return out


@dataclass
class Space:
    name: str
    fixed: dict
    axes: list  # [(column, [values...]), ...] in product order
    price_per_hour: float | dict | None = None  # one price, or {gpu or instance id: price}
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: RunConfig) -> "Space":
        fixed = fixed_columns(cfg)
        axes = list((getattr(cfg, "space", None) or {}).items())
        if "instance" in dict(axes):  # each instance sets these per row (_build); given
            given = cfg.cluster.model_fields_set  # network fields stay fixed overrides
            for name in INSTANCE_COLUMNS:
                if name not in given or name in ("gpu", "gpus_per_node"):
                    fixed.pop(name, None)
        for name, _ in axes:
            fixed.pop(name, None)
            # a varied cluster size / batch replaces the other way of giving it
            other = {"num_gpus": "nodes", "nodes": "num_gpus",
                     "global_batch": "global_batch_tokens",
                     "global_batch_tokens": "global_batch"}.get(name)
            if other:
                fixed.pop(other, None)
        price = cfg.cluster.price_per_hour
        if isinstance(price, dict):
            price = {str(k).lower().replace("_", "-"): float(v) for k, v in price.items()}
        return cls(name=getattr(cfg, "name", None) or "run", fixed=fixed, axes=axes,
                   price_per_hour=price)

    @property
    def size(self) -> int:
        return math.prod(len(v) for _, v in self.axes) if self.axes else 1

    @property
    def axis_names(self) -> list[str]:
        return [n for n, _ in self.axes]

    def instance_axis(self) -> dict:
        """{column: [value per instance of the `instance` axis]} for the INSTANCE_COLUMNS it
        sets (those the file does not fix); {} when instance is not an axis."""
        values = dict(self.axes).get("instance")
        if not values:
            return {}
        rows = [instance_columns(v) for v in values]
        return {c: [r[c] for r in rows] for c in INSTANCE_COLUMNS if c not in self.fixed}

    def prices(self) -> dict:
        """USD per GPU-hour for every GPU and instance id the space can produce (results'
        gpu_prices: the instance's catalog price, else the GPU's, unless overridden)."""
        from ..results import gpu_prices

        axes = dict(self.axes)
        inst = axes.get("instance") or ([self.fixed["instance"]] if self.fixed.get("instance")
                                        else [])
        gpus = axes.get("gpu") or self.instance_axis().get("gpu") or [self.fixed.get("gpu")]
        return gpu_prices([g for g in gpus if g], self.price_per_hour, inst)

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

    def range_digits(self, start: int, stop: int) -> list[np.ndarray]:
        """`digits(np.arange(start, stop))` without dividing every id by every radix: in a run
        of consecutive ids an axis's digit is constant over blocks of its stride, so each axis
        is its block digits repeated (a grid batch is such a run)."""
        n = max(0, stop - start)
        out = [None] * len(self.axes)
        stride = 1
        for k in range(len(self.axes) - 1, -1, -1):
            size = len(self.axes[k][1])
            if stride == 1:
                out[k] = np.arange(start, stop, dtype=np.int64) % size
            else:
                first, last = start // stride, (stop - 1) // stride
                blocks = np.arange(first, last + 1, dtype=np.int64)
                counts = np.full(len(blocks), stride, dtype=np.int64)
                counts[0] = min((first + 1) * stride, stop) - start
                if len(blocks) > 1:
                    counts[-1] = stop - last * stride
                out[k] = np.repeat(blocks % size, counts) if n else np.zeros(0, np.int64)
            stride *= size
        return out

    def digits(self, ids: np.ndarray) -> list[np.ndarray]:
        """Mixed-radix digits of config ids: one index array per axis (itertools.product order)."""
        rest = np.asarray(ids, dtype=np.int64)
        out = [None] * len(self.axes)
        for k in range(len(self.axes) - 1, -1, -1):
            rest, out[k] = np.divmod(rest, len(self.axes[k][1]))  # one pass for both
        return out

    def frame(self, start: int, stop: int) -> pd.DataFrame:
        """Candidate configurations start..stop-1 as a run frame (with `config_id`)."""
        ids = np.arange(start, stop, dtype=np.int64)
        return self._build(ids, self.digits(ids))

    def frame_of_ids(self, ids, digits: list | None = None) -> pd.DataFrame:
        """digits: `self.digits(ids)` where the caller has them already."""
        ids = np.asarray(ids, dtype=np.int64)
        return self._build(ids, self.digits(ids) if digits is None else digits)

    def duplicates(self, frame: pd.DataFrame, digits: list | None = None) -> np.ndarray:
        """Rows that normalise (NOOPS) to a configuration another row of the space already is:
        a no-op setting on an axis at a digit other than the first. The first is evaluated,
        with the setting normalised, for all of them. digits: those of frame["config_id"]
        where the caller has them already."""
        dup = np.zeros(len(np.asarray(frame["config_id"])), dtype=bool)
        names = self.axis_names
        for setting, size, _ in NOOPS:
            if setting not in names or size not in frame:
                continue
            k = names.index(setting)
            if digits is None:  # once, whatever the number of no-op settings
                digits = self.digits(np.asarray(frame["config_id"]))
            digit = digits[k]
            dup |= (np.asarray(frame[size]) == 1) & (digit != 0)
        return dup

    def noop_repeats(self, digits: list) -> np.ndarray | None:
        """`duplicates` from the digits alone (no columns built), where the size of every no-op
        setting on an axis is an axis or a fixed field; None otherwise (then `duplicates`)."""
        names = self.axis_names
        n = len(digits[0]) if digits else 0
        dup = np.zeros(n, dtype=bool)
        for setting, size, _ in NOOPS:
            if setting not in names:
                continue
            if size in names:
                k = names.index(size)
                one = (_typed(self.axes[k][1]) == 1)[digits[k]]
            elif size in self.fixed:  # (instance_axis never sets a fixed field)
                one = np.full(n, self.fixed[size] == 1)
            else:
                return None
            dup |= one & (digits[names.index(setting)] != 0)
        return dup

    def subspace_ids(self, ids, digits: list | None = None) -> np.ndarray:
        """For each config id, the id of its sub-space for the memory bound (sweep/engine/prune.py):
        the configuration with the same values but the first micro_batch and recompute."""
        ids = np.asarray(ids, dtype=np.int64)
        names = self.axis_names
        inner = [names.index(a) for a in ("micro_batch", "recompute") if a in names]
        if not inner:
            return ids
        digits = self.digits(ids) if digits is None else digits
        out = ids.copy()
        for k in inner:
            stride = int(np.prod([len(v) for _, v in self.axes[k + 1:]], dtype=np.int64))
            out -= digits[k] * stride
        return out

    def structural_columns(self, ids: np.ndarray, digits: list | None = None) -> dict | None:
        """The fields `sim_core.rules.structural_rules` reads, as float arrays straight from
        the config ids (no frame): parallel sizes, cluster size, batch, model shape. None when
        a field cannot be had that way (then every row goes the full way)."""
        from sim_core import catalog
        from sim_core.rules import STRUCTURAL_FIELDS

        ids = np.asarray(ids, dtype=np.int64)
        n, names = len(ids), self.axis_names
        if digits is None:
            digits = self.digits(ids) if self.axes else []

        derived = self.instance_axis()

        def col(name):
            if name in names:
                k = names.index(name)
                return _typed(self.axes[k][1])[digits[k]]
            if name in derived:
                k = names.index("instance")
                return _typed(derived[name])[digits[k]]
            if name in self.fixed:
                return np.full(n, self.fixed[name])
            return None

        out = {}
        try:
            num = col("num_gpus")
            if num is None and col("nodes") is not None:
                gpn = col("gpus_per_node")
                num = col("nodes") * (gpn if gpn is not None else ALL_COLUMNS["gpus_per_node"])
            batch = col("global_batch")
            if batch is None and col("global_batch_tokens") is not None:
                batch = col("global_batch_tokens") // col("seq_len")
            # the model ids: the axis's values (few), or the one fixed id, not one per row
            if "model" in names:
                model = col("model")
                models = pd.unique(np.asarray(self.axes[names.index("model")][1], dtype=object))
            elif "model" in self.fixed:
                model, models = None, [self.fixed["model"]]
            else:
                model, models = None, []
            for f in STRUCTURAL_FIELDS:
                v = {"num_gpus": num, "global_batch": batch}.get(f, col(f))
                if v is None and f in ("heads", "kv_heads", "layers", "experts") \
                        and len(models):
                    shape = {m: catalog.get_model(str(m)).columns()[f] for m in models}
                    v = np.array([shape[m] for m in model]) if len(shape) > 1 \
                        else np.full(n, next(iter(shape.values())))
                if v is None:
                    v = ALL_COLUMNS.get(f)
                    if v is None:
                        return None
                    v = np.full(n, v)
                out[f] = np.asarray(v, dtype=bool if f == "sequence_parallel" else np.float64)
        except (KeyError, ValueError, TypeError):
            return None
        out["config_id"] = ids
        # what evaluate does: no-op settings normalised
        for setting, size, off in NOOPS:
            if setting in out:
                out[setting] = np.where(out[size] == 1, off, out[setting])
        return out

    def precheck(self, cols: dict | None) -> np.ndarray:
        """Reason each configuration breaks one of the structural rules ('' = passes them, or
        unknown), from `structural_columns`: the same first reason the full check gives, since
        these rules come first, in the same order."""
        from sim_core.columns import Batch
        from sim_core.rules import structural_rules

        if cols is None:
            return np.full(0, "", dtype=object)
        from sim_core import distinct

        fields = {k: v for k, v in cols.items() if k != "config_id"}
        # the rules once per distinct combination of the fields (few: the structural axes'
        # product), then broadcast to the batch's rows
        first, inverse = distinct.rows(list(fields.values()))
        n = len(first)
        reasons = np.full(n, "", dtype=object)
        open_ = np.ones(n, dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            for text, bad in structural_rules(Batch({k: v[first] for k, v in fields.items()})):
                new = bad & open_
                reasons[new] = text
                open_ &= ~bad
        return reasons[inverse]

    def framed_fraction(self, sample: int = 20_000) -> float:
        """The share of the candidates that pass the structural rules and are not no-op
        repeats: those a grid batch builds a frame for and evaluates (the rest are counted from
        their ids). Estimated on a fixed sample of config ids spread over the space (every
        candidate of a small one); 1.0 where the structural fields cannot be had from ids."""
        if self.size == 0:
            return 0.0
        if self.size <= sample:
            ids = np.arange(self.size, dtype=np.int64)
        else:
            ids = np.unique(np.random.default_rng(0).integers(0, self.size, sample))
        digits = self.digits(ids)
        cols = self.structural_columns(ids, digits)
        if cols is None:
            return 1.0
        pre = self.structural_reasons(digits)
        if pre is None:
            pre = self.precheck(cols)
        return float(((pre == "") & ~self.duplicates(cols, digits)).mean())

    def structural_reasons(self, digits: list) -> np.ndarray | None:
        """`precheck(structural_columns(ids))` from the ids' digits: the structural fields
        depend on a few axes only (theirs and STRUCTURAL_SOURCES), so the rules are checked once per
        combination of those axes' values for the whole space (a table built on first use,
        one row per combination) and each candidate looks its reason up by the combination's
        index. None when the table would be too large or the fields cannot be had from ids
        (then precheck)."""
        coded = self.structural_codes(digits)
        return None if coded is None else coded[1][coded[0]]

    def structural_codes(self, digits: list) -> tuple[np.ndarray, np.ndarray] | None:
        """(each candidate's combination index, the reason of each combination): what
        `structural_reasons` looks up, kept apart so that a batch can count its reasons by
        combination rather than by string. None as for structural_reasons."""
        table = self.__dict__.get("_structural_table", False)
        if table is False:
            table = self.__dict__["_structural_table"] = self._build_structural_table()
        if table is None:
            return None
        axes, strides, reasons = table
        return combination_index(digits, axes, strides), reasons

    def _build_structural_table(self):
        """(axes the structural fields read, the combination index's stride for each, reason
        of each combination); None where structural_reasons falls back to precheck."""
        from sim_core.rules import STRUCTURAL_FIELDS

        names = self.axis_names
        sources = STRUCTURAL_SOURCES | set(STRUCTURAL_FIELDS)
        axes = [k for k, name in enumerate(names) if name in sources]
        ids, strides = self.combinations(axes, MAX_STRUCTURAL_TABLE)
        if not names or ids is None:
            return None
        cols = self.structural_columns(ids)
        if cols is None:
            return None
        return axes, strides, self.precheck(cols)

    def combinations(self, axes, limit: int):
        """(config ids: one candidate per combination of the values of the axes at positions
        `axes`, the other axes at their first value; each axis's stride in the combination
        index, `combination_index`), or (None, None) beyond `limit` combinations: the
        tables that are computed once per combination and looked up by candidate."""
        sizes = [len(self.axes[k][1]) for k in axes]
        total = math.prod(sizes)
        if total > limit:
            return None, None
        strides = [math.prod(sizes[j + 1:]) for j in range(len(axes))]
        full = [math.prod(len(v) for _, v in self.axes[k + 1:]) for k in range(len(self.axes))]
        combo = np.arange(total, dtype=np.int64)
        ids = np.zeros(total, dtype=np.int64)
        for k, size, stride in zip(axes, sizes, strides):
            ids += (combo // stride) % size * full[k]
        return ids, strides

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
            cols[name] = _pick(values, digits[k])
        for name, value in self.fixed.items():
            cols[name] = _pick([value], np.zeros(n, dtype=np.int64))
        if "instance" in self.axis_names:
            k = self.axis_names.index("instance")
            for name, values in self.instance_axis().items():
                cols[name] = _pick(values, digits[k])
        if "nodes" in cols:
            cols["num_gpus"] = cols["nodes"] * cols["gpus_per_node"]
        if "global_batch_tokens" in cols:
            cols["global_batch"] = cols["global_batch_tokens"] // cols["seq_len"]
        order = [c for c in COLUMN_ORDER if c in cols] + [c for c in cols if c not in COLUMN_ORDER]
        return pd.DataFrame({c: cols[c] for c in order})


def combination_index(digits: list, axes, strides) -> np.ndarray:
    """Each candidate's index among the combinations of these axes (`Space.combinations`),
    from its digits."""
    key = np.zeros(len(digits[0]) if digits else 0, dtype=np.int64)
    for k, stride in zip(axes, strides):
        key += digits[k] * stride
    return key


def _pick(values: list, index: np.ndarray):
    """values[index] as a column: numpy for numbers and bools; other values (strings) typed
    once by pandas, as the frame would type them, then taken (no conversion per row)."""
    typed = _typed(values)
    if typed.dtype != object:
        return typed[index]
    return pd.Series(typed).array.take(index)


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
        r = rule_reasons(normalise(space.frame(start, min(start + chunk, space.size))), check)
        ok = r == ""
        valid += int(ok.sum())
        reasons.update(r[~ok].tolist())
    return Census(space.size, valid, reasons)


def require_valid(c: Census, name: str) -> None:
    if c.valid == 0:
        top = ", ".join(f"'{r}' ({n:,})" for r, n in c.reasons.most_common(3))
        raise SweepError(f"space '{name}' has no valid configuration: all {c.total:,} "
                         f"candidates break the rules (most common: {top})")


# ---------------------------------------------------------------------------------------------
# Counting without walking the whole space (`sweep check`)
# ---------------------------------------------------------------------------------------------
CHECK_ENUMERATE_MAX = 1_000_000  # rule-relevant candidates counted one by one, at most
CHECK_SAMPLE = 100_000  # candidates drawn to estimate the counts of a larger space


@dataclass
class Count:
    """What `sweep check` reports: the size (always computed) and the valid count with its
    reasons, exact (factored census) or estimated from a uniform sample."""

    census: Census
    free: list  # axes no rule reads (each multiplies the counts by its length)
    exact: bool
    sample: int = 0

    def lines(self) -> list[str]:
        c = self.census
        if self.exact:
            out = c.lines()
            if self.free:
                out.append(f"(counted exactly: no rule reads {', '.join(self.free)}; each of "
                           "their values repeats the same counts)")
            return out
        share = c.valid / c.total if c.total else 0.0
        half = 1.96 * math.sqrt(max(share * (1 - share), 1e-12) / max(self.sample, 1))
        out = [f"configurations: {c.total:,}",
               f"valid (pass the rules): about {share:.2%} (+/- {half:.2%}), "
               f"~{c.valid:,.3g} -- estimated from a uniform sample of {self.sample:,}; "
               "the space is too large to count one by one"]
        for reason, n in c.reasons.most_common(8):
            out.append(f"  ~{n / c.total:>9.2%}  {reason}")
        return out


def rule_axes(space: Space) -> set[str]:
    """Axes whose value can change what the default rules say: those of the Batch fields the
    rules read (recorded while they run on a probe of the space), with the axes each field is
    derived from (GPU catalog fields from `gpu`, framework defaults from `framework` and `tp`,
    model shapes from `model`, cluster size and batch from their other forms, no-op settings
    from the size they depend on)."""
    from sim_core import frameworks, rules
    from sim_core.columns import GPU_FIELDS, NET_DEFAULTS, Batch, frame_to_batch
    from sim_core.specs import MODEL_COLUMNS

    read: set[str] = set()

    class Recording(Batch):
        __slots__ = ()

        def __getitem__(self, key):
            read.add(key)
            return dict.__getitem__(self, key)

        def get(self, key, default=None):
            read.add(key)
            return dict.get(self, key, default)

        def __contains__(self, key):
            read.add(key)
            return dict.__contains__(self, key)

    probe = [0]  # every value of every axis once
    for k, (_, values) in enumerate(space.axes):
        stride = math.prod(len(v) for _, v in space.axes[k + 1:])
        probe += [j * stride for j in range(1, len(values))]
    frame = normalise(space.frame_of_ids(sorted(set(probe))))
    rules.check(Recording(frame_to_batch(sim_frame(frame))))
    derived = {"num_gpus": {"nodes", "gpus_per_node", "instance"},
               "global_batch": {"global_batch_tokens", "seq_len"},
               "sequence_parallel": {"tp"}, "vpp": {"pp"}, "gpu_code": {"gpu", "instance"},
               "gpus_per_node": {"instance"},
               **{f: {"gpu", "instance"} for f in GPU_FIELDS + NET_DEFAULTS},
               **{f: {"framework", "tp"} for f in frameworks.profile_fields()},
               **{f: {"model"} for f in MODEL_COLUMNS if f != "model"}}
    needed = set()
    for key in read:
        needed |= {key} | derived.get(key, set())
    if "global_batch_tokens" in space.axis_names:  # the sweep's own rule
        needed |= {"global_batch_tokens", "seq_len"}
    return needed & set(space.axis_names)


def count(space: Space, chunk: int = 200_000, seed: int = 0) -> Count:
    """The counts of `census` without walking the space: the axes no rule reads are factored
    out (the census of the others, each count times the product of their lengths); when the
    rest still exceeds CHECK_ENUMERATE_MAX, the counts are estimated from a uniform sample."""
    relevant = rule_axes(space)
    free = [n for n in space.axis_names if n not in relevant]
    factor = math.prod(len(v) for n, v in space.axes if n in free)
    fixed = {**space.fixed, **{n: v[0] for n, v in space.axes if n in free}}
    if "instance" in free:  # its first value, with the columns it sets
        fixed.update({c: v[0] for c, v in space.instance_axis().items()})
    sub = Space(name=space.name, fixed=fixed,
                axes=[(n, v) for n, v in space.axes if n in relevant],
                price_per_hour=space.price_per_hour, meta=space.meta)
    if sub.size <= CHECK_ENUMERATE_MAX:
        c = census(sub, chunk=chunk)
        return Count(Census(space.size, c.valid * factor,
                            Counter({r: n * factor for r, n in c.reasons.items()})),
                     free, exact=True)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, space.size, size=CHECK_SAMPLE, dtype=np.int64)
    reasons = rule_reasons(normalise(space.frame_of_ids(ids)))
    ok = reasons == ""
    scale = space.size / CHECK_SAMPLE
    return Count(Census(space.size, int(round(ok.sum() * scale)),
                        Counter({r: int(round(n * scale))
                                 for r, n in Counter(reasons[~ok].tolist()).items()})),
                 free, exact=False, sample=CHECK_SAMPLE)
