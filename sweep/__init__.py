"""sweep: pick LLM-training parallelism with a vectorized simulator (CLI `sweep`, and this
Python API: `simulate`, `search`, `open_results`, `validate`; see sweep/api.py).

The API is imported on first use, so that `sweep` on the command line starts as fast as before.
"""

from .errors import SweepError

__all__ = ["simulate", "search", "validate", "open_results", "Results", "SweepError"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'sweep' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
