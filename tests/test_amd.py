"""AMD Instinct and Blackwell Ultra (issue 26): catalog figures, the Infinity Fabric full mesh
as RCCL runs it (sim_core/nccl.py) checked against real rccl-tests logs, published GEMM
ceilings."""

from pathlib import Path

import numpy as np
import pytest

from sim_core import catalog, nccl
from sim_core.calibration import nccl as nccl_fit

LOGS = Path(__file__).parent / "data" / "nccl_logs"
BLOG = LOGS / "rocm_blog_mi300x_rccl_xgmi_8xMI300X.log"
GRAPH = LOGS / "rocm_blog_mi300x_rccl_xgmi_8xMI300X_graph.log"
MiB = 2**20


def test_datasheet_figures():
    mi300x, mi325x, mi355x = (catalog.get_gpu(g) for g in ("mi300x", "mi325x", "mi355x"))
    assert mi300x.peak_tflops["bf16"] == 1307.4 and mi300x.peak_tflops["fp8"] == 2614.9
    assert (mi300x.vendor, mi300x.mesh_links, mi300x.nvlink_bw_gbs) == ("amd", 7, 448.0)
    assert mi325x.peak_tflops == mi300x.peak_tflops and mi325x.hbm_bw_gbs == 6000.0
    # CDNA4: MX formats at twice FP8, no TF32 in hardware, 76.8 GB/s per link
    assert catalog.peak_tflops("mi355x", "mxfp4") == 10066.3
    assert 10066.3 == pytest.approx(2 * mi355x.peak_tflops["fp8"], abs=0.2)
    assert mi355x.nvlink_bw_gbs / mi355x.mesh_links == pytest.approx(76.8)
    assert catalog.peak_tflops("mi300x", "mxfp4") == 0.0  # CDNA3 has none
    # Blackwell Ultra: GB300's NVFP4 is sourced, B300's dense NVFP4 is not (left out)
    assert catalog.peak_tflops("gb300", "nvfp4") == 15000.0
    assert catalog.peak_tflops("b300", "nvfp4") == 0.0
    assert catalog.default_cluster_for_gpu("gb300").gpus_per_node == 72
    assert catalog.default_cluster_for_gpu("b300").nic_bw_gbs == 100.0  # ConnectX-8 800G
    t = catalog.gpu_table()
    assert t.loc["mi300x", "rocm"] and not t.loc["b300", "rocm"]
    assert t.loc["mi300x", "mesh_links"] == 7 and t.loc["h100-sxm", "mesh_links"] == 0


def _net(gpu="mi300x", **kw):
    net = nccl_fit.base_network(gpu)
    net.update(kw)
    return net


def _ar(nbytes, group, net, nodes=1):
    return nccl.collective_time("all_reduce", np.asarray(nbytes, float), group, nodes, net)


def test_a_small_group_on_the_mesh_gets_its_links_not_the_gpu():
    """Through NVSwitch a 2-GPU group moves at the GPU's full bandwidth; on the mesh it has one
    Infinity Fabric link (RCCL: 48 GB/s of 64), so TP=2 is ~7x slower than switch pricing."""
    mesh, switch = _net(), _net(mesh_links=0)
    big = 256 * MiB
    t_mesh = _ar(big, 2, mesh)
    t_switch = _ar(big, 2, switch)
    assert t_mesh["busbw_gbs"][()] == pytest.approx(48.0, rel=0.03)
    assert t_mesh["time_s"][()] / t_switch["time_s"][()] > 6.0
    # the 8-GPU ring over all 7 links: 7 x 48 = 336 GB/s, below NVSwitch pricing of 448 GB/s
    t8 = _ar(4 * 2**30, 8, mesh)["busbw_gbs"][()]
    assert t8 == pytest.approx(7 * 48.0, rel=0.03)
    assert t8 < _ar(4 * 2**30, 8, switch)["busbw_gbs"][()]
    # send/recv between two GPUs of a node: one link
    sr = nccl.collective_time("send_recv", 256 * MiB, 2, 1, mesh)["busbw_gbs"][()]
    assert sr == pytest.approx(48.0, rel=0.05)


def test_rccl_algorithms_on_one_mesh_node():
    net = _net()
    sizes = np.array([4096, 256 * 1024, 4 * MiB, 16 * MiB, 32 * MiB, 1 << 30], float)
    r = _ar(sizes, 8, net)
    algo = [nccl.ALGORITHMS[a] for a in r["algo"]]
    proto = [nccl.PROTOCOLS[p] for p in r["proto"]]
    # MSCCL all-pairs up to 16 MiB (LL to 512 KiB), RCCL's rings above
    assert algo == ["allpairs"] * 4 + ["ring"] * 2
    assert proto == ["ll", "ll", "simple", "simple", "simple", "simple"]
    # no LL128 anywhere on the mesh, no tree/Simple on one node; MSCCL only on 8 GPUs
    allsizes = np.logspace(3, 31, 40, base=2)
    for g in (2, 4, 8):
        rr = _ar(allsizes, g, net)
        assert not (rr["proto"] == nccl.LL128).any()
        assert not ((rr["algo"] == nccl.TREE) & (rr["proto"] == nccl.SIMPLE)).any()
        assert ((rr["algo"] == nccl.ALLPAIRS).any()) == (g == 8)
    # an H100 node is untouched: NCCL's choice there includes NVLS
    h = _ar(sizes, 8, nccl_fit.base_network("h100-sxm"))
    assert not (h["algo"] == nccl.ALLPAIRS).any()


def _measured(path):
    df = nccl_fit.nccl_rows([path], gpu="mi300x")
    return df["size"].to_numpy(float), df["oop_time_us"].to_numpy(float), df


def test_one_shot_small_messages_match_the_rccl_log_uncalibrated():
    """1-128 KiB on 8x MI300X (ROCm blog, no HIP graphs) take 13.1-14.1 us. The all-pairs
    schedule prices them at RCCL's base latency + 2 XGMI hops (~13.6 us); a ring over the mesh
    (14 hops) would be ~23 us."""
    sizes, meas, _ = _measured(BLOG)
    sel = (sizes >= 1024) & (sizes <= 128 * 1024)
    model = _ar(sizes[sel], 8, _net())["time_s"] * 1e6
    assert np.all(np.abs(model / meas[sel] - 1) < 0.10)
    ring = nccl.RCCL_BASE_LAT[nccl.LL] + 14 * nccl.RCCL_HW_LAT_XGMI[nccl.RING][nccl.LL]
    assert np.all(ring / meas[sel] - 1 > 0.5)


def test_large_messages_match_the_rccl_log_and_calibration_closes_the_gap():
    """Uncalibrated within 10% (4-9%) from 32 MiB to 16 GiB (RCCL's 48 GB/s links; the log reaches
    319 GB/s busbw of the model's 336); after `fit_nccl_scales` on the same log within 2%."""
    sizes, meas, df = _measured(BLOG)
    big = sizes >= 32 * MiB
    net = _net()
    err0 = _ar(sizes[big], 8, net)["time_s"] * 1e6 / meas[big] - 1
    assert np.all(np.abs(err0) < 0.10) and np.all(err0 < 0)  # the model is the faster one
    scales = nccl_fit.fit_nccl_scales(df[df["size"] >= MiB], net)
    assert 0.90 < scales["nvlink_bw"] < 1.0  # slower links than RCCL's 48 GB/s, not faster
    err1 = nccl_fit.nccl_model_us(df[big], net, scales) / meas[big] - 1
    assert np.all(np.abs(err1) < 0.02)
    # the NVSwitch pricing of the same GPU is off by more than the mesh model, both ways
    sw = _ar(sizes, 8, _net(mesh_links=0))["time_s"] * 1e6 / meas - 1
    assert np.median(np.abs(sw[big])) > np.median(np.abs(err0)) + 0.05


def test_graph_launch_log_fits_like_an_nccl_tests_log():
    df = nccl_fit.nccl_rows([GRAPH], gpu="mi300x")
    fits = nccl_fit.nccl_file_fits(df, _net())
    assert fits["median_abs_err_fitted"].iloc[0] < 0.02


def test_rccl_logs_name_their_gpu():
    for name in ("rocm_blog_mi300x_rccl_xgmi_8xMI300X.log", "rccl_issue1562_8xMI300X_VF_azure.log"):
        assert nccl_fit.nccl_gpu([LOGS / name]) == "mi300x"


def test_published_gemm_ceilings_drive_the_gemm_curve():
    """hipBLASLt max-achievable (AMD, ROCm 6.3): MI300X BF16 708, MI325X 843 TFLOP/s at
    4096 x 4864 x 32896; the compute model reproduces them at that shape."""
    from sim_core import compute
    from sim_core.columns import Batch

    def eff(gpu, fp8=False):
        r = catalog.gpu_table().loc[gpu]
        b = Batch(sm_arch=np.array([float(r["sm_arch"])]), sm_count=np.array([float(r["sm_count"])]),
                  gemm_max_bf16=np.array([r["gemm_max_bf16"]]), gemm_max_fp8=np.array([r["gemm_max_fp8"]]))
        n = 4864 if not fp8 else 3648
        return compute.roofline_gemm_efficiency(b, 4096.0, float(n), 32896.0, np.array([fp8]))[0]

    assert eff("mi300x") * 1307.4 == pytest.approx(708, rel=0.005)
    assert eff("mi325x") * 1307.4 == pytest.approx(843, rel=0.005)
    assert eff("mi325x", True) > eff("mi300x", True)
    # MI355X has no published ceiling: CDNA4 takes the arch table (MI300X's fractions)
    assert catalog.gpu_table().loc["mi355x", "gemm_max_bf16"] == 0.0
    assert compute.efficiency_table()[950]["gemm_max"] == compute.efficiency_table()[942]["gemm_max"]
    assert compute.efficiency_table()[942]["gemm_max"]["bf16"] == catalog.gemm_ceilings()["mi300x"]["bf16"]


# ---------------------------------------------------------------------------------------------
# Software on ROCm: framework profiles, recipes
# ---------------------------------------------------------------------------------------------
def _evaluate(gpu="mi300x", framework=None, precision="bf16", **parallel):
    from sweep.config import parse_run
    from sweep.engine.evaluate import evaluate
    from sweep.engine.space import Space

    d = {"model": "llama3-70b", "seq_len": 8192, "global_batch": 512, "precision": precision,
         "cluster": {"gpu": gpu, "num_gpus": 64},
         "parallel": {"tp": 1, "pp": 1, "zero": 3, "recompute": "selective", **parallel}}
    if framework:
        d["framework"] = framework
    return evaluate(Space.from_config(parse_run(d)).frame(0, 1)).iloc[0]


def test_frameworks_on_rocm():
    row = _evaluate()  # megatron-core: AMD's ROCm fork, CK flash-attention by default
    assert row["status"] == "ok" and row["attention_kernel"] == "fa2"
    assert _evaluate(gpu="h100-sxm")["attention_kernel"] == "fa3"
    bad = _evaluate(attention_kernel="fa3")
    assert bad["status"] == "invalid" and "FA3/cuDNN attention on ROCm" in bad["invalid_reason"]
    # a framework whose ROCm port was not read is refused as unchecked, not as unable
    nano = _evaluate(framework="nanotron", zero=1, recompute="full")
    assert nano["status"] == "invalid" and \
        "nanotron has no ROCm port read for this project" in nano["invalid_reason"]
    assert _evaluate(framework="torchtitan")["status"] == "ok"
    # torchao's float8 on MI300 (e4m3fnuz; pytorch/ao v0.18.0 torchao/float8/config.py)
    assert _evaluate(framework="torchtitan", precision="fp8")["status"] == "ok"
    assert _evaluate(precision="fp8")["status"] == "ok"  # TE FP8 in AMD's Megatron fork
    # NeMo / Megatron-Bridge on ROCm through AMD's Primus (Megatron fork + ROCm TE)
    nemo = _evaluate(framework="nemo", zero=1, tp=8)
    assert nemo["status"] == "ok" and nemo["attention_kernel"] == "fa2"
    assert _evaluate(framework="nemo", zero=1, tp=8, precision="fp8")["status"] == "ok"


def test_recipes_say_what_differs_on_rocm():
    import tomllib

    from sweep.advice import export

    amd, nv = _evaluate(), _evaluate(gpu="h100-sxm")
    text = export.megatron_text(amd)
    assert "export HSA_NO_SCRATCH_RECLAIM=1" in text and "ROCm/Megatron-LM" in text
    assert "--attention-backend" in text
    assert export.parse_megatron_text(text)[export.parse_megatron_text(text).index(
        "--attention-backend") + 1] == "fused"  # TE fused attention = CK on ROCm
    assert "ROCm" not in export.megatron_text(nv) and "export " not in export.megatron_text(nv)
    nemo = export.megatron_text(_evaluate(framework="nemo", zero=1, tp=8))
    assert "AMD-AGI/Primus" in nemo and "export HSA_NO_SCRATCH_RECLAIM=1" in nemo
    toml = export.torchtitan_toml(amd)
    assert "# export NCCL_MIN_NCHANNELS=112" in toml and "HSA_NO_SCRATCH" not in toml
    tomllib.loads(toml)  # the ROCm lines are comments: still a valid job file


def test_multi_vendor_space_runs_end_to_end(tmp_path):
    """search_spaces/multi-vendor.yaml: H100, H200, MI300X and MI325X searched together; it
    recommends, and the report gives every GPU type its own frontier."""
    from sweep import api
    from sweep.advice import report

    out = tmp_path / "mv"
    api.search(Path(__file__).parent.parent / "search_spaces" / "multi-vendor.yaml", out)
    r = report.build(out)
    assert r["rec"].found
    assert set(r["gpu_front"]["gpu"]) == {"h100-sxm", "h200", "mi300x", "mi325x"}
    md = report.render_md(r, None)
    assert "Each GPU type's own frontier" in md and "mi300x" in md
    # the mesh makes TP expensive on AMD: MI300X's frontier runs TP 1, not NVSwitch's TP 2+
    amd = r["gpu_front"][r["gpu_front"]["gpu"].isin(["mi300x", "mi325x"])]
    assert (amd["tp"] == 1).all()


def test_space_count_reads_the_gpu_once_an_amd_part_is_in_it():
    """A space of NVIDIA parts keeps `gpu` free of the validity rules (test_space); with MI300X
    in it, validity depends on the GPU (nanotron has no ROCm profile) and the count says so."""
    import sweep.engine.space as sp
    from sweep.config import parse_space

    d = {"name": "t", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
         "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
         "space": {"gpu": ["h100-sxm", "mi300x"], "framework": ["megatron-core", "nanotron"],
                   "tp": [1, 2], "zero": [0, 1], "recompute": ["none", "full"]}}
    space = sp.Space.from_config(parse_space(d))
    c = sp.count(space)
    brute = sp.census(space)
    assert "gpu" not in c.free
    assert c.census.valid == brute.valid and c.census.reasons == brute.reasons
    assert any("nanotron has no ROCm port read" in r for r in brute.reasons)
