"""slime's (and miles') colocated weight update (sim_core/rl/slime_refit.py): what slime
05370bf9's walk moves and how many buckets, keys and tensors it handles."""

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, slime_refit, training, weight_sync

ROW = dict(algorithm="grpo", model="qwen3-30b-a3b", gpu="h100-sxm", num_gpus=8,
           placement="colocated", rollout_tp=8, prompts_per_step=32, responses_per_prompt=8,
           prompt_len=512, response_mean=2048, response_max=8192,
           gpu_memory_utilization=0.7, train_tp=4, train_pp=1, mini_batches=1,
           rl_framework="slime", offload_optimizer=True, offload_params=True)


def _batch(rows):
    return inputs.to_batch(pd.DataFrame([{**ROW, **r} for r in rows]))


def _update(b, tp, pp, ep, etp=1.0):
    n = len(b.params)
    a = lambda v: np.full(n, v, float) if np.isscalar(v) else np.asarray(v, float)
    return slime_refit.update_time(b, a(tp), a(pp), a(ep), a(etp), b.train_gpus,
                                   inputs.network(b), training.pcie_bytes_per_s(b))


def test_expert_broadcast_moves_every_expert_to_every_rank():
    """EP > 1: each routed-expert key is broadcast from its EP owner, so every rank receives
    the whole routed model (ETP 1), one broadcast per expert key of every EP rank."""
    b = _batch([{}, {}])
    out = _update(b, 4, 1, [1, 8])
    assert out["slime_ep_bcast_bytes"][0] == 0
    assert out["slime_ep_bcast_bytes"][1] == pytest.approx(b.routed_params[1] * 2.0)
    # Qwen3-30B-A3B: 48 MoE layers x 128 experts x (fc1, fc2) expert keys, whatever the EP
    assert out["slime_expert_keys"][0] == out["slime_expert_keys"][1] == 48 * 128 * 2
    assert out["slime_ep_bcast_s"][1] > 0 and out["slime_ep_bcast_s"][0] == 0
    # the rank's own shard from the host copy: 1/EP of the experts
    assert out["slime_h2d_bytes"][1] < out["slime_h2d_bytes"][0]


def test_buckets_follow_the_buffer_and_cost_time():
    """Buckets = bf16 bytes of the full model / --update-weight-buffer-size (512 MiB default);
    a smaller buffer means more buckets, more IPC handles, more time."""
    b = _batch([{}])
    full = b.params[0] * 2.0
    c = slime_refit.counts(b, np.array([8.0]))
    assert c["slime_buckets"][0] == np.ceil(full / 2.0 ** 29)
    small = slime_refit.counts(b, np.array([8.0]), buffer_bytes=2.0 ** 27)
    assert small["slime_buckets"][0] == pytest.approx(4 * c["slime_buckets"][0], abs=4)


def test_more_experts_take_longer():
    """Per HF tensor metadata entries and per expert key latencies: a model with more experts
    of the same total size takes longer (Qwen3-30B-A3B: 128 experts vs Mixtral-style 8)."""
    b = _batch([{}, {}])
    b.experts[1] = 8.0  # same bytes, fewer expert tensors
    out = _update(b, 4, 1, 8)
    assert out["slime_hf_tensors"][0] > out["slime_hf_tensors"][1]
    assert out["slime_update_s"][0] > out["slime_update_s"][1]
    assert out["slime_ep_bcast_bytes"][0] == out["slime_ep_bcast_bytes"][1]


def test_only_slime_colocated_rows_take_the_slime_walk():
    """weight_sync routes slime colocated Megatron rows to slime_refit; the same layout under
    NeMo RL is priced as before (NeMo RL's gather_params order)."""
    rows = [{}, {"rl_framework": "nemo_rl"}]
    b = _batch(rows)
    one = np.ones(2)
    ws = weight_sync.sync_time(b, 4 * one, one, one, 8 * one, b.train_gpus, one)
    out = _update(b, 4, 1, 8)
    assert ws["sync_gather_s"][0] == pytest.approx(out["slime_update_s"][0])
    b2 = _batch(rows[1:])
    ws2 = weight_sync.sync_time(b2, np.array([4.0]), np.ones(1), np.ones(1), np.array([8.0]),
                                b2.train_gpus, np.ones(1))
    assert ws2["weight_sync_time_s"][0] == ws["weight_sync_time_s"][1]
    assert ws["sync_gather_s"][1] != pytest.approx(out["slime_update_s"][1])


def test_slime_reference_pass_restores_two_weight_copies():
    """slime's train_actor restores the ref copy then the actor copy (pinned host -> device)
    around the reference pass: 2 x the rank's weights over PCIe with use_ref; none without a
    reference model or under another framework."""
    from sim_core.rl import slime_train
    b = _batch([{}, {"use_ref": False}, {"rl_framework": "nemo_rl"}])
    pcie = training.pcie_bytes_per_s(b)
    t = slime_train.ref_swap_seconds(b, np.full(3, 8.0), pcie)
    assert t[0] == pytest.approx(2 * 8.0 * 2 ** 30 / pcie[0])
    assert t[1] == 0 and t[2] == 0
