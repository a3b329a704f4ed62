"""Reading the catalogs' YAML files.

Every command reads the catalogs when it starts (GPUs, models, frameworks, efficiency tables:
about 0.5 s with PyYAML's pure-Python parser). libyaml's C parser, where PyYAML was built with
it, reads the same documents into the same objects (the constructors are PyYAML's own) several
times faster; without it the pure-Python loader is used.
"""

from __future__ import annotations

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read(text: str):
    """`yaml.safe_load(text)`, with the C parser when there is one (what safe_load does, with
    the safe loader class chosen here)."""
    loader = SAFE_LOADER(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
