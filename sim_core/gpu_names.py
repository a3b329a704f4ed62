"""One GPU-name resolver for every place a user names a GPU.

Run tables, nccl/rccl-tests headers, YAML files and `--gpu` flags name GPUs the way tools and
vendors print them ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X VF", "NVIDIA-B300-SXM6-AC",
"AMD MI300x (8xMI300X GPUs)"), not by catalog id. Before this module each reader kept its own
list of substrings, and they disagreed (the run-table reader knew no AMD part at all). Here the
names are data (catalogs/gpu_names.yaml: ordered regular expressions, each tested on real names
from public logs and tables); `resolve()` gives the catalog id or None, `suggest()` a
did-you-mean for a miss. This module does not import the catalog (the catalog imports it):
whether the id has an entry is the catalog's question.
"""

from __future__ import annotations

import difflib
import functools
import re
from importlib import resources

from . import catalog_yaml

NAMES_FILE = "gpu_names.yaml"


def normalise(name) -> str:
    """Lower case; runs of anything but letters, digits and '.' -> one space; 'NN GB' -> 'NNgb'
    ("NVIDIA-B300-SXM6-AC" -> "nvidia b300 sxm6 ac", "A100 80 GB" -> "a100 80gb")."""
    text = re.sub(r"[^a-z0-9.]+", " ", str(name).lower()).strip()
    return re.sub(r"\b(\d+) gb\b", r"\1gb", text)


@functools.lru_cache(maxsize=None)
def _raw() -> dict:
    return catalog_yaml.read(resources.files("sim_core").joinpath("catalogs", NAMES_FILE)
                          .read_text()) or {}


_VENDOR_WORDS = {"nvidia", "amd", "instinct", "tesla"}


def ambiguous(name) -> list[str]:
    """The catalog ids a bare family name ("H100", "NVIDIA A100") stands for, or []."""
    words = [w for w in normalise(name).split() if w not in _VENDOR_WORDS]
    return list((_raw().get("ambiguous") or {}).get(" ".join(words), []))


@functools.lru_cache(maxsize=None)
def rules() -> tuple[tuple[str, re.Pattern], ...]:
    """(catalog id, compiled pattern) in file order."""
    raw = _raw()
    out = []
    for i, r in enumerate(raw.get("rules") or []):
        if not isinstance(r, dict) or set(r) != {"id", "match"}:
            raise ValueError(f"{NAMES_FILE}: rule {i + 1}: expected {{id, match}}, got {r!r}")
        out.append((str(r["id"]), re.compile(str(r["match"]))))
    return tuple(out)


def resolve(name, ids=()) -> str | None:
    """Catalog id for a GPU name, or None. `ids`: the catalog's ids; a name that is one of them
    (case-insensitive, '_' or ' ' for '-') resolves to itself before any rule."""
    if name is None:
        return None
    exact = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    if exact in ids:
        return exact
    text = normalise(name)
    if not text:
        return None
    # a near miss of an id, written as one word without a vendor's name ("h100-sxmm",
    # "h100-pcei"), is a typo, not a product name: the rules would read it as some variant the
    # user did not write, so it is left to the caller's did-you-mean
    if " " not in str(name).strip() and not set(text.split()) & _VENDOR_WORDS and any(
            difflib.SequenceMatcher(None, exact, str(i)).ratio() >= 0.85 for i in ids):
        return None
    for gid, pat in rules():
        if pat.search(text):
            return gid
    return None


def suggest(name, ids, cutoff: float = 0.6) -> str | None:
    """The catalog id closest to a name no rule matched (a did-you-mean), or None: each word
    of the name that carries a digit ("mi300", "h1000") is compared with the ids and with the
    model words of the rules."""
    ids = list(ids)
    exact = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    close = difflib.get_close_matches(exact, ids, n=1, cutoff=0.85)  # a misspelled id
    if close:
        return close[0]
    words = [w for w in normalise(name).split() if re.search(r"\d", w)] or [normalise(name)]
    best, score = None, cutoff
    for w in words:
        for gid in ids:
            for cand in {gid, gid.split("-")[0]}:
                s = difflib.SequenceMatcher(None, w, cand).ratio()
                if s > score:
                    best, score = gid, s
    return best
