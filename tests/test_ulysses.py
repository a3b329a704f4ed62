"""Ulysses context parallelism (cp_comm a2a) and verl's Ulysses sequence parallelism in RL."""

import numpy as np
import pandas as pd
import pytest

from sim_core import nccl, rules, workload
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate_frame

# llama3-8b: 32 heads, 8 KV heads, head_dim 128, 32 layers
LLAMA = dict(model="llama3-8b", gpu="h100-sxm", num_gpus=16, gpus_per_node=8, tp=1, pp=1,
             cp=4, seq_len=32768, micro_batch=1, global_batch=8, recompute="none",
             cp_comm="a2a")


def batch(**over):
    return frame_to_batch(pd.DataFrame([{**LLAMA, **over}]))


def a2a(wl):
    return [c for c in wl.comms if c.dim == "cp" and c.op == "all_to_all"]


def test_four_all_to_alls_per_layer_each_way_of_the_local_q_k_v_o_shards():
    b = batch()
    wl = workload.build(b, ops=False)
    qo, kv = a2a(wl)
    L, m = wl.layers_per_stage[0], wl.num_microbatches[0]
    # forward: q, k, v before attention and the output after; backward: dO, dQ, dK, dV
    assert qo.calls_per_step[0] + kv.calls_per_step[0] == 8 * L * m
    assert qo.calls_per_step[0] == kv.calls_per_step[0]
    T = 32768 / 4  # tokens on one CP rank
    assert qo.nbytes[0] == 2 * T * 32 * 128  # all local heads of q (or o), bf16
    assert kv.nbytes[0] == 2 * T * 8 * 128  # the KV heads of k (or v)
    # a full recompute replays the forward's four
    full = workload.build(batch(recompute="full"), ops=False)
    assert sum(c.calls_per_step[0] for c in a2a(full)) == 12 * L * m
    # ring and all-gather layouts issue none
    ring = workload.build(batch(cp_comm="ring"), ops=False)
    assert all(c.calls_per_step[0] == 0 for c in a2a(ring))


def test_each_rank_sends_cp_minus_one_over_cp_of_its_shard():
    # nccl.py prices an all-to-all of S bytes per rank as (n-1)/n of S on the wire: at large
    # messages one node's 2-rank and 8-rank all-to-alls differ by that factor
    S = 2.0 ** 30
    t2, t8 = (nccl.collective_time("all_to_all", S, n, 1, {})["time_s"][()] for n in (2, 8))
    assert t8 / t2 == pytest.approx((7 / 8) / (1 / 2), rel=0.1)


def test_attention_work_matches_ring_and_the_all_to_alls_are_exposed():
    sim = simulate_frame(pd.DataFrame([{**LLAMA, "cp_comm": "ring"}, LLAMA]))
    assert sim.valid.all()
    # heads / cp over the whole sequence: the same causal work per GPU as balanced ring CP
    assert sim.time_compute[1] == pytest.approx(sim.time_compute[0])
    assert sim.time_cp[1] > 0


def test_window_pairs_are_split_evenly_over_the_heads():
    b = batch(sliding_window=4096)
    w = np.array([4096.0])
    assert workload.window_pairs_per_gpu(b, w)[0] == pytest.approx(
        workload.window_pairs(32768, 4096) / 4)


def test_heads_must_split_over_cp():
    valid, reason = rules.check(batch(model="qwen2.5-7b", cp=8))  # 28 heads
    assert not valid[0] and reason[0].startswith("cp_comm a2a needs the attention heads")
    # 8 KV heads over cp 16: TE and DeepSpeed refuse; verl repeats them up to 16
    valid, reason = rules.check(batch(cp=16))
    assert not valid[0] and "KV heads" in reason[0]
    valid, _ = rules.check(batch(cp=16, cp_kv_repeat=True))
    assert valid[0]
    kv = [c for c in a2a(workload.build(batch(cp=16, cp_kv_repeat=True), ops=False))][1]
    assert kv.nbytes[0] == 2 * (32768 / 16) * 16 * 128  # repeated to 16 KV heads


def test_a_framework_without_it_refuses_it_naming_the_field():
    valid, reason = rules.check(batch(framework="torchtitan"))
    assert not valid[0] and reason[0] == ("torchtitan has no cp_comm a2a (context-parallel "
                                          "communication)")
    # DeepSpeed's sequence parallelism is Ulysses only
    valid, reason = rules.check(batch(framework="deepspeed", zero=1, cp_comm="ring"))
    assert not valid[0] and "cp_comm ring" in reason[0]
    valid, _ = rules.check(batch(framework="deepspeed", zero=1))
    assert valid[0]


# ---- RL: verl's Ulysses sequence parallelism --------------------------------------------------
VERL = dict(model="qwen2.5-7b", gpu="h100-sxm", num_gpus=16, rollout_tp=2,
            prompts_per_step=64, responses_per_prompt=8, prompt_len=200, response_mean=1000,
            response_max=4096, gpu_memory_utilization=0.6, train_zero=3,
            train_recompute="full", mini_batches=2, rl_framework="verl")


def test_rl_ulysses_is_cp_with_all_to_alls_and_fewer_data_parallel_ranks():
    from sim_core.rl import inputs, training

    df = pd.DataFrame([VERL, {**VERL, "train_ulysses": 4}])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    assert list(tf.cp) == [1, 4] and tf.cp_comm[1] == "a2a" and bool(tf.cp_kv_repeat[1])
    sim = simulate_frame(tf.reset_index(drop=True))
    assert sim.valid.all() and list(sim.dp) == [16, 4]  # train GPUs / (tp x ulysses x pp)
    # verl's dynamic batching multiplies the per-GPU token budget by the Ulysses size
    assert training.pack_budget(df, b)[1] == 4 * training.pack_budget(df, b)[0]


def test_verl_recipe_sets_the_ulysses_size_of_actor_and_reference():
    from sweep.advice import rl as adv
    from sweep.errors import SweepError

    row = pd.Series({**VERL, "gpus_per_node": 8, "placement": "colocated", "train_gpus": 16,
                     "rollout_gpus": 0, "rollout_pp": 1, "train_tp": 1, "train_pp": 1,
                     "train_cp": 1, "train_ep": 1, "offload_params": False,
                     "offload_optimizer": False, "ppo_epochs": 1, "use_ref": True,
                     "algorithm": "grpo", "train_ulysses": 4})
    o = adv.verl_overrides(row)
    assert o["actor_rollout_ref.actor.ulysses_sequence_parallel_size"] == 4
    assert o["actor_rollout_ref.ref.ulysses_sequence_parallel_size"] == 4
    assert set(o) <= adv.known_keys("verl_fsdp") and not any(".megatron." in k for k in o)
    one = adv.verl_overrides(pd.Series({**row.to_dict(), "train_ulysses": 1}))
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size" not in one
    with pytest.raises(SweepError, match="train_tp"):
        adv.verl_overrides(pd.Series({**row.to_dict(), "train_tp": 2}))


def test_run_file_ulysses_needs_verl_fsdp():
    from sweep.config.rl import parse_rl
    from sweep.errors import ConfigError

    run = dict(task="rl", model="qwen2.5-7b", cluster={"gpu": "h100-sxm", "num_gpus": 16},
               prompts_per_step=64, prompt_len=200, response_len={"mean": 1000, "max": 4096},
               parallel={"zero": 3, "ulysses": 4})
    assert parse_rl(run).frame().train_ulysses.tolist() == [4]
    with pytest.raises(ConfigError, match="^parallel.ulysses: .*verl") as e:
        parse_rl({**run, "parallel": {"zero": 1, "ulysses": 4}})
    assert "\n" not in str(e.value)


def test_megatron_recipe_asks_for_the_a2a_layout():
    from sweep.advice import export

    args = export.megatron_args(LLAMA)
    assert args[args.index("--cp-comm-type") + 1] == "a2a"
    assert "--cp-comm-type" not in export.megatron_args({**LLAMA, "cp_comm": "ring"})
