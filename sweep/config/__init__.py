"""Run and space files: parsing and validation into typed objects (RunConfig, SpaceConfig).

The rest of sweep receives these objects, never raw YAML. May import sweep.errors and
sim_core's catalogs and specs; nothing else of sweep.
"""

from .files import *  # noqa: F401,F403
