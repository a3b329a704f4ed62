"""Megatron-Core's unfused MLA RoPE on THD micro-batches (sim_core/rl/mla_rope.py): the counts
read from megatron-core 0.16.0, which rows carry it, and that the phases add exactly it."""

from __future__ import annotations

import pandas as pd
import pytest

from sim_core.rl import host, mla_rope
from sim_core.rl.phases import simulate_rl

from .rl_rows import priced_training_frame

# the SkyRL GLM-4.7-Flash notes' layout (TP4 SP EP8, one unpadded sequence per micro-batch,
# full recompute as its script sets)
GLM = dict(model="glm-4.7-flash", gpu="h200", num_gpus=32, rollout_tp=4,
           prompts_per_step=1024, responses_per_prompt=16, prompt_len=92, response_mean=3379,
           response_max=8192, train_tp=4, train_ep=8, train_etp=1, train_recompute="full",
           mini_batches=4, rl_framework="skyrl", sequence_packing=False, remove_padding=True,
           micro_batch_seqs=1, logprob_micro_batch_seqs=1, train_sequence_parallel=True,
           use_ref=False)


def _seconds(**over):
    df, b, tf, sim, _, _ = priced_training_frame({**GLM, **over})
    return mla_rope.seconds(b, df, tf, sim), tf, sim


def test_layer_forward_counts():
    # one sequence: 2 calls x (tolist, comparison, one .item()) syncs; 18 kernels behind them
    one = mla_rope.layer_forward_seconds(1.0)
    assert one == pytest.approx(6 * host.sync_seconds() + 18 * host.seconds_per_kernel())
    # several sequences take the traditional branch: no per-sequence .item()
    two = mla_rope.layer_forward_seconds(2.0)
    assert one - two == pytest.approx(2 * host.sync_seconds())
    # the declared costs: 20 us a sync, 9.7 us a kernel -> ~0.29 ms per layer forward
    assert one == pytest.approx(294.6e-6, rel=1e-3)


def test_rows_it_applies_to():
    s, tf, sim = _seconds()
    m = sim["num_microbatches"][0]
    per = m * 47 * mla_rope.layer_forward_seconds(1.0)
    # log-prob pass: one forward per micro-batch; update: forward + full recompute's replay
    assert s["log_prob_s"][0] == pytest.approx(per)
    assert s["update_s"][0] == pytest.approx(2 * per)
    assert _seconds(train_recompute="none")[0]["update_s"][0] == pytest.approx(per)
    # RoPE fused (the row says so), a GQA model, another framework, SkyRL's FSDP2 workers: zero
    for over in (dict(train_apply_rope_fusion=True),
                 dict(model="qwen3-30b-a3b"),
                 dict(rl_framework="nemo_rl"),
                 dict(train_zero=3, train_tp=1, train_ep=1)):
        z = _seconds(**over)[0]
        assert z["update_s"][0] == 0 and z["log_prob_s"][0] == 0, over


def test_phases_add_exactly_it(monkeypatch):
    df = pd.DataFrame([GLM])
    with_rule = simulate_rl(df, phase_scales={})
    seen = {}
    real = mla_rope.seconds

    def zero(*a, **k):
        out = real(*a, **k)
        seen.update(out)
        return {key: v * 0 for key, v in out.items()}
    monkeypatch.setattr(mla_rope, "seconds", zero)
    without = simulate_rl(df, phase_scales={})
    # four optimizer steps; one log-prob pass (no reference: the notes' run has no KL term)
    assert with_rule.update_time_s[0] - without.update_time_s[0] == \
        pytest.approx(4 * seen["update_s"][0])
    assert with_rule.log_prob_time_s[0] - without.log_prob_time_s[0] == \
        pytest.approx(4 * seen["log_prob_s"][0])
    # a reference pass (a KL term) runs the same forwards again
    ref = pd.DataFrame([{**GLM, "use_ref": True}])
    assert simulate_rl(ref, phase_scales={}).log_prob_time_s[0] - \
        with_rule.log_prob_time_s[0] > 4 * seen["log_prob_s"][0]


def test_run_table_carries_the_flag():
    # the SkyRL GLM-4.7-Flash row of rl_runs.csv, stated with RoPE fusion on
    from sim_core.accuracy import rl
    t = rl.load()
    row = t[t.model.astype(str).str.contains("GLM-4.7-Flash")].head(1).copy()
    df, _, reason = rl.to_frame(row.reset_index(drop=True))
    assert reason[0] == ""
    assert rl.compare(row)["pred_log_prob_time_s"][0] > 0
    row["train_apply_rope_fusion"] = "true"
    df, _, reason = rl.to_frame(row.reset_index(drop=True))
    assert df["train_apply_rope_fusion"].astype(str).str.lower()[0] == "true"
    fused = rl.compare(row)
    blank = rl.compare(row.drop(columns="train_apply_rope_fusion"))
    assert fused["pred_log_prob_time_s"][0] < blank["pred_log_prob_time_s"][0]
