"""Validation and checkpoints inside an RL run's wall time (sim_core/rl/periodic.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import step_fixed
from sim_core.rl.phases import simulate_rl

BASE = dict(model="llama3.1-8b", gpu="h100-sxm", num_gpus=16, gpus_per_node=8, rollout_tp=1,
            prompts_per_step=64, responses_per_prompt=8, prompt_len=92, response_mean=600,
            response_max=2048, gpu_memory_utilization=0.6, train_tp=1, train_pp=1,
            train_zero=3)
SPLIT = dict(placement="split", rollout_gpus=8)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]))


def params(model="llama3.1-8b") -> float:
    return float(catalog.param_count(catalog.get_model(model)))


def test_blank_columns_change_nothing():
    """No period, no samples, or NaN cells: the step is the one priced without the columns."""
    plain = run({}, SPLIT, {"rl_framework": "nemo_rl"})
    blank = run({"val_period": np.nan, "val_samples": np.nan, "save_period": np.nan},
                {**SPLIT, "val_samples": 256},            # samples without a period
                {"rl_framework": "nemo_rl", "val_period": 10, "storage_gbs_per_node": 3.0})
    assert np.array_equal(plain.step_time_s, blank.step_time_s)
    assert (blank.validation_time_s == 0).all() and (blank.checkpoint_time_s == 0).all()
    assert np.array_equal(blank.step_time_s, blank.step_time_without_periodic_s)


def test_checkpoint_bytes_of_a_known_model_and_optimizer():
    """FSDP: fp32 master weights + AdamW moments, 12 B per parameter, each rank its shard: the
    busiest of 2 nodes writes half at 1 GB/s per node; Megatron's torch_dist 14 B; a PPO critic
    doubles it; an HF export adds rank 0's fp32 copy to its node."""
    P = params()
    assert 8.0e9 < P < 8.1e9   # Llama 3.1 8B
    r = run({"save_period": 10}, {"save_period": 10, "train_zero": 1},
            {"save_period": 10, "algorithm": "ppo"},
            {"save_period": 10, "save_hf_model": True},
            {"save_period": 10, "storage_gbs_per_node": 4.0}, {**SPLIT, "save_period": 10})
    assert r.checkpoint_gib[0] == pytest.approx(12 * P / 2 ** 30)
    assert r.checkpoint_write_s[0] == pytest.approx(12 * P / 2 / 1e9)
    assert r.checkpoint_time_s[0] == pytest.approx(12 * P / 2 / 1e9 / 10)
    assert r.checkpoint_write_s[1] == pytest.approx(14 * P / 2 / 1e9)
    assert r.checkpoint_write_s[2] == pytest.approx(2 * 12 * P / 2 / 1e9)
    assert r.checkpoint_write_s[3] == pytest.approx((12 * P / 2 + 4 * P) / 1e9)
    assert r.checkpoint_write_s[4] == pytest.approx(12 * P / 2 / 4e9)
    # split: only the 8 trainer GPUs (one node) write
    assert r.checkpoint_write_s[5] == pytest.approx(12 * P / 1e9)
    assert np.allclose(r.step_time_s, r.step_time_without_periodic_s + r.checkpoint_time_s)


def test_validation_is_a_generation_of_that_batch_divided_by_the_period():
    """Split (no engine cycle): one validation = calls x the generation of `val_batch`
    sequences of one response at the validation cap, priced as a step's own generation."""
    val = run({**SPLIT, "val_period": 5, "val_samples": 96, "val_batch": 32,
               "val_max_len": 1024})
    # the same generation as a training step of 32 prompts x 1 response at the 1024 cap
    gen = run({**SPLIT, "prompts_per_step": 32, "responses_per_prompt": 1,
               "response_max": 1024})
    one = float(gen.gen_tail_time_s[0])
    assert val.validation_run_s[0] == pytest.approx(3 * one, rel=1e-12)
    assert val.validation_time_s[0] == pytest.approx(3 * one / 5, rel=1e-12)
    assert val.validation_fixed_s[0] == 0 and val.validation_sync_s[0] == 0
    # all at once (blank val_batch, verl) is one call of 96, shorter than three of 32
    once = run({**SPLIT, "val_period": 5, "val_samples": 96, "val_max_len": 1024})
    gen96 = run({**SPLIT, "prompts_per_step": 96, "responses_per_prompt": 1,
                 "response_max": 1024})
    assert once.validation_run_s[0] == pytest.approx(float(gen96.gen_tail_time_s[0]))
    assert once.validation_run_s[0] < val.validation_run_s[0]
    # a last, partial call holds the rest (verl's val dataloader, drop_last False): 80 in 32s
    rest = run({**SPLIT, "val_period": 5, "val_samples": 80, "val_batch": 32,
                "val_max_len": 1024})
    gen16 = run({**SPLIT, "prompts_per_step": 16, "responses_per_prompt": 1,
                 "response_max": 1024})
    assert rest.validation_run_s[0] == pytest.approx(2 * one + float(gen16.gen_tail_time_s[0]),
                                                     rel=1e-12)
    # the mean is capped at a shorter validation cap
    short = run({**SPLIT, "val_period": 5, "val_samples": 32, "val_max_len": 256})
    gen256 = run({**SPLIT, "prompts_per_step": 32, "responses_per_prompt": 1,
                  "response_max": 256, "response_mean": 256})
    assert short.validation_run_s[0] == pytest.approx(float(gen256.gen_tail_time_s[0]))


def test_colocated_validation_pays_one_engine_cycle_and_verl_a_weight_push():
    """NeMo RL: the refit before a validation is the next step's (grpo.py), so only a sleep and
    a wake more; verl's sharding manager also pushes the weights on entry."""
    v = {"val_period": 10, "val_samples": 64}
    r = run({**v, "rl_framework": "nemo_rl"}, {**v, "rl_framework": "verl"},
            {"rl_framework": "verl"})
    # the engine's bf16 weights back at the wake rate of step_fixed, + the fixed sleep / wake
    from sim_core.rl import inputs, training

    b = inputs.to_batch(pd.DataFrame([BASE]))
    wake = 2 * params() / 1 / step_fixed.wake_bytes_per_s(training.pcie_bytes_per_s(b))[0]
    cycle = wake + step_fixed.sleep_wake_fixed_s()
    assert r.validation_fixed_s[0] * 10 == pytest.approx(cycle, rel=0.01)
    assert r.validation_sync_s[0] == 0
    assert r.validation_fixed_s[1] * 10 == pytest.approx(cycle, rel=0.01)
    assert r.validation_sync_s[1] * 10 == pytest.approx(float(r.weight_sync_time_s[1]))
    assert r.validation_gen_s[0] == pytest.approx(r.validation_gen_s[1])
    assert r.step_time_without_periodic_s[1] == r.step_time_s[2]


def test_cost_counts_them_and_the_run_file_sets_them(tmp_path):
    import yaml

    import sweep
    from sweep.config import load_run

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    d = {**src, "validation": {"period": 10, "samples": 512, "batch": 256, "max_len": 4096},
         "checkpoint": {"period": 20, "storage_gbs_per_node": 2.0, "hf_export": True}}
    p = tmp_path / "rl.yaml"
    p.write_text(yaml.safe_dump(d))
    f = load_run(str(p)).frame()
    row = f.iloc[0]
    assert (row.val_period, row.val_samples, row.val_batch, row.val_max_len) == (10, 512, 256,
                                                                                4096)
    assert (row.save_period, row.storage_gbs_per_node, bool(row.save_hf_model)) == (20, 2.0,
                                                                                   True)
    r = sweep.simulate(str(p)).iloc[0]
    assert r.validation_time_s > 0 and r.checkpoint_time_s > 0
    assert r.step_time_s == pytest.approx(r.step_time_without_periodic_s + r.validation_time_s
                                          + r.checkpoint_time_s)
    plain = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    q = tmp_path / "plain.yaml"
    q.write_text(yaml.safe_dump(plain))
    r0 = sweep.simulate(str(q)).iloc[0]
    assert r0.step_time_s == pytest.approx(r.step_time_without_periodic_s)
    assert r.cost_per_1000_steps / r0.cost_per_1000_steps == pytest.approx(
        r.step_time_s / r0.step_time_s)


@pytest.mark.parametrize("patch, msg", [
    ({"validation": {"period": 0, "samples": 8}}, "validation.period"),
    ({"validation": {"period": 10}}, "validation.samples"),
    ({"checkpoint": {"period": 5, "storage_gbs_per_node": -1}},
     "checkpoint.storage_gbs_per_node"),
    ({"checkpoint": {"period": 5, "hf": True}}, "checkpoint.hf"),
    ({"space": {"val_period": [5, 10]}}, "space.val_period: needs validation"),
    ({"space": {"save_period": [0, 10]}}, "space.save_period"),
    ({"space": {"storage_gbs_per_node": [1.0, 4.0]}}, "space.storage_gbs_per_node"),
])
def test_bad_values_are_one_line_errors_naming_the_field(tmp_path, patch, msg):
    import yaml

    from sweep.config import load_run
    from sweep.errors import ConfigError

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    p = tmp_path / "rl.yaml"
    p.write_text(yaml.safe_dump({**src, **patch}))
    with pytest.raises(ConfigError, match=msg.replace(".", r"\.")) as e:
        load_run(str(p))
    assert "\n" not in str(e.value)


def test_a_space_varies_the_checkpoint_period_and_the_storage(tmp_path):
    import yaml

    from sweep.config import load_run

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    d = {**src, "checkpoint": {"period": 10},
         "space": {"save_period": [10, 50], "storage_gbs_per_node": [1.0, 4.0]}}
    p = tmp_path / "rl.yaml"
    p.write_text(yaml.safe_dump(d))
    r = simulate_rl(load_run(str(p)).frame())
    assert len(r) == 4
    # 5x the period and 4x the bandwidth: 20x less per step; the write itself 4x shorter
    t = r.checkpoint_time_s.to_numpy()
    assert t[0] / t[3] == pytest.approx(20.0)
    assert r.checkpoint_write_s[0] / r.checkpoint_write_s[1] == pytest.approx(4.0)


def test_the_nemo_rl_nightly_rows_validate_in_the_stated_calls():
    """rl_runs.csv: the 8K DeepScaleR suite validates 480 samples in 15 calls of 32 (its recipe
    at 29f58809); a step's share is the run over val_period 10; rows that state no period are
    priced without them."""
    from sim_core.accuracy import rl as arl

    t = arl.load()
    suite = t[t.source.astype(str).str.startswith("NeMo RL nightly")].reset_index(drop=True)
    df, _, reason = arl.to_frame(suite)
    assert (reason == "").all()
    r = simulate_rl(df)
    big = int(np.flatnonzero(df.val_batch.to_numpy(float) == 32)[0])
    assert (df.val_samples[big], df.val_period[big]) == (480, 10)
    assert r.validation_time_s[big] == pytest.approx(r.validation_run_s[big] / 10)
    assert (r.validation_time_s > 0).all() and (r.checkpoint_time_s > 0).all()
    other = t[t.source.astype(str).str.startswith("NeMo RL v0.3 blog")].reset_index(drop=True)
    o = simulate_rl(arl.to_frame(other)[0])
    assert (o.validation_time_s == 0).all() and (o.checkpoint_time_s == 0).all()


def test_the_recipes_carry_the_periods(tmp_path):
    """verl trainer.test_freq / save_freq and NeMo RL grpo.val_period, max_val_samples,
    val_batch_size, checkpointing.save_period (keys checked against their definitions)."""
    import yaml

    import sweep
    from sweep.advice import rl as adv

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    p = tmp_path / "rl.yaml"
    p.write_text(yaml.safe_dump({**src, "validation": {"period": 10, "samples": 480,
                                                        "batch": 32},
                                 "checkpoint": {"period": 20}}))
    r = sweep.simulate(str(p)).iloc[0]
    o = adv.verl_overrides(r)
    assert (o["trainer.test_freq"], o["trainer.save_freq"]) == (10, 20)
    n = adv.nemo_rl_config(r)
    assert (n["grpo"]["val_period"], n["grpo"]["max_val_samples"],
            n["grpo"]["val_batch_size"], n["checkpointing"]["save_period"]) == (10, 480, 32, 20)
    q = tmp_path / "plain.yaml"
    q.write_text(yaml.safe_dump(src))
    plain = sweep.simulate(str(q)).iloc[0]
    assert "trainer.test_freq" not in adv.verl_overrides(plain)
    assert "checkpointing" not in adv.nemo_rl_config(plain)


def test_the_published_timers_check_runs():
    """benchmarks/rl_periodic_check.py prices every published timer on its row (nothing is
    fitted on them): each is matched and priced, validation and checkpoint both present."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chk", "benchmarks/rl_periodic_check.py")
    chk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chk)
    r = chk.check()
    assert set(r.kind) == {"validation", "checkpoint"}
    assert np.isfinite(r.predicted_s).all() and (r.predicted_s > 0).all()


def test_the_deepscaler_suite_validates_in_15_calls_over_its_8_engines():
    """NeMo RL 29f58809, the 8K GSPO DeepScaleR suite: validate() runs 480 // 32 = 15 batches in
    turn (grpo.py 2236-2283), each through run_multi_turn_rollout (async_engine false) into
    VllmGeneration.generate, which shards the 32 prompts over the 8 TP-1 workers
    (vllm_generation.py 476-480: 4 each), one response each at max_new_tokens 8192. So one
    validation = 15 x the generation of a 32 x 1 batch on the row's own 8 engines, and a step
    carries a tenth of it (val_period 10 at steps 10, 20, 30 of max_num_steps 30). Fails if a
    call were priced on one engine, all 480 at once, or with the training's 8 responses."""
    from sim_core.accuracy import rl as arl

    t = arl.load()
    row = t[t.url.astype(str).str.endswith("grpo-gspo-deepscaler-1.5b-8K.sh")]
    assert len(row) == 1
    df = arl.to_frame(row.reset_index(drop=True))[0]
    assert (df.val_period[0], df.val_samples[0], df.val_batch[0]) == (10, 480, 32)
    assert np.isnan(df.val_max_len[0]) and df.response_max[0] == 8192
    r = simulate_rl(df)
    call = df.copy()
    for k in ("val_period", "val_samples", "val_batch", "save_period"):
        call[k] = np.nan
    call["prompts_per_step"], call["responses_per_prompt"] = 32, 1
    call["rollout_batch_seqs"] = call["train_gbs_seqs"] = 32
    one = float(simulate_rl(call).gen_tail_time_s[0])
    assert r.validation_gen_s[0] * 10 == pytest.approx(15 * one, rel=1e-9)
    # the call's batch runs on the row's 8 TP-1 engines (4 sequences each), as the training's
    from sim_core.rl import inputs, periodic

    b = inputs.to_batch(df)
    v = periodic.validation_batch(b, np.ones(1, bool), np.array([32.0]))
    assert (v.replicas[0], v.sequences[0], v.responses_per_prompt[0]) == (8, 32, 1)
    # in turn, not together: 15 calls of 32 cost more than the 480 sent at once
    wide = call.copy()
    wide["prompts_per_step"] = wide["rollout_batch_seqs"] = wide["train_gbs_seqs"] = 480
    assert float(simulate_rl(wide).gen_tail_time_s[0]) < 15 * one
