"""One model-name resolver for every table that names a model.

Published-run tables write a model by family and size ("Llama 3.1 8B", "GPT-3 175B"); RL
tables and launch scripts by its Hugging Face checkpoint ("Qwen/Qwen2.5-Math-7B-Instruct").
Before this module the two readers each had their own resolver and each knew only its own
spellings. Here both spellings reduce to catalog ids one way, and checkpoints that share a
catalog model's architecture are data (catalogs/model_names.yaml, each alias cited). Like
gpu_names, this module does not import the catalog: callers pass the catalog's ids.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from . import catalog_yaml

NAMES_FILE = "model_names.yaml"

# fine-tuning and packaging suffixes a checkpoint id carries on top of its base model
_SUFFIX = re.compile(r"-(instruct|base|chat|it|hf|sft|zero|preview|thinking|fp8|bf16|\d{4})$")


@functools.lru_cache(maxsize=None)
def same_architecture() -> dict[str, str]:
    """Checkpoint spelling -> catalog id of the model with its architecture."""
    raw = catalog_yaml.read(resources.files("sim_core").joinpath("catalogs", NAMES_FILE)
                            .read_text()) or {}
    aliases = raw.get("same_architecture") or {}
    if not isinstance(aliases, dict):
        raise ValueError(f"{NAMES_FILE}: same_architecture: expected a mapping, got {aliases!r}")
    return {str(k).lower(): str(v) for k, v in aliases.items()}


def checkpoint_name(text) -> str:
    """A hub model id as one lower-case spelling: organisation, fine-tuning suffixes and
    separators dropped ("Qwen/Qwen2.5-Math-7B-Instruct" -> "qwen2.5-math-7b")."""
    if text is None:
        return ""
    s = str(text).strip().lower().split("/")[-1].strip().replace(" ", "-").replace("_", "-")
    s = re.sub(r"^meta-", "", s)
    s = re.sub(r"llama-(\d)", r"llama\1", s)
    for _ in range(3):
        s = _SUFFIX.sub("", s)
    return s


def _published_spellings(text: str) -> list[str]:
    """How a published table writes a model, as candidate ids: 'GPT3-5B' -> gpt3-5b,
    'GPT-3 175B' -> gpt3-175b, 'Llama 3.1 8B (BF16)' -> llama3.1-8b."""
    base = re.sub(r"\(.*?\)", "", text.strip().lower()).strip()
    joined = re.sub(r"^([a-z]+)[\s_-]+(\d[\d.]*)[\s_-]+", r"\1\2-", base)
    return [re.sub(r"[\s_]+", "-", s) for s in (base, joined)]


def resolve(text, ids) -> tuple[str | None, str]:
    """(catalog id or None, how it was read): 'id' when the text is a catalog id or a
    published spelling of one, 'checkpoint' when its checkpoint spelling is, 'same
    architecture' through an alias of catalogs/model_names.yaml."""
    if text is None or not str(text).strip():
        return None, ""
    ids = set(ids)
    for guess in _published_spellings(str(text)):
        if guess in ids:
            return guess, "id"
    ck = checkpoint_name(text)
    if ck in ids:
        return ck, "checkpoint"
    alias = same_architecture().get(ck)
    if alias in ids:
        return alias, "same architecture"
    return None, ""
