"""`sweep calibrate`: learned compute/overlap models, NCCL scale fit, profiles (round trips,
recovery of known ground truth from synthetic data, activation and exact deactivation)."""

import json

import numpy as np
import pandas as pd
import pytest

from sim_core import compute, nccl, overlap, profiles
from sim_core.calibration import kernels, synthetic
from sim_core.calibration import nccl as nccl_fit
from sim_core.calibration import overlap as overlap_fit
from sim_core.simulate import simulate_frame

EX = synthetic.EXAMPLES_DIR
NCCL_FILES = sorted(EX.glob("*_perf_*.txt"))
# a multi-node H100 configuration with exposed DP/TP communication and overlapped gradients
H100 = dict(model="llama3-8b", seq_len=4096, global_batch=256, gpu="h100-sxm", num_gpus=32,
            tp=2, pp=1, micro_batch=1, recompute="none", overlap_grad_reduce=True)
A100 = {**H100, "gpu": "a100-80gb"}


pytestmark = pytest.mark.usefixtures("isolated_profiles")


def _frame(*rows):
    return pd.DataFrame(list(rows))


# ---- examples ------------------------------------------------------------------------------
def test_shipped_examples_are_what_the_generator_writes(tmp_path):
    for p in synthetic.make_examples(tmp_path):
        assert p.read_bytes() == (EX / p.name).read_bytes(), p.name
        if p.suffix in (".csv", ".txt"):
            assert "SYNTHETIC" in p.read_text().splitlines()[0] or p.name.startswith("nsys")


# ---- loaders -------------------------------------------------------------------------------
def test_nsys_loader_classifies_kernels_and_has_no_shapes():
    df = kernels.load_kernels(EX / "nsys_kern_sum_synthetic.csv", gpu="h100-sxm")
    assert list(df["op_class"]) == ["gemm", "attention", "communication", "elementwise"]
    assert df["time_us"].tolist() == [412.0, 450.0, 604.0, 40.0]
    assert df[["m", "n", "k", "seq"]].isna().all().all()
    assert (df["gpu"] == "h100-sxm").all()


def test_torch_trace_loader_recovers_shapes_and_kernel_time():
    df = kernels.load_kernels(EX / "torch_trace_synthetic.json", gpu="h100-sxm")
    g = df[df["op_class"] == "gemm"].iloc[0]
    assert (g["m"], g["n"], g["k"], g["time_us"]) == (8192, 11008, 4096, 1010.5)
    a = df[df["op_class"] == "attention"].iloc[0]
    # the kernel belongs to the innermost op (_flash_attention_forward, layout b s h d)
    assert a["name"] == "aten::_flash_attention_forward"
    assert (a["batch"], a["seq"], a["heads"], a["head_dim"]) == (2, 4096, 32, 128)
    assert len(df) == 2  # aten::linear and the outer sdpa op launched no kernels themselves


def test_classify_kernel_names():
    assert kernels.classify_kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn") == "gemm"
    assert kernels.classify_kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN") == "gemm"
    assert kernels.classify_kernel("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention"
    assert kernels.classify_kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "communication"
    assert kernels.classify_kernel("triton_poi_fused_add_mul_0") == "elementwise"


# ---- compute -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel_models():
    df = kernels.load_kernels(EX / "kernels_h100_synthetic.csv")
    return kernels.train_kernel_models(df, folds=3, rounds=150, log=lambda *a: None)


def test_compute_model_recovers_the_known_surface(kernel_models):
    mod = kernel_models[("h100-sxm", "gemm")]
    rng = np.random.default_rng(7)
    m, n, k = (2.0 ** rng.integers(9, 15, 300) for _ in range(3))
    pred = mod.efficiency(kernels.gemm_features(m, n, k, 0.0))
    true = synthetic.synth_gemm_eff(m, n, k, False)
    assert np.median(np.abs(pred / true - 1)) < 0.05
    att = kernel_models[("h100-sxm", "attention")]
    s = np.array([1024.0, 4096.0, 16384.0])
    pred = att.efficiency(kernels.attention_features(64.0, s, 128.0, 1.0, 0.0))
    assert np.allclose(pred, synthetic.synth_attn_eff(s, 128.0, False), rtol=0.05)
    cv = mod.meta["cv"]
    assert cv["kfold3"]["median_abs_err"] < 0.06
    assert set(cv["leave_one_source_out"]) == {"sweep0", "sweep1", "sweep2"}


def test_compute_model_round_trips(kernel_models, tmp_path):
    mod = kernel_models[("h100-sxm", "gemm")]
    mod.save(tmp_path / "g.json")
    back = kernels.KernelModel.load(tmp_path / "g.json", "h100-sxm", "gemm")
    X = kernels.gemm_features([512, 4096, 3000], [8192, 1024, 7000], [4096, 256, 11000], 0.0)
    assert np.array_equal(mod.efficiency(X), back.efficiency(X))


# ---- overlap -------------------------------------------------------------------------------
def test_overlap_model_recovers_known_slowdowns():
    train = overlap_fit.load_overlap_table(EX / "overlap_synthetic.csv")
    model = overlap_fit.train_overlap_model(train)
    test = synthetic.make_overlap_table(n=400, seed=99, noise=0.0)  # unseen draws, no noise
    pred = model.predict(test["sm_arch"], test["kernel_class"], test["collective"],
                         test["nbytes"], test["group"])
    true = test["time_overlap_us"] / test["time_alone_us"]
    err = np.abs(pred / true - 1)
    assert np.median(err) < 0.01 and np.mean(err < 0.05) > 0.95
    meta = model.meta
    assert meta["holdout_80_20"]["within_5pct"] > 0.95
    assert meta["cv"]["kfold5"]["n"] == len(train)
    assert meta["prior_on_data"]["within_5pct"] < meta["holdout_80_20"]["within_5pct"]
    # without message size and group (the simulator does not pass them yet): a value inside
    # the range of that class's slowdowns
    f = model.predict([90.0], ["gemm"], ["all_reduce"])[0]
    sub = true[(test["sm_arch"] == 90) & (test["kernel_class"] == "gemm")
               & (test["collective"] == "all_reduce")]
    assert sub.min() <= f <= sub.max()


def test_overlap_hook_falls_back_to_the_prior_for_unseen_architectures():
    model = overlap_fit.train_overlap_model(synthetic.make_overlap_table(n=300), rounds=20)
    hook = overlap_fit.overlap_hook(model)
    arch = np.array([80.0, 90.0, 100.0])
    out = hook({"sm_arch": arch, "kernel_class": "gemm", "collective": "all_reduce",
                "nbytes": np.zeros(3), "group": np.zeros(3)})
    assert out[2] == overlap.slowdown(arch, "gemm")[2]  # Blackwell: not in the data
    assert out[0] != overlap.slowdown(arch, "gemm")[0]


# ---- nccl ----------------------------------------------------------------------------------
def test_nccl_fit_recovers_the_perturbed_scales():
    df = nccl_fit.nccl_rows(NCCL_FILES)
    net = nccl_fit.base_network(nccl_fit.guess_gpu(NCCL_FILES[0].read_text()))
    scales = nccl_fit.fit_nccl_scales(df, net)
    for k, v in synthetic.SYNTH_NCCL_SCALES.items():
        assert scales[k] == pytest.approx(v, rel=0.03), k
    rep = nccl_fit.nccl_fit_report(df, net, scales)
    assert rep["err_fitted"].abs().median() < 0.01 < rep["err_default"].abs().median()
    loso = nccl_fit.nccl_loso(df, net)
    assert len(loso) == len(NCCL_FILES) and (loso["median_abs_err"] < 0.05).all()


def test_nccl_single_node_data_leaves_network_scales_at_one():
    df = nccl_fit.nccl_rows([p for p in NCCL_FILES if "1node" in p.name])
    scales = nccl_fit.fit_nccl_scales(df, nccl_fit.base_network("h100-sxm"))
    assert scales["nic_bw"] == 1.0 and scales["inter_latency"] == 1.0
    assert scales["nvlink_bw"] == pytest.approx(synthetic.SYNTH_NCCL_SCALES["nvlink_bw"], rel=0.03)


# ---- profiles ------------------------------------------------------------------------------
def _calibrate(*argv):
    from sweep.cli import main

    assert main(["calibrate", *argv]) == 0


def _slow_tables(tmp_path):
    """A deliberately slow GPU (60% of the synthetic efficiency) and large slowdowns."""
    k = tmp_path / "slow_kernels.csv"
    synthetic.make_kernel_table(scale=0.6).to_csv(k, index=False)
    o = tmp_path / "big_slowdowns.csv"
    synthetic.make_overlap_table(scale=4.0).to_csv(o, index=False)
    return k, o


def test_profile_changes_simulation_in_the_expected_direction_and_deactivates_exactly(
        tmp_path, capsys):
    kern, over = _slow_tables(tmp_path)
    _calibrate("compute", str(kern), "--profile", "slow", "--rounds", "80", "--folds", "3")
    _calibrate("overlap", str(over), "--profile", "slow", "--rounds", "30")
    _calibrate("nccl", *map(str, NCCL_FILES), "--profile", "slow")
    out = capsys.readouterr().out
    assert "80/20 hold-out" in out and "leave-one-file-out" in out and "nvlink_bw" in out
    df = _frame(H100, A100)
    before = simulate_frame(df)
    man = profiles.activate("slow")
    assert set(man["components"]) == {"compute", "overlap", "nccl"}
    after = simulate_frame(df)
    h, a = before.iloc[0], after.iloc[0]
    assert a["time_compute"] > 1.3 * h["time_compute"]  # 60% efficiency: slower GEMMs/attention
    assert a["time_slowdown"] > h["time_slowdown"] > 0  # larger learned slowdowns
    assert a["time_dp"] > h["time_dp"]  # slower NICs, higher latencies
    # the compute model knows only the H100: the A100 keeps its roofline compute time
    assert after.iloc[1]["time_compute"] == before.iloc[1]["time_compute"]
    profiles.deactivate()
    pd.testing.assert_frame_equal(simulate_frame(df), before)
    assert compute._gemm_model is None and overlap._model is None
    assert not hasattr(nccl.collective_time, "_calibrated")


def test_profile_round_trip_version_and_show(tmp_path, capsys):
    d = tmp_path / "p"
    _calibrate("nccl", *map(str, NCCL_FILES[:2]), "--profile", str(d))
    man = json.loads((d / "manifest.json").read_text())
    v1 = man["version"]
    assert [i["sha256"] for i in man["components"]["nccl"]["inputs"]] == [
        profiles.sha256(p) for p in NCCL_FILES[:2]]
    _calibrate("nccl", *map(str, NCCL_FILES), "--profile", str(d))
    v2 = profiles.load_manifest(d)["version"]
    assert v1 != v2  # other data, other version
    _calibrate("show", str(d))
    assert v2 in capsys.readouterr().out
    # same data elsewhere: same version
    _calibrate("nccl", *map(str, NCCL_FILES), "--profile", "again")
    assert profiles.load_manifest("again")["version"] == v2
    # tampering with the copied data is caught at activation
    f = d / man["components"]["nccl"]["inputs"][0]["file"]
    f.write_text(f.read_text() + "\n# edited\n")
    assert profiles.verify(d)
    with pytest.raises(profiles.ProfileError, match="changed"):
        profiles.activate(d)


def test_measured_override_and_packed_activation(tmp_path):
    _calibrate("nccl", *map(str, NCCL_FILES), "--profile", "m")
    blob = profiles.pack("m")
    profiles.activate_packed(blob)
    # an all-reduce of a measured size on 8 GPUs of one node: the measured time exactly
    rows = nccl_fit.nccl_rows([p for p in NCCL_FILES if "all_reduce_perf_8gpu" in p.name])
    r = rows[rows["size"] == 2**26].iloc[0]
    t = nccl.collective_time("all_reduce", 2**26, 8, 1, nccl_fit.base_network("h100-sxm"))
    # (via the printed busbw, 2 decimals)
    assert t["time_s"][()] * 1e6 == pytest.approx(r["oop_time_us"], rel=1e-3)
    assert profiles.active()["name"] == "m"
    profiles.deactivate()
    assert profiles.active() is None


def test_unknown_profile_is_a_one_line_error(capsys):
    from sweep.cli import main

    assert main(["calibrate", "show", "nope"]) == 2
    assert "no calibration profile" in capsys.readouterr().err


# ---- --profile on the command line and in Ray tasks ------------------------------------------
def test_cli_profile_flag_and_picklable_profiled_simulate(tmp_path, capsys):
    import json
    import pickle

    from sweep.cli import main
    from sweep.engine.evaluate import ProfiledSimulate, model_key as _model_key

    _calibrate("nccl", *map(str, NCCL_FILES), "--profile", "net")
    capsys.readouterr()
    run = EX.parents[2] / "search_spaces" / "examples" / "llama3-70b-64xh100.yaml"
    assert main(["simulate", str(run), "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(run), "--json", "--profile", "net"]) == 0
    tuned = json.loads(capsys.readouterr().out)
    assert tuned["step_time_s"] != base["step_time_s"]  # the fitted network is slower
    profiles.deactivate()

    # what a Ray task receives: a pickled callable that activates the profile where it runs
    sim = pickle.loads(pickle.dumps(ProfiledSimulate("net")))
    df = _frame(H100)
    got = sim(df)
    profiles.deactivate()
    before = simulate_frame(df)
    profiles.activate("net")
    expected = simulate_frame(df)
    pd.testing.assert_frame_equal(got, expected)
    assert not got.equals(before)
    # results under a profile never resume into a folder computed without it
    assert _model_key(sim) == {"profile": sim.version} and _model_key(None) == {}
