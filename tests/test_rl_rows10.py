"""Rows batch 10 of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
10)"): verl's r1_ascend recipe (DeepSeek-V3 GRPO on 128 Ascend A3 packages = 256 dies) and
three reports of hicann/cann-recipes-train v0.1.0 (DeepSeek-V3 on 256 dies, Qwen3-235B-A22B
GRPO / DAPO on 128 dies, SAM speculative decoding), read as they state them, their
configuration from the scripts they name, and priced."""
import numpy as np
import pytest

from sim_core.accuracy import rl, rl_table
from tests.rl_rows import published_rows

R1_ASCEND = "verl recipe r1_ascend (DeepSeek-V3 on 128 Ascend A3)"
CANN_DS = "cann-recipes-train DeepSeek-R1 RL report (128 Ascend A3)"
CANN_QW = "cann-recipes-train Qwen3-235B 32K RL report (64 Ascend A3)"
CANN_SAM = "cann-recipes-train SAM decoding report (Qwen3-235B DAPO, 64 Ascend A3)"
CANN_TAG = "7294b1ab15b9cac8935115feeca53dd4443ffabf"   # hicann/cann-recipes-train v0.1.0
RLK_ROCM = "RL-Kernel ROCm G10 (vime Qwen3-8B, 8 MI300X)"   # rows batch 11


_rows = published_rows


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
    assert not d.sequence_packing   # no use_dynamic_bsz
    assert not d.rollout_vllm_v0 and not d.enforce_eager
    # the script's max_num_batched_tokens 1024 (the recipe's report: set on purpose, the default
    # 8192 runs ranks out of memory under uneven expert load)
    assert d.max_num_batched_tokens == 1024
    # its old log-prob pass ran (timing_old_prob 105.5 s): not the report's "old_log_prob free"
    assert not d.reuse_log_probs


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
    # (batch 11's RL-Kernel row states reuse_log_probs False: its source says the pass ran)
    other = t[~t.source.isin([R1_ASCEND, CANN_DS, CANN_QW, CANN_SAM, RLK_ROCM])]
    assert other.rollout_ep.isna().all() and other.spec_tokens.isna().all()
    df, _, _ = rl.to_frame(other)
    assert (df.rollout_ep == 1).all() and (df.spec_tokens == 0).all()
    # reuse_log_probs: stated only on the cann reports' rows; vime rows still get it imputed
    assert other.reuse_log_probs.isna().all()
    assert set(df.reuse_log_probs[other.source.str.startswith("vime").to_numpy()]) == {True}


def test_cann_deepseek_report_rows_are_its_two_tables():
    t = _rows(CANN_DS)
    assert len(t) == 2 and t.url.str.contains(CANN_TAG).all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""]
    assert set(n.model) == {"deepseek-v3"} and set(n.gpu) == {"ascend-a3"}
    assert (n.num_gpus == 256).all() and (n.prompts_per_step == 512).all()
    assert (n.responses_per_prompt == 16).all() and (n.max_response_or_total_len == 3072).all()
    # sec. 1.4.1 real weights (step 2) and 1.4.2 random weights (step 5): totals as published
    assert list(n.step_time_s) == [859.68, 796.8]
    assert list(n.gen_time_s) == [373.65, 318.27] and list(n.ref_time_s) == [144.5, 104.7]
    assert list(n.update_actor_time_s) == [319.3, 328.8]
    assert list(n.weight_sync_time_s) == [11.5, 11.18] and (n.old_log_prob_time_s == 0).all()
    assert list(n.mean_seq_len) == [1576.6, 3039.8]
    # real weights: data generation 523.38 = rollout + ref + reward 5.0 + adv 0.21, and the
    # step = data generation + training + switching (reshard + offload 5.5)
    r = n.iloc[0]
    assert r.gen_time_s + r.ref_time_s + 5.0 + 0.21 == pytest.approx(523.38, abs=0.05)
    assert 523.38 + r.update_actor_time_s + r.weight_sync_time_s + 5.5 == \
        pytest.approx(r.step_time_s, abs=0.05)
    # rollout DP64 TP2 EP128 (two instances) vs DP128 TP2 EP256; actor TP4 EP8 PP8
    assert list(t.rollout_ep.astype(int)) == [128, 256]
    assert (n.train_tp == 4).all() and (n.train_ep == 8).all() and (n.train_pp == 8).all()
    df, _, _ = rl.to_frame(t)
    assert df.reuse_log_probs.all() and df.use_ref.all() and (df.mini_batches == 1).all()
    assert (df.max_num_batched_tokens == 1024).all()
    # use_dynamic_bsz False: micro-batches of one sequence (update), eight (reference)
    assert not df.sequence_packing.astype(bool).any()
    assert (df.micro_batch_seqs == 1).all() and (df.logprob_micro_batch_seqs == 8).all()
    cmp = rl.compare(t)
    assert (cmp.skipped == "").all() and np.isfinite(cmp.pred_step_s).all()
    # the skipped old pass: the log-prob phase is the reference pass alone, both sides
    assert list(cmp.meas_log_prob_time_s) == [144.5, 104.7]


def test_cann_qwen3_235b_report_rows_grpo_and_dapo():
    t = _rows(CANN_QW)
    assert len(t) == 2 and t.url.str.contains(CANN_TAG).all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""] and set(n.model) == {"qwen3-235b-a22b"}
    assert (n.num_gpus == 128).all() and list(n.algorithm) == ["grpo", "dapo"]
    assert list(n.prompts_per_step) == [512, 128] and (n.responses_per_prompt == 16).all()
    # 2K prompts; 32K and 34K responses ("32k" read as 32 x 1024)
    assert (n.max_prompt_len == 2048).all()
    assert list(n.max_response_or_total_len) == [32768, 34816]
    assert list(n.step_time_s) == [7780.36, 7833.16]
    assert list(n.gen_time_s) == [4065.71, 6619.78]
    assert list(n.update_actor_time_s) == [2353.23, 797.93]
    assert list(n.mean_seq_len) == [7344.973, 10119.23]
    # DAPO: two generation batches (num_gen_batches 2), no KL loss -> no reference pass
    df, _, _ = rl.to_frame(t)
    assert list(df.gen_rounds) == [1, 2] and list(df.use_ref) == [True, False]
    assert list(df.reuse_log_probs) == [True, False]
    # use_dynamic_bsz True: token budgets of (prompt + response caps) / CP per GPU
    assert df.sequence_packing.astype(bool).all() and t.micro_batch_seqs.isna().all()
    assert list(n.train_seq_len) == [(2048 + 32768) // 4, (2048 + 34816) // 4]
    # rollout DP32 TP4 EP128; actor TP4 PP4 CP4 EP32
    assert (df.rollout_ep == 128).all() and (n.rollout_tp == 4).all()
    assert (n.train_cp == 4).all() and (n.train_ep == 32).all() and (n.train_pp == 4).all()
    cmp = rl.compare(t)
    assert (cmp.skipped == "").all() and np.isfinite(cmp.pred_step_s).all()
    assert "response mean=" not in "".join(cmp.imputed)   # both stated


def test_cann_sam_rows_are_the_235b_table_off_and_on():
    t = _rows(CANN_SAM)
    assert len(t) == 2 and t.url.str.contains(CANN_TAG + "/docs/llm_rl/sam_decoding.md").all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""]
    assert list(n.step_time_s) == [15441.45, 13960.98]
    assert list(n.gen_time_s) == [14287.54, 12811.98]
    df, _, _ = rl.to_frame(t)
    assert list(df.spec_tokens) == [0, 3] and df.enforce_eager.all()
    # two rounds: the step's rollout over the stated mean single round
    assert 14287.54 / 7102.92 == pytest.approx(2, abs=0.05) and (df.gen_rounds == 2).all()
    cmp = rl.compare(t)
    assert (cmp.skipped == "").all() and np.isfinite(cmp.pred_step_s).all()
    # SAM drafts only while at most 8 requests run (the report's adaptive switch): the step is
    # no longer than without it, and no shorter than drafting at every batch size
    assert list(df.spec_max_running) == [0, 8]
    always = rl.compare(t.assign(spec_max_running=["", ""]))
    assert always.pred_step_s.iloc[1] < cmp.pred_step_s.iloc[1] <= cmp.pred_step_s.iloc[0]
