"""Tolerant reading of published RL run tables (sim_core/accuracy/rl_table.py) and the
length priors behind `sweep validate --rl`, on real excerpts (tests/data/rl_tables)."""

import math

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl, rl_table

EXCERPTS = "tests/data/rl_tables/published_excerpts.csv"


@pytest.mark.parametrize("cell,kind,value", [
    ("8k", "length", 8192), ("16K", "length", 16384), ("1.2e3", "count", 1200),
    ("~1960", "length", 1960), ("20,480", "length", 20480), ("$((1024 * 2))", "length", 2048),
    ("1204*8", "length", 9632), ("16 nodes x 8", "count", 128), ("3 × 8", "count", 24),
    ("60%", "fraction", 0.6), ("0.6", "fraction", 0.6), ("60", "fraction", 0.6),
    ("445 s", "time", 445), ("~290s", "time", 290), ("~9 min", "time", 540),
    ("19h18m", "time", 69480), ("3–4 min", "time", 210), ("0.3 ms", "time", 0.0003),
    # markdown emphasis as AReaL v0.1's tutorial log and hand-written tables carry it
    ("*2124.429*s", "time", 2124.429), ("**445 s**", "time", 445),
    (512, "count", 512)])
def test_numbers_as_published(cell, kind, value):
    v, why = rl_table.parse_number(cell, kind)
    assert v == pytest.approx(value) and why == ""


@pytest.mark.parametrize("cell", ["-", "", "n/a", None, float("nan")])
def test_blank_cells_are_blank(cell):
    v, why = rl_table.parse_number(cell, "time")
    assert math.isnan(v) and why == ""


def test_a_share_outside_0_1_and_percent_is_unreadable():
    assert rl_table.parse_number("1.7", "fraction")[0] != rl_table.parse_number("1.7", "fraction")[0]
    assert "not a fraction" in rl_table.parse_number(1.7, "fraction")[1]
    assert rl_table.parse_number(85, "fraction")[0] == pytest.approx(0.85)


def test_unreadable_gpu_count_is_the_reason_given():
    t = pd.DataFrame([{"model": "llama3.1-8b", "gpu": "h100", "num_gpus": "eight",
                       "step_time_s": 100}])
    cmp = rl.compare(t)
    assert "num_gpus: unreadable 'eight'" in cmp.skipped[0]
    assert cmp.source[0] == "(no source)"


def test_unreadable_cell_is_blank_with_a_reason():
    v, why = rl_table.parse_number("fast", "time")
    assert math.isnan(v) and "unreadable" in why
    v, why = rl_table.parse_number("12 parsecs", "length")
    assert math.isnan(v) and "unit" in why


@pytest.mark.parametrize("cell,placement", [
    ("hybrid", "colocated"), ("colocate", "colocated"), ("Co-located", "colocated"),
    ("hybrid_engine", "colocated"), ("standalone", "split"), ("Disaggregated", "split"),
    ("split", "split"), ("non-colocated", "split"), ("one-step-overlap async", "split")])
def test_placements_as_the_frameworks_spell_them(cell, placement):
    assert rl_table.parse_placement(cell)[0] == placement


@pytest.mark.parametrize("cell,mode,staleness", [
    ("sync", "sync", None), ("on-policy", "sync", None), ("colocate sync", "sync", None),
    ("one_step_off", "one_step_off", None), ("one-step-overlap async", "one_step_off", None),
    ("async (staleness 2)", "async", 2), ("async-4", "async", 4),
    ("fully_async", "async", None), ("Fully Async", "async", None)])
def test_policy_modes(cell, mode, staleness):
    m, st, note = rl_table.parse_policy_mode(cell)
    assert m == mode
    if staleness is None:
        assert math.isnan(st)
        assert (mode != "async") or "staleness not stated" in note
    else:
        assert st == staleness


def test_model_and_gpu_spellings():
    assert rl_table.resolve_model("Qwen/Qwen3-30B-A3B")[0] == "qwen3-30b-a3b"
    assert rl_table.resolve_model("Llama-3.1-8B-Instruct")[0] == "llama3.1-8b"
    m, note = rl_table.resolve_model("Qwen2.5-Math-7B")
    assert m == "qwen2.5-7b" and "same architecture" in note
    m, why = rl_table.resolve_model("Qwen3.5-9B")
    assert m is None and "unknown model" in why
    assert rl_table.resolve_gpu("NVIDIA H100 80GB HBM3")[0] == "h100-sxm"
    assert rl_table.resolve_gpu("8*H800")[0] == "h800"
    g, why = rl_table.resolve_gpu("GH200")
    assert g is None and "unknown gpu" in why


def test_published_excerpts_are_read_without_help():
    t = rl.load(EXCERPTS)
    cmp = rl.compare(t)
    assert len(cmp) == len(t) == 11
    # a row the catalog cannot price is listed with a one-line reason, not predicted
    reasons = cmp.skipped.tolist()
    assert "unknown model" in reasons[4] and "unknown model" in reasons[5]
    assert reasons[6] != "" and all("\n" not in r for r in reasons)
    assert cmp.pred_step_s[[4, 5, 6]].isna().all()
    # every other row is predicted, whatever its spellings
    ok = [0, 1, 2, 3, 7]
    assert np.isfinite(cmp.pred_step_s[ok]).all() and (cmp.skipped[ok] == "").all()
    assert cmp.step_time_s[4] == pytest.approx(540)               # "~9 min"
    assert cmp.num_gpus[3] == 128 and cmp.num_gpus[1] == 16       # "16 nodes x 8"; 4 + 12
    assert cmp.placement[1] == "split" and cmp.policy_mode[1] == "one_step_off"
    assert cmp.policy_mode[7] == "async"
    # blanks are imputed and said so: the mean response from the published priors
    assert "length_priors.csv" in cmp.imputed[0] and "response mean" in cmp.imputed[0]
    assert "response mean" not in cmp.imputed[2]                  # dpsk.md states 1960
    # the Miles ROCm blog: "AMD Instinct MI300X" is the catalog's mi300x, "388.50s" a time
    assert cmp.skipped[8] == "" and cmp.step_time_s[8] == pytest.approx(388.5)
    assert cmp.gpu[8] == "AMD Instinct MI300X" and np.isfinite(cmp.pred_step_s[8])
    assert "qwen3-30b-a3b" in cmp.imputed[8]
    # NeMo RL issue 959 does not name its GPU: listed with the reason, not predicted
    assert cmp.skipped[9] == "gpu: not stated" and np.isnan(cmp.pred_step_s[9])
    assert cmp.num_gpus[9] == 64                                   # "8 nodes x 8"
    # AReaL v0.1's tutorial: its allocation_mode in the placement cell, "*2124.429*s"
    assert cmp.placement[10] == "split" and cmp.num_gpus[10] == 128
    assert cmp.step_time_s[10] == pytest.approx(2124.429) and cmp.skipped[10] == ""
    assert "allocation_mode 'vllm.d16p1m4+d32p2m1' read as split" in cmp.imputed[10]
    df, _, _ = rl.to_frame(t)
    assert df.rollout_gpus[10] == 64 and df.rollout_tp[10] == 4 and df.train_pp[10] == 2
    assert df.max_num_seqs[10] == 128 and (df.max_num_seqs[:10] == 0).all()


def test_no_published_row_is_skipped_for_a_blank_length():
    t = rl.load()
    cmp = rl.compare(t)
    # every row is priced: the vime issue 358 rows' "Ascend A3" is now a catalog part (one 910C
    # die, gpus.yaml ascend-a3), so no row is left out; but for the vision-language checkpoints
    # of EasyR1's performance table (rows batch 9), which the catalog does not read: those are
    # left out for their model, never for a blank length
    skipped = (cmp.skipped != "").to_numpy()
    vl = t.model.str.contains("-VL-").to_numpy()
    assert (skipped == vl).all() and vl.sum() == 8
    assert cmp.skipped[skipped].str.startswith("unknown model 'Qwen/Qwen").all()
    assert cmp.pred_step_s[~skipped].notna().all()
    vime = (cmp.source == "vime issue 358").to_numpy()
    assert vime.sum() == 4 and (cmp.gpu[vime] == "Ascend A3").all()
    no_mean = t.mean_seq_len.isna().to_numpy()
    assert (no_mean & ~skipped).sum() >= 4
    assert cmp.imputed[no_mean & ~skipped].str.contains("response mean=").all()
    # a source that measured both placements is ranked
    s = rl.summary(cmp)
    assert s["rows"] == len(t) - 8 and s["skipped"] == 8
    assert any(r["source"] == "verl one_step_off.md" for r in s["ranking"])


def test_length_priors_come_from_other_runs_than_the_validation_table():
    pri = pd.read_csv("sim_core/data/rl/length_priors.csv")
    runs = rl.load()
    assert pri.url.str.startswith("https://").all()
    assert not set(pri.url) & set(runs.url)
    f = rl.length_priors()
    assert 0.1 < f["fraction"] < 0.9 and 10 < f["prompt_mean"] < 1000
    # the imputed mean is that fraction of the row's cap, and moves with it
    t = pd.DataFrame([{"model": "qwen2.5-7b", "gpu": "h100", "num_gpus": 8, "step_time_s": 100,
                       "max_response_or_total_len": cap} for cap in ("4k", "8k")])
    df, imputed, reason = rl.to_frame(t)
    assert (reason == "").all()
    assert df.response_mean.tolist() == pytest.approx([f["fraction"] * 4096,
                                                       f["fraction"] * 8192])


def test_length_prior_rows_are_consistent_with_their_caps_and_clip_ratios():
    # every published mean is within its cap; where the source logs the share of responses at
    # the cap, a share of 1 means every response is the cap long, and a share c below 1 bounds
    # the mean from below by c x cap (the clipped ones alone) -- a row breaking either was
    # misread; the prior is the median mean/cap over all rows, each with its own URL
    pri = pd.read_csv("sim_core/data/rl/length_priors.csv")
    assert (pri.mean_response_len > 0).all()
    assert (pri.mean_response_len <= pri.max_response_len).all()
    c = pri.clip_ratio.dropna()
    assert len(c) >= 5 and c.between(0, 1).all()
    full = pri[pri.clip_ratio == 1]
    assert len(full) >= 2 and (full.mean_response_len == full.max_response_len).all()
    part = pri[pri.clip_ratio.notna() & (pri.clip_ratio < 1)]
    assert (part.mean_response_len >= part.clip_ratio * part.max_response_len).all()
    f = rl.length_priors()
    assert f["rows"] == len(pri) >= 15
    assert f["fraction"] == pytest.approx(
        float((pri.mean_response_len / pri.max_response_len).median()))
    assert pri.url.is_unique or pri.groupby("url").size().max() <= 2
    # caps from 80 to 30k tokens
    assert pri.max_response_len.min() < 256 and pri.max_response_len.max() >= 16384


def test_validate_cli_lists_unpredicted_rows(capsys):
    from sweep.cli.main import main

    assert main(["validate", "--rl", EXCERPTS]) == 0
    out = capsys.readouterr().out
    assert "unknown model 'Qwen3.5-9B'" in out and "7 rows predicted" in out
    assert "gpu: not stated" in out   # NeMo RL issue 959 names no GPU


def test_a_checkpoint_with_a_published_length_uses_it_under_a_comparable_cap():
    # Qwen2.5-Math-7B on DAPO-Math: "average_responses 1k" at a 16k cap (verl-recipe
    # async_flow); a 64k-cap row is over twice that budget -> the cap fraction instead
    pri = rl.length_priors()
    t = pd.DataFrame([{"model": "Qwen/Qwen2.5-Math-7B", "gpu": "h20", "num_gpus": 16,
                       "step_time_s": 700, "max_response_or_total_len": cap}
                      for cap in ("20k", "8k", "64k")])
    df, imputed, _ = rl.to_frame(t)
    # a 1k mean far below the 16k cap says the same of a 20k or an 8k cap
    assert df.response_mean.tolist()[:2] == pytest.approx([1000, 1000], abs=1)
    assert df.response_mean[2] == pytest.approx(pri["fraction"] * 65536)
    assert "published for qwen2.5-math-7b" in imputed[0] and "cap" in imputed[2]


def test_a_published_mean_is_carried_to_the_rows_cap_under_the_length_law():
    # DeepScaleR's 8K stage: mean 4,500 at an 8,192 cap. At a 16k cap the responses the 8k
    # cap cut run on (longer mean); at the published cap the figure is taken as published
    from sim_core.rl import generation

    t = pd.DataFrame([{"model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "gpu": "h100",
                       "num_gpus": 8, "step_time_s": 100, "max_response_or_total_len": cap}
                      for cap in ("8192", "16384", "12288")])
    df, imputed, _ = rl.to_frame(t)
    th = generation.length_scale(4500.0, 8192.0)
    assert th > 4500  # a clipped law's scale exceeds its clipped mean
    assert df.response_mean[0] == pytest.approx(4500)
    assert df.response_mean[1] == pytest.approx(th * (1 - np.exp(-16384 / th)))
    assert 4500 < df.response_mean[2] < df.response_mean[1] < 2 * 4500
    assert "carried" not in imputed[0] and "carried to the 16384 cap" in imputed[1]


def test_a_stated_share_at_the_cap_fixes_the_mean_under_the_length_law():
    from sim_core.rl import generation

    t = pd.DataFrame([{"model": "qwen3-32b", "gpu": "h100", "num_gpus": 64, "step_time_s": 1,
                       "max_response_or_total_len": "8k", "response_clip_ratio": c}
                      for c in ("55%", "0.05")])
    df, imputed, _ = rl.to_frame(t)
    # the RL model's own law, fed back the imputed mean, puts that share at the cap
    th = generation.length_scale(df.response_mean.to_numpy(), np.full(2, 8192.0))
    assert np.exp(-8192.0 / th) == pytest.approx([0.55, 0.05], rel=1e-3)
    assert df.response_mean[0] > df.response_mean[1]
    assert "at the 8192 cap" in imputed[0]


VERL_LOGS = "tests/data/rl_tables/verl_console_excerpts.csv"


def test_verl_runs_as_their_scripts_and_logs_spell_them():
    """dingxianzhong/play-verl: `adv_estimator=gae` is PPO, Qwen2-7B-Instruct has Qwen2.5-7B's
    shape, a stated `use_ref` False (no KL term) drops the reference pass, `8×H100`."""
    t = pd.read_csv(VERL_LOGS, dtype=str)
    norm, notes, reason = rl_table.normalize(t)
    assert reason == ["", "", ""]
    assert norm.algorithm.tolist() == ["ppo", "grpo", "ppo"]
    assert norm.model.tolist() == ["qwen2.5-7b", "qwen2.5-0.5b", "qwen2.5-0.5b"]
    assert norm.gpu.tolist() == ["h100-sxm"] * 3 and norm.num_gpus.tolist() == [8] * 3
    assert "same architecture" in "; ".join(notes[0])
    df, _, _ = rl.to_frame(t)
    assert df.use_ref.tolist() == [True, True, False]
    # the stated reference pass is priced; the row without one has none
    cmp = rl.compare(t)
    assert np.isfinite(cmp.pred_step_s).all()
    from sim_core.rl.phases import simulate_rl
    p = simulate_rl(df)
    assert p.ref_time_s[0] > 0 and p.ref_time_s[1] > 0 and p.ref_time_s[2] == 0
    # the stated mean prompt is used, not the published prior
    assert df.prompt_len.tolist() == pytest.approx([93.63, 103.63, 103.62])
    assert not cmp.imputed.str.contains("prompt mean=").any()


def test_sync_vs_async_pairs_are_found_on_the_published_rows():
    """rl.mode_ranking pairs a synchronous row with its asynchronous twin (same source, model,
    GPU count and batch), whatever the placements: vime issue 358 (split / split, two batch
    sizes), verl one_step_off.md (colocated / split) and the AReaL paper (split / split: its
    synchronous runs are the same system at staleness 0, with the same 3/4 inference split)."""
    cmp = rl.compare(rl.load())
    pairs = {(r["source"], r["model"], r["batch"]): r for r in rl.mode_ranking(cmp)}
    vime = pairs[("vime issue 358", "Qwen/Qwen3-4B", "32x1024")]
    assert vime["measured_speedup"] == pytest.approx(31.5 / 20.8)
    assert pairs[("vime issue 358", "Qwen/Qwen3-4B", "256x2048")]["measured_speedup"] == \
        pytest.approx(178.3 / 104.0)
    assert vime["placement"] == "split / split" and vime["mode"] == "async"
    areal = [r for (src, _, _), r in pairs.items() if src == "AReaL paper (arXiv 2505.24298)"]
    # Table 1's four sizes; the 14B / 32B groups also hold verl's colocated sync row: the twin
    # is Sync.AReaL, on the asynchronous run's split (48.8 / 21.9 h and 51.1 / 31.1 h)
    assert len(areal) == 4 and all(r["placement"] == "split / split" for r in areal)
    assert sorted(round(r["measured_speedup"], 2) for r in areal) == [1.64, 2.23, 2.27, 2.77]
    # a pair is two rows of one batch: the one-step-off rows of another batch (8k cap) pair too
    assert any(k[0] == "verl one_step_off.md" and k[2] == "6144x20480" for k in pairs)
    assert all(r["predicted_speedup"] > 0 for r in pairs.values())


def test_ascend_a3_is_one_die():
    """The vime rows' 'Ascend A3' is the catalog's ascend-a3: one 910C die (64 GB HBM, 16
    devices to an A3 node), priced with the stand-ins its catalog entry names."""
    from sim_core import catalog
    g = catalog.get_gpu("Ascend A3")
    assert g.name == "ascend-a3" and g.vendor == "huawei"
    # BF16 matmul 353.9 T per die (Ascend/msmodeling's A3 die), below the FP16 752 / 2
    assert 60 < g.hbm_gib < 64 and g.peak_tflops["bf16"] == pytest.approx(353.9)
    assert catalog.default_cluster_for_gpu("ascend-a3").gpus_per_node == 16
    assert catalog.get_gpu("Ascend910_9392").name == "ascend-a3"


def test_areal_rows_are_the_papers_training_steps():
    """AReaL paper (arXiv 2505.24298) Table 1: the v0.3 blog's training hours cover 250 PPO
    steps of 512 x 16 (the blog's '1000' are its 4 minibatch updates per step), with 3/4 of the
    GPUs generating; the 1.5B rows carry the mean derived from Fig. 5c, the 7B rows the prior."""
    t = rl.load()
    # the first reading's four rows (AReaL's own 1.5B / 7B math runs); the table's other
    # eight (verl, the 14B / 32B coding runs) are tests/test_rl_papers10.py's
    a = t[t.source == "AReaL paper (arXiv 2505.24298)"].iloc[:4]
    hours = {("1.5B", "sync"): 41.0, ("1.5B", "async"): 14.8,
             ("7B", "sync"): 57.7, ("7B", "async"): 25.4}
    assert len(a) == 4
    for _, r in a.iterrows():
        size = "1.5B" if "1.5B" in r.model else "7B"
        mode = "sync" if r.policy_mode == "sync" else "async"
        assert float(r.step_time_s) * 250 / 3600 == pytest.approx(hours[(size, mode)])
        assert int(r.rollout_gpus) == 3 * int(r.num_gpus) // 4
        assert (r.prompts_per_step, r.responses_per_prompt, r.train_gbs_seqs) == ("512", "16", "2048")
    df, imputed, _ = rl.to_frame(a)
    assert df.mini_batches.tolist() == [4, 4, 4, 4] and not df.use_ref.any()
    is15 = a.model.str.contains("1.5B").to_numpy()
    assert (df.response_mean[is15] == 9184).all()
    assert all("length_priors.csv" in s for s, b in zip(imputed, is15) if not b)


def test_deepscaler_rows_take_deepscalers_own_8k_mean():
    """rllm issue 29 re-runs DeepScaleR's 8k script: its mean response is the DeepScaleR
    post's 8K-stage figure (length_priors.csv), not the cap fraction; the vendored verl's
    enforce_eager default (True) is stated on the rows."""
    t = rl.load()
    r = t[t.source == "rllm issue 29 (DeepScaleR 8k)"]
    df, imputed, _ = rl.to_frame(r)
    assert df.response_mean.tolist() == [4500, 4500]
    assert all("DeepScaleR blog (8K stage)" in s for s in imputed)
    assert df.enforce_eager.astype(str).eq("True").all()


@pytest.mark.parametrize("cell,want", [
    ("vllm.d16p1m4+d32p2m1", dict(rollout_gpus=64, rollout_tp=4, rollout_pp=1, train_gpus=64,
                                  train_tp=1, train_pp=2, rollout_engine="vllm")),
    # either order, any order of d/p/m, the SGLang spelling (AReaL v0.3 sglang.d64p1m1+...)
    ("d8m2p1+sglang.d4m2p1", dict(rollout_gpus=8, rollout_tp=2, train_gpus=16, train_tp=2,
                                  train_pp=1, rollout_engine="sglang")),
])
def test_areal_allocation_mode(cell, want):
    a = rl_table.parse_allocation(cell)
    assert a["placement"] == "split"
    for k, v in want.items():
        assert a[k] == v, k


@pytest.mark.parametrize("cell", ["actor_gen:d4p1m2,*:d4p2m1", "d4p2m1", "vllm.d4p1+d8p2m1",
                                  "colocated", None])
def test_not_an_areal_split_allocation(cell):
    # the colocated (ReaLHF's own generation) and symmetric modes are not a split
    assert rl_table.parse_allocation(cell) is None


def test_batch5_rows_read_as_their_sources_write_them():
    """The rows of the fifth batch (docs/rl.md, 'More published rows (batch 5)') as their
    sources spell them: approximate seconds and minutes from maintainers' notes ('~252s',
    '~63 min'), a NeMo RL printout ('35.70s'), a GRPO relative (GSPO), a workstation GPU
    ('RTX PRO 6000'), and a run's days over its steps (maxrl: ~3 days / 1000 steps)."""
    t = rl.load()
    new = t[t.source.isin([
        "maxrl issue 2 (Qwen3-4B-Base, 32 H200)", "NeMo RL nightly test suites (H100)",
        "SkyRL GLM-4.7-Flash H200 notes (PR 1280 branch)",
        "nemo-rl-on-gke (Gemma 3 1B, 8 RTX PRO 6000)",
        "AI-Hypercomputer gpu-recipes (NeMo RL on A4)"])].reset_index(drop=True)
    assert len(new) == 8
    n, notes, reason = rl_table.normalize(new)
    assert all(r == "" for r in reason)
    by = {s: n[new.source == s] for s in new.source.unique()}
    sky = by["SkyRL GLM-4.7-Flash H200 notes (PR 1280 branch)"].iloc[0]
    assert (sky.step_time_s, sky.gen_time_s, sky.update_actor_time_s,
            sky.weight_sync_time_s) == (3780.0, 720.0, 2280.0, 10.0)
    nightly = by["NeMo RL nightly test suites (H100)"]
    assert sorted(nightly.step_time_s) == [12.0, 13.7, 18.5, 252.0]
    assert set(nightly.gpu) == {"h100-sxm"}
    gke = by["nemo-rl-on-gke (Gemma 3 1B, 8 RTX PRO 6000)"].iloc[0]
    # its printed 35.70 s step is step 10: NeMo RL v0.5.0 runs that step's validation (6.25 s
    # outside every printed timer) and checkpoint (6.49 s) inside total_step_time, so the row
    # holds the sum of the training timers (batch-5 audit); its prompt from the E2E tokens
    assert gke.gpu == "rtx-pro-6000" and gke.step_time_s == pytest.approx(35.70 - 6.49 - 6.25)
    assert float(new.prompt_len[new.source == gke.source].iloc[0]) == pytest.approx(
        8588.75 * 35.70 / 1024 - 201.2197, abs=0.1)
    assert by["AI-Hypercomputer gpu-recipes (NeMo RL on A4)"].iloc[0].gpu == "b200"
    maxrl = by["maxrl issue 2 (Qwen3-4B-Base, 32 H200)"].iloc[0]
    assert maxrl.step_time_s * 1000 / 86400 == pytest.approx(3.0)
    # vLLM 0.17.0 schedules asynchronously by default on NeMo RL's TP-1 `uni` executor: the
    # two nightly vLLM rows say so (batch-5 audit), the SGLang ones and the rest do not
    ahead = nightly[nightly.rollout_engine.eq("vllm")].rollout_async_scheduling
    assert len(ahead) == 2 and all(x is True for x in ahead)
    assert not any(x is True for x in n.rollout_async_scheduling[
        ~(new.source.eq("NeMo RL nightly test suites (H100)") & new.rollout_engine.eq("vllm"))])
    gspo = int(np.flatnonzero(new.algorithm.eq("gspo"))[0])
    assert n.algorithm[gspo] == "grpo" and any("priced as GRPO" in x for x in notes[gspo])
    # every one is priced (the catalog has their models and GPUs)
    cmp = rl.compare(new)
    assert cmp.pred_step_s.notna().all() and (cmp.skipped == "").all()


def test_a_blank_framework_is_read_from_the_rows_url_source_or_backend():
    """A NeMo RL run whose table leaves `rl_framework` blank is priced as NeMo RL when its URL,
    its source's name or its DTensor backend says so (the framework picks the code whose costs
    price the row), and the same as a row that states it; a row naming nothing is verl's, and
    every guess is said."""
    t = rl.load()
    nemo = t[(t.source == "NeMo RL v0.3 blog") & (t.train_backend == "megatron")].iloc[:1]
    stated = rl.compare(nemo)
    rows = pd.concat([nemo] * 4, ignore_index=True)
    rows["rl_framework"] = np.nan
    rows.loc[1, "url"] = "https://example.org/x"          # the source's name says NeMo RL
    rows.loc[2, ["url", "source"]] = ["https://example.org/x", "a blog"]
    rows.loc[2, "train_backend"] = "DTensor"               # only NeMo RL calls it that
    rows.loc[3, ["url", "source"]] = ["https://example.org/x", "a blog"]
    df, imputed, _ = rl.to_frame(rows)
    assert df.rl_framework.tolist() == ["nemo_rl", "nemo_rl", "nemo_rl", "verl"]
    assert "rl_framework=nemo_rl (read from its URL, nvidia-nemo.github.io)" in imputed[0]
    assert "rl_framework=nemo_rl (read from its source's name)" in imputed[1]
    assert "rl_framework=nemo_rl (read from its DTensor training backend)" in imputed[2]
    assert "rl_framework=verl (not stated; the default)" in imputed[3]
    got = rl.compare(rows.iloc[:1])
    assert got.pred_step_s.iloc[0] == pytest.approx(stated.pred_step_s.iloc[0], rel=1e-9)
    # read as verl, the same run is priced differently (verl's workers, no NeMo RL scales)
    assert rl.compare(rows.iloc[3:]).pred_step_s.iloc[0] != pytest.approx(
        stated.pred_step_s.iloc[0], rel=1e-3)


def test_blank_cells_of_a_nemo_rl_row_take_nemo_rls_values():
    """NeMo RL's blog Megatron row states NeMo RL's own values (offload around the refit,
    no activation checkpointing, bf16 gradient reduction, log-prob batch 4); with those cells
    blank the reader fills NeMo RL's, not verl's, and prices the row the same."""
    t = rl.load()
    row = t[(t.source == "NeMo RL v0.3 blog") & (t.train_backend == "megatron")].iloc[:1]
    cols = ["offload_params", "offload_optimizer", "train_recompute",
            "train_grad_reduce_fp32", "logprob_batch_size"]
    bare = row.drop(columns=cols).reset_index(drop=True)
    bare["algorithm"] = "dapo"          # NeMo RL still runs the reference pass without KL
    stated = row.copy()
    stated["algorithm"] = "dapo"
    stated["use_ref"] = True
    df, imputed, _ = rl.to_frame(bare)
    assert bool(df.offload_params[0]) and df.train_recompute[0] == "none"
    assert not bool(df.train_grad_reduce_fp32[0]) and df.logprob_batch_size[0] == 4
    assert bool(df.use_ref[0]) and "use_ref=True (NeMo RL's)" in imputed[0]
    assert rl.compare(bare).pred_step_s.iloc[0] == pytest.approx(
        rl.compare(stated).pred_step_s.iloc[0], rel=1e-9)
    # however the table spells the framework
    spelled, _, _ = rl.to_frame(bare.assign(rl_framework="NeMo RL"))
    assert bool(spelled.offload_params[0]) and spelled.train_recompute[0] == "none"
    assert spelled.rl_framework[0] == "nemo_rl"
    # the same blanks on a verl row keep verl's defaults
    verl = bare.assign(rl_framework="verl")
    dv, _, _ = rl.to_frame(verl)
    assert not bool(dv.offload_params[0]) and dv.train_recompute[0] == "full"
    assert not bool(dv.use_ref[0])


def test_a_published_length_belongs_to_its_release_not_its_architecture():
    """verl issue 3816 publishes Qwen3-4B-Instruct's mean length; Qwen3-4B (the hybrid
    thinking release) and Qwen3-4B-Base share its architecture but not its post-training, so
    they take the cap fraction, while the release itself takes its own figure."""
    from sim_core.accuracy import rl_table

    assert rl_table.release_name("Qwen/Qwen3-4B-Instruct-2507") == "qwen3-4b-instruct-2507"
    assert rl_table.release_name("Qwen/Qwen3-4B") == "qwen3-4b"
    assert rl_table.checkpoint_name("Qwen/Qwen3-4B-Instruct") == rl_table.checkpoint_name(
        "Qwen/Qwen3-4B")   # one architecture for the catalog
    pri = rl.length_priors()
    t = pd.DataFrame([{"model": m, "gpu": "h100", "num_gpus": 8, "step_time_s": 100,
                       "max_response_or_total_len": "20480"}
                      for m in ("Qwen/Qwen3-4B-Instruct", "Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base")])
    df, imputed, _ = rl.to_frame(t)
    assert "published for qwen3-4b-instruct" in imputed[0]
    assert df.response_mean[1] == pytest.approx(pri["fraction"] * 20480)
    assert df.response_mean[2] == pytest.approx(pri["fraction"] * 20480)
    assert df.response_mean[0] != pytest.approx(df.response_mean[1])
