"""Megatron-Core's MoE layer forward as one host-synchronised segment (sim_core/rl/moe_host.py):
the kernel counts, and the direction of the rule (one-sequence micro-batches pay more host
time than packed ones, dense models nothing, sequential experts more than grouped GEMM)."""

from __future__ import annotations

import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import moe_host
from sim_core.rl.phases import simulate_rl

from .rl_rows import priced_training_frame

# the NeMo RL v0.3 blog's Qwen3-30B-A3B row (TP2 EP8, 64 H100, no sequence packing), with
# short responses so that one sequence per micro-batch is little GPU work per layer
SHORT = dict(model="qwen3-30b-a3b", gpu="h100-sxm", num_gpus=64, rollout_tp=4,
             prompts_per_step=64, responses_per_prompt=32, prompt_len=92, response_mean=200,
             response_max=420, gpu_memory_utilization=0.7, train_tp=2, train_ep=8,
             train_etp=1, train_recompute="none", mini_batches=4, rl_framework="nemo_rl",
             logprob_batch_size=4, sequence_packing=False)


def _exposed(**over):
    df, b, tf, sim, tok, gathers = priced_training_frame({**SHORT, **over})
    return moe_host.exposed(b, df, tf, sim, tok, gathers), sim


def test_kernel_counts():
    # 16 local experts (128 / EP 8), grouped GEMM, permute fusion, router unfused:
    # forward 15 attn + 13 router + 20 dispatch + 6 permute + (2 x 16 + 12) experts
    k = moe_host.layer_kernels(16, True, True, False)
    assert k["fwd"] == 98
    # backward 30 + 10 + 6 + 4 + 2 + (4 x 16 + 24)
    assert k["bwd"] == 140
    # router fusion: 8 fewer; permute unfused: 6 more
    assert moe_host.layer_kernels(16, True, True, True)["fwd"] == 90
    assert moe_host.layer_kernels(16, True, False, False)["fwd"] == 104


def test_grouped_gemm_off_costs_more_launches():
    on = moe_host.layer_kernels(16, True, True, False)
    off = moe_host.layer_kernels(16, False, True, False)
    assert off["fwd"] == 15 + 13 + 20 + 6 + 6 * 16 + 2
    assert off["fwd"] > on["fwd"] and off["bwd"] > on["bwd"]
    # and the host binds harder with sequential experts
    e_on, _ = _exposed()
    e_off, _ = _exposed(train_moe_grouped_gemm=False)
    assert e_off["update_s"][0] > e_on["update_s"][0] > 0


def test_one_sequence_microbatches_cost_more_host_time_per_token():
    one, sim_one = _exposed()
    packed, sim_packed = _exposed(sequence_packing=True, train_seq_len=4096)
    # one short sequence per micro-batch: the layer's GPU time is below its host time
    assert one["gpu_fwd_s"][0] < one["host_fwd_s"][0]
    assert one["update_s"][0] > 0
    # log-prob micro-batches of 4 sequences: 4x the GPU work per segment, the same host work
    assert one["log_prob_s"][0] < one["update_s"][0]
    assert _exposed(logprob_batch_size=1)[0]["log_prob_s"][0] > 0
    # the same sequences packed into 4,096-token micro-batches: fewer segments, each longer
    # on the GPU, so less host time per token and less of it exposed
    def host_per_token(e, sim):
        m = sim["num_microbatches"][0]
        tokens = sim["tokens_per_s_per_gpu"][0] * sim["step_time_s"][0]
        return m * 48 * e["host_fwd_s"][0] / tokens
    assert host_per_token(one, sim_one) > host_per_token(packed, sim_packed)
    assert packed["update_s"][0] < one["update_s"][0]


def test_dense_and_fsdp_rows_unaffected():
    dense, _ = _exposed(model="qwen3-32b", train_ep=1, train_etp=1)
    assert dense["update_s"][0] == 0 and dense["log_prob_s"][0] == 0
    fsdp, _ = _exposed(train_zero=3, train_tp=1, train_ep=1)
    assert fsdp["update_s"][0] == 0 and fsdp["kernels_fwd"][0] == 0


def test_full_recompute_replays_the_sync_in_backward():
    plain, _ = _exposed()
    full, _ = _exposed(train_recompute="full")
    # the replayed forward's host time joins each layer's backward segment
    assert full["update_s"][0] > plain["update_s"][0]


def test_update_and_log_prob_carry_it(monkeypatch):
    df = pd.DataFrame([SHORT])
    with_rule = simulate_rl(df, phase_scales={})  # the white-box model: the rule alone
    seen = {}
    real = moe_host.exposed

    def zero(*a, **k):
        out = real(*a, **k)
        seen.update(out)
        return {**out, "update_s": out["update_s"] * 0, "log_prob_s": out["log_prob_s"] * 0}
    monkeypatch.setattr(moe_host, "exposed", zero)
    without = simulate_rl(df, phase_scales={})
    # four optimizer steps per RL step, one log-prob pass each for the policy and the reference
    assert with_rule.update_time_s[0] - without.update_time_s[0] == \
        pytest.approx(4 * seen["update_s"][0])
    assert with_rule.log_prob_time_s[0] - without.log_prob_time_s[0] == \
        pytest.approx(2 * 4 * seen["log_prob_s"][0])


def test_bad_flag_names_the_field():
    with pytest.raises(catalog.CatalogError, match="train_moe_grouped_gemm"):
        _exposed(train_moe_grouped_gemm="maybe")


def test_run_table_carries_the_flags():
    # the NeMo RL Qwen3-30B-A3B row of rl_runs.csv, stated without grouped GEMM
    from sim_core.accuracy import rl
    t = rl.load()
    row = t[t.model.astype(str).eq("qwen3-30b-a3b")].head(1).copy()
    row["train_moe_grouped_gemm"] = "false"
    df, _, reason = rl.to_frame(row.reset_index(drop=True))
    assert reason[0] == ""
    assert not moe_host._flag(df, "train_moe_grouped_gemm")[0]
    assert moe_host._flag(df, "train_moe_permute_fusion")[0]


# SkyRL's Megatron worker (megatron-core 0.16.0, whose alltoall dispatcher still syncs once per
# layer forward): the GLM-4.7-Flash notes' layout (TP4 SP EP8, one unpadded sequence per
# micro-batch, full recompute as its script sets)
SKYRL_GLM = dict(model="glm-4.7-flash", gpu="h200", num_gpus=32, rollout_tp=4,
                 prompts_per_step=1024, responses_per_prompt=16, prompt_len=92,
                 response_mean=3379, response_max=8192, train_tp=4, train_ep=8, train_etp=1,
                 train_recompute="full", mini_batches=4, rl_framework="skyrl",
                 sequence_packing=False, remove_padding=True, micro_batch_seqs=1,
                 logprob_micro_batch_seqs=1, train_sequence_parallel=True)


def test_skyrl_megatron_rows_carry_the_host_floor():
    df, b, tf, sim, tok, gathers = priced_training_frame(SKYRL_GLM)
    e = moe_host.exposed(b, df, tf, sim, tok, gathers)
    # 64 experts / EP 8 = 8 local: 15 + 13 + 20 + 6 + (2 x 8 + 12) forward kernels
    assert e["kernels_fwd"][0] == 82
    assert e["kernels_bwd"][0] == 30 + 10 + 6 + 4 + 2 + (4 * 8 + 24)
    # at the notes' ~5k-token sequences the layer's GPU forward outlasts its host: nothing added
    assert e["gpu_fwd_s"][0] > e["host_fwd_s"][0]
    assert e["update_s"][0] == 0 and e["log_prob_s"][0] == 0
    # short sequences (one ~250-token sequence per micro-batch, 64 tokens per GPU): the host binds
    short = {**SKYRL_GLM, "response_mean": 150, "response_max": 300, "prompt_len": 92}
    df, b, tf, sim, tok, gathers = priced_training_frame(short)
    e = moe_host.exposed(b, df, tf, sim, tok, gathers)
    assert e["gpu_fwd_s"][0] < e["host_fwd_s"][0]
    assert e["update_s"][0] > 0 and e["log_prob_s"][0] > 0
    # SkyRL's FSDP2 workers run the Hugging Face block, not Megatron-Core's: no sync rule
    fsdp = {**short, "train_zero": 3, "train_tp": 1, "train_ep": 1}
    df, b, tf, sim, tok, gathers = priced_training_frame(fsdp)
    assert moe_host.exposed(b, df, tf, sim, tok, gathers)["kernels_fwd"][0] == 0
