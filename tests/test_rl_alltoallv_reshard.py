"""cann-recipes-train's zero-redundancy reshard (sim_core/rl/alltoallv_reshard.py): the keys,
bytes and seconds of the walk its code (7294b1ab llm_rl/deepseek/verl_patches) runs."""

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl
from sim_core.rl import alltoallv_reshard as A, inputs, weight_sync

ROW = dict(algorithm="grpo", model="deepseek-v3", gpu="ascend-a3", num_gpus=256,
           placement="colocated", rollout_tp=2, rollout_ep=128, prompts_per_step=512,
           responses_per_prompt=16, prompt_len=78, response_mean=1577, response_max=3072,
           gpu_memory_utilization=0.8, train_tp=4, train_pp=8, train_ep=8, mini_batches=1,
           rl_framework="verl", offload_params=True)


def _batch(rows):
    return inputs.to_batch(pd.DataFrame([{**ROW, **r} for r in rows]))


def _reshard(b, tp=4, pp=8, ep=8, rollout_ep=128):
    n = len(b.params)
    a = lambda v: np.full(n, v, float) if np.isscalar(v) else np.asarray(v, float)
    return A.reshard_time(b, a(tp), a(pp), a(ep), a(rollout_ep), b.train_gpus,
                          inputs.network(b))


def test_key_counts_of_the_recipes_deepseek_layout():
    """61 layers (3 dense) over PP 8 as [7,7,8,8,8,8,8,7]: 5 layers beyond the shortest stage.
    verl's chain: 61 linear_qkv + 58 x (weight1, weight2, expert_bias) + 3 dense x (fc1, fc2)
    + 7 stages x 3 first local slots x (router, shared fc1, fc2) + 5 x 10 + 3 outside keys
    = 357; path 2: 7 x 6 attention + 7 norms + 4 x 3 MoE keys = 61 slots per stage."""
    kc = A.key_counts(_batch([{}]), np.array([8.0]))
    assert kc["chain_keys"][0] == 61 + 174 + 6 + 63 + 50 + 3
    assert kc["a2a_slots"][0] == 61
    # each expert key yields one HF tensor per expert (gate and up for weight1, down for
    # weight2): 58 x 768, less the one per key the per-key constant already holds
    assert kc["hf_extra"][0] == 58 * (3 * 256 - 2)


def test_expert_alltoallv_sends_only_what_each_rollout_rank_serves():
    """The busiest sender ships its TP x EP shard of the routed experts, less the piece it
    keeps; a rollout rank receives its 1 / rollout EP; the expert bytes do not grow with the
    rollout EP (no all-gather of every expert, the report's 'zero redundancy')."""
    b = _batch([{}, {}])
    v = A.volumes(b, np.full(2, 4.0), np.full(2, 8.0), np.full(2, 8.0), np.array([128.0, 256.0]))
    shard = b.routed_params[0] * 2.0 / 32
    assert v["expert_a2a_bytes"][0] == pytest.approx(shard * 3 / 4)
    assert v["expert_a2a_bytes"][1] == pytest.approx(shard * 7 / 8)
    assert v["received_bytes"][1] < v["received_bytes"][0]
    # path 1 and path 2 share the non-expert model between them
    nonexp = (b.params[0] - b.routed_params[0]) * 2.0
    assert v["chain_bytes"][0] + v["a2a_bytes"][0] == pytest.approx(nonexp)
    assert 0 < v["chain_bytes"][0] < v["a2a_bytes"][0]


def test_far_below_verls_walk_and_host_bound():
    """On the report's layout the reshard is an order of magnitude below verl's per-key walk
    (which counts every expert key of an EP rank) and its host work per key dominates the
    bytes."""
    b = _batch([{"refit_alltoallv": True}, {}])
    ws = weight_sync.sync_time(b, np.full(2, 4.0), np.full(2, 8.0), np.ones(2),
                               np.full(2, 8.0), b.train_gpus)
    assert ws["weight_sync_time_s"][1] > 5 * ws["weight_sync_time_s"][0]
    r = _reshard(_batch([{}]))
    assert r["reshard_host_s"][0] > r["reshard_bytes_s"][0] > r["reshard_latency_s"][0] > 0
    assert 5.0 < r["reshard_s"][0] < 30.0


def test_bytes_follow_the_fabric():
    """Across servers the PP broadcast and all-to-all run at the RoCE figure (24.5 GB/s per
    die), inside a server at the UB figure: a faster inter-node link shortens only the bytes."""
    b = _batch([{}])
    slow = _reshard(b)
    net = dict(inputs.network(b))
    net["nic_bw_gbs"] = b.nvlink_bw_gbs
    fast = A.reshard_time(b, np.full(1, 4.0), np.full(1, 8.0), np.full(1, 8.0),
                          np.full(1, 128.0), b.train_gpus, net)
    assert fast["reshard_bytes_s"][0] < slow["reshard_bytes_s"][0] / 3
    assert fast["reshard_host_s"][0] == slow["reshard_host_s"][0]


def test_only_the_rows_that_run_it():
    """rl_runs.csv: the two cann-recipes-train DeepSeek rows set refit_alltoallv; verl's own
    r1_ascend row (verl's walk) does not."""
    t = rl.load()
    on = t["refit_alltoallv"].astype(str).str.lower() == "true"
    assert on.sum() == 2
    assert t.loc[on, "source"].str.startswith("cann-recipes-train DeepSeek").all()
    assert not on[t["source"].str.startswith("verl recipe r1_ascend")].any()
