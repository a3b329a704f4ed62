"""The one GPU-name resolver (sim_core/gpu_names.py) on names copied from public logs, tool
output and tables, and its use by YAML files, run tables and nccl/rccl-tests logs."""

from __future__ import annotations

import pytest

from sim_core import catalog, gpu_names
from sim_core.accuracy import validation
from sim_core.calibration import nccl as nccl_fit

# (name as printed, catalog id, where it was printed)
SEEN = [
    ("AMD Instinct MI300X", "mi300x",
     "rocminfo Marketing Name, github.com/ROCm/rccl-tests/issues/146; rccl-tests device lines, "
     "github.com/crickett-hpe/hpc-ai-envs/pull/30"),
    ("AMD Instinct MI300X VF", "mi300x",
     "rccl-tests device line (SR-IOV, Azure), github.com/ROCm/rccl/issues/1562"),
    ("AMD Instinct MI355X", "mi355x",
     "torch.cuda.get_device_name(), github.com/pytorch/pytorch/pull/196365"),
    ("AMD Instinct MI350X", "mi350x",
     "amd-smi static MARKET_NAME, github.com/ROCm/rocm-systems/pull/2987"),
    ("AMD Instinct MI350 OAM", "mi350x",
     "amd-smi static BOARD PRODUCT_NAME, github.com/ROCm/rocm-systems/pull/2987"),
    ("AMD MI350X", "mi350x", "amd-smi static IFWI NAME, github.com/ROCm/rocm-systems/pull/2987"),
    ("AMD Instinct MI250X/MI250", "mi250x",
     "rocminfo Marketing Name (gfx90a), github.com/ROCm/aiter/issues/179 and "
     "github.com/ROCm/rocm_smi_lib/issues/160"),
    ("NVIDIA B300 SXM6 AC", "b300",
     "torch.cuda.get_device_name(), github.com/pytorch/ao/pull/3640 and "
     "github.com/NVIDIA/cosmos-framework/pull/114"),
    ("NVIDIA-B300-SXM6-AC", "b300", "DCGM GPU label (AWS p6-b300), "
     "github.com/NVIDIA/NVSentinel/pull/1658"),
    ("NVIDIA-GB300", "gb300", "NVIDIA NIM support matrix identifier, quoted in "
     "github.com/midudev/canirun.ai/pull/20"),
    ("NVIDIA B200", "b200", "nvidia-smi --query-gpu=name, github.com/pytorch/test-infra/pull/7631"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm",
     "nvidia-smi --query-gpu=name, github.com/pytorch/test-infra/pull/7631"),
    ("NVIDIA H200-SXM-141GB", "h200", "MLPerf Inference v4.1 accelerator_model_name, "
     "github.com/mlcommons/inference_results_v4.1 closed/GigaComputing"),
    ("NVIDIA H100-PCIe-80GB", "h100-pcie", "MLPerf Inference v4.1 accelerator_model_name, "
     "github.com/mlcommons/inference_results_v4.1 closed/ASUSTeK"),
    ("NVIDIA H100-SXM-80GB", "h100-sxm", "MLPerf Inference v4.1 accelerator_model_name, "
     "github.com/mlcommons/inference_results_v4.1 open/HPE"),
    ("A100-SXM4-40GB", "a100-40gb", "nccl-tests device line, tests/data/nccl_logs "
     "(aws-samples/aws-efa-eks, shipped before)"),
    # the published-runs dataset's own GPU column (sim_core/data/published_runs.csv)
    ("H100 95GB HBM2e SXM (lower TDP)", "h100-96gb", "published_runs.csv"),
    ("GB200 (DGX-GB200 NVL72)", "gb200", "published_runs.csv"),
    ("H100 80GB (DGX-H100)", "h100-sxm", "published_runs.csv"),
    # Huawei Ascend 910C dies (issue 40)
    ("Ascend A3", "ascend-a3", "github.com/vllm-project/vime/issues/358 (hardware line)"),
    ("Atlas 800 A3", "ascend-a3", "vllm-ascend tutorials, 'Atlas 800 A3 (64G x 16)'"),
    ("Ascend910_9392", "ascend-a3", "CANN SoC name printed by acl.get_soc_name() on a 910C, "
     "quoted in public build scripts (SOC_VERSION=Ascend910_9392)"),
]


# the names issue 38 quotes from AMD run tables and product pages (no row of those tables is
# used here: only how they write the GPU)
SEEN += [(n, g, "issue 38") for n, g in [
    ("AMD Instinct MI325X", "mi325x"), ("AMD Instinct MI325X 256GB HBM3e", "mi325x"),
    ("AMD MI300x (8xMI300X GPUs)", "mi300x"), ("MI300X VF", "mi300x"), ("B300", "b300"),
    ("NVIDIA B300-SXM-270GB", "b300"), ("GB300", "gb300"), ("mi355x", "mi355x")]]


@pytest.mark.parametrize("name, gid, source", SEEN)
def test_real_names_resolve(name, gid, source):
    assert catalog.get_gpu(name).name == gid
    assert validation._gpu_id(name) == gid


def test_every_catalog_id_resolves_to_itself_and_every_rule_names_an_entry():
    for gid in catalog.gpu_names():
        assert catalog.get_gpu(gid).name == gid
        assert catalog.get_gpu(gid.upper().replace("-", "_")).name == gid
    assert {gid for gid, _ in gpu_names.rules()} <= set(catalog.gpu_names())


@pytest.mark.parametrize("name", ["NVIDIA-GB300-WS", "AMD Instinct MI300A", "MI250",
                                  "Tesla V100-SXM2-32GB"])
def test_other_parts_stay_unknown(name):
    """A different part with a similar name is not silently another catalog entry: DGX
    Station's GB300 (252 GB), the MI300A APU, MI250 (208 CUs), V100."""
    assert gpu_names.resolve(name, catalog.gpu_names()) is None
    with pytest.raises(catalog.CatalogError, match="unknown gpu"):
        catalog.get_gpu(name)


def test_did_you_mean_on_a_miss():
    with pytest.raises(catalog.CatalogError) as exc:
        catalog.get_gpu("MI300")
    assert "did you mean 'mi300x'?" in str(exc.value) and "\n" not in str(exc.value)
    assert validation._unknown_gpu("MI300") == "unknown GPU 'MI300' (did you mean mi300x?)"
    assert validation._unknown_gpu("TPU v5") == "unknown GPU 'TPU v5'"


def test_rccl_device_lines_and_gpu_flag_resolve():
    # what calibrate nccl reads from the rank lines, and what --gpu may say
    assert nccl_fit.gpu_from_names(["AMD Instinct MI350X"]) == "mi350x"
    assert nccl_fit.gpu_from_names(["AMD Instinct MI250X/MI250"]) == "mi250x"
    assert nccl_fit.nccl_gpu([], given="AMD Instinct MI355X") == "mi355x"
    # the gfx target alone (HIP gcnArchName, as rocminfo prints it: github.com/ROCm/rccl-tests/
    # issues/146): read as the first part that has it in a log, refused in a file
    assert nccl_fit.gpu_from_names(["gfx942:sramecc+:xnack-"]) == "mi300x"
    assert nccl_fit.gpu_from_names(["gfx950"]) == "mi355x"
    with pytest.raises(catalog.CatalogError, match="unknown gpu 'gfx942'"):
        catalog.get_gpu("gfx942")
    text = "#  Rank  0 Group  0 Pid  37300 on   g100n126 device  0 [0000:05:00] AMD Instinct MI300X\n"
    assert nccl_fit.guess_gpu(text) == "mi300x"


def test_yaml_takes_a_product_name(tmp_path):
    from sweep.config.files import parse_space

    base = {"model": "llama3-8b", "seq_len": 4096, "global_batch": 64}
    cfg = parse_space({**base, "cluster": {"gpu": "AMD Instinct MI300X", "num_gpus": 8},
                       "space": {"tp": [1, 2]}})
    assert cfg.cluster.gpu == "mi300x"
    cfg = parse_space({**base, "cluster": {"num_gpus": 8},
                       "space": {"gpu": ["MI325X", "NVIDIA-B300-SXM6-AC"], "tp": [1, 2]}})
    assert cfg.space["gpu"] == ["mi325x", "b300"]
    from sweep.errors import ConfigError

    with pytest.raises(ConfigError, match="cluster.gpu: unknown gpu 'A100': did you mean"):
        parse_space({**base, "cluster": {"gpu": "A100", "num_gpus": 8}})  # 40 or 80 GB?


@pytest.mark.parametrize("text, prec", [
    ("BF16 (no float8)", "bf16"), ("BF16, without FP8", "bf16"), ("fp8 off", "bf16"),
    ("BF16 (TE_FP8=0)", "bf16"), ("FP8 (TE_FP8=1)", "fp8"), ("MXFP4", "mxfp4"),
    ("NVFP4 (TE NVFP4BlockScaling)", "nvfp4"), ("FP8-MX (MXFP8)", "fp8"), ("FP4", "fp4"),
    ("BF16 + Float8 linears", "fp8"), ("FP8-CS", "fp8"), ("amp_bf16", "bf16")])
def test_precision_column_reads_a_negation(text, prec):
    """A run table's "BF16 (no float8)" was read as FP8 (it names float8)."""
    assert validation._precision(text) == prec


def test_amd_run_table_as_the_rocm_docs_state_it():
    """AMD's Megatron-LM benchmark commands (tests/data/amd_runs): the GPU resolves, TE_FP8=0
    reads as BF16, FSDP=1 as ZeRO-3; every row is skipped only because nothing is measured,
    and the simulator predicts each stated layout or says truly why it cannot."""
    from pathlib import Path

    import sim_core

    path = Path(__file__).parent / "data" / "amd_runs" / "rocm_docs_megatron_lm_v25_4_configs.csv"
    d = validation.load_published(path)
    assert set(d["gpu"]) == {"mi300x"} and set(d["framework"]) == {"megatron-core"}
    assert d["precision"].tolist() == ["fp8", "bf16", "fp8", "bf16", "bf16", "bf16"]
    assert d["zero"].tolist() == [1, 1, 1, 1, 3, 3]
    assert set(d["skip"]) == {"nothing measured (no step time, throughput or peak memory)"}
    cols = ["model", "framework", "seq_len", "global_batch", "precision", "gpu", "num_gpus",
            "gpus_per_node", "tp", "pp", "cp", "vpp", "micro_batch", "recompute",
            "sequence_parallel", "zero", "tp_comm_overlap", "ep", "moe_dropless", "etp"]
    frame = d[cols].assign(recompute=d["recompute"].replace("", "selective"))
    reasons = sim_core.check_rules(frame).tolist()
    assert reasons[:5] == [""] * 5
    assert reasons[5] == "global_batch % (dp*micro_batch) != 0"  # BS=56, MBS=3, 8 GPUs
    out = sim_core.simulate_frame(frame.iloc[:4])
    assert (out["step_time_s"] > 0).all()
    # FP8 (TE on MI300X) is faster than BF16 on the same layout
    assert out["step_time_s"][0] < out["step_time_s"][1]
    assert out["step_time_s"][2] < out["step_time_s"][3]


@pytest.mark.parametrize("typo, meant", [("h100-sxmm", "h100-sxm"), ("h100-pcei", "h100-pcie"),
                                         ("mi300xx", "mi300x")])
def test_a_misspelled_id_is_a_miss_with_a_suggestion_not_another_variant(typo, meant):
    from sim_core import catalog

    assert catalog.resolve_gpu(typo) is None
    with pytest.raises(catalog.CatalogError, match=f"did you mean '{meant}'"):
        catalog.get_gpu(typo)
