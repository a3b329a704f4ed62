"""vime (vllm-project/vime: slime 44d29ee with vLLM rollouts) as the RL simulator reads it:
slime's reuse of the training forward's log-probs (rl/slime_train.py reuses_log_probs), the
`perf/train_time` timer (log-prob passes + update, column train_time_s), and the vime 358
rows specified from vime's code and its PR 368 script."""

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl, rl_table
from sim_core.rl import inputs, slime_train
from sim_core.rl.phases import simulate_rl

ROW = dict(algorithm="grpo", model="qwen3-4b", gpu="h100-sxm", num_gpus=4, placement="split",
           rollout_gpus=2, rollout_tp=2, prompts_per_step=32, responses_per_prompt=8,
           prompt_len=92, response_mean=752, response_max=2048, train_tp=2,
           mini_batches=1, rl_framework="slime", use_ref=False)


def _frame(rows):
    return pd.DataFrame([{**ROW, **r} for r in rows])


def test_reuse_drops_the_old_log_prob_pass_only_with_one_optimizer_step():
    """slime's can_reuse_log_probs_in_loss: one optimizer step per rollout, no critic, the
    rule present (reuse_log_probs); two mini-batches, PPO or the rule absent keep the pass."""
    df = _frame([{"reuse_log_probs": True}, {"reuse_log_probs": False},
                 {"reuse_log_probs": True, "mini_batches": 2},
                 {"reuse_log_probs": True, "algorithm": "ppo"}])
    b = inputs.to_batch(df)
    assert slime_train.reuses_log_probs(b).tolist() == [True, False, False, False]
    p = simulate_rl(df)
    assert p.old_log_prob_time_s[0] == 0 and p.old_log_prob_time_s[1] > 0
    assert p.old_log_prob_time_s[2] > 0 and p.old_log_prob_time_s[3] > 0
    # the update itself does not move; the step loses the pass
    assert p.update_time_s[0] == pytest.approx(p.update_time_s[1])
    assert p.step_time_s[1] - p.step_time_s[0] == pytest.approx(p.old_log_prob_time_s[1])


def test_reuse_keeps_the_reference_pass():
    """The KL loss's reference pass stays (slime checks kl_coef, the reward KL, not
    use_kl_loss): only the actor's own pass goes."""
    p = simulate_rl(_frame([{"reuse_log_probs": True, "use_ref": True}]))
    assert p.old_log_prob_time_s[0] == 0 and p.ref_time_s[0] > 0
    assert p.log_prob_time_s[0] == pytest.approx(p.ref_time_s[0])


def test_train_time_is_the_log_prob_passes_plus_the_update():
    p = simulate_rl(_frame([{"use_ref": True}]))
    assert p.train_time_s[0] == pytest.approx(p.log_prob_time_s[0] + p.update_time_s[0])


def test_train_time_column_is_read_as_a_duration():
    t = pd.DataFrame([{**{k: v for k, v in ROW.items() if k != "response_mean"},
                       "step_time_s": "2m58.3s", "train_time_s": "1m21.4s"}])
    norm, _, reason = rl_table.normalize(t)
    assert reason == [""]
    assert norm.train_time_s[0] == pytest.approx(81.4)


def test_vime_rows_read_from_vimes_code():
    """The four vime 358 rows: priced as slime with the reuse rule, train_time compared with
    the log-prob passes + update (not the update alone), no reference model in setup 2
    (use-kl-loss False, kl-coef 0), PR 368's settings (CPU optimizer, 8192-token packing)."""
    t = rl.load()
    rows = t.index[t.source.eq("vime issue 358")]
    assert len(rows) == 4
    sub = t.loc[rows].reset_index(drop=True)
    df, imputed, _ = rl.to_frame(sub)
    assert (df.rl_framework == "slime").all()
    assert df.reuse_log_probs.astype(bool).all()
    assert all("reuse_log_probs=True" in s for s in imputed)
    assert df.optimizer_cpu_offload.astype(float).eq(1).all()
    assert pd.to_numeric(df.train_seq_len).eq(8192).all()
    setup2 = sub.prompts_per_step.astype(float).eq(32).to_numpy()
    assert (df.use_ref.astype(bool).to_numpy() == ~setup2).all()
    cmp = rl.compare(sub)
    p = simulate_rl(df)
    assert (p.old_log_prob_time_s == 0).all()
    assert (p.ref_time_s[setup2] == 0).all() and (p.ref_time_s[~setup2] > 0).all()
    # train_time_s is stated on setup 2 and compared with log-probs + update
    assert cmp.meas_train_time_s[setup2].tolist() == [81.4, 99.6]
    assert np.allclose(cmp.pred_train_time_s, p.log_prob_time_s + p.update_time_s)
    assert cmp.meas_update_time_s.isna().all()
    ph = rl.phase_summary(cmp)
    assert ph["train"]["rows"] == 2


def test_other_frameworks_and_rows_keep_the_pass():
    """A row without the rule (every slime / miles row, verl ...) keeps its log-prob pass:
    the reader sets reuse_log_probs only for vime rows. Rows whose code has the rule state it
    (batch 10: cann-recipes-train's verl patch, `recompute_old_log_prob False`)."""
    t = rl.load()
    other = t[~t.source.eq("vime issue 358")].reset_index(drop=True)
    df, imputed, _ = rl.to_frame(other)
    stated = other.reuse_log_probs.notna().to_numpy()
    assert not df.reuse_log_probs[~stated].astype(bool).any()
    assert set(other.source[stated]) == {
        "cann-recipes-train DeepSeek-R1 RL report (128 Ascend A3)",
        "cann-recipes-train Qwen3-235B 32K RL report (64 Ascend A3)",
        # batch 11: a vime run whose launcher recomputes the log-probs states False
        "RL-Kernel ROCm G10 (vime Qwen3-8B, 8 MI300X)"}
    rlk = other.source.str.startswith("RL-Kernel").to_numpy()
    assert not df.reuse_log_probs[rlk].astype(bool).any()
    assert not any("reuse_log_probs" in s for s in imputed)
