"""RL training phases on Megatron that the pre-training step does not price (issue 40):
NeMo RL's packed bins dealt round-robin over data-parallel ranks and padded to the longest
with pipeline parallelism (sim_core/rl/nemo_rl.py), verl's per-phase parameter offload
(sim_core/rl/verl_megatron.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, nemo_rl, training
from sim_core.rl.phases import simulate_rl
from sim_core.simulate import simulate_frame

# the NeMo RL v0.3 blog's Llama 3.1-70B Megatron row: 64 H100, tp4 pp4, 512-sequence steps
BASE = dict(model="llama3.1-70b", gpu="h100-sxm", num_gpus=64, rollout_tp=4,
            prompts_per_step=64, responses_per_prompt=32, prompt_len=92, response_mean=398,
            response_max=4004, gpu_memory_utilization=0.6, train_tp=4, train_pp=4,
            train_recompute="none", mini_batches=4, train_seq_len=4096,
            rl_framework="nemo_rl", logprob_batch_size=4)


def _frames(**over):
    df = pd.DataFrame([{**BASE, **over}])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True))
    return b, tf, sim


def _want(tf, sim, seqs, cap, pp, mult, padded_to_cap, scale=1.0):
    """The busiest rank's tokens over what the step priced, counted by hand."""
    dp = sim["dp"][0]
    tokens = seqs * (92 + 398 + (mult - 1) / 2)
    bins = math.ceil(tokens / cap)
    per_bin = cap if padded_to_cap else tokens / bins
    priced = tf["global_batch"][0] * tf["seq_len"][0] / dp * scale
    return max(math.ceil(bins / dp) * per_bin / priced - 1, 0.0)


@pytest.mark.parametrize("pp", [1, 4])
def test_bins_round_robin_and_pp_padding(pp):
    b, tf, sim = _frames(train_pp=pp)
    up, lp = nemo_rl.megatron_bin_padding(b, tf, sim, np.array([4096.0]))
    # update: 512 sequences per optimizer step into 4,096-token bins, padded to a multiple of
    # tp = 4; with PP every bin runs at the capacity (pad_full_seq_to)
    assert up[0] == pytest.approx(_want(tf, sim, 512, 4096, pp, 4, pp > 1))
    # log-probs: all 2,048 sequences in bins of 4,096 x logprob_batch_size 4
    assert lp[0] == pytest.approx(_want(tf, sim, 2048, 16384, pp, 4, pp > 1, scale=4))
    if pp > 1:
        # 62 bins over dp 4 -> 16 on the busiest rank, each padded to 4,096 tokens
        assert 0.02 < up[0] < 0.08


def test_bins_only_for_packed_megatron():
    b, tf, sim = _frames()
    assert nemo_rl.megatron_bin_padding(b, tf, sim, np.array([4096.0]))[0][0] > 0
    for over in (dict(sequence_packing=False), dict(dynamic_batching=True), dict(train_zero=3)):
        b, tf, sim = _frames(**over)
        up, lp = nemo_rl.megatron_bin_padding(b, tf, sim, np.array([4096.0]))
        assert up[0] == 0 and lp[0] == 0, over


def test_bins_lengthen_the_nemo_rl_phases_only():
    r = simulate_rl(pd.DataFrame([BASE, {**BASE, "rl_framework": "verl"}]))
    b, tf, sim = _frames()
    up, lp = nemo_rl.megatron_bin_padding(b, tf, sim, np.array([4096.0]))
    pipe = sim["time_compute"][0] + sim["time_bubble"][0]
    # per optimizer step (4 of them) on the update; a third of it per mini-batch on each
    # log-prob pass (old policy + reference)
    assert r.update_time_s[0] > r.update_time_s[1]
    ext = nemo_rl.extras(b, tf, sim, training.pcie_bytes_per_s(b), np.array([4096.0]))
    assert ext["update_bins_s"][0] == pytest.approx(up[0] * pipe)
    assert ext["logprob_bins_s"][0] == pytest.approx(lp[0] * pipe / 3 * 4)


# verl's DeepSeek-V3 recipe shape, small: verl Megatron, colocated, offloaded parameters
VERL = dict(model="qwen2.5-7b", gpu="h100-sxm", num_gpus=16, rollout_tp=2,
            prompts_per_step=64, responses_per_prompt=8, prompt_len=200, response_mean=1000,
            response_max=4096, gpu_memory_utilization=0.6, train_tp=2, train_pp=2,
            train_recompute="full", mini_batches=2, rl_framework="verl")


def test_verl_megatron_moves_parameters_in_every_phase():
    # megatron_workers.py v0.7.0: compute_log_prob and update_actor load the actor's bf16
    # parameter buffers from pinned memory and offload them through pageable memory;
    # compute_ref_log_prob moves the reference module both ways pinned
    rows = [VERL, {**VERL, "offload_params": True},
            {**VERL, "offload_params": True, "ref_offload": True}]
    r = simulate_rl(pd.DataFrame(rows))
    df = pd.DataFrame([VERL])
    b = inputs.to_batch(df)
    sim = simulate_frame(training.training_frame(df, b).reset_index(drop=True))
    w = sim["params_per_gpu"][0] * 2
    pcie = training.pcie_bytes_per_s(b)[0]
    slow = inputs.constants()["pageable_slowdown"]
    actor = w / pcie * (1 + slow)
    assert 0.05 < w / pcie < 0.1  # 7.6B / tp2 / pp2 in bf16 over ~51 GB/s
    assert r.old_log_prob_time_s[1] - r.old_log_prob_time_s[0] == pytest.approx(actor)
    assert r.update_time_s[1] - r.update_time_s[0] == pytest.approx(actor)
    assert r.ref_time_s[1] == pytest.approx(r.ref_time_s[0])
    assert r.ref_time_s[2] - r.ref_time_s[1] == pytest.approx(2 * w / pcie)
    assert r.log_prob_time_s[2] - r.log_prob_time_s[0] == pytest.approx(actor + 2 * w / pcie)


def test_verl_megatron_moves_only_for_verl_megatron_with_a_reference():
    base = {**VERL, "offload_params": True, "ref_offload": True}
    r = simulate_rl(pd.DataFrame([base, {**base, "rl_framework": "nemo_rl"},
                                  {**base, "train_zero": 3}, {**base, "use_ref": False}]))
    # an FSDP trainer's offload is verl.py's (its FSDP workers), so it is compared with the
    # same offload without the Megatron-only ref_offload
    plain = simulate_rl(pd.DataFrame([{**VERL, "rl_framework": "nemo_rl"},
                                      {**VERL, "train_zero": 3, "offload_params": True}, VERL]))
    assert r.old_log_prob_time_s[0] > plain.old_log_prob_time_s[2]
    # NeMo RL (its own reference swap) and FSDP trainers: nothing from verl_megatron
    assert r.update_time_s[1] == pytest.approx(plain.update_time_s[0])
    assert r.update_time_s[2] == pytest.approx(plain.update_time_s[1])
    # no KL term (DAPO): no reference pass, nothing to move
    assert r.ref_time_s[3] == 0


def test_run_file_ref_offload_reaches_the_model_and_the_verl_recipe(tmp_path):
    import yaml

    import sweep
    from sweep.advice.rl import verl_overrides

    path = "search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"
    src = yaml.safe_load(open(path))
    src["train"]["ref_offload"] = True
    f = tmp_path / "ref_offload.yaml"
    f.write_text(yaml.safe_dump(src))
    one, two = sweep.simulate(path), sweep.simulate(str(f))
    assert two.ref_time_s.iloc[0] > one.ref_time_s.iloc[0]
    assert two.update_time_s.iloc[0] == pytest.approx(one.update_time_s.iloc[0])
    assert verl_overrides(two.iloc[0])["actor_rollout_ref.ref.megatron.param_offload"] is True
    assert verl_overrides(one.iloc[0])["actor_rollout_ref.ref.megatron.param_offload"] is False


def test_host_adam_bounds_the_cpu_optimizer_step():
    # Megatron HybridDeviceOptimizer: torch.optim.AdamW on the host, 80 B per parameter of
    # memory traffic at the node's DRAM bandwidth shared by its 8 GPU processes; the PCIe
    # copies overlap with it (the longer counts)
    rows = [{**VERL, "num_gpus": 16}, {**VERL, "num_gpus": 16, "optimizer_cpu_offload": 1.0}]
    df = pd.DataFrame(rows)
    b = inputs.to_batch(df)
    sim = simulate_frame(training.training_frame(df, b).reset_index(drop=True))
    tr = training.passes(df, b)
    k = inputs.constants()
    params = sim["mem_optimizer"][1] * 2 ** 30 / 12  # the optimizer shard's parameters
    adam = params * k["host_adam_bytes_per_param"] / (k["host_dram_gbs"] * 1e9 / 8)
    pcie = params * 4 / training.pcie_bytes_per_s(b)[1]
    assert adam > pcie  # host memory, not PCIe, sets the pace: 80 B at 77 GB/s vs 4 B at 51
    assert tr["optimizer_host_time_s"][1] == pytest.approx(adam * 2)  # 2 optimizer steps
    assert tr["optimizer_host_time_s"][0] == 0
    assert tr["update_time_s"][1] - tr["update_time_s"][0] > 0.9 * adam * 2


def test_slime_pauses_once_around_the_rollout_and_not_per_phase():
    # slime `--colocate` (offload_train) pauses the whole Megatron state before the rollout
    # and resumes it after (actor.py sleep / wake_up); verl's Megatron workers also move the
    # parameters inside every training phase (verl_megatron.py)
    off = {**VERL, "offload_params": True, "offload_optimizer": True}
    r = simulate_rl(pd.DataFrame([off, {**off, "rl_framework": "slime"},
                                  {**VERL, "rl_framework": "slime"}]))
    # the same round trip around generation for both frameworks
    assert r.offload_time_s[1] == pytest.approx(r.offload_time_s[0])
    assert r.offload_time_s[1] > r.offload_time_s[2]
    # no per-phase moves: slime's training phases are those of the row without offload
    assert r.old_log_prob_time_s[1] == pytest.approx(r.old_log_prob_time_s[2])
    assert r.update_time_s[1] == pytest.approx(r.update_time_s[2])
    assert r.update_time_s[0] > r.update_time_s[1]


def test_verl_megatron_colocated_trains_with_expandable_segments():
    # megatron_workers.py v0.7.0 trainer_mode: set_expandable_segments(True) after every
    # generation (colocated hybrid engine): the training peak is the bytes allocated + the
    # CUDA context and NCCL buffers, not the default allocator's reserved bytes
    from sim_core.memory import RUNTIME_GIB
    from sim_core.rl import verl_megatron

    rows = [VERL, {**VERL, "rl_framework": "nemo_rl"}, {**VERL, "train_zero": 3},
            {**VERL, "placement": "split", "rollout_gpus": 8, "train_gpus": 8}]
    df = pd.DataFrame(rows)
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b, for_memory=True)
    mem = simulate_frame(tf.reset_index(drop=True))
    peak = verl_megatron.training_peak_gib(b, tf, mem)
    assert (mem["peak_allocated_gib"] < mem["peak_reserved_gib"]).all()
    assert peak[0] == pytest.approx(mem["peak_allocated_gib"][0] + RUNTIME_GIB)
    # NeMo RL, verl's FSDP workers (priced in verl.py) and the split trainer keep the default
    assert np.allclose(peak[1:], mem["peak_memory_gib"][1:])
    r = simulate_rl(pd.DataFrame([VERL, {**VERL, "rl_framework": "nemo_rl"}]))
    assert r.train_peak_gib[0] < r.train_peak_gib[1]
