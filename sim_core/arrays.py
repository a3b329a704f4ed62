"""Array helpers of the simulator's hot path.

`select(mask, a, b)` is `np.where(mask, a, b)` for float64 results, bit for bit, computed with
integer bit operations: numpy's `where` branches per element, so on a batch whose masks
scatter (random configurations) it runs about 5x slower than on grid-ordered ones; the bit
form runs the same on both.
"""

from __future__ import annotations

import numpy as np


def select(mask, a, b) -> np.ndarray:
    """np.where(mask, a, b) as float64 (a and b arrays or scalars, broadcast to the mask)."""
    mask = np.asarray(mask)
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if mask.dtype != bool or mask.ndim != 1:
        return np.where(mask, a, b)
    n = mask.shape[0]
    if a.shape not in ((), (n,)) or b.shape not in ((), (n,)):
        return np.where(mask, a, b)
    if not mask.any():  # one side only (a batch that does not vary this switch)
        return np.array(np.broadcast_to(b, (n,)))
    if mask.all():
        return np.array(np.broadcast_to(a, (n,)))
    ones = np.negative(mask.view(np.uint8), dtype=np.uint64)  # all bits set where mask
    if b.ndim == 0 and b == 0.0 and not np.signbit(b):  # b is +0.0: all bits clear
        ones &= a.view(np.uint64)
        return ones.view(np.float64)
    if a.ndim == 0 and a == 0.0 and not np.signbit(a):  # a is +0.0: b where the mask is clear
        ones = np.invert(ones, out=ones)
        ones &= np.broadcast_to(b, (n,)).view(np.uint64)
        return ones.view(np.float64)
    av, bv = a.view(np.uint64), b.view(np.uint64)
    x = np.bitwise_xor(av, bv) if a.ndim or b.ndim else np.full(n, av ^ bv, dtype=np.uint64)
    x &= ones
    x ^= bv
    return x.view(np.float64)


def where(mask, a, b):
    """np.where(mask, a, b), the same dtype and bits: `select`'s bit operations where the result
    is float64 (a 1-d bool mask; a and b float64 arrays of its length or Python numbers), else
    numpy's own. numpy's `where` branches per element (slow on scattered masks)."""
    if (isinstance(mask, np.ndarray) and mask.dtype == bool and mask.ndim == 1
            and _float64_operand(a, mask.shape) and _float64_operand(b, mask.shape)
            and (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)
                 or isinstance(a, float) or isinstance(b, float))):
        return select(mask, a, b)
    return np.where(mask, a, b)


def _float64_operand(x, shape) -> bool:
    """A float64 array of the given shape, or a Python int or float (not bool): np.where's
    result with it is float64 whenever the other operand is float64 or a Python float."""
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 and x.shape in (shape, ())
    return type(x) in (int, float)


# glibc malloc: arrays up to MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of
# freed heap stays mapped. A batch of 200,000 configurations allocates hundreds of 1.6 MB
# temporaries; under glibc's defaults freed memory is returned to the kernel (trimmed) as soon
# as a few MB lie free, so nearly every new temporary faults its pages in again: about a third
# of the simulator's time on one core (benchmarks/core_throughput.py). The trim threshold must
# sit above what one call frees at its end: a 200,000-row dense batch (the grid's largest,
# sweep/engine/grid.py MAX_GRID_BATCH) peaks at ~465 MB of heap, so at 256 MiB glibc trimmed
# it after some calls and not others, depending on where long-lived objects sat in the heap
# (set by PYTHONHASHSEED): 0.85M or 1.6M configurations/s per process, 2.6x the page faults
# in the slow one. At 1 GiB no call trims. What stays mapped is at most the heap's peak,
# which the process has already reached, so the peak resident memory does not grow.
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 1 << 30  # 1 GiB
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds as above (True if set). A no-op where the C library
    is not glibc, or with SWEEP_MALLOC_DEFAULTS=1 in the environment."""
    import ctypes
    import ctypes.util
    import os
    import sys

    if os.environ.get("SWEEP_MALLOC_DEFAULTS") == "1" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
