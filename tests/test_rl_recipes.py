"""The RL model on the frameworks' own shipped recipes (tests/data/rl_recipes.csv): every
recipe prices, fits on the cluster it is shipped for, and composes its phases as its mode says.

The table holds one row per recipe (NeMo RL v0.7.0 `examples/configs/recipes/llm/performance`
and the GRPO/DAPO recipes of its nightly and release suites, written by
tests/data/rl_recipes_build.py from the merged configs; verl v0.7.0
`recipe/fully_async_policy` and `examples/grpo_trainer` scripts), every field from the recipe
(file@tag in `notes`), nothing measured: these tests check that the model can price the runs a
held-out check of that kind would hold, not its accuracy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim_core import nccl
from sim_core.accuracy import rl
from sim_core.rl import inputs
from sim_core.rl.phases import simulate_rl

DATA = Path(__file__).parent / "data" / "rl_recipes.csv"
MEASURED = ("step_time_s", "gen_time_s", "old_log_prob_time_s", "ref_time_s",
            "update_actor_time_s", "weight_sync_time_s")


@pytest.fixture(scope="module")
def table():
    return rl.load(DATA)


@pytest.fixture(scope="module")
def frame(table):
    df, _, reason = rl.to_frame(table)
    return df, reason


@pytest.fixture(scope="module")
def pred(frame):
    df, _ = frame
    return simulate_rl(df)


def test_rows_are_recipes_with_nothing_measured(table):
    assert len(table) >= 30
    assert table[list(MEASURED)].isna().all().all(), "a recipe row states no measured time"
    assert table.url.str.match(r"https://github.com/(NVIDIA-NeMo/RL|volcengine/verl)/blob/v").all()
    assert table.notes.str.contains("@v0.7.0").all()
    # the kinds of run the held-out check names
    assert set(table.algorithm) == {"grpo", "dapo"}
    assert {"colocated", "split"} <= set(table.placement)
    assert table.policy_mode.eq("sync").any() and table.policy_mode.str.startswith("async").any()
    assert {"h100-sxm", "gb200"} <= set(table.gpu)
    assert table.precision.eq("fp8").any() and table.train_precision.eq("fp8").any()
    for m in ("Llama-3.1-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "DeepSeek-V3",
              "Qwen2.5-32B"):
        assert table.model.str.contains(m).any(), m
    assert {"megatron", "dtensor", "fsdp2"} <= set(table.train_backend)
    assert pd.to_numeric(table.kv_cache_bytes).eq(1).any()  # an FP8 KV cache (vLLM kv_cache_dtype fp8)


# verl example scripts the memory model still puts over 96 GB although verl says they ran on
# H20 96 GB ("tested in NNODES=1~4 * 96G H20 GPU"; "minimum nodes need for qwen3-235B-A22B"):
# Megatron without recompute, fp32 grads, 10-12k-token micro-batches; 110.9 / 101.7 GiB with
# verl's expandable segments (docs/rl.md "Known false OOMs": what is left is in the
# pre-training memory model). Pinned so that a fix shows here; every other recipe must fit.
KNOWN_FALSE_OOM = {"run_qwen3-235b_megatron_96gb", "run_qwen3moe-30b_megatron_96gb"}


def test_every_recipe_prices_and_fits(table, frame, pred):
    _, reason = frame
    assert (reason == "").all(), list(reason[reason != ""])
    bad = pred[~pred.valid]
    assert bad.empty, bad.invalid_reason.tolist()
    assert np.isfinite(pred.step_time_s).all() and (pred.step_time_s > 0).all()
    names = table.url.str.extract(r"([^/]+)\.(?:yaml|sh)$")[0]
    oom = set(names[~pred.fits.to_numpy()])
    assert oom == KNOWN_FALSE_OOM, sorted(oom)
    assert pred.oom_reason[~pred.fits].str.startswith("training: peak").all()


def test_sync_step_is_the_sum_of_its_phases(frame, pred):
    df, _ = frame
    s = df.asynchrony.eq("sync").to_numpy()
    parts = (pred.gen_time_s + pred.log_prob_time_s + pred.update_time_s
             + pred.weight_sync_time_s + pred.offload_time_s + pred.step_fixed_time_s)
    assert np.allclose(pred.step_time_s[s], parts[s], rtol=1e-9)


def test_async_overlaps_what_sync_serialises(frame, pred):
    """The same recipe run synchronously (asynchrony the only change) is slower, and the
    asynchronous step is still at least its slower side plus the refit."""
    df, _ = frame
    a = df.asynchrony.eq("async").to_numpy()
    assert a.sum() >= 10
    sync = simulate_rl(df[a].assign(asynchrony="sync"))
    assert (pred.step_time_s[a].to_numpy() < sync.step_time_s.to_numpy()).all()
    floor = np.maximum(pred.gen_time_s[a], pred.log_prob_time_s[a] + pred.update_time_s[a]
                       + pred.phase_cleanup_time_s[a] + pred.verl_driver_time_s[a]) \
        + pred.weight_sync_time_s[a]
    assert np.allclose(pred.step_time_s[a], floor, rtol=1e-9)


def test_gb200_recipes_price_one_nvlink_domain(frame):
    """A GB200 rack is one 72-GPU NVLink domain (catalogs/clusters.yaml gb200-nvl72); HGX
    nodes hold 8; a stated gpus_per_node wins."""
    df, _ = frame
    b = inputs.to_batch(df)
    gpu = df.gpu.to_numpy()
    assert (b.gpus_per_node[gpu == "gb200"] == 72).all()
    assert (b.gpus_per_node[gpu == "h100-sxm"] == 8).all()
    one = df[df.gpu.eq("gb200")].head(1).assign(gpus_per_node=4)
    assert inputs.to_batch(one).gpus_per_node[0] == 4


def _row(df, name_part, table):
    i = np.flatnonzero(table.url.str.contains(name_part, regex=False).to_numpy())
    assert len(i) == 1, name_part
    return df.iloc[[i[0]]].reset_index(drop=True)


def test_fp8_rollout_and_training_are_cheaper(frame, table):
    df, _ = frame
    fp8 = _row(df, "grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off", table)
    assert fp8.rollout_precision[0] == "fp8" and fp8.train_precision[0] == "fp8"
    p8 = simulate_rl(fp8)
    p16 = simulate_rl(fp8.assign(rollout_precision="bf16", train_precision="bf16"))
    assert p8.decode_time_s[0] < p16.decode_time_s[0]     # half the weight bytes per step
    assert p8.update_time_s[0] < p16.update_time_s[0]     # FP8 GEMMs


def test_rollout_log_probs_skip_the_old_log_prob_pass(frame, table):
    df, _ = frame
    r = _row(df, "dapo_7b_math_fsdp2_8_8", table)
    assert bool(r.use_rollout_log_probs[0])
    assert simulate_rl(r).old_log_prob_time_s[0] == 0
    assert simulate_rl(r.assign(use_rollout_log_probs=False)).old_log_prob_time_s[0] > 0


def test_offloaded_params_take_their_grad_buffers_along(frame, table):
    """verl's 235B recipe (param, grad and optimizer offload, 96 GB GPUs) fits its rollout
    only because the gradient buffers leave with the parameters before generation."""
    df, _ = frame
    r = _row(df, "run_qwen3-235b_megatron_96gb", table)
    on = simulate_rl(r)
    off = simulate_rl(r.assign(offload_params=False))
    # (its training peak is the known false OOM above; the rollout side fits)
    assert not on.oom_reason[0].startswith("rollout")
    assert off.oom_reason[0].startswith("rollout")
    assert on.rollout_peak_gib[0] < off.rollout_peak_gib[0]


def test_nemo_rl_refit_broadcasts_over_every_gpu(frame, table):
    """NeMo RL's non-colocated refit is one broadcast over train + inference GPUs
    (grpo.py init_collective); verl's over the rollout GPUs + 1."""
    from sim_core.rl import weight_sync
    df, _ = frame
    r = _row(df, "grpo-deepseek-v3-64n8g-async-1off", table)
    b_nemo = inputs.to_batch(r)
    b_verl = inputs.to_batch(r.assign(rl_framework="verl"))
    args = (np.ones(1), np.full(1, 16.0), np.ones(1), np.full(1, 16.0))
    t_nemo = weight_sync.sync_time(b_nemo, *args)["sync_transfer_s"][0]
    t_verl = weight_sync.sync_time(b_verl, *args)["sync_transfer_s"][0]
    net = inputs.network(b_nemo)
    full = b_nemo.params * 2.0
    assert b_nemo.num_gpus[0] == 512 and b_nemo.rollout_gpus[0] == 256
    want_nemo = nccl.collective_time("broadcast", full, 512.0, 64.0, net)["time_s"][0]
    want_verl = nccl.collective_time("broadcast", full, 257.0, 33.0, net)["time_s"][0]
    assert t_nemo == pytest.approx(want_nemo) and t_verl == pytest.approx(want_verl)
    assert t_nemo != pytest.approx(t_verl)
    # bandwidth-bound either way: 1.34 TB of bf16 weights at tens to hundreds of GB/s
    assert 1.0 < t_nemo < 60.0


def test_broadcast_pipelines_its_loops():
    """A 1 GB ring broadcast stays bandwidth-bound on 512 ranks: the chain latency is paid once
    per call, not once per loop (NCCL broadcast.h; tuning.cc)."""
    net = {"sm_arch": np.array(90.0), "nvlink_bw_gbs": np.array(450.0), "nvls": np.array(True),
           "mesh_links": np.array(0.0), "nic_bw_gbs": np.array(50.0),
           "intra_latency_us": np.array(2.0), "inter_latency_us": np.array(5.0)}
    t16 = nccl.collective_time("broadcast", 1e9, 16, 2, net)["time_s"]
    t512 = nccl.collective_time("broadcast", 1e9, 512, 64, net)["time_s"]
    assert t512 < 2.0 * t16
    small = nccl.collective_time("broadcast", 1e4, 512, 64, net)["time_s"]
    assert small > nccl.collective_time("broadcast", 1e4, 16, 2, net)["time_s"]  # latency grows


def test_recipe_reader_merges_defaults_and_reads_placement():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "rl_recipes_build", Path(__file__).parent / "data" / "rl_recipes_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    base = {"policy": {"generation": {"colocated": {"enabled": True}}, "x": 1}}
    over = {"policy": {"generation": {"colocated": {"enabled": False,
                                                    "resources": {"num_nodes": 2}}}}}
    m = mod._merge(base, over)
    assert m["policy"]["x"] == 1 and m["policy"]["generation"]["colocated"] == {
        "enabled": False, "resources": {"num_nodes": 2}}
    assert mod._ref({"a": {"b": 7}}, "${a.b}") == 7 and mod._ref({}, "${mul:1, 2}") == "${mul:1, 2}"


def test_cli_prices_a_table_without_measured_steps(capsys):
    from sweep.cli.validate import run_rl

    class A:
        dataset = str(DATA)
    assert run_rl(A()) == 0
    out = capsys.readouterr().out
    assert "62 rows priced in all (60 fit in memory), 62 without a measured step" in out


def test_mtp_speculative_decoding_shortens_decode(frame, table):
    """NeMo RL's DeepSeek-V3 recipes draft one MTP token per step (vLLM deepseek_mtp, k 1):
    1 + a tokens per step at acceptance a (catalogs/rl.yaml spec.acceptance, vLLM PR 12755),
    each step verifying two tokens per sequence; never better than 1 + a."""
    from sim_core.rl import generation
    df, _ = frame
    r = _row(df, "grpo-deepseek-v3-32n8g.yaml", table)
    assert r.spec_tokens[0] == 1
    b = inputs.to_batch(r)
    a = inputs.constants()["spec"]["acceptance"]
    assert generation.tokens_per_step(b)[0] == pytest.approx(1 + a)
    on = simulate_rl(r).decode_time_s[0]
    off = simulate_rl(r.assign(spec_tokens=0)).decode_time_s[0]
    assert off / (1 + a) < on < off
    half = simulate_rl(r.assign(spec_acceptance=0.5)).decode_time_s[0]
    assert on < half < off * 1.0 + 1e-9


def test_fp8_kv_cache_doubles_the_cached_tokens(frame, table):
    df, _ = frame
    r = _row(df, "grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron", table)
    assert r.kv_cache_bytes[0] == 1
    fp8 = simulate_rl(r)
    bf16 = simulate_rl(r.assign(kv_cache_bytes=2))
    assert fp8.kv_tokens[0] == pytest.approx(2 * bf16.kv_tokens[0])
