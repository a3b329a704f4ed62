"""The `sweep` command line (`sweep.cli:main`): one module per command, wired in main.py.

The top of the package: it may import everything below (config, engine, results, advice,
sim_core); nothing in sweep imports it. Errors become one line `error: ...` and exit 2.
"""

from .main import main  # noqa: F401
