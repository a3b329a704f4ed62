"""AReaL's weight update through storage, time-based recovery checkpoints and re-prefill after
an update (sim_core/rl/disk_refit.py, periodic.save_period_steps, generation.reprefill_time)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import generation, inputs, periodic
from sim_core.rl.phases import simulate_rl

# a 32B split run laid out as AReaL's 32B (SGLang TP 8; trainer TP 2 PP 8 on 96 GPUs)
BASE = dict(model="qwen2.5-32b", gpu="h800", num_gpus=384, gpus_per_node=8,
            placement="split", rollout_gpus=288, rollout_engine="sglang", rollout_tp=8,
            gpu_memory_utilization=0.7, prompts_per_step=512, responses_per_prompt=16,
            prompt_len=92, response_mean=11403, response_max=27648, mini_batches=4,
            train_tp=2, train_pp=8, train_zero=1, use_ref=False, train_seq_len=32768)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]), phase_scales={})


def rows(*r):
    """simulate_rl's rows as Series, one per given row."""
    out = run(*r)
    return [out.iloc[i] for i in range(len(out))]


def params(model="qwen2.5-32b") -> float:
    return float(catalog.param_count(catalog.get_model(model)))


def test_disk_refit_is_one_writer_node_share_plus_one_full_read():
    """fp16 model bytes: 8 PP stages of ~8.2 GB each (one <=10 GB shard, one writer each, on
    8 of the 12 trainer nodes) written at 1 GB/s per node, then each rollout node reads the
    whole model at the same rate; it replaces the NCCL broadcast."""
    P = params()
    nccl, disk = rows({}, {"refit_via_disk": True})
    assert disk.weight_sync_time_s == pytest.approx(2 * P / 8 / 1e9 + 2 * P / 1e9, rel=1e-9)
    assert nccl.weight_sync_time_s < 0.3 * disk.weight_sync_time_s
    # the storage rate a row states
    fast = run({"refit_via_disk": True, "storage_gbs_per_node": 4.0}).iloc[0]
    assert fast.weight_sync_time_s == pytest.approx(disk.weight_sync_time_s / 4)
    # synchronous: the refit is on the critical path, second for second
    assert disk.step_time_s - nccl.step_time_s == pytest.approx(
        disk.weight_sync_time_s - nccl.weight_sync_time_s)


def test_disk_writers_follow_the_10gb_shards_and_the_nodes():
    """One PP stage over 10 GB writes ceil(bytes / 10 GB) shards from as many ranks; writers
    beyond the trainer's nodes share a node."""
    P = params()
    b = inputs.to_batch(pd.DataFrame([{**BASE}, {**BASE, "train_pp": 1, "train_tp": 8},
                                      {**BASE, "num_gpus": 296}]))
    from sim_core.rl import disk_refit
    s = disk_refit.seconds(b, np.array([8.0, 1.0, 8.0]))
    assert s["disk_write_s"][0] == pytest.approx(2 * P / 8 / 1e9)
    shards = np.ceil(2 * P / 1e10)          # 7 shards of a 65.5 GB single stage
    assert s["disk_write_s"][1] == pytest.approx(2 * P / shards / 1e9)
    assert s["disk_write_s"][2] == pytest.approx(2 * P / 1 / 1e9)   # 8 trainer GPUs: one node
    assert np.allclose(s["disk_read_s"], 2 * P / 1e9)


def test_time_based_checkpoint_period_counts_whole_steps():
    """A checkpoint once 600 s have passed: every step for steps of 600 s or more, every
    ceil(600 / T) steps below; a stated step period wins."""
    b = inputs.to_batch(pd.DataFrame([{**BASE, "save_period_s": 600}] * 4
                                     + [{**BASE, "save_period": 5, "save_period_s": 600}]))
    got = periodic.save_period_steps(b, np.array([1500.0, 600.0, 250.0, 100.0, 100.0]))
    assert list(got) == [1.0, 1.0, 3.0, 6.0, 5.0]


def test_time_based_checkpoint_prices_megatron_state_every_long_step():
    """The 32B's steps exceed 600 s: each writes Megatron's 14 B per parameter over the 12
    trainer nodes at 1 GB/s, the whole write in every step."""
    P = params()
    plain, ck = rows({}, {"save_period_s": 600})
    assert ck.checkpoint_write_s == pytest.approx(14 * P / 12 / 1e9)
    assert ck.checkpoint_time_s == pytest.approx(ck.checkpoint_write_s)
    assert ck.step_time_s == pytest.approx(plain.step_time_s + ck.checkpoint_write_s)
    # a short step amortises it over ceil(600 / step) steps
    small = run({"model": "qwen2.5-1.5b", "rollout_tp": 1, "train_tp": 1, "train_pp": 1,
                 "save_period_s": 600, "response_mean": 2000, "response_max": 4096}).iloc[0]
    k = np.ceil(600 / small.step_time_without_periodic_s)
    assert k > 1
    assert small.checkpoint_time_s == pytest.approx(small.checkpoint_write_s / k)


def test_reprefill_is_the_running_caches_prefill_once_per_async_step():
    """Async with re-prefill: the generation side gains one prefill of the running requests'
    caches (concurrency x in-flight context) per step; sync and rows without it unchanged."""
    a = {"asynchrony": "async", "staleness": 4}
    off, on, sync_on = rows(a, {**a, "reprefill_on_update": True}, {"reprefill_on_update": True})
    b = inputs.to_batch(pd.DataFrame([{**BASE, "reprefill_on_update": True}]))
    g = generation.generate(b)
    p = generation.truncated_fraction(b)
    _, m1, m2 = generation.length_law(b.response_mean, b.response_max, p)
    ctx = b.prompt_len + m2 / (2 * m1)
    want = generation.prefill_time(b, g["concurrency"] * ctx, ctx)[0]
    assert g["reprefill_time_s"][0] == pytest.approx(want)
    assert want > 5.0        # ~1.5M cached tokens of a 32B on 8 GPUs: tens of seconds
    assert on.gen_time_s - off.gen_time_s == pytest.approx(want)
    assert sync_on.step_time_s == pytest.approx(run({}).step_time_s[0])


def test_blank_columns_price_as_before():
    """NaN / False in the three columns: byte-identical to a row without them."""
    plain = run({})
    blank = run({"save_period_s": np.nan, "refit_via_disk": False,
                 "reprefill_on_update": False})
    assert np.array_equal(plain.step_time_s, blank.step_time_s)
