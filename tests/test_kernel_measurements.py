"""The kernel tables measured on an H100 and an H200 (sim_core/data/kernels), the measuring
tool's GPU-free parts, and the compute model's Hopper curves against those measurements."""

import sys
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from sim_core import compute
from sim_core.accuracy import fit
from sim_core.calibration import kernels, measure
from sim_core.columns import Batch

DATA = resources.files("sim_core").joinpath("data/kernels")
TABLES = {"h100-sxm": DATA / "h100-sxm.csv", "h200": DATA / "h200.csv"}


@pytest.fixture(scope="module")
def measured():
    return fit.kernel_tables()


def test_measured_tables_load_as_kernel_tables():
    for gpu, path in TABLES.items():
        df = kernels.load_kernels(path)
        assert set(df["gpu"]) == {gpu}
        assert df["op_class"].value_counts().to_dict() == {"gemm": 1862, "attention": 336,
                                                           "elementwise": 10}
        failed = df[df["time_us"].isna()]
        # only FP8 shapes _scaled_mm refuses (a dimension not a multiple of 16) have no time
        assert len(failed) == 8 and (failed["dtype"] == "fp8").all()
        assert (((failed["n"] % 16) != 0) | ((failed["k"] % 16) != 0)).all()
        assert (df["time_us"].dropna() > 0).all()


def test_shipped_hopper_constants_are_the_fit_of_the_measured_kernels(measured):
    """efficiency.yaml's MEASURED values come from `python -m sim_core.accuracy.fit --kernels`: edit
    one by hand, or change the tables, and this fails."""
    params = fit.fit_kernel_curves(measured)
    hopper = compute.efficiency_table()[90]
    for dt in ("bf16", "fp8"):
        assert hopper["gemm_k_half"][dt] == pytest.approx(params[("gemm", dt, "")][1], rel=0.05)
    for fam in ("fa3", "fa2"):
        for d in ("fwd", "bwd"):
            emax, seq_half, tiles_half = params[("attention", fam, d)]
            assert hopper[f"attn_seq_half_{d}"][fam] == pytest.approx(seq_half, rel=0.05)
            assert hopper[f"attn_tiles_half_{d}"][fam] == pytest.approx(tiles_half, rel=0.05)
            if fam == "fa3":  # the FA2 level is fitted on runs (sim_core.accuracy.fit FITTED)
                assert hopper[f"attn_{d}"][fam] == pytest.approx(emax, rel=0.05)


def _attention_batch(rows: pd.DataFrame, tp: int, cp: int) -> Batch:
    """The configurations whose per-GPU attention is the measured call: heads x tp query heads
    split over tp, the sequence split over cp, `batch` sequences (1 where not stated)."""
    n = len(rows)
    mb = rows["batch"].fillna(1).to_numpy(float) if "batch" in rows else np.ones(n)
    return Batch(sm_arch=np.full(n, 90.0), micro_batch=mb,
                 heads=rows["heads"].to_numpy(float) * tp, tp=np.full(n, float(tp)),
                 seq_len=rows["seq"].to_numpy(float), cp=np.full(n, float(cp)),
                 attention_kernel=np.where(rows["kernel"] == "flash", 1, 0))


@pytest.mark.parametrize("direction,kernel,tolerance", [
    ("fwd", "cudnn", 0.05), ("fwd", "flash", 0.05), ("bwd", "flash", 0.08),
    ("bwd", "cudnn", 0.20)])  # cuDNN backward is timed as a difference of two timings
def test_compute_model_reproduces_measured_attention(measured, direction, kernel, tolerance):
    rows = measured[(measured["op_class"] == "attention") & (measured["kernel"] == kernel)
                    & (measured["direction"] == direction) & (measured["head_dim"] == 128)]
    assert (rows["batch"] > 1).sum() >= 15  # the short-sequence micro-batches of h100-sxm-edges
    b = _attention_batch(rows, tp=4, cp=1)
    eff = compute.attention_efficiency(b, direction)
    if kernel == "flash":  # the FA2 level is fitted on runs: compare the curve's shape
        eff = eff / np.median(eff / rows["eff"].to_numpy())
    err = np.abs(rows["eff"].to_numpy() / eff - 1)
    assert np.median(err) < tolerance
    # the occupancy term is what carries few heads at short sequences: without it the same
    # rows are predicted far worse
    few = ((rows["heads"] <= 8) & (rows["seq"] <= 4096) & (rows["batch"] == 1)).to_numpy()
    tiles_half = compute.efficiency_table()[90][f"attn_tiles_half_{direction}"]
    fam = "fa2" if kernel == "flash" else "fa3"
    no_occupancy = eff * (1 + tiles_half[fam] / (rows["heads"].to_numpy() * np.ceil(
        rows["seq"].to_numpy() / compute.ATTN_TILE)))
    err_without = np.abs(rows["eff"].to_numpy() / no_occupancy - 1)
    assert np.median(err_without[few]) > 2 * np.median(err[few])


@pytest.mark.parametrize("kernel,tolerance", [("cudnn", 0.10), ("flash", 0.06)])
def test_short_sequences_in_a_micro_batch_follow_the_curve(measured, kernel, tolerance):
    """512-16k-token sequences packed 16k tokens to the micro-batch (what FSDP frameworks run
    for small models), head dims 64 and 128: the seq_half x occupancy x head-dim curve, at
    the kernel's own level, within a few percent forward and backward."""
    rows = measured[(measured["op_class"] == "attention") & (measured["kernel"] == kernel)
                    & (measured["note"] == "short")]
    assert set(rows["seq"]) == {512, 1024, 2048, 4096, 8192, 16384}
    assert set(rows["head_dim"]) == {64, 128}
    fam = "fa2" if kernel == "flash" else "fa3"
    hd_half = compute.efficiency_table()[90]["attn_head_dim_half"][fam]
    for d in ("fwd", "bwd"):
        r = rows[rows["direction"] == d]
        eff = compute.attention_efficiency(_attention_batch(r, tp=1, cp=1), d) * (
            compute.head_dim_factor(r["head_dim"].to_numpy(float), hd_half))
        ratio = r["eff"].to_numpy() / eff
        if kernel == "flash":  # the FA2 level is fitted on runs: compare the shape
            ratio = ratio / np.median(ratio)
        assert np.median(np.abs(ratio - 1)) < tolerance
        # and 512-token rows are no outliers of it: the half-saturation length holds
        short = r["seq"].to_numpy() == 512
        assert np.median(np.abs(ratio[short] - 1)) < 2.5 * tolerance


def test_context_parallel_splits_the_query_blocks():
    """cp = 4 on 32k tokens leaves each GPU 8k queries: a quarter of the query blocks (the
    per-block work still spans the whole sequence)."""
    rows = pd.DataFrame({"heads": [4], "seq": [32768], "kernel": ["cudnn"]})
    cp4 = compute.attention_efficiency(_attention_batch(rows, tp=8, cp=4), "fwd")[0]
    cp1 = compute.attention_efficiency(_attention_batch(rows, tp=8, cp=1), "fwd")[0]
    th = compute.efficiency_table()[90]["attn_tiles_half_fwd"]["fa3"]
    tiles = 4 * 32768 / compute.ATTN_TILE
    assert cp4 / cp1 == pytest.approx((tiles / 4 / (tiles / 4 + th)) / (tiles / (tiles + th)))
    assert cp4 < cp1


def test_gemm_curve_has_the_measured_shape(measured):
    """The roofline GEMM curve over the measured bf16 and fp8 shapes: up to its level (fitted
    on runs), it tracks each measured kernel within a few percent."""
    for dt in ("bf16", "fp8"):
        g = measured[(measured["op_class"] == "gemm") & (measured["dtype"] == dt)]
        n = len(g)
        b = Batch(sm_arch=np.full(n, 90.0), sm_count=np.full(n, 132.0))
        pred = compute.roofline_gemm_efficiency(
            b, g["m"].to_numpy(float), g["n"].to_numpy(float), g["k"].to_numpy(float),
            np.full(n, dt == "fp8"))
        ratio = g["eff"].to_numpy() / pred
        assert np.median(np.abs(ratio / np.median(ratio) - 1)) < 0.035
        # short reductions are where the old k_half (512) was wrong by 15-25%
        short = g["k"].to_numpy() <= 2048
        assert abs(np.median(ratio[short]) / np.median(ratio) - 1) < 0.06


def test_split_k_carries_few_tile_long_k_gemms(measured):
    """Shapes of few 128x128 output tiles and a long K (a small model's weight gradients, an
    LM head's input gradient at short micro-batches): the library splits K over idle SMs. The
    shipped curve prices them within ~10%; wave quantization alone (one split) was off by 80%."""
    g = fit._dense_gemms(measured, "bf16")
    tiles = np.ceil(g["m"] / 128) * np.ceil(g["n"] / 128)
    few = g[(tiles < 66) & (g["k"] >= 4096)]
    assert len(few) >= 8
    hopper = compute.efficiency_table()[90]
    m, n, k = (few[c].to_numpy(float) for c in ("m", "n", "k"))
    emax = fit.fit_kernel_curves(measured)[("gemm", "bf16", "")][0]
    split = compute.gemm_curve(m, n, k, emax, hopper["gemm_k_half"]["bf16"], 132)
    waves = np.ceil(m / 128) * np.ceil(n / 128) / 132
    one = emax * waves / np.ceil(waves) * k / (k + hopper["gemm_k_half"]["bf16"])
    err = np.median(np.abs(few["eff"].to_numpy() / split - 1))
    assert err < 0.15
    assert np.median(np.abs(few["eff"].to_numpy() / one - 1)) > 3 * err


def test_host_bound_gemms_are_left_out_of_the_curve_fit(measured):
    """Back-to-back eager launches of tiny GEMMs time PyTorch's dispatch (the launch rows):
    the fit drops rows within 1.5x their table's fastest launch."""
    g = fit._dense_gemms(measured, "bf16")
    for gpu in ("h100-sxm", "h200"):
        one = measured[measured["gpu"] == gpu]
        launch = one[one["op"].astype(str).str.startswith("launch_")].set_index("op")
        assert launch.loc["launch_graph", "time_us"] < 3 < launch.loc["launch_eager", "time_us"]
        small = one[(one["op_class"] == "gemm") & (one["note"] == "small")]
        kept = g[(g["gpu"] == gpu) & (g["note"] == "small")]
        assert 0 < len(kept) < len(small)
        assert (kept["time_us"] >= fit.HOST_BOUND * small["time_us"].min()).all()


def test_fp8_recipes_gemm_time_is_the_measured_ratio(measured):
    """efficiency.yaml fp8_recipes gemm_time for rowwise and blockwise is the median of the
    measured per-shape time ratio to the per-tensor-scaled GEMM: edit one by hand, or change
    the table, and this fails."""
    ratio = fit.fp8_recipe_gemm_time(measured)
    table = compute.fp8_recipe_table()
    for recipe in ("rowwise", "blockwise"):
        assert table[recipe]["gemm_time"] == pytest.approx(ratio[recipe], abs=0.01)
    assert table["rowwise_with_gw_hp"]["gemm_time"] == table["rowwise"]["gemm_time"]
    assert 1.6 < ratio["bf16"] < 2.0  # FP8 is not free of its own loss either
    edges = measured[measured["note"].astype(str).str.startswith("fp8_recipe")]
    assert edges["time_us"].notna().all()  # the padded second pass left no refused shape


def test_gemm_shapes_are_the_simulators_megatron_shapes():
    g = measure.gemm_shapes(["llama3-8b"], [2], [4096])
    fwd = g[g["phase"] == "fwd"].set_index("op")[["m", "n", "k"]]
    assert fwd.loc["qkv_proj"].tolist() == [4096, (4096 + 2 * 8 * 128) // 2, 4096]
    assert fwd.loc["out_proj"].tolist() == [4096, 4096, 2048]
    assert fwd.loc["fc1"].tolist() == [4096, 14336, 4096]  # gate + up, column-parallel
    assert fwd.loc["fc2"].tolist() == [4096, 4096, 7168]
    assert fwd.loc["lm_head"].tolist() == [4096, 128256 // 2, 4096]
    qkv = g[g["op"] == "qkv_proj"].set_index("phase")[["m", "n", "k"]]
    assert qkv.loc["dgrad"].tolist() == [4096, 4096, 3072]  # dY W: K is the output width
    assert qkv.loc["wgrad"].tolist() == [3072, 4096, 4096]  # dY^T X: K is the tokens
    heads = measure.attention_shapes(["llama3-8b"], [1, 8], [2048])["heads"].tolist()
    assert heads == [4, 32]


def test_measure_without_torch_says_what_it_needs(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(SystemExit, match="needs PyTorch"):
        measure.main(["--out", str(tmp_path / "k.csv")])
    assert not (tmp_path / "k.csv").exists()


def test_calibrate_compute_on_a_measured_table_asks_for_one_attention_kernel(tmp_path, capsys):
    from sweep.cli import main

    path = str(TABLES["h100-sxm"])
    assert main(["calibrate", "compute", path, "--profile", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err
    assert "--attention-kernel" in err and "cudnn, flash" in err
    assert main(["calibrate", "compute", path, "--attention-kernel", "cudnn", "--rounds", "40",
                 "--folds", "2", "--profile", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm attention: 168 rows" in out and "h100-sxm gemm: 1854 rows" in out


def test_moe_expert_gemms_run_near_the_dense_curve(measured):
    """torch._grouped_mm over the local experts runs at ~the dense efficiency of one expert's
    shape (0.9-1.0 by model): the fitted grouped_gemm (0.65) is not the kernel's own loss."""
    ratio = fit.grouped_over_dense(measured, fit.fit_kernel_curves(measured))
    assert set(ratio.index) == set(measure.MOE_MODELS)
    assert ratio["grouped_mm"].between(0.85, 1.1).all()
    assert ratio["grouped_mm"].median() > 1.3 * compute.efficiency_table()[90]["grouped_gemm"][
        "bf16"]


def test_compute_model_predicts_measured_whole_layers(measured):
    """Eager Llama 8B/70B/405B decoder layers timed on an H100 (cuDNN attention; nn.RMSNorm
    is one fused kernel in PyTorch 2.11): the compute model, elementwise priced fused, within
    8% on every layer forward and backward."""
    lay = fit.layer_errors(measured)
    lay = lay[lay["layers"] == "Llama 8B-405B"]
    cudnn = lay[(lay["kernel"] == "cudnn") & lay["fused_elementwise"]]
    assert len(cudnn) == 18 and set(cudnn["model"]) == {"llama3-8b", "llama3-70b",
                                                        "llama3.1-405b"}
    assert cudnn["error"].abs().max() < 0.08
    # pricing those fused ops as unfused (x2.5 bytes) is measurably wrong on this software
    unfused = lay[(lay["kernel"] == "cudnn") & ~lay["fused_elementwise"]
                  & (lay["direction"] == "fwd")]
    assert unfused["error"].median() > 0.08


@pytest.mark.usefixtures("isolated_profiles")
def test_a_profile_learned_on_measured_kernels_composes_with_runs_scales(capsys):
    """A compute component trained on the real H100 table and a runs component scaling the
    compute term (issue 24: runs fit terms of the step, x1.25 = compute 20% slower): the
    learned kernels agree with the white-box curve on a real configuration, the
    runs scale then acts on top of them, and deactivating restores the defaults exactly."""
    from sim_core import profiles
    from sim_core.simulate import simulate_frame
    from sweep.cli import main

    assert main(["calibrate", "compute", str(TABLES["h100-sxm"]), "--attention-kernel", "cudnn",
                 "--rounds", "60", "--folds", "2", "--profile", "kernels"]) == 0
    assert main(["calibrate", "compute", str(TABLES["h100-sxm"]), "--attention-kernel", "cudnn",
                 "--rounds", "60", "--folds", "2", "--profile", "both"]) == 0
    profiles.save_component("both", "runs", {"terms": {"compute": 1.25}}, [],
                            lambda d: [])
    capsys.readouterr()
    frame = pd.DataFrame([dict(model=m, seq_len=8192, global_batch=64, gpu="h100-sxm",
                               num_gpus=8, tp=tp, pp=1, micro_batch=1)
                          for m, tp in (("llama3-8b", 1), ("llama3-70b", 8))])
    step = lambda: simulate_frame(frame)["step_time_s"].to_numpy()  # noqa: E731
    base = step()
    profiles.activate("kernels")
    learned = step()
    profiles.activate("both")
    scaled = step()
    profiles.deactivate()
    assert np.array_equal(step(), base)
    # isolated kernels run ~4% under the in-loop curve's level at these shapes: close, not equal
    assert np.all(np.abs(learned / base - 1) < 0.12) and not np.allclose(learned, base)
    # compute is most of these steps: 20% slower compute makes the step 8-25% slower
    assert np.all((scaled / learned > 1.08) & (scaled / learned < 1.25))


def test_ampere_attention_constants_reproduce_the_fa2_paper_table():
    """Ampere's attention curve (seq_half, hd_half, the fwd/bwd maxima's blend) reproduces the
    FA2 paper's A100 causal fwd+bwd table within 3% at every sequence length and head dim; the
    old seq_half 256 was 20% too fast at 512 tokens. Causal masking more than doubles the
    half-efficiency length (non-causal fits well under half of it)."""
    from sim_core.accuracy import fit

    df = fit.published_attention()
    rows = fit._paper_rows(df, "a100-80gb", "flash", "fwd_bwd", 1)
    assert len(rows) == 12
    amp = compute.efficiency_table()[80]
    fwd, bwd = amp["attn_fwd"]["fa2"], amp["attn_bwd"]["fa2"]
    blend = 3.5 / (1 / fwd + 2.5 / bwd)  # fwd + bwd time: fwd FLOPs x (1/fwd + 2.5/bwd)
    assert amp["attn_seq_half_fwd"]["fa2"] == amp["attn_seq_half_bwd"]["fa2"]
    pred = fit.paper_curve(rows["seq"], rows["head_dim"], blend, amp["attn_seq_half_fwd"]["fa2"],
                           amp["attn_head_dim_half"]["fa2"])
    err = (pred / rows["eff"] - 1).abs()
    assert err.max() < 0.03, err.max()
    old = fit.paper_curve(rows["seq"], rows["head_dim"], blend, 256, amp["attn_head_dim_half"]["fa2"])
    assert (old / rows["eff"] - 1)[rows["seq"] == 512].min() > 0.15
    non = fit.fit_paper_series(fit._paper_rows(df, "a100-80gb", "flash", "fwd_bwd", 0))
    assert non[1] < 0.5 * amp["attn_seq_half_fwd"]["fa2"]


def test_head_dim_factor_is_one_at_128_and_slows_narrow_heads():
    f = compute.head_dim_factor(np.array([64.0, 128.0, 256.0]), 22.0)
    assert f[1] == 1.0 and f[0] < 0.9 and 1.0 < f[2] < 1.1
    assert (compute.head_dim_factor(np.array([64.0, 256.0]), 0.0) == 1.0).all()


def test_the_gemm_curve_holds_on_the_measured_small_shapes():
    """Short K (512-1k: high-TP projections) and few output tiles (m x n < 16M) stay within 5%
    (bf16) and 8% (fp8) median on the H100/H200 tables; long K within 2.5%."""
    df = fit.kernel_tables()
    small = fit.small_shape_errors(df, fit.fit_kernel_curves(df)).set_index(
        ["dtype", "by", "bucket"])["median_abs_err"]
    assert small[("bf16", "K", "K<1k")] < 0.05 and small[("bf16", "m x n", "mn<16M")] < 0.05
    assert small[("fp8", "K", "K<1k")] < 0.08 and small[("fp8", "m x n", "mn<16M")] < 0.06
    assert small[("bf16", "K", "K>=4k")] < 0.025


def test_split_k_pruning_gives_the_exhaustive_best():
    """gemm_curve tries the K splits only where one could win; that is exact: on random shapes
    it equals the best over every split (and one split where split_k is off)."""
    rng = np.random.default_rng(7)
    m, n, k = (rng.integers(16, 70000, 20000).astype(float) for _ in range(3))
    tiles = np.ceil(m / 128) * np.ceil(n / 128)
    best = None
    for s in compute.SPLIT_K:
        ks = k / s
        w = tiles * s / 132
        e = np.where((ks >= compute.SPLIT_K_MIN) | (s == 1), w / np.ceil(w) * ks / (ks + 138), 0)
        best = e if best is None else np.maximum(best, e)
    assert np.allclose(compute.gemm_curve(m, n, k, 0.74, 138, 132), 0.74 * best, rtol=0,
                       atol=1e-12)
    one = tiles / 132 / np.ceil(tiles / 132) * k / (k + 138)
    assert np.allclose(compute.gemm_curve(m, n, k, 0.74, 138, 132, split_k=False), 0.74 * one)
    assert (best > one).mean() > 0.05  # the splits do win somewhere
