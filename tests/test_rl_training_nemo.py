"""RL training phases as NeMo RL v0.3.0 runs them (issue 40): the reference swap from the
host, the fp32 log-softmax over the vocabulary, FSDP gathers in forward-only passes,
unpacked and padded micro-batches (sim_core/rl/nemo_rl.py, training.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, nemo_rl, nemo_rl_host, training, verl_calls
from sim_core.rl.phases import simulate_rl
from sim_core.simulate import simulate_frame

BASE = dict(model="llama3.1-8b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
            prompts_per_step=64, responses_per_prompt=32, prompt_len=92, response_mean=795,
            response_max=4004, gpu_memory_utilization=0.6, train_tp=1, train_pp=1,
            train_recompute="none", mini_batches=4, train_seq_len=4096)
FSDP = dict(train_zero=3)


def run(*rows):
    # the white-box model: each test checks one rule exactly (not the shipped NeMo RL scales)
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]), phase_scales={})


def _sim(row):
    df = pd.DataFrame([{**BASE, **row}])
    b = inputs.to_batch(df)
    return b, simulate_frame(training.training_frame(df, b).reset_index(drop=True))


@pytest.mark.parametrize("extra,bytes_per_param,shards", [({}, 2.0, 1), (FSDP, 4.0, 8)])
def test_reference_swap_is_three_weight_copies_over_pcie(extra, bytes_per_param, shards):
    # megatron_policy_worker.py / dtensor_policy_worker.py use_reference_model: policy out,
    # reference in, policy back; DTensor's parameters are fp32
    r = run(extra, {**extra, "rl_framework": "nemo_rl"})
    b, sim = _sim({**extra, "rl_framework": "nemo_rl"})
    want = 3 * sim["params_per_gpu"][0] / shards * bytes_per_param \
        / training.pcie_bytes_per_s(b)[0]
    assert r.ref_swap_time_s[0] == 0
    assert r.ref_swap_time_s[1] == pytest.approx(want)
    # 8B: 16 GB bf16 on each Megatron rank; a 4 GB fp32 FSDP shard of 8; three copies, ~51 GB/s
    assert (0.8 < r.ref_swap_time_s[1] < 1.1) if shards == 1 else \
        (0.15 < r.ref_swap_time_s[1] < 0.3)
    # the swap sits in the reference pass, and the old-policy pass pays the vocabulary's
    # fp32 log-softmax only
    assert r.ref_time_s[1] - r.old_log_prob_time_s[1] == pytest.approx(want)
    # (verl's FSDP rows are priced by verl.py, test_rl_verl.py: compared on Megatron only)
    assert r.old_log_prob_time_s[1] > r.old_log_prob_time_s[0] or shards > 1
    # no reference model (DAPO): no swap
    assert run({**extra, "rl_framework": "nemo_rl", "use_ref": False}).ref_swap_time_s[0] == 0


def test_fp32_log_softmax_costs_hbm_traffic_per_logit(monkeypatch):
    # the first row is verl's: its worker-group calls (verl_calls.py) left out of the difference
    real = verl_calls.seconds
    monkeypatch.setattr(verl_calls, "seconds", lambda *a, **k: {
        key: np.zeros_like(v) for key, v in real(*a, **k).items()})
    r = run({}, {"rl_framework": "nemo_rl"})
    b, sim = _sim({"rl_framework": "nemo_rl"})
    tf = training.training_frame(pd.DataFrame([{**BASE, "rl_framework": "nemo_rl"}]), b)
    ext = nemo_rl.extras(b, tf, sim, training.pcie_bytes_per_s(b), np.array([4096.0]))
    # Megatron's own loss (vocab_parallel: 38 + 14 bytes per logit) is already in the step:
    # the update adds 116 - 52 bytes over each logit of the rank's tokens
    logits = 2048 * (92 + 795) / 8 * 128256  # the rank's tokens, at the mean length
    hbm = b.hbm_bw_gbs[0] * 1e9 * 0.8
    assert ext["update_loss_s"][0] == pytest.approx(64 * logits / hbm, rel=1e-6)
    # (plus the packed bins' round-robin imbalance per optimizer step: test_rl_training_megatron,
    # and the loss run one sequence at a time: test_rl_nemo_host)
    nh = nemo_rl_host.seconds(b, tf, sim, np.array([4096.0]))
    assert r.update_time_s[1] - r.update_time_s[0] == pytest.approx(
        ext["update_loss_s"][0] + 4 * ext["update_bins_s"][0] + nh["update_s"][0])


def test_fsdp_log_prob_passes_gather_per_log_prob_micro_batch():
    # NeMo RL's DTensor rows (a verl FSDP row runs verl's own micro-batches: verl.py)
    nemo = {"rl_framework": "nemo_rl"}
    r = run({**FSDP, **nemo}, {**FSDP, **nemo, "logprob_batch_size": 2}, nemo,
            {**nemo, "logprob_batch_size": 2})
    b, sim = _sim(FSDP)
    gather = sim["time_dp"][0] * 2 / 8 * 4  # bf16 gather of 2+2+4 bytes, 4 optimizer steps
    assert gather > 0
    assert r.old_log_prob_time_s[0] - r.old_log_prob_time_s[1] == pytest.approx(gather / 2)
    # ZeRO-1 has no parameter gathers: the log-prob micro-batch does not matter
    assert r.old_log_prob_time_s[2] == pytest.approx(r.old_log_prob_time_s[3])


def test_unpacked_micro_batches_run_at_the_budget():
    # grpo_math_qwen30ba3b_megatron.yaml: sequence_packing off -> one sequence per micro-batch,
    # padded to the batch's longest (the budget)
    r = run({}, {"sequence_packing": False})
    assert r.train_seq_len[0] < 4096 / 2  # packed: two or more sequences per micro-batch
    assert r.train_seq_len[1] == 4096
    assert r.update_time_s[1] > r.update_time_s[0] * 2
    assert r.log_prob_time_s[1] > r.log_prob_time_s[0] * 2


def test_dtensor_pads_packed_training_micro_batches_not_log_probs():
    nemo = {**FSDP, "rl_framework": "nemo_rl"}
    df = pd.DataFrame([{**BASE, **nemo}, {**BASE, **nemo, "dynamic_batching": True}])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True))
    ext = nemo_rl.extras(b, tf, sim, training.pcie_bytes_per_s(b), np.full(2, 4096.0))
    filled = 4 * (92 + 795)  # four sequences of the mean fill 3548 of the 4096 tokens
    assert ext["update_pad_s"][0] == pytest.approx(sim["time_compute"][0] * (4096 / filled - 1))
    # dynamic batching pads each micro-batch to its own longest instead: its micro-batches
    # are the training frame's (nemo_rl.dynamic_microbatches, test_rl_nemo_dtensor.py)
    assert ext["update_pad_s"][1] == 0
    # the log-prob passes carry no padding term: only their loss bytes and (Megatron) bins
    assert set(k for k in ext if k.startswith("logprob")) == {"logprob_loss_s", "logprob_bins_s"}
    assert ext["logprob_bins_s"][0] == 0


def test_unknown_rl_framework_is_a_one_line_error():
    from sim_core.catalog import CatalogError

    with pytest.raises(CatalogError, match="rl_framework: unknown value 'openrlhf'"):
        run({"rl_framework": "openrlhf"})


def test_rl_table_reads_the_new_columns_as_published():
    from sim_core.accuracy import rl

    t = rl.load()
    df, _, _ = rl.to_frame(t)
    # the blog's runs, NeMo RL issue 959's reruns of them, the nightly test suites' runs
    # (batch 5) and two cloud recipes' NeMo RL runs (batch 5)
    nemo = (t.source.str.startswith("NeMo RL")
            | t.source.isin(["nemo-rl-on-gke (Gemma 3 1B, 8 RTX PRO 6000)",
                             "AI-Hypercomputer gpu-recipes (NeMo RL on A4)"])).to_numpy()
    assert nemo.sum() == 17 and (df.rl_framework[nemo] == "nemo_rl").all()
    # marin issue 8653 ran SkyRL's FSDP2 workers (sim_core/rl/skyrl.py); SkyRL's GLM-4.7-Flash
    # notes its Megatron workers
    # (and batch 11's YottaLabs guide: SkyRL's FSDP2 workers on one H200)
    sky = t.source.isin(["marin issue 8653",
                         "SkyRL GLM-4.7-Flash H200 notes (PR 1280 branch)",
                         "YottaLabs SkyRL GSM8K guide (Qwen2.5-1.5B, 1 H200)"]).to_numpy()
    assert sky.sum() == 3 and (df.rl_framework[sky] == "skyrl").all()
    # the Miles ROCm blog's run, spelled 'miles' in the table (a fork of slime)
    slime = t.source.str.contains("Miles").to_numpy()
    assert slime.sum() == 1 and (df.rl_framework[slime] == "slime").all()
    # vime 358's rows: vime is a snapshot of slime 44d29ee, priced as slime (test_rl_vime.py)
    vime = t.source.str.startswith("vime").to_numpy()
    assert vime.sum() == 4 and (df.rl_framework[vime] == "slime").all()
    # RL-Kernel's ROCm G10 row (batch 11) ran vime too, spelled 'vime' in the table
    rlk = t.source.str.startswith("RL-Kernel").to_numpy()
    assert rlk.sum() == 1 and (df.rl_framework[rlk] == "slime").all()
    # Relax issue 149's two rows (batch 13): Relax is a slime derivative, stated 'slime'
    relax = t.source.str.startswith("Relax").to_numpy()
    assert relax.sum() == 2 and (df.rl_framework[relax] == "slime").all()
    slime = slime | vime | rlk | relax
    assert (df.rl_framework[~nemo & ~sky & ~slime] == "verl").all()
    # NeMo RL's Qwen3-30B-A3B config turns packing off; slime's recipe packs (dynamic batch)
    moe = df.model.eq("qwen3-30b-a3b").to_numpy()
    assert (~df.sequence_packing[moe & nemo].astype(bool)).all()
    assert df.sequence_packing[moe & slime].astype(bool).all()
    # verl rows run without use_dynamic_bsz where they state a micro-batch (test_rl_verl.py);
    # a stated sequence_packing is read as stated (the batch-5 NeMo RL recipes turn it off),
    # a blank packs
    fixed = pd.to_numeric(t["micro_batch_seqs"]).notna().to_numpy()
    stated = t["sequence_packing"].notna().to_numpy()
    assert df.sequence_packing[~moe & ~fixed & ~stated].astype(bool).all()
    assert (~df.sequence_packing[fixed].astype(bool)).all()
    assert (df.sequence_packing[stated].astype(bool)
            == t.sequence_packing[stated].str.strip().eq("True")).all()
    # spellings as a table might carry them
    t2 = t.copy()
    t2["rl_framework"] = np.where(nemo, "NeMo RL", "")
    df2, _, _ = rl.to_frame(t2)
    assert (df2.rl_framework[nemo] == "nemo_rl").all()


def test_packed_sequences_are_priced_at_the_length_biased_mean():
    # varlen attention costs sum L^2: the sequences are priced near E[L^2] / E[L], the
    # micro-batch keeps the tokens of mean-length packing and the step keeps N E[L] tokens
    rows = [BASE, {**BASE, "response_clip_ratio": 0.0}, {**BASE, "sequence_packing": False}]
    df = pd.DataFrame(rows)
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    mean = 92 + 795
    biased = training.length_biased(b)
    assert biased[0] > biased[1] > mean  # the truncated tail weighs most
    fill = np.floor(4096 / mean) * mean
    np.testing.assert_allclose(tf.micro_batch[:2] * tf.seq_len[:2], fill, rtol=1e-3)
    assert abs(tf.seq_len[0] - biased[0]) < biased[0] / 2
    tokens = tf.global_batch * tf.seq_len * 4
    assert (abs(tokens[:2] / (2048 * mean) - 1) < 0.03).all()
    assert tf.seq_len[2] == 4096  # unpacked: padded to the budget, not biased
