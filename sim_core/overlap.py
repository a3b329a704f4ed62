"""Slowdown of compute that runs while communication runs (Echo, seed 000, section 6).

NCCL kernels occupy SMs (one CTA per channel) and HBM bandwidth, so the compute kernels that
overlap a collective run slower. The factor is kernel time with overlap / time alone.

The default is an explained prior by kernel class and GPU architecture; `set_model` installs a
learned model (e.g. the XGBoost regressor `sweep calibrate` trains, Echo Table 5 settings) that
maps the same inputs to a factor.
"""

from __future__ import annotations

import numpy as np

# Prior slowdown factors by architecture and kernel class (Echo Tables 2-3):
# - Ampere (A100 DDP, 25 MB all-reduce): GEMM 1.269, elementwise "Sum"/"Transform" 1.14-1.51;
#   A800 GEMM 1.134 (CUDA 11.8) - 1.178 (12.1), LayerNorm 1.091 - 1.207.
# - Hopper/Blackwell: no published per-kernel table; we take the A800 (CUDA 12) figures, the
#   closest datacenter part with the same NCCL channel/SM ratio, as the prior.
PRIOR = {
    80: {"gemm": 1.178, "attention": 1.178, "elementwise": 1.207},
    90: {"gemm": 1.134, "attention": 1.134, "elementwise": 1.150},
    100: {"gemm": 1.134, "attention": 1.134, "elementwise": 1.150},
}

_model = None


def set_model(model) -> None:
    """Install a learned slowdown model: f(features: dict of arrays) -> factor array."""
    global _model
    _model = model


def reads_features() -> bool:
    """Whether `slowdown` reads the features of each overlap (a learned model is installed);
    the prior needs only the kernel class and the architecture."""
    return _model is not None


def slowdown(sm_arch: np.ndarray, kernel_class: str, features: dict | None = None) -> np.ndarray:
    """Factor (>= 1) by which overlapped compute of `kernel_class` is slowed.

    `features` describes each overlap (sm_arch, kernel_class, dim, collective, comm_s, window_s,
    nbytes, group); a learned model sees them, the prior needs only the class and architecture.
    """
    if _model is not None and features is not None:
        return np.maximum(np.asarray(_model(features), dtype=np.float64), 1.0)
    default = PRIOR[max(PRIOR)][kernel_class]
    arch = np.asarray(sm_arch)
    code = arch.astype(np.int64)
    if code.size and (code == arch).all() and 0 <= code.min() and code.max() < 4096:
        # architectures are small integers: one table lookup instead of a mask per entry
        table = np.full(int(code.max()) + 1, default)
        for a, row in PRIOR.items():
            if a < table.size:
                table[a] = row[kernel_class]
        return table[code]
    out = np.full(sm_arch.shape, default)
    for a, row in PRIOR.items():
        out[sm_arch == a] = row[kernel_class]
    return out


def overlap_with(comm: np.ndarray, window: np.ndarray, sm_arch: np.ndarray, kernel_class: str,
                 dim: str, collective: str, nbytes=None, group=None):
    """`overlapped` with the slowdown factor of this particular overlap."""
    zeros = np.zeros_like(comm)
    feats = {"sm_arch": sm_arch, "kernel_class": kernel_class, "dim": dim,
             "collective": collective, "comm_s": comm, "window_s": window,
             "nbytes": zeros if nbytes is None else nbytes,
             "group": zeros if group is None else group}
    return overlapped(comm, window, slowdown(sm_arch, kernel_class, feats))


def overlapped(comm: np.ndarray, window: np.ndarray, factor: np.ndarray):
    """Exposed communication and extra compute time when `comm` overlaps `window` of compute.

    The compute inside the overlap runs `factor` times slower; the collective hides behind it.
    """
    hidden = np.minimum(comm, window)
    exposed = comm - hidden
    extra = (factor - 1.0) * hidden
    return exposed, extra
