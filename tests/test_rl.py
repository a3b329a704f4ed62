"""RL post-training (issue 40): generation physics, composition, run files, recipes, validation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import calibrate, generation, inputs
from sim_core.rl.phases import simulate_rl

BASE = dict(model="qwen3-32b", gpu="h100-sxm", num_gpus=64, rollout_tp=4,
            prompts_per_step=512, responses_per_prompt=16, prompt_len=1024, response_mean=3000,
            response_max=8192, gpu_memory_utilization=0.6, train_tp=8, train_pp=2,
            train_recompute="full", mini_batches=4)


def run(*rows):
    return simulate_rl(pd.DataFrame([{**BASE, **r} for r in rows]))


def test_length_law_has_the_given_mean():
    mean, mx = np.array([500.0, 3000.0, 7000.0]), np.array([8192.0] * 3)
    th, m1, m2 = generation.length_moments(mean, mx)
    np.testing.assert_allclose(m1, mean, rtol=1e-3)
    assert (m2 > m1 ** 2).all()  # a spread, not a point


def test_the_tail_sets_generation_time():
    r = run({}, {"response_max": 16384}, {"num_gpus": 128})
    # the same mean with a longer cap: a longer tail, a longer generation
    assert r.gen_time_s[1] > r.gen_time_s[0] * 1.2
    # twice the replicas: faster, but less than twice (the last batch decodes at small batch)
    assert r.gen_time_s[0] / 2 < r.gen_time_s[2] < r.gen_time_s[0]


def test_kv_cache_follows_gpu_memory_utilization_and_ooms():
    r = run({"gpu_memory_utilization": 0.4}, {"gpu_memory_utilization": 0.8},
            {"gpu_memory_utilization": 0.15, "rollout_tp": 1})
    assert r.kv_tokens[1] > 2 * r.kv_tokens[0]
    assert r.concurrency[1] > r.concurrency[0]
    assert not r.fits[2] and "rollout" in r.oom_reason[2]


def test_placement_composition():
    r = run({}, {"placement": "split", "rollout_gpus": 32, "asynchrony": "sync"},
            {"placement": "split", "rollout_gpus": 32, "asynchrony": "one_step_off"},
            {"asynchrony": "one_step_off"})
    serial = r.gen_time_s + r.log_prob_time_s + r.update_time_s + r.weight_sync_time_s
    np.testing.assert_allclose(r.step_time_s[:2],
                               (serial + r.offload_time_s + r.step_fixed_time_s)[:2], rtol=1e-9)
    assert r.offload_time_s[0] > 0 and r.offload_time_s[1] == 0
    # the training pipeline carries the phases' cleaning and verl's driver (verl_driver.py)
    over = np.maximum(r.gen_time_s[2], r.log_prob_time_s[2] + r.update_time_s[2]
                      + r.phase_cleanup_time_s[2] + r.verl_driver_time_s[2])
    assert r.step_time_s[2] == pytest.approx(over + r.weight_sync_time_s[2])
    assert r.step_time_s[2] < r.step_time_s[1]
    assert not r.valid[3] and "colocated" in r.invalid_reason[3]
    # split: the broadcast to the rollout GPUs costs more than colocated IPC
    assert r.weight_sync_time_s[1] > r.weight_sync_time_s[0]


def test_moe_decode_reads_fewer_weights_than_dense():
    b = inputs.to_batch(pd.DataFrame([{**BASE, "model": "qwen3-30b-a3b", "rollout_tp": 1}]))
    k = generation.decode_constants()
    small = generation.step_time(b, np.array([1.0]), np.array([1000.0]), k)
    big = generation.step_time(b, np.array([256.0]), np.array([1000.0]), k)
    assert big > small  # more experts touched, more cache read


def test_decode_constants_are_the_fit_of_the_published_table():
    bench = calibrate.load()
    assert bench.url.str.startswith("https://").all()
    eff, ovh = calibrate.fit(bench)
    k = inputs.constants()["decode"]
    assert k["hbm_efficiency"] == pytest.approx(eff, abs=1e-4)
    assert k["step_overhead_s"] == pytest.approx(ovh, abs=1e-6)


def test_recipe_keys_come_from_the_frameworks_definitions():
    from sweep.advice import rl as adv
    from sweep.errors import SweepError

    from sweep.config import load_run
    from sweep.engine.rl import evaluate

    cfg = load_run("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml")
    cfg.space = {"placement": ["colocated", "split"], "rollout_gpus": [32],
                 "asynchrony": ["sync", "one_step_off"]}
    df = evaluate(cfg)
    # a prediction that resolves an input replaces it (no duplicate columns in results.csv)
    assert df.columns.is_unique and df.train_seq_len.notna().all()
    df = df[df.valid].reset_index(drop=True)
    assert set(df.placement) == {"colocated", "split"}
    for _, row in df.iterrows():
        o = adv.verl_overrides(row)
        assert set(o) <= adv.known_keys("verl")
        assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
        n = adv.nemo_rl_config(row)
        assert n["policy"]["generation"]["vllm_cfg"]["tensor_parallel_size"] == 4
    assert "rollout.nnodes" in adv.verl_overrides(df[df.placement == "split"].iloc[0])
    with pytest.raises(SweepError, match="not in verl"):
        adv._check("verl", ["actor_rollout_ref.rollout.tp_size"])


def test_run_file_errors_are_one_line(tmp_path):
    from sweep.cli.main import main

    p = tmp_path / "rl.yaml"
    p.write_text("task: rl\nmodel: qwen3-32b\ncluster: {gpu: h100-sxm, num_gpus: 8}\n"
                 "prompts_per_step: 8\nprompt_len: 100\nresponse_len: {mean: 100, max: 200}\n"
                 "rollout: {tp: 2, gpu_memory_utilisation: 0.5}\n")
    assert main(["simulate", str(p)]) == 2
    p.write_text(p.read_text().replace("gpu_memory_utilisation", "gpu_memory_utilization"))
    assert main(["simulate", str(p), "--json"]) == 0


def test_bundled_space_runs_end_to_end(tmp_path, capsys):
    from sweep.cli.main import main

    assert main(["search", "search_spaces/rl-grpo-qwen3-32b-64xh100.yaml", "--out",
                 str(tmp_path)]) == 0
    ranked = pd.read_csv(tmp_path / "ranking.csv")
    assert ranked.fits.all() and ranked.step_time_s.is_monotonic_increasing
    assert set(ranked.placement) == {"colocated", "split"}
    assert (tmp_path / "recipe" / "verl.sh").exists()
    assert (tmp_path / "recipe" / "nemo_rl.yaml").exists()
    assert "recommendation" in capsys.readouterr().out


def test_validate_reads_the_published_rl_table():
    from sim_core.accuracy import rl

    t = rl.load()
    assert t.url.str.startswith("https://").all() and t.source.nunique() >= 3
    cmp = rl.compare(t)
    assert cmp.step_err.notna().sum() >= 12
    # a run that does not state its mean response length is predicted with the published
    # prior (data/rl/length_priors.csv), and says so
    # (rows on a GPU or of a checkpoint the catalog lacks are listed with that reason, not
    # priced: EasyR1's vision-language rows, rows batch 9)
    priced = (cmp.skipped == "").to_numpy()
    assert cmp.skipped[~priced].str.match(r"unknown (gpu|model)").all()
    no_mean = t.mean_seq_len.isna().to_numpy() & priced
    assert no_mean.any() and cmp.step_err[no_mean].notna().all()
    assert cmp.imputed[no_mean].str.contains("length_priors.csv").all()
    # other blanks are imputed and said so
    assert cmp.imputed[~no_mean].str.contains("prompt mean").any()
    s = rl.summary(cmp)
    assert s["skipped"] == (~priced).sum() and set(s["by_source"]) <= set(t.source)


def test_a_step_waits_for_the_slowest_replica():
    # the same per-replica load on 1 or 16 replicas: the longest of 16x more responses is
    # longer, so the synchronous step's generation is too (no truncated responses here: with
    # them both steps' longest response runs to the cap, tests/test_rl_physics.py)
    one = {"num_gpus": 4, "prompts_per_step": 8, "responses_per_prompt": 16, "train_tp": 4,
           "train_pp": 1, "response_mean": 800, "response_clip_ratio": 0.0}
    r = run(one, {**one, "num_gpus": 64, "prompts_per_step": 128})
    assert r.concurrency[0] == r.concurrency[1]
    assert r.gen_time_s[1] > r.gen_time_s[0] * 1.05


def test_enforce_eager_pays_a_launch_overhead_per_layer():
    r = run({}, {"enforce_eager": True})
    b = inputs.to_batch(pd.DataFrame([BASE, {**BASE, "enforce_eager": True}]))
    k = generation.decode_constants()
    t = generation.step_time(b, np.array([64.0, 64.0]), np.array([2000.0, 2000.0]), k)
    per_layer = inputs.constants()["vllm"]["eager_overhead_per_layer_s"]
    assert t[1] - t[0] == pytest.approx(b.layers[0] * per_layer)
    assert r.gen_time_s[1] > r.gen_time_s[0]


def test_cpu_optimizer_offload_frees_the_training_peak_and_costs_transfers():
    r = run({}, {"optimizer_cpu_offload": 1.0})
    assert r.train_peak_gib[1] < r.train_peak_gib[0] - 1
    # colocated: what stays on the GPU through generation no longer holds those states
    assert r.rollout_peak_gib[1] < r.rollout_peak_gib[0] - 1
    assert r.update_time_s[1] > r.update_time_s[0]


def test_context_parallel_pads_the_mean_sequence():
    # an odd mean length trains under CP (padded to a multiple of 2 x cp), not rejected
    r = run({"train_cp": 4, "train_tp": 4, "train_pp": 1, "prompt_len": 511, "response_mean": 750})
    assert r.valid[0] and r.update_time_s[0] > 0


def test_engine_wider_than_a_node_pays_the_network():
    b = inputs.to_batch(pd.DataFrame([{**BASE, "rollout_tp": 8}, {**BASE, "rollout_tp": 8,
                                                                   "gpus_per_node": 4}]))
    k = generation.decode_constants()
    t = generation.step_time(b, np.array([64.0, 64.0]), np.array([2000.0, 2000.0]), k)
    assert t[1] > t[0]  # the same engine across two nodes all-reduces over the NICs


def test_expert_parallel_rollout_spreads_the_experts():
    moe = {**BASE, "model": "qwen3-235b-a22b", "rollout_tp": 4, "train_tp": 4, "train_pp": 4,
           "train_ep": 4, "train_etp": 1}
    b = inputs.to_batch(pd.DataFrame([moe, {**moe, "rollout_ep": 16}]))
    w = generation.weights_per_gpu(b)
    assert w[1] < w[0] / 2
    r = run(moe, {**moe, "rollout_ep": 16}, {**moe, "rollout_ep": 3})
    assert r.kv_cache_gib[1] > r.kv_cache_gib[0]
    assert not r.valid[2] and "rollout_ep" in r.invalid_reason[2]


def test_python_api_and_check(tmp_path, capsys):
    import json

    import sweep
    from sweep.cli.main import main

    one = sweep.simulate("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml")
    assert len(one) == 1 and one.step_time_s.iloc[0] > one.gen_time_s.iloc[0]
    assert main(["check", "search_spaces/rl-grpo-qwen3-32b-64xh100.yaml"]) == 0
    assert "configurations:" in capsys.readouterr().out
    trace = tmp_path / "step.json"
    assert main(["simulate", "search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml",
                 "--trace", str(trace)]) == 0
    ev = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    # colocated sync: the phases follow each other on one track and add up to the step
    end = max(e["ts"] + e["dur"] for e in ev) / 1e6
    assert end == pytest.approx(one.step_time_s.iloc[0], rel=1e-6)
    assert [e["name"] for e in ev][:4] == ["reload (wake)", "sleep / wake, cleanup (fixed)",
                                           "prefill", "decode"]
    assert "trainer cleanup (fixed)" in [e["name"] for e in ev]


def test_rl_errors_are_one_line(tmp_path, capsys):
    from sweep.cli.main import main

    bad = tmp_path / "runs.csv"
    bad.write_text("model,gpu\nqwen3-32b,h100-sxm\n")
    assert main(["validate", "--rl", str(bad)]) == 2
    space = tmp_path / "s.yaml"
    space.write_text("task: rl\nmodel: qwen3-32b\ncluster: {gpu: h100-sxm, num_gpus: 8}\n"
                     "prompts_per_step: 8\nprompt_len: 100\nresponse_len: {mean: 100, max: 200}\n"
                     "space: {rollout_tpp: [1, 2]}\n")
    assert main(["search", str(space)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "rollout_tpp" in err[1] and "allowed" in err[1]


def test_decode_step_out_of_sample_on_other_engines():
    chk = calibrate.tpot_check()
    assert set(chk.engine) == {"sglang", "vllm"} and chk.url.str.startswith("https://").all()
    # a decode step on other engines, GPUs and precision than the fit's, within its spread
    assert np.median(np.abs(chk.err)) < 0.25
    # more running requests, a longer step (more cache, more FLOPs)
    one = chk[(chk.model == "llama3.1-70b") & (chk.engine == "sglang")].sort_values("batch")
    assert one.pred_tpot_ms.is_monotonic_increasing


def test_decode_leave_one_source_out():
    lo = calibrate.leave_one_source_out()
    assert lo["trt_from_tpot"] < 0.3 and lo["tpot_from_trt"] < 0.3
    assert lo["trt_fit"] == calibrate.fit(calibrate.load())


def test_run_file_sets_eager_and_cpu_optimizer_and_the_recipes_carry_them(tmp_path):
    import yaml

    import sweep
    from sweep.advice.rl import nemo_rl_config, verl_overrides

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    one = sweep.simulate("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml")
    src["rollout"]["enforce_eager"] = True
    src["train"]["optimizer_cpu_offload"] = 1.0
    f = tmp_path / "eager.yaml"
    f.write_text(yaml.safe_dump(src))
    two = sweep.simulate(str(f))
    assert two.gen_time_s.iloc[0] > one.gen_time_s.iloc[0]
    assert two.train_peak_gib.iloc[0] < one.train_peak_gib.iloc[0]
    row = two.iloc[0]
    assert verl_overrides(row)["actor_rollout_ref.rollout.enforce_eager"] is True
    opt = nemo_rl_config(row)["policy"]["megatron_cfg"]["optimizer"]
    assert opt["optimizer_cpu_offload"] is True and opt["optimizer_offload_fraction"] == 1.0



def test_refit_broadcasts_the_full_model_over_pipeline_stages():
    """NeMo RL v0.3.0 gather_params: every tensor is broadcast over the PP group, so with
    stages on different nodes each GPU receives the whole bf16 model through its NIC."""
    from sim_core.rl import weight_sync
    rows = pd.DataFrame([{**BASE, "model": "llama3.1-70b", "num_gpus": n,
                          "rl_framework": fw} for fw in ("nemo_rl", "verl") for n in (8, 64)])
    b = inputs.to_batch(rows)
    one = np.ones(4)
    ws = weight_sync.sync_time(b, 4 * one, 2 * one, one, one, b.num_gpus)
    nic = b.nic_bw_gbs * b.nics_per_node / b.gpus_per_node * 1e9
    # 64 GPUs: the two stages are 32 ranks apart, on different nodes
    assert ws["sync_gather_s"][1] >= b.params[1] * 2.0 / nic[1]
    # 8 GPUs: both stages in one node, over NVLink: much faster
    assert ws["sync_gather_s"][0] < ws["sync_gather_s"][1] / 3
    # verl's per_tensor_generator broadcasts the TP shard over PP: a quarter of the bytes at TP 4
    assert ws["sync_pp_bcast_bytes"][3] == pytest.approx(ws["sync_pp_bcast_bytes"][1] / 4)
    assert ws["sync_gather_s"][3] - ws["sync_verl_key_host_s"][3] < ws["sync_gather_s"][1] / 2


def test_offloaded_optimizer_moves_through_pageable_memory():
    r = run({"offload_optimizer": False}, {"offload_optimizer": True})
    b = inputs.to_batch(pd.DataFrame([BASE]))
    from sim_core.rl import training
    slow = inputs.constants()["pageable_slowdown"]
    tr = training.passes(pd.DataFrame([BASE]), b)
    extra = 2 * tr["train_optimizer_gib"][0] * 2.0 ** 30 * slow / training.pcie_bytes_per_s(b)[0]
    assert r.offload_time_s[1] - r.offload_time_s[0] == pytest.approx(extra, rel=1e-6)
    assert slow > 1


def test_validate_compares_each_stated_phase_with_its_prediction():
    """The per-phase view: a NeMo RL row's lumped 'Get logprobs' is compared with all the
    log-prob passes, a PPO row (critic) is left out of log-probs and update, and generation
    is compared on synchronous rows only."""
    from sim_core.accuracy import rl

    t = rl.load()
    nemo = t.index[t.source.eq("NeMo RL v0.3 blog")][0]
    ppo = t.index[t.algorithm.str.lower().eq("ppo")][0]
    asyn = t.index[t.policy_mode.ne("sync")][0]
    sub = t.loc[[nemo, ppo, asyn]].reset_index(drop=True)
    cmp = rl.compare(sub)
    df, _, _ = rl.to_frame(sub)
    p = simulate_rl(df)
    assert cmp.pred_log_prob_time_s[0] == pytest.approx(p.log_prob_time_s[0])
    assert p.ref_time_s[0] > 0 and p.log_prob_time_s[0] > p.old_log_prob_time_s[0]
    assert cmp.meas_log_prob_time_s[0] == float(sub.old_log_prob_time_s[0])
    assert np.isnan(cmp.meas_update_time_s[1]) and np.isnan(cmp.meas_log_prob_time_s[1])
    assert np.isnan(cmp.meas_gen_time_s[2])
    ph = rl.phase_summary(cmp)
    assert ph["update"]["rows"] == 1 + int(pd.notna(sub.update_actor_time_s[2]))
    gen = [p.gen_time_s[i] / float(sub.gen_time_s[i]) for i in (0, 1)]
    assert ph["generation"]["rows"] == 2
    assert ph["generation"]["median_ratio"] == pytest.approx(np.median(gen))


def test_a_run_file_states_the_frameworks_release(tmp_path):
    """`train.rl_framework_version` reaches the frame: NeMo RL 0.3 prices its colocated
    refit through the controller, the current release (none stated) streams it."""
    import yaml

    import sweep

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    out = {}
    for ver in (None, 0.3):
        d = dict(src)
        d["train"] = {**src.get("train", {}), "rl_framework": "nemo_rl"}
        if ver is not None:
            d["train"]["rl_framework_version"] = ver
        p = tmp_path / f"rl-{ver}.yaml"
        p.write_text(yaml.safe_dump(d))
        out[ver] = sweep.simulate(str(p))
    assert out[0.3].refit_host_time_s.iloc[0] > out[None].refit_host_time_s.iloc[0]
    assert out[None].refit_handles.iloc[0] == out[None].refit_groups.iloc[0]


def test_a_nemo_rl_run_file_offloads_around_the_refit_unless_it_says_not(tmp_path):
    """NeMo RL's colocated refit offloads the trainer's states in code: a run file naming
    nemo_rl without offload keys gets both offloads, verl's gets none, a stated value wins."""
    import yaml

    from sweep.config import load_run

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    got = {}
    for name, train in (("nemo", {"rl_framework": "nemo_rl"}), ("verl", {}),
                        ("stated", {"rl_framework": "nemo_rl", "offload_params": False})):
        d = {**src, "train": {**src.get("train", {}), **train}}
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(d))
        got[name] = load_run(str(p)).frame()
    assert got["nemo"].offload_params.all() and got["nemo"].offload_optimizer.all()
    assert not got["verl"].offload_params.any() and not got["verl"].offload_optimizer.any()
    assert not got["stated"].offload_params.any() and got["stated"].offload_optimizer.all()
