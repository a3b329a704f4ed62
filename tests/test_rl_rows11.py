"""Rows batch 11 of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
11)"): RL-Kernel's ROCm G10 run (vime's production kernels, Qwen3-8B GRPO on 8 MI300X, 200
steps), read as its README and summary.json state it, its configuration from the launcher the
result bundle names; and YottaLabs' SkyRL GSM8K guide (Qwen2.5-1.5B-Instruct on one H200, the
printed first step), its configuration from the guide's command and SkyRL's defaults; both
priced."""
import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl, rl_table
from tests.rl_rows import published_rows

RLK_ROCM = "RL-Kernel ROCm G10 (vime Qwen3-8B, 8 MI300X)"
RLK_README = ("b45560829c264492ed19a62cae0949cafa967c4a/reports/archive/experiments/dense/"
              "pr396_rocm_s1234_g10_g11_200/README.md")


_rows = published_rows


def test_rl_kernel_row_is_the_readmes_g10_means():
    t = _rows(RLK_ROCM)
    assert len(t) == 1 and t.url.str.contains(RLK_README).all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == [""]
    r = n.iloc[0]
    # "one 8xAMD Instinct MI300X 192GB node, TP4/CP2/PP1 ... rollout batch 1 prompt x 8 samples,
    # global batch 8, maximum response length 7,168, and maximum 4,096 tokens/GPU"
    assert (r.model, r.gpu, r.num_gpus) == ("qwen3-8b", "mi300x", 8)
    assert (r.train_tp, r.train_cp, r.train_pp, r.rollout_tp) == (4, 2, 1, 4)
    assert (r.prompts_per_step, r.responses_per_prompt, r.train_gbs_seqs) == (1, 8, 8)
    assert (r.max_response_or_total_len, r.train_seq_len) == (7168, 4096)
    assert r.placement == "colocated" and r.policy_mode == "sync"
    # the README's G10 column (200-step means of vime's perf/* timers): rollout 73.77, reference
    # log-probs 1.56, actor train 4.88, total step 84.52; summary.json: log-probs 1.35, mean
    # response 6,820.3 tokens
    assert (r.step_time_s, r.gen_time_s, r.ref_time_s, r.update_actor_time_s) == \
        (84.52, 73.77, 1.56, 4.88)
    assert (r.old_log_prob_time_s, r.mean_seq_len) == (1.35, 6820.3)
    # the timed phases leave 3 s of the step for the weight update, advantages and data moves
    # (summary.json's perf/train_time, 8.54 s, holds the three training timers and more)
    left = r.step_time_s - r.gen_time_s - r.old_log_prob_time_s - r.ref_time_s \
        - r.update_actor_time_s
    assert 0 < left < 3.5
    assert r.old_log_prob_time_s + r.ref_time_s + r.update_actor_time_s < 8.54


def test_rl_kernel_launcher_settings_reach_the_simulator():
    t = _rows(RLK_ROCM)
    df, imputed, _ = rl.to_frame(t)
    d = df.iloc[0]
    # vime is slime's code base: priced as slime
    assert d.rl_framework == "slime"
    # "both arms recompute training logp" (run_pr377_workload.py) and a 1.35 s log-prob timer:
    # stated False, so the vime default (slime's reuse of the training forward) is not imputed
    assert not d.reuse_log_probs and "reuse_log_probs=True" not in imputed[0]
    # reference model and KL loss 0.001 -> a reference pass; --no-offload-train keeps the
    # Megatron state on the GPU; HIP graphs, not eager; --use-dynamic-batch-size
    assert d.use_ref and not d.offload_params and not d.offload_optimizer
    assert not d.enforce_eager and d.sequence_packing and not d.rollout_vllm_v0
    assert d.gpu_memory_utilization == pytest.approx(0.38) and d.mini_batches == 1
    assert not d.train_sequence_parallel and d.train_recompute == "full"


def test_rl_kernel_row_is_priced_with_its_phases():
    cmp = rl.compare(_rows(RLK_ROCM))
    c = cmp.iloc[0]
    assert c.skipped == "" and np.isfinite(c.pred_step_s) and c.pred_step_s > 0
    # the mean response is stated; the mean prompt is the prior (said)
    assert "response mean=" not in c.imputed and "prompt mean=92" in c.imputed
    assert (c.meas_gen_time_s, c.meas_update_time_s) == (73.77, 4.88)
    assert c.meas_log_prob_time_s == pytest.approx(1.35 + 1.56)
    assert np.isfinite([c.pred_gen_time_s, c.pred_log_prob_time_s, c.pred_update_time_s]).all()
    assert c.gen_share == pytest.approx(73.77 / 84.52)


YOTTA = "YottaLabs SkyRL GSM8K guide (Qwen2.5-1.5B, 1 H200)"
YOTTA_PAGE = "7aa6fbcb3416ef0bc367f342ea30ba12d6e40874/tutorials/grpo-on-gsm8k-with-virtual-machine.md"


def test_yottalabs_row_is_the_guides_first_step():
    t = _rows(YOTTA)
    assert len(t) == 1 and t.url.str.contains(YOTTA_PAGE).all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == [""]
    r = n.iloc[0]
    assert (r.model, r.gpu, r.num_gpus, r.rollout_tp) == ("qwen2.5-1.5b", "h200", 1, 1)
    # the printed step: fwd_logprobs_values_reward 377.36, policy_train 866.49, sync_weights
    # 7.04, step 1331.13 s; avg_response_length 273.68 over batch_num_seq 5120
    assert (r.step_time_s, r.old_log_prob_time_s, r.update_actor_time_s,
            r.weight_sync_time_s) == (1331.13, 377.36, 866.49, 7.04)
    assert r.mean_seq_len == 273.68
    assert r.prompts_per_step * r.responses_per_prompt == 5120
    # convert 1.54 s and advantages 0.11 s are printed too; what is left is the unprinted
    # generate, within 0.2 s of the next step's printed 78.47 s
    left = r.step_time_s - r.old_log_prob_time_s - r.update_actor_time_s \
        - r.weight_sync_time_s - 1.54 - 0.11 - 0.02
    assert left == pytest.approx(78.47, abs=0.2)
    assert pd.isna(r.gen_time_s)   # not printed for this step: not filled in
    # SkyRL's defaults at 27676c23: 256-prompt mini-batches (four optimizer steps), 512 / 1024
    # prompt / generation caps
    assert r.train_gbs_seqs == 256 * 5
    assert (r.max_prompt_len, r.max_response_or_total_len) == (512, 1024)


def test_yottalabs_skyrl_defaults_reach_the_simulator():
    df, imputed, _ = rl.to_frame(_rows(YOTTA))
    d = df.iloc[0]
    assert d.rl_framework == "skyrl" and d.mini_batches == 4
    # micro-batches of one unpadded sequence, no token packing; a reference pass (use_kl_loss
    # True by default); no FSDP2 CPUOffloadPolicy, optimizer states moved off after each step
    assert (d.micro_batch_seqs, d.logprob_micro_batch_seqs) == (1, 1)
    assert d.remove_padding and not d.sequence_packing and d.use_ref
    assert not d.offload_params and d.offload_optimizer
    assert d.enforce_eager and d.gpu_memory_utilization == pytest.approx(0.8)
    assert d.max_num_seqs == 1024 and d.max_num_batched_tokens == 8192
    assert "response mean=" not in imputed[0] and "prompt mean=92" in imputed[0]
    cmp = rl.compare(_rows(YOTTA))
    c = cmp.iloc[0]
    assert c.skipped == "" and np.isfinite(c.pred_step_s)
    assert (c.meas_log_prob_time_s, c.meas_update_time_s) == (377.36, 866.49)
    assert np.isnan(c.meas_gen_time_s)

