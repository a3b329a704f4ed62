"""Kernel loaders on real profiler exports (tests/data/profiler, each cited in its README):
what they extract, what they say, and that what cannot train is not passed off as shapes."""

from pathlib import Path

import numpy as np
import pytest

from sim_core.calibration import kernels

DATA = Path(__file__).parent / "data" / "profiler"


def test_every_file_is_cited():
    readme = (DATA / "README.md").read_text()
    for f in DATA.iterdir():
        if f.name != "README.md":
            assert f"`{f.name}`" in readme, f.name


def test_kineto_trace_with_shapes_gives_gemm_shapes_and_kernel_times():
    df = kernels.load_kernels(DATA / "hta_sampled_rank0_shapes.json.gz")
    shaped = df[df["m"].notna()]
    assert len(shaped) == 377 and set(shaped["op_class"]) == {"gemm"}
    assert set(shaped["dtype"]) == {"fp32"}  # 'Input type': ['float', 'float']
    assert (shaped["time_us"] > 0).all()
    # aten::mm [[2, 2048], [2048, 1]] -> m=2, k=2048, n=1, as recorded
    assert ((shaped["m"] == 2) & (shaped["k"] == 2048) & (shaped["n"] == 1)).any()
    # kernels outside the recognised ops are kept, classed by name, without shapes
    rest = df[df["m"].isna()]
    assert {"communication", "elementwise"} <= set(rest["op_class"])
    assert rest["name"].str.startswith("ncclKernel").sum() + \
        rest["name"].str.startswith("ncclDevKernel").sum() == (rest["op_class"] == "communication").sum()
    assert df["gpu"].isna().all() and "names no device" in df.attrs["notes"][0]
    # every kernel event is counted once: the rows' time is the trace's kernel time
    import gzip
    import json

    ev = json.loads(gzip.open(DATA / "hta_sampled_rank0_shapes.json.gz").read())["traceEvents"]
    total = sum(e["dur"] for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X")
    assert df["time_us"].sum() == pytest.approx(total)


def test_trace_without_shapes_names_its_gpu_and_trains_nothing():
    df = kernels.load_kernels(DATA / "hta_alexnet_a100_no_shapes.json.gz")
    assert len(df) == 79 and df["m"].isna().all()
    assert set(df["gpu"]) == {"a100-40gb"}  # 'NVIDIA A100-PG509-200', 42 GB
    assert (df["op_class"] == "gemm").sum() == 20
    assert any("record_shapes=False" in n for n in df.attrs["notes"])
    assert kernels.train_kernel_models(df, log=lambda *_: None) == {}


@pytest.mark.parametrize("name", ["hta_cpu_only.json.gz", "hta_cupti_profiler_no_kernels.json.gz"])
def test_traces_without_kernel_events_give_no_rows_and_say_why(name):
    df = kernels.load_kernels(DATA / name)
    assert len(df) == 0
    assert any("no GPU kernel events" in n for n in df.attrs["notes"])


def test_nsys_console_output_every_kernel_section():
    df = kernels.load_kernels(DATA / "nsys_stats_console_rtx2080ti.md")
    assert list(df["section"]) == [0, 0, 0, 0, 1]  # naive run: 4 kernels; flash run: 1
    mm = df[df["name"].str.startswith("matrix_multiply")].iloc[0]
    # "1,612,880,076  2  806,440,038.0": Avg (ns) with thousands separators -> us
    assert mm["time_us"] == pytest.approx(806440.038) and mm["instances"] == 2
    assert mm["op_class"] == "gemm"
    flash = df[df["name"].str.startswith("flash_attn_forward_kernel")].iloc[0]
    assert flash["op_class"] == "attention" and flash["name"].endswith("…")
    assert flash["time_us"] == pytest.approx(12085.42)
    assert df[["m", "n", "k", "seq"]].isna().all().all()  # a summary has no shapes


def test_real_nsys_csv_export_with_tool_lines_before_the_header():
    df = kernels.load_kernels(DATA / "nsys_kern_sum_csv_polyfhe.csv")
    assert len(df) == 15 and df["name"].str.contains(",").all()  # quoted signatures
    first = df.iloc[0]
    # 28.4,1791874,5,358374.8,... "phantom::key_switch_inner_prod_c2_and_evk(...)"
    assert first["name"].startswith("phantom::key_switch_inner_prod_c2_and_evk(")
    assert first["time_us"] == pytest.approx(358.3748) and first["instances"] == 5
    assert (df["op_class"] == "gemm").sum() == 2  # the two bconv_matmul kernels, by name


def test_nsys_csv_with_preamble_and_quoted_names(tmp_path):
    # the layout `nsys stats --format csv` prints: tool lines first, names quoted with commas
    f = tmp_path / "k.csv"
    f.write_text("Generating SQLite file r.sqlite from r.nsys-rep\nProcessing [r.sqlite] with "
                 "[cuda_gpu_kern_sum.py]...\n"
                 "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),"
                 "StdDev (ns),Name\n"
                 '60.0,600000,10,60000.0,60000.0,1,2,0.0,"sm90_xmma_gemm_bf16bf16_bf16f32, tn"\n'
                 "40.0,400000,8,50000.0,50000.0,1,2,0.0,ncclDevKernel_AllReduce_Sum_bf16_RING_LL\n")
    df = kernels.load_kernels(f)
    assert list(df["op_class"]) == ["gemm", "communication"]
    assert list(df["time_us"]) == [60.0, 50.0] and df["dtype"].iloc[0] == "bf16"


def test_gpu_from_device_uses_memory_to_tell_variants():
    assert kernels.gpu_from_device("NVIDIA A100-SXM4-80GB", 85e9) == "a100-80gb"
    assert kernels.gpu_from_device("NVIDIA A100-PG509-200", 42.3e9) == "a100-40gb"
    assert kernels.gpu_from_device("NVIDIA H100 80GB HBM3", 85e9) == "h100-sxm"
    assert kernels.gpu_from_device("Tesla T4", 16e9) is None


def test_cli_inspect_prints_what_each_file_gives(capsys, tmp_path):
    from sweep.cli import main

    out_csv = tmp_path / "rows.csv"
    assert main(["calibrate", "inspect", *map(str, sorted(DATA.glob("*.gz"))),
                 str(DATA / "nsys_stats_console_rtx2080ti.md"),
                 str(DATA / "nsys_kern_sum_csv_polyfhe.csv"), "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "hta_sampled_rank0_shapes.json.gz: 1145 kernel rows, 377 with shapes" in out
    assert "GPU a100-40gb" in out and "no GPU kernel events" in out
    import pandas as pd

    assert len(pd.read_csv(out_csv)) == 1145 + 79 + 5 + 15
    assert np.isfinite(pd.read_csv(out_csv)["time_us"]).all()


def test_cli_unreadable_file_is_one_line(capsys, tmp_path):
    from sweep.cli import main

    bad = tmp_path / "x.csv"
    bad.write_text("hello\n1\n")
    assert main(["calibrate", "inspect", str(bad)]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot read it" in err
