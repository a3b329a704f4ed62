"""sweep: pick LLM-training parallelism with a vectorized simulator (CLI `sweep`, and this
Python API: `simulate`, `search`, `open_results`, `validate`; see sweep/api.py)."""

from .api import Results, open_results, search, simulate, validate
from .errors import SweepError

__all__ = ["simulate", "search", "validate", "open_results", "Results", "SweepError"]
