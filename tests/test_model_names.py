"""One model-name resolver for published-run names and hub checkpoints (sim_core/model_names.py).

The spellings below are copied from the tables the project reads: published_runs.csv's model
column (Megatron-Bridge performance summaries write 'Qwen3_235B_a22B', Megatron-LM's README
'GPT-3 175B', NeMo 24.07 'LLAMA3.1_405B') and rl_runs.csv's (hub ids as the RL logs print them:
verl GSM8K reports 'meta-llama/Llama-3.2-1B-Instruct', play-verl 'Qwen/Qwen2-7B-Instruct',
marin#8653 'Qwen/Qwen3-235B-A22B-Thinking-2507')."""

import pandas as pd
import pytest

from sim_core import catalog, model_names
from sim_core.accuracy import rl_table, validation


@pytest.mark.parametrize("name, mid", [
    ("GPT-3 175B", "gpt3-175b"), ("GPT3-5B", "gpt3-5b"), ("LLAMA3.1_405B", "llama3.1-405b"),
    ("Llama 3 8B (dense, per torchao bench)", "llama3-8b"), ("Qwen3_235B_a22B (tokendrop)",
                                                              "qwen3-235b-a22b"),
    ("meta-llama/Llama-3.2-1B-Instruct", "llama3.2-1b"), ("Qwen/Qwen3-4B", "qwen3-4b"),
    ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3-235b-a22b"),
])
def test_published_and_checkpoint_spellings_resolve_to_one_id(name, mid):
    assert catalog.resolve_model(name)[0] == mid


def test_both_readers_share_the_resolver():
    # before: the pre-training reader did not know hub ids, the RL reader not 'Llama 3.1 8B'
    assert validation._catalog_model("meta-llama/Llama-3.1-8B-Instruct") == "llama3.1-8b"
    assert rl_table.resolve_model("Llama 3.1 8B")[0] == "llama3.1-8b"
    assert validation._catalog_model("Qwen/Qwen2-7B-Instruct") == "qwen2.5-7b"


def test_same_architecture_aliases_are_said_and_point_at_catalog_models():
    mid, note = rl_table.resolve_model("Qwen/Qwen2-7B-Instruct")
    assert mid == "qwen2.5-7b" and "same architecture" in note
    assert catalog.resolve_model("Qwen/Qwen2-7B-Instruct")[1] == "same architecture"
    names = set(catalog.model_names())
    aliases = model_names.same_architecture()
    assert aliases and set(aliases.values()) <= names
    assert not set(aliases) & names  # an alias never shadows a model the catalog has


def test_unknown_names_resolve_to_nothing():
    assert catalog.resolve_model("Qwen3.5-9B") == (None, "")
    assert catalog.resolve_model("") == (None, "")
    assert validation._catalog_model("GPT 1.7B (Megatron weak-scaling family)") == ""
    assert rl_table.resolve_model(float("nan"))[0] is None
    assert rl_table.checkpoint_name(float("nan")) == ""


def test_every_shipped_table_name_that_resolved_before_still_resolves_the_same():
    runs = pd.read_csv("sim_core/data/rl/rl_runs.csv")
    got = {m: rl_table.resolve_model(m)[0] for m in runs.model.dropna().unique()}
    assert got["Qwen2.5-Math-7B"] == "qwen2.5-7b"
    assert got["deepseek-v3"] == "deepseek-v3"
