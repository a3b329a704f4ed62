"""Results on disk: parts, manifest and resume, the published Parquet dataset, ranking, costs.

Both strategies write through `store.ResultStore`; reports and the API read through
`store.read_results` / `scan_results`. May import sweep.config and sweep.errors; never
sweep.engine, sweep.advice or sweep.cli.
"""

from .store import *  # noqa: F401,F403
