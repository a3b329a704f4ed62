"""Rows batch 12 of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
12: papers)"): verl's two runs on RLinf's "Comparison with VeRL" page (R1-Distill-Qwen-7B on 64
GPUs, its timers and script; R1-Distill-Qwen-1.5B on 8 H100 at verl v0.5.0) and Sky-T1-mini's
two RL stages from the NovaSky blog (hours over stated steps at 8k and 16k caps, 8 H100), the
configuration from SkyThought's run-sky-t1-mini.sh and its verl 0.1 fork; read as the sources
state them, and all priced."""
import numpy as np
import pytest

from sim_core.accuracy import rl, rl_table
from tests.rl_rows import published_rows

RLINF = "RLinf docs: comparison with verl (Boba math)"
SKYT1 = "NovaSky Sky-T1-7B blog: Sky-T1-mini RL (8 H100)"


_rows = published_rows


def test_rlinf_page_rows_are_verls_stated_timers():
    t = _rows(RLINF)
    assert len(t) == 2
    # the 7B table was rendered at the first docs commit, the 1.5B table is the current one
    assert t.url[0].startswith("https://github.com/RLinf/RLinf/blob/298084c8b1a043b5")
    assert t.url[1].startswith("https://github.com/RLinf/RLinf/blob/5d75412a245847a2")
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""]
    seven, small = n.iloc[0], n.iloc[1]
    # 7B: "Hardware: 8 nodes x 8 GPUs"; gen (with the reshard) 325.09, old_log_prob 21.58,
    # ref 20.74, update_actor 73.01, step 447.36, response_length 10,425.77
    assert (seven.model, seven.num_gpus) == ("qwen2.5-7b", 64)
    assert (seven.step_time_s, seven.gen_time_s) == pytest.approx((447.358303, 325.086604))
    assert (seven.old_log_prob_time_s, seven.ref_time_s, seven.update_actor_time_s) == \
        pytest.approx((21.583357, 20.738621, 73.008971))
    assert seven.mean_seq_len == pytest.approx(10425.773048)
    # the timers (less save_checkpoint) account for the step within 1.5 s
    parts = 325.086604 + 5.143515 + 21.583357 + 20.738621 + 0.465133 + 73.008971
    assert abs(seven.step_time_s - parts) < 1.5
    # 1.5B: "1 nodes x 8 H100", generation 260.92, prev logprob 17.51, training 66.53 (the
    # corrected table), step 363.55, response length 14,254.84
    assert (small.model, small.gpu, small.num_gpus) == ("deepseek-r1-distill-qwen-1.5b",
                                                       "h100-sxm", 8)
    assert (small.step_time_s, small.gen_time_s, small.old_log_prob_time_s,
            small.update_actor_time_s) == pytest.approx((363.545, 260.922, 17.513, 66.53))
    assert small.mean_seq_len == pytest.approx(14254.84)
    assert np.isnan(small.ref_time_s)                   # verl's reference pass: not stated
    # context 28672 less the 1024-token prompt cap
    assert (n.max_prompt_len == 1024).all() and (n.max_response_or_total_len == 27648).all()


def test_rlinf_page_batches_and_verl_settings():
    t = _rows(RLINF)
    n, _, _ = rl_table.normalize(t)
    df, _, _ = rl.to_frame(t)
    # the 7B script: 128 prompts x 16, mini-batch 32 prompts (four updates); the 1.5B: 128
    # sequences per DP rank x DP 4 = 512, read as 32 x 16 with four updates
    assert list(n.prompts_per_step * n.responses_per_prompt) == [2048, 512]
    assert list(n.train_gbs_seqs) == [512, 128]
    # the generated tokens agree with 512 sequences of the stated response and a ~92-token
    # prompt: 3,533.27 tok/s/GPU x 8 x 260.92 s
    assert 3533.27 * 8 * 260.922 / 512 == pytest.approx(14254.84 + 92, rel=0.01)
    assert list(df.train_ulysses) == [4, 2]             # ulysses 4 / "Sequence Parallelism 2"
    assert (n.rollout_engine == "sglang").all() and (n.rollout_tp == 2).all()
    assert (df.rl_framework == "verl").all() and (n.placement == "colocated").all()
    assert df.use_ref.astype(bool).all()                # use_kl_loss True
    assert (n.train_seq_len == 30000).all() and df.sequence_packing.astype(bool).all()
    assert t.offload_params.astype(bool).all() and t.offload_optimizer.astype(bool).all()
    # not settled whether the step holds the 6.60 s checkpoint: no periodic work priced
    assert t.save_period.isna().all() and t.val_period.isna().all()
    assert "GPU (not stated for this run" in t.notes[0]         # the 7B's H100 is imputed


def test_sky_t1_mini_rows_are_hours_over_steps():
    t = _rows(SKYT1)
    assert len(t) == 2 and t.url.str.contains("c76da3f2beee1021ca999032d0f822ae68f33968").all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""]
    # "119 steps (~28 hours) ... cutoff length of 8k", "29 steps (~8.7 hours) ... 16k"
    assert list(n.step_time_s) == pytest.approx([28 * 3600 / 119, 8.7 * 3600 / 29], abs=0.01)
    assert list(n.max_response_or_total_len) == [8192, 16384]
    assert (n.model == "qwen2.5-7b").all() and (n.gpu == "h100-sxm").all()
    assert (n.num_gpus == 8).all()


def test_sky_t1_mini_script_settings_reach_the_simulator():
    t = _rows(SKYT1)
    n, _, _ = rl_table.normalize(t)
    df, _, _ = rl.to_frame(t)
    # run-sky-t1-mini.sh: 256 prompts x 4, one update, vLLM TP 4 at 0.7, kl_coef 0 -> no
    # reference worker in the fork (use_reference_policy needs kl_coef > 0)
    assert (n.prompts_per_step == 256).all() and (n.responses_per_prompt == 4).all()
    assert (n.train_gbs_seqs == 1024).all() and (n.rollout_tp == 4).all()
    assert (~df.use_ref.astype(bool)).all()
    # the fork's verl 0.1 defaults: vLLM 0.6.3 (V0), eager, no dynamic batching
    assert df.rollout_vllm_v0.astype(bool).all() and df.enforce_eager.astype(bool).all()
    assert (~df.sequence_packing.astype(bool)).all()
    assert list(df.logprob_micro_batch_seqs) == [8, 8]
    # validation before training and every 15 steps, 570 prompts (AIME24 30 + MATH500 500 +
    # AMC23 40) in one call; the export-only checkpoint is not priced
    assert list(df.val_period) == pytest.approx([119 / 8, 29 / 2])
    assert (df.val_samples == 570).all() and t.save_period.isna().all()


def test_every_new_row_is_priced():
    t = rl.load()
    cmp = rl.compare(t[t.source.isin([RLINF, SKYT1])].reset_index(drop=True))
    assert len(cmp) == 4 and (cmp.skipped == "").all()
    assert np.isfinite(cmp.pred_step_s.to_numpy(float)).all()
    # the stated mean responses are used; the Sky-T1 rows take the prior
    assert not cmp.imputed[:2].str.contains("response mean=").any()
    assert cmp.imputed[2:].str.contains("response mean=").all()
