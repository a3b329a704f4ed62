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
    """`yaml.safe_load(text)`, with the C parser when there is one."""
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
