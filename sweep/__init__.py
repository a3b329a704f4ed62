"""sweep: pick LLM-training parallelism with a vectorized simulator (CLI `sweep`, and this
Python API: `simulate`, `search`, `open_results`, `validate`; see sweep/api.py).

The API is imported on first use, so that `sweep` on the command line starts as fast as before.
"""

import os

# pyarrow's default allocator (mimalloc) keeps what each scanned part freed, so a process that
# streams a large results dataset part by part would grow with it; the system one gives it back
# (set before pyarrow is first imported, and inherited by the Ray workers a search starts)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

from .errors import SweepError  # noqa: E402

__all__ = ["simulate", "search", "rl_search", "validate", "open_results", "Results",
           "SweepError"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'sweep' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
