"""Rows batch 9 of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
9)"): the SimpleRL-Zoo README's wall time over its steps and EasyR1's performance table, read
as their sources state them, and the first ones priced."""
import pytest

from sim_core.accuracy import rl, rl_table
from tests.rl_rows import published_rows

SIMPLERL = "SimpleRL-Zoo README (hkust-nlp/simpleRL-reason)"
EASYR1 = "EasyR1 baselines.md (performance table)"


_rows = published_rows


def test_simplerl_zoo_rows_are_its_15_hours_over_100_steps_on_16_h100():
    t = _rows(SIMPLERL)
    assert len(t) == 2 and t.url.str.contains("2204dd1cfb83db4277571af196bdedb73f4d6ea2").all()
    n, notes, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""]
    assert list(n.model) == ["qwen2.5-7b", "qwen2.5-14b"]
    # "2x8 H100-80G GPUs to train 7B and 14B models for approximately 100 steps over 15 hours"
    assert list(n.step_time_s) == pytest.approx([15 * 3600 / 100] * 2)
    assert set(n.gpu) == {"h100-sxm"} and (n.num_gpus == 16).all()
    # the README's command: --train_batch_size 1024 --rollout_n 8 --max_response_length 8192
    # --rollout_tp 2 --rollout_gpu_memory_util 0.75; the script's mini-batch 256 prompts x n 8
    assert (n.prompts_per_step == 1024).all() and (n.responses_per_prompt == 8).all()
    assert (n.max_response_or_total_len == 8192).all() and (n.rollout_tp == 2).all()
    assert (n.gpu_memory_utilization == 0.75).all() and (n.train_gbs_seqs == 2048).all()
    # the fork's verl 0.1 pins vllm<=0.6.3 (V0) and runs it eagerly; 160 log-prob sequences
    # over 16 ranks
    df, _, _ = rl.to_frame(t)
    assert df.rollout_vllm_v0.astype(bool).all() and df.enforce_eager.astype(bool).all()
    assert list(df.logprob_micro_batch_seqs.astype(int)) == [10, 10]
    assert list(df.micro_batch_seqs.astype(int)) == [2, 2]
    assert list(df.max_num_batched_tokens.astype(int)) == [1024 + 8192 + 1000] * 2
    assert (df.mini_batches == 4).all() and df.use_ref.all()
    # both are priced (the catalog has Qwen2.5-7B and -14B and the H100)
    cmp = rl.compare(t)
    assert (cmp.skipped == "").all() and cmp.pred_step_s.notna().all()
    assert cmp.imputed.str.contains("response mean=").all()   # not stated: the prior


def test_easyr1_performance_table_is_read_row_by_row():
    t = _rows(EASYR1)
    assert len(t) == 8 and t.url.str.contains("b44b311b669bf1fd1aa2fc36f2251482ba33cb16").all()
    n, _, reason = rl_table.normalize(t)
    # "Sec per step" as the table states it, in its row order
    assert list(n.step_time_s) == [120, 145, 120, 580, 145, 530, 4600, 8000]
    assert list(n.rollout_tp) == [2, 2, 2, 2, 2, 8, 8, 8]
    # Batch Size = micro_batch_size_per_device_for_update / _for_experience; EasyR1's dynamic
    # batching budget is that micro-batch times the padded 2048 + 2048 tokens
    # (a token budget, not a count of sequences: micro_batch_seqs stays blank)
    assert list(n.train_seq_len) == [4096 * b for b in (1, 1, 4, 1, 1, 1, 1, 1)]
    assert list(t.logprob_seq_len.astype(int)) == [4096 * b for b in (2, 2, 8, 2, 2, 2, 2, 2)]
    assert t.micro_batch_seqs.isna().all() and n.sequence_packing.astype(bool).all()
    assert list(n.gpu[:6].fillna("")) == ["h100-sxm"] * 3 + [""] + ["h100-sxm"] * 2
    assert list(n.gpu[6:]) == ["h800", "h800"] and (n.num_gpus == 8).all()
    # examples/config.yaml at v0.3.2: 512 prompts x n 5, actor global batch 128 prompts
    assert (n.prompts_per_step == 512).all() and (n.responses_per_prompt == 5).all()
    assert (n.train_gbs_seqs == 640).all()
    # not predicted: the catalog reads no vision-language checkpoint; said per row
    assert all(r.startswith("unknown model 'Qwen/Qwen") and "-VL-" in r for r in reason)
