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


# Spellings as the RL frameworks' own example configs and scripts print them (mirrors of the
# repositories at the snapshot the project holds; file of each given):
@pytest.mark.parametrize("name, mid, how", [
    # NeMo RL examples/configs/grpo_smoke.yaml 'model_name: Qwen/Qwen3-0.6B'
    ("Qwen/Qwen3-0.6B", "qwen3-0.6b", "checkpoint"),
    # verl docs/algo/baseline.md 'Qwen/Qwen2.5-3B-Instruct' (GRPO-LoRA row)
    ("Qwen/Qwen2.5-3B-Instruct", "qwen2.5-3b", "checkpoint"),
    # ROLL llm_as_judge_optimization.md 'model_name_or_path: Qwen/Qwen2.5-72B-Instruct'
    ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b", "checkpoint"),
    # verl-recipe dapo/test_dapo_glm_air_megatron.sh 'MODEL_PATH=/models/zai-org/GLM-4.5-Air-Base'
    ("/models/zai-org/GLM-4.5-Air-Base", "glm-4.5-air", "checkpoint"),
    # NeMo RL grpo-moonlight-16ba3b-4n8g-megatron-fp8-e2e.yaml
    ("moonshotai/Moonlight-16B-A3B-Instruct", "moonlight-16b-a3b", "checkpoint"),
    # NeMo RL grpo-glm47-flash-4n8g-automodel.yaml 'model_name: zai-org/GLM-4.7-Flash'
    ("zai-org/GLM-4.7-Flash", "glm-4.7-flash", "checkpoint"),
    # verl docs/algo/baseline.md 'deepseek-ai/deepseek-llm-7b-chat' (PPO rows)
    ("deepseek-ai/deepseek-llm-7b-chat", "deepseek-llm-7b", "checkpoint"),
    # verl experimental/vla/.../configuration_prismatic.py '"mistralai/Mistral-7B-v0.1"'
    ("mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1", "checkpoint"),
    # verl examples/grpo_trainer/run_mistral13b_skyworkrm_hhrlhf.sh
    ("mistralai/Mistral-Nemo-Instruct-2407", "mistral-nemo-12b", "same architecture"),
    # NeMo RL grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1-sglang.yaml
    ("Qwen/Qwen2.5-Math-1.5B-Instruct", "qwen2.5-1.5b", "same architecture"),
    # verl examples/tuning/70b/qwen2-70b_grpo_32_h800_fsdp_vllm.sh 'model_path=Qwen/Qwen2-72B-Instruct'
    ("Qwen/Qwen2-72B-Instruct", "qwen2.5-72b", "same architecture"),
    # AReaL README.md '(Qwen/Qwen2-1.5B-Instruct)'
    ("Qwen/Qwen2-1.5B-Instruct", "qwen2.5-1.5b", "same architecture"),
    # AReaL blog/AReaL_v0_2.md 'R1-Distill-Qwen-32B' as the hub id writes it
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b", "same architecture"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "qwen2.5-14b", "same architecture"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama3.1-8b", "same architecture"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama3.1-70b", "same architecture"),
    # verl docs/sglang_multiturn/multiturn.rst 'Qwen/QwQ-32B'
    ("Qwen/QwQ-32B", "qwen2.5-32b", "same architecture"),
    # SkyRL docs/.../mini_swe_agent.mdx 'Qwen/Qwen3-Coder-30B-A3B-Instruct'; its
    # examples/train/mini_swe_agent/litellm.json writes the litellm route in front
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-30b-a3b", "same architecture"),
    ("hosted_vllm/Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8", "qwen3-30b-a3b", "same architecture"),
    # NeMo RL grpo-gemma3-1b-it-1n8g-fsdp2tp1.yaml 'model_name: google/gemma-3-1b-it'; verl
    # tests/utils/test_flops_counter.py '# mistralai/Mistral-Small-24B-Instruct-2501'
    ("google/gemma-3-1b-it", "gemma-3-1b", "checkpoint"),
    ("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b", "checkpoint"),
    # published-table spellings of the same models
    ("Qwen2.5 14B", "qwen2.5-14b", "id"), ("GLM-4.5", "glm-4.5", "id"),
])
def test_rl_framework_spellings_resolve(name, mid, how):
    assert catalog.resolve_model(name) == (mid, how)


# RL checkpoints of issue 40's target families (GRPO/DAPO, 8B-671B dense and MoE), spelled as
# the RL recipes and model cards write the hub id; each alias is cited in model_names.yaml
@pytest.mark.parametrize("name, mid, how", [
    # slime docs/en/examples/glm4.7-355B-A32B.md 'hf download zai-org/GLM-4.7'
    ("zai-org/GLM-4.7", "glm-4.5", "same architecture"),
    ("zai-org/GLM-4.6", "glm-4.5", "same architecture"),
    ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseek-v3", "same architecture"),
    # SkyRL examples/train/step_wise/run_skyrl_sql_step_wise.sh 'Qwen/Qwen2.5-Coder-7B-Instruct';
    # verl examples/tuning/14b/qwen2_14b_grpo_4_h800_fsdp_vllm.sh 'Qwen/Qwen2.5-Coder-14B-Instruct';
    # open-r1 recipes/OlympicCoder-32B 'Qwen/Qwen2.5-Coder-32B-Instruct'
    ("Qwen/Qwen2.5-Coder-7B-Instruct", "qwen2.5-7b", "same architecture"),
    ("Qwen/Qwen2.5-Coder-14B-Instruct", "qwen2.5-14b", "same architecture"),
    ("Qwen/Qwen2.5-Coder-32B-Instruct", "qwen2.5-32b", "same architecture"),
    # AReaL blog/AReaL_v0_3.md table row 'DeepSeek-R1-0528-Qwen3-8B'
    ("deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", "qwen3-8b", "same architecture"),
    # NeMo RL README 'generation.model_name=agentica-org/DeepScaleR-1.5B-Preview'
    ("agentica-org/DeepScaleR-1.5B-Preview", "deepseek-r1-distill-qwen-1.5b",
     "same architecture"),
    ("Skywork/Skywork-OR1-7B", "qwen2.5-7b", "same architecture"),
    ("Skywork/Skywork-OR1-7B-Preview", "qwen2.5-7b", "same architecture"),
    ("nvidia/AceReason-Nemotron-7B", "qwen2.5-7b", "same architecture"),
    # NeMo examples/voice_agent/README.md 'nvidia/Llama-3.1-Nemotron-Nano-8B-v1'
    ("nvidia/Llama-3.1-Nemotron-Nano-8B-v1", "llama3.1-8b", "same architecture"),
    # Awesome-ML-SYS-Tutorial sglang/qwen/coder.md '--model-path Qwen/Qwen3-Coder-480B-A35B-Instruct'
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "qwen3-coder-480b-a35b", "checkpoint"),
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "qwen3-coder-480b-a35b", "checkpoint"),
    # peft examples/alora_finetuning/README.md 'mistralai/Mistral-7B-Instruct-v0.3'
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3", "same architecture"),
    ("mistralai/Mistral-7B-v0.3", "mistral-7b-v0.3", "checkpoint"),
])
def test_issue40_rl_checkpoints_resolve(name, mid, how):
    assert catalog.resolve_model(name) == (mid, how)


def test_rl_checkpoints_whose_shape_differs_get_their_own_entry():
    # Mistral v0.3's v3 tokenizer adds 768 rows to v0.1's 32000-token embedding and LM head and
    # drops the 4096-key window: priced as v0.1 it would carry a window v0.3 does not have
    v1, v3 = catalog.get_model("mistral-7b-v0.1"), catalog.get_model("mistral-7b-v0.3")
    assert (v3.vocab, v3.sliding_window, v1.sliding_window) == (32768, 0, 4096)
    assert catalog.param_count(v3) - catalog.param_count(v1) == 2 * 768 * 4096
    # Qwen3-Coder-480B-A35B is not Qwen3-235B-A22B's shape (62 layers of 6144, 160 experts)
    coder = catalog.get_model("qwen3-coder-480b-a35b")
    big = catalog.get_model("qwen3-235b-a22b")
    assert (coder.layers, coder.hidden, coder.experts) != (big.layers, big.hidden, big.experts)
    # the GLM-4.6/4.7 aliases keep GLM-4.5's dense prefix and shared expert, not 4.7-Flash's MLA
    glm = catalog.get_model(catalog.resolve_model("zai-org/GLM-4.7")[0])
    assert (glm.first_dense_layers, glm.shared_experts, glm.kv_lora_rank) == (3, 1, 0)


def test_checkpoints_without_a_citable_config_stay_unknown():
    # Qwen2.5-Math-72B: no config.json copy found (its RM sibling's is not the LM's); Mistral
    # v0.2 (32000 vocab, no window) has no catalog entry with that shape
    assert catalog.resolve_model("Qwen/Qwen2.5-Math-72B-Instruct") == (None, "")
    assert catalog.resolve_model("mistralai/Mistral-7B-Instruct-v0.2") == (None, "")


def test_distills_with_another_shape_are_not_aliased():
    # DeepSeek-R1-Distill-Qwen-1.5B unties Qwen2.5-Math-1.5B's LM head: its own entry, not
    # the tied qwen2.5-1.5b (an alias would price 0.23B parameters too few)
    assert catalog.resolve_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")[0] == \
        "deepseek-r1-distill-qwen-1.5b"
    assert catalog.get_model("qwen2.5-1.5b").tied_embeddings is True
    assert catalog.get_model("deepseek-r1-distill-qwen-1.5b").tied_embeddings is False


@pytest.mark.parametrize("name", [
    # architectures the simulator cannot express (models.yaml says why): left unpriced
    "Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3.5-35B-A3B", "google/gemma-3-27b-it",
    "google/gemma-2-2b-it",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/Nemotron-H-8B-Base-8K",
    "zai-org/GLM-5",
])
def test_models_the_simulator_cannot_express_stay_unknown(name):
    assert catalog.resolve_model(name) == (None, "")


def _moe_row(model: str) -> pd.Series:
    # published_runs.csv row 118 (Megatron-Bridge performance summary, Qwen3 30B-A3B on 16 H100)
    # with only the model cell changed: how a pre-training table would name another MoE model
    raw = pd.read_csv("sim_core/data/published_runs.csv", dtype=str, keep_default_na=False)
    row = raw[raw["id"] == "118"].iloc[0].copy()
    row["model"] = model
    return row


@pytest.mark.parametrize("name, mid", [
    ("GLM-4.5-Air", "glm-4.5-air"), ("zai-org/GLM-4.5", "glm-4.5"),
    ("moonshotai/Moonlight-16B-A3B", "moonlight-16b-a3b"),
    ("Qwen3_30B_a3B (tokendrop)", "qwen3-30b-a3b"),  # the summary's own spelling, as before
])
def test_pretraining_reader_prices_moe_models_the_catalog_has(name, mid):
    # before: only the summaries' spellings (validation._MOE_MODELS) were read, and a MoE row
    # naming any other catalog model was skipped as 'MoE model not in the catalog'
    run, skip = validation._row_to_run(_moe_row(name))
    assert skip == "" and run["model"] == mid


def test_pretraining_reader_does_not_take_a_dense_model_for_a_moe_row():
    run, skip = validation._row_to_run(_moe_row("Qwen3 8B"))
    assert skip == "MoE model not in the catalog" and "model" not in run
