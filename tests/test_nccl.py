"""NCCL cost model: published reference points, properties, nccl-tests parser and profiles.

Run with `pytest -s tests/test_nccl.py` to see the model-vs-published table.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim_core import nccl
from sim_core.nccl_tests import load_profile, parse_output

REF = Path(__file__).resolve().parents[1] / "sim_core" / "data" / "nccl_reference.csv"
A100 = dict(sm_arch=80, nvlink_bw_gbs=300.0, nvls=False, nic_bw_gbs=25.0)
H100 = dict(sm_arch=90, nvlink_bw_gbs=450.0, nvls=True, nic_bw_gbs=50.0)
H100_NO_NVLS = dict(H100, nvls=False)
# Large-message points: the peak busbw is what the model is calibrated to reproduce (one
# efficiency per link type), so 25% leaves room for cluster-to-cluster spread (the sources
# themselves give ranges of +-5-10%, e.g. 190-220 or 230-250 GB/s).
LARGE_TOL = 0.25
# Median over every asserted busbw point: the published values are ranges and single runs;
# 10% is the spread of those ranges.
MEDIAN_TOL = 0.10


def _row_net(r):
    return dict(sm_arch=r["sm_arch"], nvlink_bw_gbs=r["nvlink_bw_gbs"], nvls=bool(r["nvls"]),
                nic_bw_gbs=r["nic_bw_gbs"], intra_latency_us=r["intra_latency_us"],
                inter_latency_us=r["inter_latency_us"])


def _model(r):
    out = nccl.collective_time(r["op"], np.array([float(r["nbytes"])]), int(r["group"]),
                               int(r["nodes"]), _row_net(r))
    return {k: v[0] for k, v in out.items()}


@pytest.fixture(scope="module")
def ref():
    return pd.read_csv(REF)


def test_reference_table(ref):
    rows = []
    for _, r in ref.iterrows():
        m = _model(r)
        meas = r["measured_busbw_gbs"] if pd.notna(r["measured_busbw_gbs"]) else np.nan
        model_val = m["busbw_gbs"]
        if pd.isna(meas) and pd.notna(r["measured_time_us"]):
            meas, model_val = r["measured_time_us"], m["time_s"] * 1e6
            unit = "us"
        elif pd.notna(r["measured_chunk_bytes"]):
            meas = r["measured_chunk_bytes"]
            model_val = float(nccl.tree_ll128_chunk_bytes(r["nbytes"], r["group"], r["nodes"],
                                                          r["sm_arch"]))
            unit = "B chunk"
        else:
            unit = "GB/s"
        rows.append(dict(kind=r["kind"], gpu=r["gpu"], op=r["op"], group=r["group"],
                         nodes=r["nodes"], nbytes=r["nbytes"], unit=unit, measured=meas,
                         model=model_val, err=model_val / meas - 1.0,
                         algo=nccl.ALGORITHMS[m["algo"]], proto=nccl.PROTOCOLS[m["proto"]],
                         source=r["source"][:48]))
    tab = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_rows", 200,
                           "display.max_colwidth", 48):
        print("\nNCCL model vs published reference points")
        print(tab.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    asserted = tab[tab.kind == "large"]
    print(f"large-message busbw: median |err| {asserted.err.abs().median():.1%}, "
          f"max |err| {asserted.err.abs().max():.1%} over {len(asserted)} points")
    assert (asserted.err.abs() <= LARGE_TOL).all(), asserted[asserted.err.abs() > LARGE_TOL]
    assert asserted.err.abs().median() <= MEDIAN_TOL
    chunk = tab[tab.kind == "chunk"]
    assert len(chunk) == 7 and (chunk.err.abs() < 1e-9).all()  # Echo Table 6, exactly


def test_neuronabox_shape(ref):
    """Table 1 (2 nodes x 1 V100, 100GbE) runs ~40x below line rate (a socket-class path the
    model does not describe), so only its shape is checked: 1-32 KB calls are latency-bound
    (time nearly flat) and 128 MB -> 1 GB scales with bytes, in the data and in the model."""
    sh = ref[ref.kind == "shape"]
    for op in ("all_reduce", "all_gather"):
        d = sh[sh.op == op]
        model = {int(r["nbytes"]): _model(r)["time_s"] for _, r in d.iterrows()}
        meas = {int(r["nbytes"]): r["measured_time_us"] for _, r in d.iterrows()}
        assert meas[32768] / meas[1024] < 1.5 and model[32768] / model[1024] < 1.5
        assert 7.0 < meas[1073741824] / meas[134217728] < 9.0
        assert 7.0 < model[1073741824] / model[134217728] < 9.0


SIZES = 2.0 ** np.arange(0, 35)


@pytest.mark.parametrize("net", [A100, H100, H100_NO_NVLS])
@pytest.mark.parametrize("op", nccl.COLLECTIVES)
@pytest.mark.parametrize("group,nodes", [(2, 1), (8, 1), (16, 2), (64, 8), (8, 8), (2, 2)])
def test_time_monotone_in_bytes(net, op, group, nodes):
    t = nccl.collective_time(op, SIZES, group, nodes, net)["time_s"]
    assert np.all(np.diff(t) >= -1e-12 * t[1:])
    assert np.all(t > 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5), st.floats(1.0, 3e10), st.sampled_from([2, 4, 8, 16, 32, 64, 256]),
       st.sampled_from([1, 2, 3, 4, 8, 32]), st.sampled_from([A100, H100, H100_NO_NVLS]))
def test_busbw_below_link_peak(op, nbytes, group, nodes, net):
    nodes = min(nodes, group)
    k = group // nodes
    out = nccl.collective_time(np.array([op]), np.array([nbytes]), group, nodes, net)
    bus = out["busbw_gbs"][0]
    nvls_ratio = nccl.NVLS_AR_RATIO[1] if net["nvls"] else 1.0
    assert bus <= net["nvlink_bw_gbs"] * nvls_ratio * 1.0001
    if nodes > 3 and op in (nccl.AR, nccl.AG, nccl.RS, nccl.BC):
        # ring/tree across >3 nodes (2 and 3 nodes get the tree's 2x and 4/3x): the node's
        # NICs carry everything (k GPUs' worth)
        assert bus <= k * net["nic_bw_gbs"] * 1.0001


def test_group_one_and_zero_bytes_are_free():
    out = nccl.collective_time(np.arange(6), np.full(6, 1e9), 1, 1, H100)
    assert np.all(out["time_s"] == 0.0)
    out = nccl.collective_time("all_reduce", np.array([0.0]), 8, 1, H100)
    assert out["time_s"][0] == 0.0


def test_all_gather_half_of_all_reduce_on_ring():
    big = np.array([2.0 ** 30])
    for net, (g, nn) in ((A100, (8, 1)), (H100_NO_NVLS, (8, 1)), (A100, (64, 8))):
        ar = nccl.collective_time("all_reduce", big, g, nn, net)
        ag = nccl.collective_time("all_gather", big, g, nn, net)
        assert nccl.ALGORITHMS[ag["algo"][0]] == "ring"
        assert 0.42 < ag["time_s"][0] / ar["time_s"][0] < 0.58


@pytest.mark.parametrize("op", nccl.COLLECTIVES)
@pytest.mark.parametrize("net", [A100, H100])
def test_multi_node_slower_than_single_node(op, net):
    s = 2.0 ** np.arange(10, 33, 2)
    g = 2 if op == "send_recv" else 16
    one = nccl.collective_time(op, s, g, 1, net)["time_s"]
    two = nccl.collective_time(op, s, g, 2, net)["time_s"]
    assert np.all(two > one)


@pytest.mark.parametrize("net", [A100, H100])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
@pytest.mark.parametrize("group,nodes", [(8, 1), (32, 4)])
def test_protocol_choice(net, op, group, nodes):
    out = nccl.collective_time(op, np.array([64.0, 8.0 * 2 ** 30]), group, nodes, net)
    assert nccl.PROTOCOLS[out["proto"][0]] == "ll"
    assert nccl.PROTOCOLS[out["proto"][1]] == "simple"


def test_small_messages_far_below_peak():
    """Echo Fig. 2 / NeuronaBox Table 1: small all-reduces are latency-bound."""
    s = np.array([2.0 ** 12, 2.0 ** 20, 2.0 ** 22, 2.0 ** 33])
    bus = nccl.collective_time("all_reduce", s, 8, 1, A100)["busbw_gbs"]
    assert bus[0] < 0.02 * bus[-1] and bus[1] < 0.5 * bus[-1] and bus[2] < 0.8 * bus[-1]
    t = nccl.collective_time("all_reduce", np.array([8.0, 4096.0]), 8, 1, A100)["time_s"]
    assert 5e-6 < t[0] < 50e-6 and t[1] / t[0] < 1.5


def test_algorithm_choice_follows_topology():
    big, small = np.array([2.0 ** 31]), np.array([2.0 ** 14])
    assert nccl.ALGORITHMS[nccl.collective_time("all_reduce", big, 8, 1, H100)["algo"][0]] == "nvls"
    assert nccl.ALGORITHMS[nccl.collective_time("all_reduce", big, 64, 8, H100)["algo"][0]] == "nvls_tree"
    assert nccl.ALGORITHMS[nccl.collective_time("all_reduce", big, 8, 1, A100)["algo"][0]] == "ring"
    assert nccl.ALGORITHMS[nccl.collective_time("all_reduce", small, 128, 16, A100)["algo"][0]] == "tree"
    # multi-node ring is limited by the NICs of the group's GPUs in each node
    b1 = nccl.collective_time("all_gather", big, 16, 16, A100)["busbw_gbs"][0]
    b8 = nccl.collective_time("all_gather", big, 128, 16, A100)["busbw_gbs"][0]
    assert 0.8 * 25 < b1 <= 25 and 0.8 * 200 < b8 <= 200


def test_all_to_all_off_node_through_nics():
    big = np.array([2.0 ** 30])
    intra = nccl.collective_time("all_to_all", big, 8, 1, H100)["busbw_gbs"][0]
    inter = nccl.collective_time("all_to_all", big, 64, 8, H100)["busbw_gbs"][0]
    assert intra > 250 and inter < 60  # (n-1)/(n-k) x NIC per GPU ~ 1.1 x 47


def test_vectorized_mixed_inputs_match_scalar_calls():
    rng = np.random.default_rng(1)
    m = 500
    op = rng.integers(0, 6, m)
    s = 10 ** rng.uniform(0, 10, m)
    g = 2 ** rng.integers(0, 8, m)
    nn = np.maximum(g // 8, 1)
    arch = rng.choice([80, 90, 100], m)
    net = dict(sm_arch=arch, nvlink_bw_gbs=np.where(arch == 80, 300.0, 450.0),
               nvls=arch >= 90, nic_bw_gbs=np.where(arch == 80, 25.0, 50.0))
    out = nccl.collective_time(op, s, g, nn, net)
    for i in rng.choice(m, 40, replace=False):
        one = nccl.collective_time(int(op[i]), s[i:i + 1], g[i], nn[i],
                                   {k: v[i] for k, v in net.items()})
        assert one["time_s"][0] == pytest.approx(out["time_s"][i], rel=1e-6)
        assert one["algo"][0] == out["algo"][i] and one["proto"][0] == out["proto"][i]


def test_p2p_time():
    t = nccl.p2p_time(np.array([2.0 ** 26, 2.0 ** 26]), np.array([True, False]), H100)
    assert t[0] < t[1]
    assert 2.0 ** 26 / t[1] / 1e9 == pytest.approx(47.0, rel=0.1)


# ---- nccl-tests parser and measured profiles -----------------------------------------------
SAMPLE = """\
# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 8(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  11001 on    node-a device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  11002 on    node-a device  1 [0x2a] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  11003 on    node-a device  2 [0x3a] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  11004 on    node-a device  3 [0x5d] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  22001 on    node-b device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  22002 on    node-b device  1 [0x2a] NVIDIA H100 80GB HBM3
#  Rank  6 Group  0 Pid  22003 on    node-b device  2 [0x3a] NVIDIA H100 80GB HBM3
#  Rank  7 Group  0 Pid  22004 on    node-b device  3 [0x5d] NVIDIA H100 80GB HBM3
NCCL version 2.21.5+cuda12.4
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    30.12    0.03    0.06      0    29.80    0.03    0.06      0
        8192          2048     float     sum      -1    33.50    0.24    0.43      0    33.01    0.25    0.43      0
       65536         16384     float     sum      -1    45.02    1.46    2.55      0    44.90    1.46    2.55      0
      524288        131072     float     sum      -1    80.40    6.52   11.41      0    79.95    6.56   11.48      0
     4194304       1048576     float     sum      -1    220.5   19.02   33.29      0    219.8   19.08   33.40      0
    33554432       8388608     float     sum      -1   1105.3   30.36   53.13      0   1101.2   30.47   53.33      0
   268435456      67108864     float     sum      -1   7440.1   36.08   63.14      0   7431.7   36.12   63.21      0
  1073741824     268435456     float     sum      -1    28990   37.04   64.82      0    28970   37.06   64.86      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 29.01
#
"""


def test_parse_nccl_tests_output():
    rows = parse_output(SAMPLE, op="all_reduce_perf")
    assert len(rows) == 8
    r = rows[4]
    assert r["op"] == "all_reduce" and r["group"] == 8 and r["nodes"] == 2
    assert r["size"] == 4194304 and r["count"] == 1048576 and r["dtype"] == "float"
    assert r["oop_time_us"] == 220.5 and r["oop_busbw"] == 33.29 and r["ip_busbw"] == 33.40
    assert r["oop_wrong"] == 0 and r["root"] == -1
    # busbw = algbw * 2(n-1)/n for all-reduce
    assert r["oop_busbw"] == pytest.approx(r["oop_algbw"] * 2 * 7 / 8, rel=0.01)
    # older format without the root column
    old = "\n".join(" ".join(l.split()[:4] + l.split()[5:]) if l.strip()[:1].isdigit() else l
                    for l in SAMPLE.splitlines())
    rows_old = parse_output(old, op="all_reduce")
    assert [x["oop_busbw"] for x in rows_old] == [x["oop_busbw"] for x in rows]


def test_profile_override_reproduces_measurements(tmp_path):
    path = tmp_path / "all_reduce_perf_2n.txt"
    path.write_text(SAMPLE)
    prof = load_profile([path])
    rows = parse_output(SAMPLE, op="all_reduce")
    sizes = np.array([r["size"] for r in rows], dtype=float)
    meas = np.array([r["oop_busbw"] for r in rows])
    out = nccl.collective_time("all_reduce", sizes, 8, 2, H100, profile=prof)
    np.testing.assert_allclose(out["busbw_gbs"], meas, rtol=1e-6)
    assert np.all(out["algo"] == -1)
    # interpolation in log(size) between points, clamped beyond the ends
    mid = nccl.collective_time("all_reduce", np.array([2.0 ** 21, 2.0 ** 40, 16.0]), 8, 2, H100,
                               profile=prof)["busbw_gbs"]
    assert 11.41 < mid[0] < 33.29 and mid[1] == pytest.approx(64.82) and mid[2] == pytest.approx(0.06)
    # other (op, group, nodes) keep the analytical model
    other = nccl.collective_time("all_reduce", sizes, 16, 2, H100, profile=prof)
    assert np.all(other["algo"] >= 0)
