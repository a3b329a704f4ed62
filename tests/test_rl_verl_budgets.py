"""verl's token budgets and gradient checkpointing as its FSDP workers apply them (issue 40,
sim_core/rl/verl.py rule 1, training.logprob_budget): the log-prob passes have their own
budget (`log_prob_max_token_len_per_gpu`), the update its own (`ppo_max_token_len_per_gpu`),
both times the Ulysses size; checkpointing replays layers in the update only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim_core.rl import inputs, training
from sim_core.rl.phases import simulate_rl

# a verl GRPO row with FSDP on 8 H100 (as tests/test_rl_verl.py's), long enough that the
# passes are GPU-bound and split into several micro-batches
BASE = dict(model="qwen2.5-7b", gpu="h100-sxm", num_gpus=8, rollout_tp=2,
            prompts_per_step=128, responses_per_prompt=8, prompt_len=200, response_mean=1500,
            response_max=4096, prompt_max=1024, gpu_memory_utilization=0.6, train_tp=1,
            train_pp=1, train_zero=3, mini_batches=4, train_seq_len=8192, use_ref=True)


def frame(*rows):
    return pd.DataFrame([{**BASE, **r} for r in rows])


def test_logprob_budget_is_its_own_times_ulysses_else_the_updates():
    df = frame({}, {"logprob_seq_len": 24576}, {"logprob_seq_len": 24576, "train_ulysses": 4},
               {"train_ulysses": 4})
    b = inputs.to_batch(df)
    assert list(training.logprob_budget(df, b)) == [8192, 24576, 4 * 24576, 4 * 8192]
    assert list(training.pack_budget(df, b)) == [8192, 8192, 4 * 8192, 4 * 8192]


def test_a_larger_logprob_budget_streams_the_reference_fewer_times():
    # verl streams the reference's bf16 shard from the host once per reference micro-batch
    # (fsdp_workers.py forces CPUOffload on the reference): 3x the budget, a third of them
    r = simulate_rl(frame({}, {"logprob_seq_len": 3 * 8192}))
    assert r.ref_time_s[1] < r.ref_time_s[0]
    assert r.old_log_prob_time_s[1] <= r.old_log_prob_time_s[0]
    # the update keeps its own budget
    assert np.isclose(r.update_time_s[1], r.update_time_s[0])


def test_checkpointing_replays_layers_in_the_update_only():
    # enable_gradient_checkpointing wraps the decoder layers (HF gradient_checkpointing_enable);
    # compute_log_prob runs under torch.no_grad, so nothing is replayed there
    r = simulate_rl(frame({"train_recompute": "full"}, {"train_recompute": "none"}))
    assert np.isclose(r.old_log_prob_time_s[0], r.old_log_prob_time_s[1])
    assert r.update_time_s[0] > 1.2 * r.update_time_s[1]


def test_one_step_off_rows_carry_the_recipes_budgets():
    t = pd.read_csv("sim_core/data/rl/rl_runs.csv")
    fsdp2 = t[(t.source == "verl one_step_off.md") & (t.train_backend == "fsdp2")]
    # dapo_7b_math_fsdp2_*.sh: (max_prompt 2048 + max_response 20480) x 2 and x 3
    assert list(fsdp2.train_seq_len) == [45056, 45056]
    assert list(fsdp2.logprob_seq_len) == [67584, 67584]


def test_run_file_sets_the_logprob_budget(tmp_path):
    import pytest
    import yaml

    import sweep
    from sweep.errors import SweepError

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    src["parallel"] = {"tp": 1, "pp": 1, "zero": 3, "recompute": "full"}
    src["train"].update({"seq_len": 8192, "use_ref": True})
    f = tmp_path / "verl.yaml"
    f.write_text(yaml.safe_dump(src))
    one = sweep.simulate(str(f))
    src["train"]["logprob_seq_len"] = 4 * 8192
    f.write_text(yaml.safe_dump(src))
    two = sweep.simulate(str(f))
    assert two.ref_time_s.iloc[0] < one.ref_time_s.iloc[0]
    src["train"]["logprob_seq_len"] = 0
    f.write_text(yaml.safe_dump(src))
    with pytest.raises(SweepError, match="logprob_seq_len"):
        sweep.simulate(str(f))
