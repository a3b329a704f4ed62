"""Evaluate what is distinct once: find the distinct input tuples of a batch, compute a part of
the simulator on those, broadcast the results back (issue 37).

A search batch has hundreds of thousands of rows but each part of the model sees few distinct
inputs: the GEMMs of a layer depend on the model, the sequence, tp, cp and the micro-batch, not
on pp, dp or ZeRO; a collective's time on its kind, bytes, group, nodes spanned and fabric.
`rows(columns)` finds the distinct tuples exactly (each column's codes, remembered per array
within a `scope`, packed into one int64 key and grouped through a table indexed by it: no hash,
so no collision to check), and `on_distinct` evaluates a function of a Batch on one
representative row per distinct tuple of the columns it reads.

Rows are compared by their bits, so two rows share a group only if every input is bit-identical:
a part evaluated on the representative gives each row of its group exactly what the direct
evaluation gives it (the parts are elementwise over rows). `direct()` switches the factorisation
off, the reference path the tests compare against.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd

from .columns import Batch

_state = {"on": True}
# below this many rows factorising costs more than it saves
MIN_ROWS = 256


def enabled() -> bool:
    return _state["on"]


@contextlib.contextmanager
def direct():
    """Within the block every part is evaluated row by row (the un-factorised reference)."""
    before = _state["on"]
    _state["on"] = False
    try:
        yield
    finally:
        _state["on"] = before


def _bits(a: np.ndarray) -> np.ndarray:
    """The row values as uint64 bit patterns (equal bits = the same input)."""
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize == 8 and a.dtype.kind in "fiu":
        return a.view(np.uint64)
    if a.dtype.kind == "f":
        a = a.astype(np.float64)
        return a.view(np.uint64)
    return a.astype(np.int64).view(np.uint64)


def _constant(a: np.ndarray) -> bool:
    """Every element has the same bits as the first (remembered within a `scope`)."""
    memo = _scope.get("constant")
    if memo is not None:
        hit = memo.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
    if a.dtype == bool:
        same = bool(a.all() or not a.any())
    else:
        x = _bits(a)
        # (the first rows tell most varying columns apart without reading the whole column)
        same = bool((x[:64] == x[0]).all()) and bool((x == x[0]).all())
    if memo is not None:
        memo[id(a)] = (a, same)  # the reference keeps the id from being reused
    return same


def _known_constant(a: np.ndarray) -> bool:
    """`_constant(a)` where a `scope` has already found it out, else False."""
    memo = _scope.get("constant")
    hit = memo.get(id(a)) if memo is not None else None
    return hit is not None and hit[0] is a and hit[1]


_scope: dict = {}


@contextlib.contextmanager
def scope():
    """Within the block, arrays are taken not to change in place (simulate's inputs): which
    columns are constant is found once per array, not once per part that keys on it."""
    outer = _scope.get("constant")
    if outer is None:
        _scope["constant"] = {}
        _scope["codes"] = {}
    try:
        yield
    finally:
        if outer is None:
            _scope.pop("constant", None)
            _scope.pop("codes", None)


# a packed key below this many values is grouped through a table indexed by the key (no hash
# table); above it, by pandas' hash table on the exact int64 key
DENSE_KEYS = 1 << 21
# the packed key stays below this bound (int64, with room for one more factor)
PACK_LIMIT = 1 << 62


def _codes(a: np.ndarray) -> tuple[np.ndarray, int]:
    """(code per row, number of codes K): rows have equal codes exactly when their values have
    equal bits, codes in [0, K). Nonnegative integers (floats without -0.0, ints, bools) are
    their own codes (K = max + 1; uint8/16/32 where they fit); anything else is factorised by
    its bits. Remembered per array within a `scope`."""
    memo = _scope.get("codes")
    if memo is not None and id(a) in memo and memo[id(a)][0] is a:
        return memo[id(a)][1:]
    out = _small_ints(a)
    if out is None:
        x = _bits(a)
        out = _few_values(x)
        if out is None:
            codes, uniq = pd.factorize(x)
            out = codes, len(uniq)
    if memo is not None:
        memo[id(a)] = (a, *out)
    return out


def _small_ints(a: np.ndarray):
    """(codes, K) where every value is a nonnegative integer below 2^24 (no -0.0, no NaN),
    else None."""
    if a.dtype == bool:
        return a.view(np.uint8), 2
    if a.dtype.kind not in "fiu" or a.size == 0:
        return None
    lo, hi = a.min(), a.max()
    if not (lo >= 0 and hi < (1 << 24)):  # (False for NaN)
        return None
    k = int(hi) + 1
    dt = np.uint8 if k <= 1 << 8 else np.uint16 if k <= 1 << 16 else np.uint32
    codes = a.astype(dt)
    if a.dtype.kind == "f" and not (np.equal(codes, a).all()
                                    and not (lo == 0 and np.signbit(a).any())):
        return None  # fractions (or -0.0): factorised by bits instead
    if k > 64:  # numbered by the values present (256, 512, 1024 -> 0..2): a smaller key
        few = _few_values(codes)
        if few is not None:
            return few
        used = np.flatnonzero(np.bincount(codes, minlength=k))
        if len(used) < k:
            lut = np.zeros(k, dtype=dt)
            lut[used] = np.arange(len(used), dtype=dt)
            codes, k = lut.take(codes), len(used)
    return codes, k


def _few_values(x: np.ndarray, most: int = 8):
    """(codes, K) of an array taking at most `most` distinct values, compared as stored (bit
    patterns or integers): a few comparisons instead of a hash table (a GPU's figures, a
    fabric's, a message size), else None."""
    # a row holding the j-th value found lies in the first j "rest" sets: its code is their count
    rest = x != x[0]
    codes = rest.view(np.uint8).copy()
    for j in range(1, most + 1):
        i = int(rest.argmax())
        if not rest[i]:
            return codes, j
        if j == most:
            return None
        rest &= x != x[i]
        codes += rest.view(np.uint8)
    return None


def _group(key: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(one row of each distinct key, each row's group number) for an exact int64 key in
    [0, k)."""
    n = key.size
    if k <= max(DENSE_KEYS, 4 * n):  # a table indexed by the key: the last row holding each
        pos = np.full(k, -1, dtype=np.int64)
        pos[key] = np.arange(n, dtype=np.int64)
        keys = np.flatnonzero(pos >= 0)
        lut = np.empty(k, dtype=np.int64)
        lut[keys] = np.arange(len(keys), dtype=np.int64)
        return pos[keys], lut.take(key)
    inverse, keys = pd.factorize(key)
    inverse = inverse.astype(np.int64, copy=False)
    first = np.empty(len(keys), dtype=np.int64)
    first[inverse] = np.arange(n, dtype=np.int64)  # (the last row of each group)
    return first, inverse


def rows(columns) -> tuple[np.ndarray, np.ndarray]:
    """(index of one representative row per distinct tuple, each row's tuple number) for
    equal-length 1-d arrays: `columns[j][first][inverse]` equals `columns[j]` bit for bit.
    Constant columns are left out of the key. Exact, no hashing: each column's codes
    (`_codes`) are packed into one int64 key (mixed radix); a key that would outgrow int64 is
    renumbered by its distinct values first."""
    # (the arrays themselves where 1-d: a view would miss the per-array memos of a `scope`)
    cols = [c if isinstance(c, np.ndarray) and c.ndim == 1 else np.asarray(c).ravel()
            for c in columns]
    n = cols[0].size if cols else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    varying = [c for c in cols if not _constant(c)]
    if not varying:
        return np.zeros(1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    key, k = None, 1
    for c in varying:
        codes, kc = _codes(c)
        if key is None:
            key, k = codes.astype(np.int64), kc
            continue
        if k * kc >= PACK_LIMIT:  # renumber what is packed so far: at most n values
            first, key = _group(key, k)
            k = len(first)
        key *= kc
        key += codes
        k *= kc
    return _group(key, k)


def take(b: Batch, idx: np.ndarray) -> Batch:
    """The rows `idx` of every array of the batch (scalars are kept)."""
    n, k = len(b), len(idx)
    out = Batch()
    for name, v in b.items():
        if isinstance(v, np.ndarray) and v.ndim == 1 and v.shape[0] == n:
            # a column known to be constant (most of a batch: the model's shape, defaults): its
            # first k elements are those rows' values (a view; the simulator never writes into
            # inputs); any other is gathered (cheaper than reading all n rows to find out)
            v = v[:k] if _known_constant(v) else v.take(idx)
        elif np.ndim(v) == 1 and len(v) == n:
            v = np.asarray(v)[idx]
        out[name] = v
    return out


class Recorder(Batch):
    """A Batch that notes every column read from it (item, attribute or get)."""

    __slots__ = ()
    _reads: set = set()

    def __getitem__(self, key):
        Recorder._reads.add(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        Recorder._reads.add(key)
        return dict.get(self, key, default)


# columns each factorised part has been seen to read, by part name (grows when a part reads a
# column it had not read before: the part is then evaluated again with the larger key)
_keys: dict[str, set] = {}


def on_distinct(name: str, b: Batch, fn, seed=()) -> dict:
    """fn(b) -> dict of arrays (one element per row), evaluated on one row per distinct tuple of
    the columns fn reads, the results broadcast back to every row. The columns fn reads are
    recorded while it runs; if it reads one outside the key it was grouped by, it is evaluated
    again grouped by that one too, so the result never depends on a guessed column list."""
    n = len(b)
    if not enabled() or n < MIN_ROWS:
        return fn(b)
    key = _keys.setdefault(name, set(seed))
    while True:
        # (dict's own lookups: a recording batch handed in hears only what fn reads, below)
        cols = sorted(k for k in key if k in b and np.ndim(dict.__getitem__(b, k)) == 1)
        first, inverse = rows([dict.__getitem__(b, k) for k in cols])
        sub = Recorder(take(b, first))
        outer, Recorder._reads = Recorder._reads, set()
        try:
            out = fn(sub)
        finally:
            mine, Recorder._reads = Recorder._reads, outer | Recorder._reads
        read = {k for k in mine if k in b}
        if read <= key:
            break
        key |= read
    for k in sorted(read):  # what fn read, read from the batch handed in (it may record too)
        b.get(k)
    return {k: broadcast(v, inverse, len(first)) for k, v in out.items()}


def broadcast(v, inverse: np.ndarray, k: int):
    """A part's output on the distinct rows, back on every row (scalars stay scalars)."""
    if np.ndim(v) == 1 and len(v) == k:
        v = np.asarray(v)
        if k == 1 or (v.dtype.kind in "fiub" and _constant(v)):  # one value: fill, not gather
            return np.full(len(inverse), v[0], dtype=v.dtype)
        return v.take(inverse)
    return v
