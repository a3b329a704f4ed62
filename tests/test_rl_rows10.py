"""Rows batch 10 of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
10)"): verl's r1_ascend recipe (DeepSeek-V3 GRPO on 128 Ascend A3 packages = 256 dies), read
as its README states it, its configuration from the script it names, and priced."""
import numpy as np
import pytest

from sim_core.accuracy import rl, rl_table

R1_ASCEND = "verl recipe r1_ascend (DeepSeek-V3 on 128 Ascend A3)"


def _rows(source):
    t = rl.load()
    return t[t.source.eq(source)].reset_index(drop=True)


def test_r1_ascend_row_is_the_readmes_step_2_as_stated():
    t = _rows(R1_ASCEND)
    assert len(t) == 1
    assert t.url.str.contains("448c6c35835fa16518c1d604a1ca5348f33a14fb/recipe/r1_ascend").all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == [""]
    r = n.iloc[0]
    # "utilizing 128 A3 NPUs, which is equivalent to 256 accelerator ranks": one catalog
    # ascend-a3 is one 910C die
    assert (r.model, r.gpu, r.num_gpus) == ("deepseek-v3", "ascend-a3", 256)
    # the README's performance table, step 2: timing_step / gen / old_prob / ref_prob / update
    assert (r.step_time_s, r.gen_time_s, r.old_log_prob_time_s, r.ref_time_s,
            r.update_actor_time_s) == (1044.8, 482.2, 105.5, 92.7, 342.9)
    # prompt_len is kept as written by normalize (rl.py reads it as a number)
    assert (float(r.prompt_len), r.mean_seq_len) == (175.1, 1385.0)
    # the stated phases plus timing_reward 20.4 s fall within 1.1 s of the step
    phases = r.gen_time_s + r.old_log_prob_time_s + r.ref_time_s + r.update_actor_time_s
    assert 0 < r.step_time_s - phases - 20.4 < 1.2
    # its throughput column (95.5 tokens/s per A3 package) is the same step over 128 packages
    tokens = (float(r.prompt_len) + r.mean_seq_len) * r.prompts_per_step * r.responses_per_prompt
    assert tokens / r.step_time_s / (r.num_gpus / 2) == pytest.approx(95.5, abs=0.1)
    # hyper-parameter table and script: 512 x 16, caps 1024 / 2048, one optimizer step of all
    # 8,192 sequences; rollout TP2 EP256, actor TP1 EP32 PP8
    assert (r.prompts_per_step, r.responses_per_prompt, r.train_gbs_seqs) == (512, 16, 8192)
    assert (r.max_prompt_len, r.max_response_or_total_len) == (1024, 2048)
    assert (r.rollout_tp, r.train_tp, r.train_ep, r.train_pp) == (2, 1, 32, 8)
    assert r.placement == "colocated" and r.policy_mode == "sync"


def test_r1_ascend_script_settings_reach_the_simulator():
    t = _rows(R1_ASCEND)
    df, _, _ = rl.to_frame(t)
    d = df.iloc[0]
    assert d.rollout_ep == 256 and d.max_num_seqs == 64 and d.mini_batches == 1
    assert (d.micro_batch_seqs, d.logprob_micro_batch_seqs) == (1, 4)
    # full offload (the swap optimizer read as optimizer offload), the reference offloaded,
    # a KL loss -> a reference pass; VLLM_USE_V1=1 and graph mode
    assert d.offload_params and d.offload_optimizer and d.ref_offload and d.use_ref
    assert not d.rollout_vllm_v0 and not d.enforce_eager
    # the script's max_num_batched_tokens (1024) does not take effect on vLLM Ascend: blank
    assert d.max_num_batched_tokens == 0


def test_r1_ascend_row_is_priced_with_its_phases():
    cmp = rl.compare(_rows(R1_ASCEND))
    c = cmp.iloc[0]
    assert c.skipped == "" and np.isfinite(c.pred_step_s) and c.pred_step_s > 0
    # the framework is read from the URL (verl), nothing about the lengths imputed: both stated
    assert "rl_framework=verl" in c.imputed and "response mean=" not in c.imputed
    assert "prompt mean=" not in c.imputed
    # every stated phase is compared: generation, log-probs (old + ref), update
    assert (c.meas_gen_time_s, c.meas_update_time_s) == (482.2, 342.9)
    assert c.meas_log_prob_time_s == pytest.approx(105.5 + 92.7)
    assert np.isfinite([c.pred_gen_time_s, c.pred_log_prob_time_s, c.pred_update_time_s]).all()


def test_rollout_ep_column_is_blank_on_the_earlier_rows():
    # the column added with this row must not change how the other rows are read
    t = rl.load()
    other = t[~t.source.eq(R1_ASCEND)]
    assert other.rollout_ep.isna().all()
    df, _, _ = rl.to_frame(other)
    assert (df.rollout_ep == 1).all()
