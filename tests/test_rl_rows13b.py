"""Rows batch 13b of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
13b)"): the native-verl arm of llm-d-rl's arXiv-classification workload (Qwen3-4B GRPO on one
node of 8 H200, 2,048 sequences of ~12.9k-token prompts and ~630-token responses), its stated
timers and the configuration of the files its README's command runs; read as the source states
it, and priced."""
import numpy as np
import pytest

from sim_core.accuracy import rl, rl_table
from tests.rl_rows import published_rows

LLMD = "llm-d-rl verl arxiv workload (Qwen3-4B, 8 H200)"


def test_arxiv_row_is_the_native_arms_stated_figures():
    t = published_rows(LLMD)
    assert len(t) == 1
    # the README at the last commit of its integrations/ path (the 10-step results)
    assert t.url[0].startswith("https://github.com/llm-d-incubation/llm-d-rl/blob/"
                               "ea8880f2f484ef7cbd2020ca9edee5755ce42c53/")
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == [""]
    r = n.iloc[0]
    # "1 worker node, 8x NVIDIA H200", "Qwen3-4B (FSDP1 actor/ref)"
    assert (r.model, r.gpu, r.num_gpus) == ("qwen3-4b", "h200", 8)
    # native column, steady state over steps 2-10: timing_s/step 955.3, timing_s/gen 151.7,
    # update_actor "~550 s/step"; prompt_length mean 12,890, response_length mean 628
    assert (r.step_time_s, r.gen_time_s, r.update_actor_time_s) == \
        pytest.approx((955.3, 151.7, 550.0))
    assert (float(r.prompt_len), float(r.mean_seq_len)) == pytest.approx((12890, 628))
    # max_prompt_length 24576, max_response_length 2048
    assert (r.max_prompt_len, r.max_response_or_total_len) == (24576, 2048)
    # the log-prob passes are not stated separately
    assert np.isnan(r.old_log_prob_time_s) and np.isnan(r.ref_time_s)
    # the EPP arm (910.1 s) is not a row
    assert "910.1" in t.notes[0] and len(t) == 1


def test_arxiv_row_takes_the_scripts_settings():
    t = published_rows(LLMD)
    n, _, _ = rl_table.normalize(t)
    df, _, _ = rl.to_frame(t)
    r, d = n.iloc[0], df.iloc[0]
    # run_test.sh: TRAIN_BATCH_SIZE 256, PPO_MINI_BATCH_SIZE 128 (two updates), n 8, TP 1
    assert (r.prompts_per_step, r.responses_per_prompt, r.train_gbs_seqs) == (256, 8, 1024)
    assert (r.rollout_engine, r.rollout_tp, r.placement) == ("vllm", 1, "colocated")
    # verl 334d9f8b's run_qwen3_4b_fsdp.sh: vLLM memory 0.6, dynamic batching, remove padding,
    # gradient checkpointing, KL loss (a reference pass), the reference's parameters offloaded
    assert r.gpu_memory_utilization == pytest.approx(0.6)
    assert bool(d.sequence_packing) and bool(d.remove_padding) and bool(d.use_ref)
    assert bool(d.ref_offload) and not bool(d.offload_params)
    # task.env: ppo and log-prob token budgets 28672 per GPU
    assert (float(d.train_seq_len), float(d.logprob_seq_len)) == (28672, 28672)
    assert d.rl_framework == "verl" and d.rl_framework_version == pytest.approx(0.9)
    # validation runs after the step timer closes and SAVE_FREQ is -1: nothing periodic
    assert t.val_period.isna().all() and t.save_period.isna().all()


def test_arxiv_row_is_priced_with_its_stated_lengths():
    cmp = rl.compare(published_rows(LLMD))
    assert len(cmp) == 1 and cmp.skipped[0] == ""
    assert np.isfinite(float(cmp.pred_step_s[0]))
    # the stated means are used, not the priors
    assert "response mean=" not in cmp.imputed[0] and "prompt mean=" not in cmp.imputed[0]
