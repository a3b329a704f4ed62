"""The big-MoE RL rows (issue 40): SkyRL's FSDP2 workers (sim_core/rl/skyrl.py), DAPO's
generation rounds, and the rollout engine's fused-MoE profiling workspace and step size
(sim_core/rl/generation.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import generation, inputs, skyrl, training
from sim_core.rl.phases import simulate_rl

# a SkyRL-like split DAPO row: 16 FSDP2 trainers + 16 rollout GPUs, micro-batches of 1 sequence
BASE = dict(model="qwen3-30b-a3b", gpu="h100-sxm", num_gpus=32, placement="split",
            rollout_gpus=16, rollout_tp=4, algorithm="dapo", use_ref=False,
            prompts_per_step=64, responses_per_prompt=8, prompt_len=200, response_mean=1500,
            response_max=4096, gpu_memory_utilization=0.8, train_tp=1, train_pp=1,
            train_zero=3, mini_batches=1, rl_framework="skyrl", sequence_packing=False,
            micro_batch_seqs=1, logprob_micro_batch_seqs=1)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]))


def test_on_only_for_skyrl_fsdp_rows():
    df = pd.DataFrame([BASE, {**BASE, "rl_framework": "verl"}, {**BASE, "train_zero": 1}])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    assert list(skyrl.active(b, tf)) == [True, False, False]


def test_unknown_framework_is_a_one_line_error():
    from sim_core.catalog import CatalogError
    with pytest.raises(CatalogError, match="rl_framework"):
        inputs.to_batch(pd.DataFrame([{**BASE, "rl_framework": "openrlhf"}]))


def test_offload_costs_by_rule():
    one = np.array([1.0])
    shard, pcie, host = np.array([1e9]), np.array([50e9]), np.array([80e9])
    # compute far longer than the copies: only the accumulation and AdamW remain
    c = skyrl.offload_costs(shard, 4 * one, 4 * one, 10 * one, 10 * one, 0.5 * one, pcie,
                            host, one)
    assert c["lp_s"] == pytest.approx(0.0)
    # 3 accumulating micro-batches x (reduce-scatter + 4 GB down + 12 GB host add)
    assert c["accum_s"] == pytest.approx(3 * (0.5 + 4e9 / 50e9 + 12e9 / 80e9))
    adam = 1e9 * 80 / 80e9  # catalogs/rl.yaml host_adam_bytes_per_param 80
    assert c["adam_s"] == pytest.approx(adam)
    assert c["upd_s"] == pytest.approx(c["accum_s"] + adam)
    # compute shorter than the fp32 shard copy (4 GB at 50 GB/s = 0.08 s): the rest shows
    c = skyrl.offload_costs(shard, 4 * one, 1 * one, 0.05 * one, 0.1 * one, 0.5 * one, pcie,
                            host, one)
    assert c["lp_s"] == pytest.approx(4 * (0.08 - 0.05))
    assert c["accum_s"] == 0.0  # one micro-batch: nothing accumulates on the host
    assert c["upd_s"] == pytest.approx(2 * 0.08 - 0.1 + adam)
    # without cpu_offload nothing is added
    off = skyrl.offload_costs(shard, 4 * one, 4 * one, one, one, one, pcie, host, 0 * one)
    assert off["upd_s"] == 0.0 and off["lp_s"] == 0.0


def test_cpu_offload_moves_the_states_off_the_gpu_and_slows_the_update():
    r = run({}, {"offload_params": True, "offload_optimizer": True})
    assert r.train_peak_gib[1] < r.train_peak_gib[0] - 5
    assert r.update_time_s[1] > r.update_time_s[0]
    # the forward passes only pay what the copies do not hide
    assert r.old_log_prob_time_s[1] >= r.old_log_prob_time_s[0]


def test_count_micro_batches_cost_more_than_token_bins():
    # SkyRL's default micro-batch of one sequence against 4 per micro-batch: more gathers
    r = run({}, {"micro_batch_seqs": 4, "logprob_micro_batch_seqs": 4})
    assert r.update_time_s[0] > r.update_time_s[1]
    assert r.old_log_prob_time_s[0] > r.old_log_prob_time_s[1]


def test_generation_rounds_multiply_generation():
    r = run({}, {"gen_rounds": 3})
    assert r.gen_time_s[1] == pytest.approx(3 * r.gen_time_s[0])
    assert r.update_time_s[1] == pytest.approx(r.update_time_s[0])
    assert r.step_time_s[1] - r.step_time_s[0] == pytest.approx(2 * r.gen_time_s[0])


def test_fused_moe_workspace_and_batched_tokens_shrink_the_kv_cache():
    rows = [{**BASE}, {**BASE, "max_num_batched_tokens": 16384}]
    b = inputs.to_batch(pd.DataFrame(rows))
    m = generation.rollout_memory(b)
    # vLLM fused_experts_impl: T x top_k x (max(N, hidden) + N/2) bf16, N = 2 ffn_e / tp
    n = 2 * b.expert_ffn[0] / 4
    ws = b.top_k[0] * (max(n, b.hidden[0]) + n / 2)
    act = lambda T: (T * (ws + 4 * b.hidden[0]) * 2 + 1024 * b.vocab[0] * 4 / 4) / 2 ** 30
    assert m["rollout_activation_gib"][0] - 1.5 == pytest.approx(act(8192), rel=1e-6)
    assert m["rollout_activation_gib"][1] - 1.5 == pytest.approx(act(16384), rel=1e-6)
    assert m["kv_cache_gib"][1] < m["kv_cache_gib"][0]
    # dense models keep the MLP width
    d = inputs.to_batch(pd.DataFrame([{**BASE, "model": "qwen2.5-7b"}]))
    md = generation.rollout_memory(d)
    dense = (8192 * (2 * d.ffn[0] / 4 + 4 * d.hidden[0]) * 2 + 1024 * d.vocab[0] * 4 / 4)
    assert md["rollout_activation_gib"][0] - 1.5 == pytest.approx(dense / 2 ** 30, rel=1e-6)


def test_the_published_rows_read_as_their_frameworks_run_them():
    from sim_core.accuracy import rl
    df, _, _ = rl.to_frame(rl.load())
    marin = df[df.model.eq("qwen3-235b-a22b")].iloc[0]
    assert marin.rl_framework == "skyrl" and not bool(marin.sequence_packing)
    assert marin.response_clip_ratio == pytest.approx(0.55)
    dsk = df[df.model.eq("deepseek-v3")].iloc[0]
    assert dsk.max_num_batched_tokens == 11680 and dsk.train_seq_len == 11680
    p = simulate_rl(df[df.model.eq("qwen3-235b-a22b")])
    assert bool(p.fits.iloc[0])  # FSDP2 cpu_offload: the states are on the host


def test_run_file_states_the_framework_and_the_engine_step():
    import yaml
    from sweep.config.rl import parse_rl
    from sweep.errors import ConfigError

    with open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml") as f:
        data = yaml.safe_load(f)
    data["train"] = {**data.get("train", {}), "rl_framework": "skyrl"}
    data["rollout"] = {**data["rollout"], "max_num_batched_tokens": 16384}
    cfg = parse_rl(data)
    row = cfg.base_row()
    assert row["rl_framework"] == "skyrl" and row["max_num_batched_tokens"] == 16384
    # the frame reaches the RL model: the larger engine step shrinks the KV cache
    small = parse_rl({**data, "rollout": {**data["rollout"], "max_num_batched_tokens": 4096}})
    m = generation.rollout_memory(inputs.to_batch(pd.DataFrame([row, small.base_row()])))
    assert m["kv_cache_gib"][0] < m["kv_cache_gib"][1]
    data["rollout"]["max_num_batched_tokens"] = 0
    with pytest.raises(ConfigError, match="rollout.max_num_batched_tokens"):
        parse_rl(data)


def test_skyrl_megatron_rows_run_sequence_parallel_with_tp():
    # SkyRL f6bf2f91 megatron_worker.py L300: `provider.sequence_parallel = tp > 1`; a run table
    # that leaves the column blank gets it (NeMo RL's default stays off, Megatron drops it at TP 1)
    from sim_core.accuracy import rl
    t = pd.DataFrame([dict(model="qwen3-30b-a3b", gpu="h100-sxm", num_gpus=8,
                           train_backend="megatron", rl_framework=fw, train_tp=tp, train_ep=8,
                           prompts_per_step=8, responses_per_prompt=8, step_time_s=100)
                      for fw, tp in (("skyrl", 4), ("skyrl", 1), ("nemo_rl", 4), ("verl", 4))])
    df, _, _ = rl.to_frame(t)
    assert df["train_sequence_parallel"].tolist() == [True, False, False, True]
