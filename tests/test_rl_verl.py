"""RL training phases as verl's FSDP workers run them (issue 40, sim_core/rl/verl.py): their
micro-batches, padding without remove-padding, the critic as its own model, the reference
weights streamed from the host, per-phase offload, verl's kernels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, training, verl
from sim_core.rl.phases import simulate_rl

# a verl GSM8K-like GRPO row on 8 H100 with FSDP (zero 3)
BASE = dict(model="qwen2.5-0.5b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
            prompts_per_step=256, responses_per_prompt=4, prompt_len=100, response_mean=200,
            response_max=256, prompt_max=512, gpu_memory_utilization=0.6, train_tp=1,
            train_pp=1, train_zero=3, mini_batches=4, train_seq_len=8000)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]))


@pytest.fixture
def gpu_only(monkeypatch):
    """The GPU-side rules alone: the host floor (rule 7, tests/test_rl_host.py) set to zero,
    since a 0.5B model at four sequences per micro-batch is host-bound and hides them."""
    from sim_core.rl import host

    monkeypatch.setattr(host, "seconds_per_kernel", lambda: 0.0)
    monkeypatch.setattr(host, "view_seconds", lambda: 0.0)


def test_micro_batches_as_the_worker_forms_them():
    s = np.array([64.0, 64.0, 64.0])
    # use_dynamic_bsz: ceil(effective tokens / budget), never more than one per sequence
    mb, n = verl.micro_batching(s, np.array([300.0] * 3), np.array([True, True, False]),
                                np.array([8000.0, 100.0, 8000.0]), np.array([4.0, 4.0, 4.0]))
    assert list(n) == [3.0, 64.0, 16.0]  # 19200 / 8000 -> 3; budget < a sequence -> 64
    assert mb == pytest.approx([64 / 3, 1.0, 4.0])


def test_off_for_nemo_rl_and_megatron_rows():
    df = pd.DataFrame([BASE, {**BASE, "rl_framework": "nemo_rl"}, {**BASE, "train_zero": 1}])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    assert list(verl.active(b, tf)) == [True, False, False]


def test_fixed_micro_batches_cost_more_than_dynamic_ones_for_small_models():
    # four sequences per micro-batch against one ~8000-token micro-batch: the step's fixed
    # costs per micro-batch (FSDP gathers, layer overheads) are paid 6x as often
    r = run({}, {"sequence_packing": False, "micro_batch_seqs": 4})
    assert r.update_time_s[1] > r.update_time_s[0]
    assert r.old_log_prob_time_s[1] > r.old_log_prob_time_s[0]


def test_without_remove_padding_every_sequence_runs_at_the_caps(gpu_only):
    # use_remove_padding False: [batch, prompt_max + response_max] through every layer
    fixed = {"sequence_packing": False, "micro_batch_seqs": 4}
    r = run(fixed, {**fixed, "remove_padding": False}, {**fixed, "remove_padding": False,
                                                        "prompt_max": 100})
    ratio = (512 + 256) / (100 + 200)
    assert r.update_time_s[1] / r.update_time_s[0] == pytest.approx(ratio, rel=0.35)
    assert r.update_time_s[1] > 1.8 * r.update_time_s[0]
    # the padding is the prompt cap's, not the mean prompt's
    assert r.update_time_s[2] < r.update_time_s[1]


def test_ppo_critic_is_its_own_padded_model_with_a_value_head(gpu_only):
    ppo = {"algorithm": "ppo"}
    r = run(ppo, {**ppo, "critic_remove_padding": True}, {})
    # PPO: values pass and critic update on top of the actor's phases
    assert r.values_time_s[0] > 0 and r.values_time_s[2] == 0
    assert r.update_time_s[0] > r.update_time_s[2]
    # verl's critic default (use_remove_padding False) pads to the caps: slower than unpadded
    assert r.values_time_s[0] > 1.5 * r.values_time_s[1]
    assert r.update_time_s[0] > r.update_time_s[1]
    # unpadded, with the actor's budget and micro-batch, the critic is the actor less its LM
    # head and vocabulary loss: cheaper than the actor's update (the 0.5B head is ~28% of it)
    same = {**ppo, "critic_remove_padding": True, "critic_seq_len": 8000}
    r2 = run(same)
    critic = r2.update_time_s[0] - r.update_time_s[2]
    assert 0.5 * r.update_time_s[2] < critic < 0.9 * r.update_time_s[2]


def test_reference_weights_stream_from_the_host_every_micro_batch():
    # fsdp_workers.py forces CPUOffload on the reference: its bf16 shard crosses PCIe in every
    # forward micro-batch; the old-policy pass runs the same frame without it
    fixed = {"sequence_packing": False, "micro_batch_seqs": 4}
    r = run(fixed, {**fixed, "logprob_micro_batch_seqs": 8})
    b = inputs.to_batch(pd.DataFrame([BASE]))
    shard = b.params[0] * 2.0 / 8 / training.pcie_bytes_per_s(b)[0]
    per_gpu = 256 * 4 / 8
    assert r.ref_time_s[0] - r.old_log_prob_time_s[0] == pytest.approx(per_gpu / 4 * shard,
                                                                        rel=1e-6)
    assert r.ref_time_s[1] - r.old_log_prob_time_s[1] == pytest.approx(per_gpu / 8 * shard,
                                                                        rel=1e-6)
    # no reference pass without a KL term
    assert run({"use_ref": False}).ref_time_s[0] == 0


def test_param_and_optimizer_offload_move_fp32_states_in_every_phase():
    r = run({}, {"offload_params": True}, {"offload_params": True, "offload_optimizer": True})
    b = inputs.to_batch(pd.DataFrame([BASE]))
    w = b.params[0] * 4.0 / 8 / training.pcie_bytes_per_s(b)[0]
    # offload_fsdp_model_to_cpu's empty_cache at the end of each offloaded phase
    # (verl_calls.py; not the reference's)
    ec = inputs.constants()["step_fixed"]["empty_cache_s"]
    # compute_log_prob: load + offload of the fp32 weights shard; the reference is unaffected
    assert r.old_log_prob_time_s[1] - r.old_log_prob_time_s[0] == pytest.approx(2 * w + ec)
    assert r.ref_time_s[1] == pytest.approx(r.ref_time_s[0])
    # update_actor: the weights, and the Adam moments (8 B/param) both ways
    assert r.update_time_s[1] - r.update_time_s[0] == pytest.approx(2 * w + ec)
    assert r.update_time_s[2] - r.update_time_s[1] == pytest.approx(2 * 2 * w)
    # around generation the optimizer never moves (only the rollout's weight load): the
    # pageable optimizer round trip NeMo RL pays is not charged
    assert r.offload_time_s[2] == pytest.approx(r.offload_time_s[1])


def test_frames_carry_verls_kernels():
    df = pd.DataFrame([BASE])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    fr = verl._frame(tf, np.array([8.0]), np.array([300.0]), np.array([3.4]), np.array([5.0]))
    assert fr["micro_batch"][0] == 3 and fr["global_batch"][0] == 5 * 8 * 3
    assert fr["seq_len"][0] == 300
    for k, v in verl.KERNELS.items():
        assert fr[k][0] == v
    assert not fr["fused_elementwise"][0] and fr["attention_kernel"][0] == "fa2"


def test_rl_table_reads_verls_worker_columns():
    from sim_core.accuracy import rl

    t = rl.load()
    df, _, reason = rl.to_frame(t)
    llama = t.url.str.contains("w73j5mdv").to_numpy()
    ppo05 = t.url.str.contains("verl_ppo_qwen2.5b").to_numpy()
    assert df.micro_batch_seqs[llama].iloc[0] == 4
    assert not bool(df.sequence_packing[llama].iloc[0])
    assert not bool(df.remove_padding[ppo05].iloc[0])
    assert df.logprob_micro_batch_seqs[ppo05].iloc[0] == 8
    assert df.critic_seq_len[ppo05].iloc[0] == 32768
    # the prompt cap travels to the padding
    assert df.prompt_max[ppo05].iloc[0] == 512
    assert (reason[llama | ppo05] == "").all()


def test_run_file_sets_verls_worker_fields(tmp_path):
    import yaml

    import sweep
    from sweep.errors import SweepError

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    src["parallel"] = {"tp": 1, "pp": 1, "zero": 3, "recompute": "full"}
    src["prompt_len"] = {"mean": 300, "max": 1024}
    src["train"].update({"sequence_packing": False, "micro_batch_seqs": 4})
    f = tmp_path / "verl.yaml"
    f.write_text(yaml.safe_dump(src))
    one = sweep.simulate(str(f))
    src["train"]["remove_padding"] = False
    f.write_text(yaml.safe_dump(src))
    two = sweep.simulate(str(f))
    assert two.update_time_s.iloc[0] > one.update_time_s.iloc[0]
    src["train"]["micro_batch_seqs"] = 0
    f.write_text(yaml.safe_dump(src))
    with pytest.raises(SweepError, match="micro_batch_seqs"):
        sweep.simulate(str(f))


def test_unreadable_verl_column_is_a_one_line_error():
    from sim_core.catalog import CatalogError

    with pytest.raises(CatalogError, match="micro_batch_seqs: 'four' is not a number"):
        run({"micro_batch_seqs": "four"})
