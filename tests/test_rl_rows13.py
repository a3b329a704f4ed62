"""Rows batch 13 of the RL validation table (issue 40; docs/rl.md, "More published rows (batch
13)"): Relax issue 149 / PR 193, Qwen3-30B-A3B GRPO colocated on one node of 8 H800, the
200-step means of two topologies (baseline CP2 with one TP8 SGLang engine; the adopted CP1 with
two TP4 engines), read as the issue states them, the rest from the script it names; Relax (a
slime derivative) priced as slime."""
import numpy as np
import pytest

from sim_core.accuracy import rl, rl_table
from tests.rl_rows import published_rows

RELAX = "Relax issue 149 / PR 193 (Qwen3-30B-A3B MoE topology, 8 H800)"
SCRIPT_COMMIT = "e38d4faac07a7496d8fc3880ed55fa9a9c3e1adf"


def test_relax_rows_are_the_issues_two_arms():
    t = published_rows(RELAX)
    assert len(t) == 2 and t.url.str.contains("Relax/issues/149").all()
    assert t.notes.str.contains(SCRIPT_COMMIT).all()
    n, _, reason = rl_table.normalize(t)
    assert list(reason) == ["", ""]
    for _, r in n.iterrows():
        # "single node 8 x H800 80GB, colocate ... TP4 / PP1 / EP8 / ETP1; GBS 256; 32 prompts x 8"
        assert (r.model, r.gpu, r.num_gpus, r.placement) == ("qwen3-30b-a3b", "h800", 8, "colocated")
        assert (r.train_tp, r.train_pp, r.train_ep, r.train_etp) == (4, 1, 8, 1)
        assert (r.prompts_per_step, r.responses_per_prompt, r.train_gbs_seqs) == (32, 8, 256)
        # the script: 8,192-token cap, 20,480 training / 40,960 log-prob tokens per GPU
        assert (r.max_response_or_total_len, r.train_seq_len) == (8192, 20480)
        assert float(r.logprob_seq_len) == 40960
        assert r.policy_mode == "sync"
    base, opt = n.iloc[0], n.iloc[1]
    # baseline: CP2, one TP8 engine, 329.22 s; Optimized1: CP1, two TP4 engines, 273.11 s
    assert (base.train_cp, base.rollout_tp, base.step_time_s) == (2, 8, 329.22)
    assert (opt.train_cp, opt.rollout_tp, opt.step_time_s) == (1, 4, 273.11)
    # mean response derived from the stated E2E response tokens/GPU/s x 8 GPUs x step / 256
    for r, tps in ((base, 488.4), (opt, 638.4)):
        assert r.mean_seq_len == pytest.approx(tps * 8 * r.step_time_s / 256, abs=1)
    # samples/s x step is the 256-sample batch (0.778, 0.937 stated)
    assert 0.778 * base.step_time_s == pytest.approx(256, rel=0.01)
    assert 0.937 * opt.step_time_s == pytest.approx(256, rel=0.01)


def test_relax_script_settings_reach_the_simulator():
    df, imputed, _ = rl.to_frame(published_rows(RELAX))
    for i, d in df.iterrows():
        # Relax is slime's code base: priced as slime, the Megatron state paused around the
        # rollout (--colocate), the reference model loaded (--use-kl-loss at coefficient 0)
        assert d.rl_framework == "slime" and d.use_ref
        assert d.offload_params and d.offload_optimizer and d.optimizer_cpu_offload == 1
        assert d.sequence_packing and d.train_sequence_parallel and d.train_recompute == "full"
        assert d.gpu_memory_utilization == pytest.approx(0.7)
        # the mean response is stated (derived); the prompt is the prior, said
        assert "response mean=" not in imputed[i] and "prompt mean=92" in imputed[i]
    # no periodic work priced: the issue does not say its mean step holds eval or saves
    t = published_rows(RELAX)
    assert t[["val_period", "save_period"]].isna().all().all()


def test_relax_rows_are_priced():
    cmp = rl.compare(published_rows(RELAX))
    assert (cmp.skipped == "").all()
    assert np.isfinite(cmp.pred_step_s).all() and (cmp.pred_step_s > 0).all()
    # step time only: no phase is stated, so none is compared
    assert cmp[["meas_gen_time_s", "meas_update_time_s"]].isna().all().all()
