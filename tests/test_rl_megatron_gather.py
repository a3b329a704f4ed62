"""The refit's gather out of a Megatron layout (sim_core/rl/megatron_gather.py): what each
framework's code moves, counted per model and layout."""

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, megatron_gather, weight_sync
from sim_core.rl.phases import simulate_rl

ROW = dict(algorithm="grpo", model="llama3.1-70b", gpu="h100-sxm", num_gpus=64,
           placement="colocated", rollout_tp=4, prompts_per_step=64, responses_per_prompt=16,
           prompt_len=256, response_mean=1024, response_max=4096,
           gpu_memory_utilization=0.6, train_tp=4, train_pp=4, mini_batches=1,
           rl_framework="nemo_rl", offload_optimizer=True, offload_params=True)


def _frame(rows):
    return pd.DataFrame([{**ROW, **r} for r in rows])


def _sync(rows, tp, pp, shard=None, ep=None, etp=None):
    b = inputs.to_batch(_frame(rows))
    n = len(rows)
    arr = lambda v, d: np.full(n, d, float) if v is None else np.asarray(v, float)
    return b, weight_sync.sync_time(b, arr(tp, 1), arr(pp, 1), arr(shard, 1), arr(ep, 1),
                                    b.train_gpus, None if etp is None else arr(etp, 0))


def test_pipeline_stages_add_a_broadcast_of_the_whole_model():
    """NeMo RL gather_params: every key's full tensor is broadcast over PP, so PP 4 moves the
    whole bf16 model through the PP group that PP 1 does not, and takes longer."""
    b, ws = _sync([{}, {}], tp=[4, 4], pp=[1, 4])
    full = b.params[0] * 2.0
    assert ws["sync_pp_bcast_bytes"][0] == 0
    assert ws["sync_pp_bcast_bytes"][1] == pytest.approx(full)
    assert ws["sync_gather_s"][1] > ws["sync_gather_s"][0] + full / 100e9


def test_tp_gather_moves_the_non_expert_model_serially_over_stages():
    """The owner stage all-gathers each key over TP, one key after another, whatever stage
    owns it: the whole non-expert model passes through a TP all-gather (not 1/pp of it);
    routed experts (ETP 1) are not TP-gathered; nothing at TP 1."""
    b, ws = _sync([{}, {}, {"model": "qwen3-30b-a3b"}], tp=[1, 4, 2], pp=[4, 4, 1],
                  ep=[1, 1, 8], etp=[0, 0, 1])
    assert ws["sync_tp_gather_bytes"][0] == 0
    assert ws["sync_tp_gather_bytes"][1] == pytest.approx(b.params[1] * 2.0)
    assert ws["sync_tp_gather_bytes"][2] == pytest.approx(
        (b.params[2] - b.routed_params[2]) * 2.0)
    assert b.routed_params[2] > 0.5 * b.params[2]


def test_verl_broadcasts_the_tp_shard_over_pipeline_stages():
    """verl's per_tensor_generator (and mbridge's export_weights) broadcast the owner's TP
    shard over PP, then all-gather over TP on every rank."""
    rows = [{"rl_framework": "nemo_rl"}, {"rl_framework": "verl"}]
    b, ws = _sync(rows, tp=[4, 4], pp=[4, 4])
    assert ws["sync_pp_bcast_bytes"][1] == pytest.approx(ws["sync_pp_bcast_bytes"][0] / 4)
    assert ws["sync_tp_gather_bytes"][1] == ws["sync_tp_gather_bytes"][0]
    # the bytes and latencies (without verl's fitted host cost per key) take less time
    assert ws["sync_gather_s"][1] - ws["sync_verl_key_host_s"][1] < ws["sync_gather_s"][0]


def test_verl_pays_its_per_key_object_collectives_only_across_stages():
    b = inputs.to_batch(_frame([{"rl_framework": "verl"}] * 2))
    net = inputs.network(b)
    one = np.ones(2)
    g = megatron_gather.gather_time(b, 4 * one, np.array([1.0, 4.0]), one, one, b.train_gpus,
                                    net, np.array([True, True]), np.array([False, False]))
    assert g["verl_chain_s"][0] < g["verl_chain_s"][1]
    # PP 4: 4 all-gathers + 3 broadcasts over PP per key (two all_gather_object, one
    # broadcast_object_list, one broadcast), plus the TP all-gather of non-expert keys
    from sim_core.rl.refit_host import megatron_keys
    non_expert, expert = megatron_keys(b, one)
    assert g["verl_key_collectives"][1] == pytest.approx(7 * (non_expert + expert)[1]
                                                         + non_expert[1])


def test_nemo_rl_converts_and_packs_the_whole_model_on_every_rank():
    """Colocated NeMo RL: torch.cat of the gathered slices (also at TP 1), the QKV split, the
    gate/up rearrange at TP > 1 and the packing copy: read + write each."""
    b, ws = _sync([{}, {}], tp=[1, 4], pp=[1, 1])
    full = b.params * 2.0
    qkv = b.layers * b.hidden * (b.heads + 2 * b.kv_heads) * b.head_dim * 2.0
    fc1 = b.layers * 2 * b.hidden * b.ffn * 2.0
    cb = megatron_gather.copy_bytes(b, np.array([1.0, 4.0]), np.ones(2), np.array([True, True]))
    assert cb[0] == pytest.approx(2 * (2 * full[0] + qkv[0]))
    assert cb[1] == pytest.approx(2 * (2 * full[1] + qkv[1] + fc1[1]))
    assert 0 < ws["sync_copy_s"][0] < ws["sync_copy_s"][1]
    # verl packs nothing; its cat of TP slices only at TP > 1
    cv = megatron_gather.copy_bytes(b, np.array([1.0, 4.0]), np.ones(2), np.array([False, False]))
    assert cv[0] == 0 and cv[1] == pytest.approx(2 * full[1])


def test_expert_groups_follow_megatrons_expert_rank_generator():
    """EP groups are ETP x EP consecutive ranks: EP 8 at ETP 1 stays in one 8-GPU node; with
    ETP unstated it defaults to TP (2), and the EP group spans two nodes: slower."""
    rows = [{"model": "qwen3-30b-a3b", "train_tp": 2, "train_pp": 1, "train_ep": 8}] * 2
    b, ws = _sync(rows, tp=[2, 2], pp=[1, 1], ep=[8, 8], etp=[1, 0])
    assert ws["sync_gather_s"][0] < ws["sync_gather_s"][1]


def test_a_dtensor_row_does_not_take_the_megatron_path():
    """Weights sharded over data parallelism (NeMo RL DTensor / FSDP): one all-gather over
    TP x shards; no PP broadcast, no packing copies counted."""
    rows = [{"train_zero": 3, "train_pp": 1, "train_tp": 8}, {"train_pp": 1, "train_tp": 8}]
    p = simulate_rl(_frame(rows))
    b, ws = _sync(rows, tp=[8, 8], pp=[1, 1], shard=[8, 1])
    assert ws["sync_copy_s"][0] == 0 and ws["sync_pp_bcast_bytes"][0] == 0
    assert ws["sync_copy_s"][1] > 0
    from sim_core import nccl
    # (NeMo RL's DTensor worker gathers its fp32 parameters: 4 B each, weight_sync.py)
    flat = nccl.collective_time("all_gather", b.params * 4.0, np.full(2, 64.0), np.full(2, 8.0),
                                inputs.network(b))["time_s"]
    assert ws["sync_gather_s"][0] == pytest.approx(flat[0])
    assert (p.weight_sync_time_s > 0).all()


def test_verl_key_cost_is_the_fit_on_its_published_points_and_needs_stages():
    """refit.verl_key_s is what verl_refit_fit fits on verl issue 5311's two totals (not on
    rl_runs.csv), within 10% of each; it is paid per key walked, by verl rows with PP > 1."""
    from sim_core.rl import verl_refit_fit
    pts = verl_refit_fit.points()
    res = verl_refit_fit.fit(pts)
    stored = inputs.constants()["refit"]["verl_key_s"]
    assert stored == pytest.approx(res["verl_key_s"], rel=2e-3)
    assert np.all(np.abs(res["pred"] / res["measured"] - 1) < 0.10)
    # the priced bytes and latencies are a small part of the published totals
    assert np.all(res["base"] < 0.15 * res["measured"])
    rows = [{"rl_framework": "verl"}, {"rl_framework": "verl"}, {"rl_framework": "nemo_rl"}]
    b, ws = _sync(rows, tp=[4, 4, 4], pp=[1, 4, 4])
    assert ws["sync_verl_key_host_s"][0] == 0 and ws["sync_verl_key_host_s"][2] == 0
    assert ws["sync_verl_key_host_s"][1] == pytest.approx(ws["sync_verl_keys"][1] * stored)
