"""nccl-tests logs as users have them (tests/data/nccl_logs, each cited in its README): what
read_log recovers from each, what it infers and says, where it asks, and that
`sweep calibrate nccl` fits each one's own curve."""

import re
from pathlib import Path

import numpy as np
import pytest

from sim_core import profiles
from sim_core.calibration import nccl as nccl_fit
from sim_core.nccl_tests import read_log, strip_prefix

LOGS = Path(__file__).parent / "data" / "nccl_logs"


def _log(name, **kw):
    return read_log((LOGS / name).read_text(errors="replace"), **kw)


pytestmark = pytest.mark.usefixtures("isolated_profiles")


def test_every_log_is_cited():
    readme = (LOGS / "README.md").read_text()
    for f in LOGS.glob("*.log"):
        assert f"`{f.name}`" in readme, f.name


def test_launcher_prefixes_are_stripped():
    assert strip_prefix("[1,0]<stdout>:#  Rank  0 Group") == "#  Rank  0 Group"
    assert strip_prefix("(head, rank=0, pid=3808) (head, rank=0, pid=3808)    1024  x") == \
        "1024  x"
    assert strip_prefix("3: 1024 256 float") == "1024 256 float"


# (file, rows, collective, ranks, nodes, first size, its out-of-place time in us): read off
# each file by eye.
CASES = [
    ("aws_efa_eks_p4d_allreduce_mpijob.log", 30, "all_reduce", 16, 2),
    ("gcp_a3mega_h100_allreduce_mpirun.log", 31, "all_reduce", 16, 2),
    ("skypilot_gke_h200_allgather_prefixed.log", 24, "all_gather", 16, 2),
    ("oci_bm_gpu4_a100_allreduce_2node_linear.log", 1, "all_reduce", 16, 2),
    ("nccl_tests_issue331_a100_sendrecv_info_na.log", 29, "all_reduce", 2, 1),
    ("nccl_tests_issue232_h100_2node_1gpu.log", 5, "all_reduce", 2, None),
    ("nccl_tests_issue176_old_error_column.log", 6, "all_reduce", 128, None),
    ("nccl_tests_issue119_console_rows_linear.log", 11, "all_reduce", 24, None),
    # rccl-tests (AMD Instinct MI300X, issue 26): the same table under RCCL/HIP/ROCm headers
    ("rocm_blog_mi300x_rccl_xgmi_8xMI300X.log", 32, "all_reduce", 8, 1),
    ("rocm_blog_mi300x_rccl_xgmi_8xMI300X_graph.log", 32, "all_reduce", 8, 1),
    ("rccl_issue1562_8xMI300X_VF_azure.log", 25, "all_reduce", 8, 1),
    # issue 38: 8x MI350X (gfx950), one process driving 8 GPUs and one rank per GPU
    ("ihc_mi350x_allreduce_1proc_g8_8xMI350X.log", 31, "all_reduce", 8, 1),
    ("ihc_mi350x_allreduce_mpirun_8xMI350X_dips.log", 31, "all_reduce", 8, 1),
]


@pytest.mark.parametrize("name,rows,op,ranks,nodes", CASES)
def test_each_real_log_parses(name, rows, op, ranks, nodes):
    log = _log(name)
    assert len(log.rows) == rows
    assert (log.op, log.group, log.nodes) == (op, ranks, nodes)
    t = np.array([r["oop_time_us"] for r in log.rows])
    assert np.all(t > 0)
    sizes = [r["size"] for r in log.rows]
    assert sizes == sorted(sizes)
    assert all(n.startswith(("collective", f"{ranks} ranks", f"{nodes} node")) for n in log.notes)


def test_values_are_read_from_the_right_columns():
    aws = _log("aws_efa_eks_p4d_allreduce_mpijob.log").rows
    # "[1,0]<stdout>:  4294967296  1073741824  float  sum  183834  23.36  43.81  5e-07 ..."
    big = aws[-1]
    assert (big["size"], big["oop_time_us"], big["oop_busbw"], big["ip_time_us"]) == \
        (4294967296, 183834, 43.81, 184216)
    assert big["oop_wrong"] == pytest.approx(5e-7) and big["root"] == -1
    old = _log("nccl_tests_issue176_old_error_column.log").rows
    assert old[0]["root"] == -1  # no root column there
    assert (old[0]["size"], old[0]["oop_time_us"], old[0]["ip_time_us"]) == (4096, 93.73, 93.15)
    assert old[0]["oop_wrong"] == pytest.approx(1e-6)
    na = _log("nccl_tests_issue331_a100_sendrecv_info_na.log").rows
    assert all(r["oop_wrong"] == 0 and np.isnan(r["ip_wrong"]) for r in na)  # "N/A"
    one = _log("oci_bm_gpu4_a100_allreduce_2node_linear.log").rows[0]
    assert (one["size"], one["oop_time_us"], one["oop_busbw"]) == (10737418240, 104989, 191.76)


def test_inferences_are_stated():
    sky = _log("skypilot_gke_h200_allgather_prefixed.log")
    assert any("no reduction" in n and "--op alltoall" in n for n in sky.notes)
    console = _log("nccl_tests_issue119_console_rows_linear.log")
    assert any(n.startswith("24 ranks: busbw/algbw") for n in console.notes)
    launch = _log("nccl_tests_issue232_h100_2node_1gpu.log")
    assert any("launch command (2 processes x 1" in n for n in launch.notes)
    title = _log("nccl_tests_issue176_old_error_column.log")
    assert any("'128 GPU(s)/ranks' in the log's text" in n for n in title.notes)
    # without the title, the ratio alone admits many counts and the reader asks
    text = (LOGS / "nccl_tests_issue176_old_error_column.log").read_text()
    bare = read_log(text.replace("128 GPU", "many GPUs"))
    assert bare.group is None and any("rank counts" in n for n in bare.notes)


def test_given_options_override_the_inference():
    log = _log("nccl_tests_issue331_a100_sendrecv_info_na.log", op="sendrecv", ranks=2, nodes=1)
    assert (log.op, log.group, log.nodes) == ("send_recv", 2, 1)


def test_nodes_from_the_bandwidth_when_the_log_lists_no_hosts():
    notes = {}
    df = nccl_fit.nccl_rows([LOGS / "nccl_tests_issue232_h100_2node_1gpu.log"], gpu="h100-sxm",
                           notes=notes)
    assert set(df["nodes"]) == {2}  # 41 GB/s over 2 ranks cannot be NVLink
    assert any("one rank per node" in n for v in notes.values() for n in v)
    df = nccl_fit.nccl_rows([LOGS / "nccl_tests_issue119_console_rows_linear.log"],
                           gpu="h100-sxm")
    assert set(df["nodes"]) == {3}  # 24 ranks packed 8 to a node


def test_unknown_gpu_is_one_line_naming_gpu_and_a_table_without_names_is_said():
    with pytest.raises(ValueError, match=r"GPU 'Tesla T4' .* not in the catalog; give --gpu"):
        nccl_fit.nccl_gpu([LOGS / "nccl_issue428_t4_info_unknown_gpu.log"])
    notes = {}
    gpu = nccl_fit.nccl_gpu([LOGS / "nccl_tests_issue119_console_rows_linear.log"], notes=notes)
    assert gpu == nccl_fit.DEFAULT_NCCL_GPU and "name none" in notes["*"][0]
    assert nccl_fit.nccl_gpu([LOGS / "gcp_a3mega_h100_allreduce_mpirun.log"]) == "h100-sxm"
    assert nccl_fit.nccl_gpu([LOGS / "aws_efa_eks_p4d_allreduce_mpijob.log"]) == "a100-40gb"
    assert nccl_fit.nccl_gpu([LOGS / "skypilot_gke_h200_allgather_prefixed.log"]) == "h200"


def test_cli_unknown_gpu_exits_non_zero_with_one_line(capsys):
    from sweep.cli import main

    rc = main(["calibrate", "nccl", str(LOGS / "nccl_issue428_t4_info_unknown_gpu.log"),
               "--profile", "t4"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err and "--gpu" in err and "Traceback" not in err


# a curve whose large sizes are disturbed (the mpirun MI350X run: 64 MiB and 512 MiB-2 GiB at
# 2-4x the neighbouring sizes' time, in-place columns too): fitted, but not to 10%
NOISY = {"ihc_mi350x_allreduce_mpirun_8xMI350X_dips.log"}
CURVES = [c[0] for c in CASES if c[1] >= 5 and c[0] not in NOISY]


@pytest.mark.parametrize("name", CURVES)
def test_calibrate_fits_each_logs_own_curve_and_prints_it(name, capsys):
    """Target of issue 15: the fitted median error above 1 MiB within 10% on each curve."""
    from sweep.cli import main

    assert main(["calibrate", "nccl", str(LOGS / name), "--profile", "p"]) == 0
    out = capsys.readouterr().out
    print(out)
    line = next(x for x in out.splitlines() if x.strip().startswith(name) and "sizes:" in x)
    default, fitted = map(float, re.search(r"default\s+([\d.]+)% -> fitted\s+([\d.]+)%",
                                           line).groups())
    assert fitted <= 10.0 and fitted < default


def test_a_profile_from_a_log_without_hosts_loads_with_what_calibration_resolved():
    """The saved profile re-reads its logs at activation: a log that needed inference (ranks
    from the launch command, nodes from the bandwidth) must load the same curve."""
    from sweep.cli import main

    name = "nccl_tests_issue232_h100_2node_1gpu.log"
    assert main(["calibrate", "nccl", str(LOGS / name), "--profile", "ib"]) == 0
    man = profiles.activate("ib")
    c = man["components"]["nccl"]
    assert c["curves"][name] == {"op": "all_reduce", "group": 2, "nodes": 2}
    from sim_core.nccl_tests import load_profile

    prof = load_profile([profiles.profile_dir("ib") / i["file"] for i in c["inputs"]],
                        curves=c["curves"])
    assert list(prof.curves) == [("all_reduce", 2, 2)]
    with pytest.raises(ValueError, match="nodes"):
        load_profile([LOGS / name])


def _fit_line(name, capsys):
    from sweep.cli import main

    assert main(["calibrate", "nccl", str(LOGS / name), "--profile", "p"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith(name) and "sizes:" in x)
    return tuple(map(float, re.search(r"default\s+([\d.]+)% -> fitted\s+([\d.]+)%",
                                      line).groups()))


@pytest.mark.parametrize("name", sorted(NOISY))
def test_a_disturbed_curve_is_still_fitted_better_than_the_default(name, capsys):
    default, fitted = _fit_line(name, capsys)
    assert fitted < default


def test_a_failed_rccl_run_says_it_failed():
    """ROCm/rccl issue 1728: 4x MI300X VF, RCCL init fails ('Failed to find reverse path'), the
    table never comes: one line naming the failure, not 'no rows' alone."""
    name = "rccl_issue1728_4xMI300X_VF_reverse_path_failure.log"
    assert _log(name).rows == []
    with pytest.raises(ValueError, match=r"no nccl-tests result rows.*the run failed \(internal "
                                         r"error - please report this issue"):
        nccl_fit.nccl_rows([LOGS / name])


def test_gfx950_links_are_priced_as_rccl_models_them():
    """RCCL models a gfx950 Infinity Fabric link at 48 GB/s, as a gfx942 one (ROCm/rccl
    @08814b0a topo.h GFX95X_XGMI_WIDTH = GFX94X_XGMI_WIDTH = 48.0), although CDNA4's datasheet
    link is 76.8 GB/s per direction against CDNA3's 64: a large 8-GPU all-reduce takes the
    same time on MI350X/MI355X as on MI300X. On the MI350X logs' undisturbed large sizes (the
    mpirun run's 128-256 MiB, the one-process run's 512 MiB-1 GiB and 4-8 GiB) the default model
    is 3-10% slow (at 57.6 GB/s per link it was 8-13% fast)."""
    import pandas as pd

    df = pd.DataFrame({"op": ["all_reduce"], "group": [8], "nodes": [1], "size": [2**33]})
    t = {g: nccl_fit.nccl_model_us(df, nccl_fit.base_network(g))[0]
         for g in ("mi300x", "mi350x", "mi355x")}
    assert t["mi350x"] == pytest.approx(t["mi300x"], rel=1e-6) == t["mi355x"]
    mpi = nccl_fit.nccl_rows([LOGS / "ihc_mi350x_allreduce_mpirun_8xMI350X_dips.log"])
    one = nccl_fit.nccl_rows([LOGS / "ihc_mi350x_allreduce_1proc_g8_8xMI350X.log"])
    clean = pd.concat([mpi[mpi["size"].isin([2**27, 2**28])],
                       one[one["size"].isin([2**29, 2**30, 2**32, 2**33])]])
    err = nccl_fit.nccl_model_us(clean, nccl_fit.base_network("mi350x")) / clean[
        "oop_time_us"].to_numpy() - 1
    assert len(err) == 6 and np.all((err > 0.0) & (err < 0.11))
