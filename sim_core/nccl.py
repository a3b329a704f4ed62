"""White-box NCCL cost model, vectorized over configurations.

Why white-box: NCCL does not run one algorithm. For every call it estimates the time of each
(algorithm, protocol) pair as latency + bytes / bandwidth and runs the cheapest (NCCL
src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime). Small messages are therefore
latency-bound (LL, tens of microseconds) and far below peak bus bandwidth, large ones run Simple
near link speed, and multi-node groups switch between ring, double-binary tree and NVLS-tree.
This module reproduces that choice with NCCL's own latency tables, protocol efficiencies, chunk
rules and channel counts, on top of a physical bandwidth model (NVLink per GPU, NIC per GPU, how
many ranks of the group share a node) calibrated once against published nccl-tests peaks.

Conventions (nccl-tests, see modeling-notes sec. 1): `nbytes` is the all-reduce buffer, the
all-gather OUTPUT, the reduce-scatter INPUT, the all-to-all bytes each rank sends (incl. to
itself), the broadcast buffer, the bytes one rank sends in send_recv. busbw = algbw * f with
f = 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all), 1 otherwise.

Point-to-point (pipeline send/recv, ring-attention exchange) is op "send_recv" with group 2 and
nodes 1 (same node) or 2; `p2p_time` is a shorthand for that.

AMD Instinct nodes (net["mesh_links"] > 0) have no switch: each GPU has one Infinity Fabric link
to each of its 7 peers. RCCL (ROCm/rccl develop 0cbce2a7, 2024-10-24, the RCCL of ROCm 6.2/6.3)
runs many rings over that mesh at once, so a group reaches one link per peer it has on the node,
(k - 1) links, not the GPU's whole bandwidth as through NVSwitch; it has its own latency tables,
no LL128 and no single-node tree/Simple; and an 8-GPU all-reduce up to 16 MiB runs an MSCCL
all-pairs (one-shot: reduce-scatter then all-gather with every peer at once) schedule. See the
RCCL block of constants below.
"""

from __future__ import annotations

import numpy as np

from . import distinct

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "p2p", "allpairs")
PROTOCOLS = ("ll", "ll128", "simple")

AR, AG, RS, A2A, BC, SR = range(6)
RING, TREE, NVLS, NVLS_TREE, P2P, ALLPAIRS = range(6)
LL, LL128, SIMPLE = range(3)

# =============================================================================================
# Constants. Arch-indexed tuples are (SM80 Ampere, SM90 Hopper, SM100 Blackwell).
# =============================================================================================
# --- Bandwidth calibration (the only fitted numbers; each from a published nccl-tests peak) ---
# Ring bus bandwidth NCCL reaches over NVLink, as a fraction of the datasheet per-direction
# NVLink bandwidth (net["nvlink_bw_gbs"]: A100 300, H100 450, B200 900 GB/s).
#  SM80: NCCL's own SM80 cap was 235 GB/s (tuning.cc, NCCL 2.8 "busBw = min(busBw, 235)");
#        8x A100 SXM4 nccl-tests all-reduce 230-250 GB/s (docs.alayanew.com nccl-tests guide)
#        -> 235/300 = 0.78.
#  SM90: "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective
#        NVLink bandwidth of 370GB/s" (S. Jeaugey, NVIDIA/nccl-tests#212) -> 370/450 = 0.82.
#  SM100: no public figure found; assumed equal to SM90.
NVL_EFF = (0.78, 0.82, 0.82)
# NVLS (NVLink SHARP) single-node all-reduce peak busbw / datasheet NVLink bandwidth.
#  H100: ~480 GB/s busbw on 8 GPUs (nccl-tests#212, GTC S62129 via nccl#1374), 476 (nccl-tests#290)
#  H200: 475 (nccl-tests#272); H800 (200 GB/s NVLink): 215 (nccl#1374) -> 480/450 = 1.07.
#  SM100: scaled by NCCL's nvlsEfficiency Blackwell/Hopper = 0.74/0.85 (tuning.cc).
NVLS_AR_RATIO = (0.0, 1.07, 1.07 * 0.74 / 0.85)
# NVLS efficiency for all-gather/reduce-scatter (NCCL tuning.cc nvlsEfficiency, Hopper 0.85,
# Blackwell 0.74); NCCL scales it by (ppn-1)/ppn, so ring usually wins by default.
NVLS_EFF = (0.0, 0.85, 0.74)
# Usable fraction of the NIC line rate: "For NDR @ 400Gbps you should see 46-48GB/s per NIC"
# (D. Addison, NVIDIA/nccl-tests#290) -> 47/50 = 0.94.
NIC_EFF = 0.94
# All-to-all (grouped send/recv) relative to ring: thesis (seed 004) 4x A100 NVLink mesh,
# alltoall ~190 GB/s vs all-reduce/all-gather 190-220 GB/s -> 0.9.
A2A_EFF = 0.9

# --- NCCL tuning tables (src/graph/tuning.cc, NCCL 2.2x master) -----------------------------
# base latency (us) per algorithm x protocol (LL, LL128, Simple)
BASE_LAT = {RING: (6.6, 14.0, 8.4), TREE: (6.8, 14.0, 8.4), NVLS: (0.0, 0.0, 0.0),
            NVLS_TREE: (0.0, 0.0, 0.0)}
# per-hop hardware latency (us): NVLink hop and network hop, per algorithm x protocol
HW_LAT_NVL = {RING: (0.6, 1.9, 3.4), TREE: (0.6, 1.25, 4.0), NVLS: (0, 0, 25.0),
              NVLS_TREE: (0, 0, 25.0)}
HW_LAT_NET = {RING: (2.7, 4.0, 14.0), TREE: (5.0, 8.5, 14.0), NVLS: (0, 0, 18.0),
              NVLS_TREE: (0, 0, 20.9)}
# The hop latencies above are scaled by the cluster's latencies relative to these reference
# values (the catalog defaults, clusters.yaml header), so the default cluster gets NCCL's tables.
REF_INTRA_LAT_US = 2.0
REF_INTER_LAT_US = 5.0
NET_OVERHEAD_US = 1.0  # tuning.cc getNetOverhead (x86 Intel), x3 for Simple, per ring step
RING_PLATEAU = 1.4  # tuning.cc: multi-node ring/Simple all-reduce latency x1.4 (SM80+)
# LL max bus bandwidth (GB/s): single node by arch; multi-node by node count (Intel row: N2, N4+)
LL_MAX_BW_1NODE = (87.7, 141.0, 282.0)
LL_MAX_BW_NET = (39.0, 20.4)
# per-channel caps (GB/s): ring LL128, tree (Simple), tree LL128 for N=1, N=2, N>2 nodes
PER_CH_RING_LL128 = (20.0, 36.7, 40.0)
PER_CH_TREE = ((24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_TREE_LL128 = ((20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_NVLS_TREE = ((24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
LL128_EFF = 0.92  # tuning.cc ring LL128 (~120/128 payload)
TREE_EFF = 0.92  # tuning.cc tree all-reduce bandwidth factor
TREE_LL_DIV = 3.8  # tuning.cc tree LL
# Protocol payload efficiency of a line: LL 8-byte lines carry 4 data bytes, LL128 120/128.
LL_PAYLOAD = 0.5

# --- Channels, buffers and chunks (src/include/device.h, comm.h, enqueue.cc) ------------------
# Ring/tree channels: HGX A100 runs 24 channels (NCCL INFO "Channel 23/24", nccl-tests#100);
# 24 also reproduces Echo Table 6's chunk sizes (any 16..30 does). NVLS uses 16 channels.
N_CHANNELS = (24, 24, 32)
N_CHANNELS_NVLS = 16
NCCL_STEPS = 8
STEP_BYTES = (  # buffer / NCCL_STEPS
    8 * 512 * 8 * 16 // NCCL_STEPS,  # LL: lines/thread x threads x steps x 16 B line = 64 KiB
    120 * 640 * 8 * 8 // NCCL_STEPS,  # LL128: 614,400 B (Echo: "base LL128 step 614,400 B")
    (1 << 22) // NCCL_STEPS,  # Simple: 4 MiB buffer -> 512 KiB
)
RING_CHUNK_STEPS_SIMPLE = 4  # ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS = NCCL_STEPS/2
NVLS_CHUNK = 131072  # NCCL_NVLS_CHUNKSIZE default 128 KiB
# Channel tuning: a call uses fewer channels while nBytes < nc * nthreads * threshold
THREADS = (512, 640, 512)  # LL, LL128, Simple max threads
THREAD_THRESHOLD = (8, 8, 64)  # bytes per thread (LL ring: x nRanks)
# --- RCCL on a full Infinity Fabric mesh (ROCm/rccl develop @0cbce2a7571c, 2024-10-24) ---------
# Usable bandwidth of one link as a fraction of its datasheet per-direction rate: RCCL's graph
# search models a gfx94x XGMI link at 48 GB/s (src/graph/topo.h GFX94X_XGMI_WIDTH 48.0) against
# the 64 GB/s per direction of the datasheet (CDNA 3 white paper: 896 GB/s over 7 links, both
# directions); the ROCm RCCL/xGMI blog (2025-03-02) gives the same "approximately 48 GB/s per
# link" after CRC/protocol overhead.
XGMI_EFF = 48.0 / 64.0
# CDNA4 (gfx950): RCCL models its link at the same 48 GB/s (ROCm/rccl @08814b0a src/graph/topo.h
# GFX95X_XGMI_WIDTH 48.0, ncclTopoXGMISpeed "gfx95"), against 76.8 GB/s per direction of the
# datasheet (CDNA 4 white paper: 153.6 GB/s per link, both directions): 48 / 76.8 of it.
XGMI_EFF_GFX95X = 48.0 / 76.8
# tuning.cc baseLat (us) per {LL, LL128, Simple}, the same for tree and ring
RCCL_BASE_LAT = (12.0, 12.0, 17.0)
# tuning_model_5 (the MI300X rome models 79/81/84 set tuning=5, rome_models.cc): XGMI hop
# latency (us) per {LL, LL128, Simple}; LL128 is 0 there and switched off (tuning.cc l.509-514
# enables LL128 by default only on gfx90a)
RCCL_HW_LAT_XGMI = {RING: (0.8, 0.0, 2.1), TREE: (0.9, 0.0, 2.3)}
# MSCCL all-pairs all-reduce (tools/msccl-algorithms/allreduce-allpairs-8n-*.xml, ngpus=8,
# loaded when the rome model sets mscclEnabled, connect.cc l.691): LL up to 524,287 bytes,
# Simple up to 16,777,216 (out-of-place); above that RCCL's rings.
MSCCL_GPUS = 8
MSCCL_LL_MAX = 524287
MSCCL_MAX = 16777216

# --- Point-to-point / all-to-all (not in tuning.cc; NCCL p2p uses LL below 16 KiB) -----------
P2P_LL_THRESHOLD = 16384  # NCCL_P2P_LL_THRESHOLD default
P2P_BASE_US = 5.0  # launch + handshake of a send/recv pair (order of NCCL base latencies)
A2A_PER_PEER_US = 0.5  # issuing one more send/recv pair inside a grouped all-to-all

DEFAULT_NET = {"sm_arch": 90, "nvlink_bw_gbs": 450.0, "nvls": False, "nic_bw_gbs": 50.0,
               "intra_latency_us": REF_INTRA_LAT_US, "inter_latency_us": REF_INTER_LAT_US,
               "mesh_links": 0}

# Arithmetic runs in float32 (2-3x faster than float64 on 100k-element arrays; 7 significant
# digits are far below the model's accuracy); results are returned as float64.
_DT = np.float32
_BIG = 1e30  # 'not applicable' time (us), finite so that 0 * _BIG stays 0

_OP_CODE = {name: i for i, name in enumerate(COLLECTIVES)}


def bus_factor(op, n):
    """nccl-tests busbw / algbw for op codes `op` and group sizes `n`."""
    n = np.asarray(n, dtype=float)
    nn = np.maximum(n, 1.0)
    f = np.where(op == AR, 2.0 * (nn - 1) / nn, (nn - 1) / nn)
    return np.where((op == BC) | (op == SR), 1.0, f)


def _uniform(idx):
    """The single value of an index array if all equal (then tables give scalars), else it."""
    if np.ndim(idx) and idx.size and (idx == idx.flat[0]).all():
        return int(idx.flat[0])
    return idx


def _arch_take(table, ai):
    t = np.asarray(table, dtype=_DT)[ai]
    return float(t) if np.ndim(t) == 0 else t


def _log2i(x):
    """floor(log2(x)) for x >= 1 (NCCL's log2i)."""
    return np.floor(np.log2(np.maximum(x, 1.0)))


def _channels(nbytes, nc_max, proto, n):
    """Channels NCCL actually uses: it drops channels while bytes < nc * threads * threshold."""
    thr = THREAD_THRESHOLD[proto] * THREADS[proto] * (n if proto == LL else 1.0)
    return np.clip(np.floor(nbytes / thr), 1.0, nc_max)


def _tree_ll128_chunk(nbytes, nc, nodes, ppn):
    """Tree/LL128 chunk: NCCL halves the 576,000-B chunk while there are too few per channel.

    This is the rule behind Echo Table 6 (18K..288K for 4..256 MB on 32 H800): the number of
    rounds eta = bytes / (channels * chunk) follows from it instead of being profiled. NCCL
    halves while floor(bytes/(nc*chunk)) < A and chunk > floor_size; the closed form below is the
    number of halvings that loop performs (floor(x) < A  <=>  x < ceil(A)).
    """
    c0 = float(STEP_BYTES[LL128] // 16 * 15)
    steps = 1.0 + _log2i(nodes) + 0.1 * ppn
    per = nbytes / nc
    c = c0
    for mult, floor_size in ((64.0, 131072.0), (16.0, 32768.0)):
        bound = np.maximum(per / np.ceil(steps * mult / ppn), floor_size)
        j = np.maximum(np.ceil(np.log2(c / bound) - 1e-9), 0.0)
        c = c / np.exp2(j)
    return c


def tree_ll128_chunk_bytes(nbytes, group, nodes, sm_arch=90):
    """Public helper (tests, reports): NCCL's tree/LL128 chunk size for an all-reduce."""
    nbytes = np.asarray(nbytes, dtype=float)
    ai = (np.asarray(sm_arch) >= 90).astype(int) + (np.asarray(sm_arch) >= 100)
    nc = _arch_take(N_CHANNELS, ai)
    nodes = np.asarray(nodes, dtype=float)
    return _tree_ll128_chunk(nbytes, nc, nodes, np.asarray(group, dtype=float) / nodes)


def _net_arrays(net, shape):
    out = {}
    for k, d in DEFAULT_NET.items():
        v = net.get(k, d) if net is not None else d
        out[k] = np.broadcast_to(np.asarray(v, dtype=_DT), shape)
    return out


def _sel(m, a, b):
    """Blend b -> a where the 0/1 float mask m is 1 (np.where is branchy on random masks)."""
    return b + m * (a - b)


def _analytical(op, S, n, N, net, families=("ring", "tree", "nvls", "p2p")):
    """Estimated time (s), algorithm, protocol for every element; NCCL-style minimum.

    Every applicable (algorithm, protocol) gets latency + bytes/bandwidth (+ tree pipeline
    fill); inapplicable pairs get +inf; the minimum wins, as in NCCL's topoGetAlgoInfo.
    """
    shape = S.shape
    arch = net["sm_arch"]
    ai = _uniform((arch >= 90).astype(np.int64) + (arch >= 100))
    k = np.maximum(np.floor(n / N), 1.0)  # ranks of the group per node
    multi_b = N > 1
    multi = multi_b.astype(_DT)
    s_in = net["intra_latency_us"] / REF_INTRA_LAT_US
    s_out = net["inter_latency_us"] / REF_INTER_LAT_US
    nvls_ok = ((net["nvls"] > 0) & (arch >= 90) & (k >= 2)).astype(_DT)

    # ---- physical bus bandwidths (GB/s, nccl-tests busbw convention) ------------------------
    b_nvl = net["nvlink_bw_gbs"] * _arch_take(NVL_EFF, ai)
    # full mesh (AMD): the group's k ranks on a node reach each other over k - 1 of the GPU's
    # mesh_links direct links (RCCL's rings over the mesh use one link per peer), each at
    # XGMI_EFF of its datasheet rate. AMD parts index NCCL's newest (SM100) channel and LL
    # tables below; RCCL allows up to 128 channels on gfx94x (connect.cc), so those caps do not
    # bind where bandwidth matters.
    links = net["mesh_links"]
    mesh = (links > 0).astype(_DT)
    any_mesh = bool(mesh.any())
    if any_mesh:
        xgmi_eff = np.where(arch >= 950, XGMI_EFF_GFX95X, XGMI_EFF)  # sm_arch = gfx target
        link_bw = net["nvlink_bw_gbs"] / np.maximum(links, 1.0) * xgmi_eff
        peers = np.maximum(np.minimum(k, links + 1.0) - 1.0, 1.0)
        b_nvl = _sel(mesh, peers * link_bw, b_nvl)
        mesh1 = mesh * (1.0 - multi)  # one mesh node: RCCL's single-node rules apply
    b_nic = net["nic_bw_gbs"] * NIC_EFF  # per GPU
    node_nic = k * b_nic  # a node's ranks of this group share k GPUs' NICs
    # ring: every channel crosses the node boundary once per node, so the NICs of the node
    # carry the whole ring traffic: busbw = k * NIC per GPU (SimAI: nic_bw * nics_per_node)
    # (a group with one rank per node never touches NVLink)
    b_nvl_x = b_nvl + (k == 1) * _BIG
    b_ring = _sel(multi, np.minimum(b_nvl_x, node_nic), b_nvl)
    # double binary tree: each node sends/receives 2S per direction for N > 2 (= ring), S for
    # N = 2 (2x), 1.5S for N = 3 (4/3x); inside the node a chain over NVLink
    n2 = (N == 2).astype(_DT)
    nidx = _uniform(np.minimum(N, 3).astype(np.int64) - 1)  # NCCL's index: 1, 2, >2 nodes
    nc = _arch_take(N_CHANNELS, ai)
    ll_max = _sel(multi, LL_MAX_BW_NET[1] + n2 * (LL_MAX_BW_NET[0] - LL_MAX_BW_NET[1]),
                  _arch_take(LL_MAX_BW_1NODE, ai))
    ppn1 = (k == 1).astype(_DT)

    is_ar = (op == AR).astype(_DT)
    is_agrs = ((op == AG) | (op == RS)).astype(_DT)
    is_bc = (op == BC).astype(_DT)
    is_a2a = (op == A2A).astype(_DT)
    any_bc = bool(is_bc.any())

    def penalty(applies):
        """+_BIG (us) where a family does not apply (groups of 1 are zeroed by the caller)."""
        return 0.0 if bool(applies.all()) else (1.0 - applies) * _BIG

    pen_ring = penalty(is_ar + is_agrs + is_bc)
    pen_ar = penalty(is_ar)
    pen_p2p = penalty(1.0 - is_ar - is_agrs - is_bc)
    chan = {}

    def channels(p):
        if p not in chan:
            chan[p] = _channels(S, nc, p, n)
        return chan[p]
    nsteps = n - 1.0 + is_ar * (n - 1.0) + is_bc
    ninter = multi * (N - 1.0 + is_ar * (N - 1.0) + is_bc)
    fbus = 1.0 - 1.0 / n + is_ar * (1.0 - 1.0 / n)
    fbus = fbus + is_bc * (1.0 - fbus) + (op == SR) * (1.0 - fbus)
    per_ch_ll128 = _arch_take(PER_CH_RING_LL128, ai)
    S_us = S * 1e-3  # bytes / (GB/s) -> us

    times, codes = [], []
    log2N = _log2i(N)

    # ---- ring (all-reduce, all-gather, reduce-scatter, broadcast) ---------------------------
    for p in ((LL, LL128, SIMPLE) if "ring" in families else ()):
        nc_used = channels(p)
        if p == LL:
            bus = np.minimum(b_ring * LL_PAYLOAD, ll_max)
            chunk = STEP_BYTES[LL] / 2
        elif p == LL128:
            bus = np.minimum(b_ring * LL128_EFF, nc * per_ch_ll128)
            chunk = STEP_BYTES[LL128] // 16 * 15
        else:
            bus = b_ring
            chunk = STEP_BYTES[SIMPLE] * RING_CHUNK_STEPS_SIMPLE
        # small calls run on fewer channels, each at most the per-channel LL128-class rate
        bus = np.minimum(bus, nc_used * per_ch_ll128 * (2.0 if p == SIMPLE else 1.0))
        intra = HW_LAT_NVL[RING][p] * s_in
        base = BASE_LAT[RING][p]
        off = 0.0
        if any_mesh:  # RCCL's tables on the XGMI mesh; no LL128 there
            intra = _sel(mesh, RCCL_HW_LAT_XGMI[RING][p] * s_in, intra)
            base = _sel(mesh, RCCL_BASE_LAT[p], base)
            off = mesh * _BIG if p == LL128 else 0.0
        if p == LL:
            intra = intra * (1.0 + 0.8 * multi)
        inter = (HW_LAT_NET[RING][p] + ppn1 * (HW_LAT_NET[TREE][p] - HW_LAT_NET[RING][p])) * s_out
        intra = np.maximum(intra, multi * NET_OVERHEAD_US * (3.0 if p == SIMPLE else 1.0))
        hops = (nsteps - ninter) * intra + ninter * inter
        # broadcast: NCCL adds nsteps hops (Simple uses the tree's per-hop latency)
        if any_bc:
            a_bc = TREE if p == SIMPLE else RING
            bc_hop = _sel(multi, HW_LAT_NET[a_bc][p] * s_out, HW_LAT_NVL[a_bc][p] * s_in)
            hops = hops + is_bc * (nsteps * bc_hop - hops)
            ranks_per_loop = n + is_bc * (1.0 - n)
        else:
            ranks_per_loop = n
        # rounds: a ring loop moves nc * n * chunk bytes (all-reduce), and every loop walks the
        # ring once more; Echo's eta for the ring
        loops = np.maximum(np.ceil(S / (nc_used * (chunk * ranks_per_loop))), 1.0)
        lat = base + loops * hops
        if any_bc:
            # a ring broadcast pipelines its loops down the chain: each rank forwards chunk
            # after chunk (NCCL src/device/broadcast.h runRing, recvCopySend per chunk through
            # NCCL_STEPS FIFO slots) while the next rank works on the previous one, so the
            # chain's nsteps hops are paid once per call (as NCCL's own model counts ring
            # latency, src/graph/tuning.cc: nsteps x hwLat + baseLat per call) and each further
            # loop adds one hop at the root. Only RL's weight sync broadcasts (rl/weight_sync.py)
            lat = lat + is_bc * (base + hops + (loops - 1.0) * bc_hop - lat)
        if p == SIMPLE:
            plateau = multi * is_ar * (S >= 64.0 * nc * n)
            lat = lat * (1.0 + (RING_PLATEAU - 1.0) * plateau)
        times.append(lat + S_us * fbus / bus + pen_ring + off)
        codes.append((RING, p))

    # ---- double binary tree (all-reduce): chain inside the node, tree across nodes ----------
    if "tree" in families:
        tree_bonus = 1.0 + n2 + (N == 3) * (1.0 / 3.0)
        b_tree = _sel(multi, np.minimum(b_nvl_x, tree_bonus * node_nic), b_nvl)
        depth = 2.0 * ((k - 1.0) + log2N)  # hops up and down
        tree_bus = np.minimum(b_tree * TREE_EFF, nc * _arch_take(PER_CH_TREE, (ai, nidx)))
    for p in ((LL, LL128, SIMPLE) if "tree" in families else ()):
        if p == LL:
            bus = np.minimum(tree_bus / TREE_LL_DIV, ll_max)
            chunk = STEP_BYTES[LL] / 2
        elif p == LL128:
            bus = np.minimum(tree_bus * (7.0 / 9.0 + multi * (120.0 / 128.0 - 7.0 / 9.0)),
                             nc * _arch_take(PER_CH_TREE_LL128, (ai, nidx)))
            chunk = _tree_ll128_chunk(S, nc, N, k)
        else:
            bus = tree_bus
            chunk = float(STEP_BYTES[SIMPLE])
        alg = 0.5 * bus  # NCCL: tree moves the data up and down -> algbw = busBw / 2
        intra = HW_LAT_NVL[TREE][p] * s_in
        base = BASE_LAT[TREE][p]
        off = 0.0
        if any_mesh:  # RCCL: no LL128; no tree/Simple on one gfx94 node (tuning.cc l.365)
            intra = _sel(mesh, RCCL_HW_LAT_XGMI[TREE][p] * s_in, intra)
            base = _sel(mesh, RCCL_BASE_LAT[p], base)
            off = (mesh if p == LL128 else mesh1 if p == SIMPLE else 0.0) * _BIG
        if p == LL:
            intra = intra * (1.0 + 0.8 * multi)
        lat = base + 2.0 * ((k - 1.0) * intra + log2N * HW_LAT_NET[TREE][p] * s_out)
        # pipeline fill: a chunk needs `depth` hops to reach the last rank; with eta rounds of
        # `chunk` per channel the tree runs (eta + depth - 1) chunk slots (Echo's tree formula)
        nc_used = channels(p)
        chunk_all = np.minimum(chunk * nc_used, S)
        fill = np.maximum(depth - 1.0, 0.0) * chunk_all
        times.append(lat + (S + fill) * 1e-3 / alg + pen_ar + off)
        codes.append((TREE, p))

    if "nvls" in families:
        # ---- NVLS: NVLink SHARP inside one node (all-reduce, all-gather, reduce-scatter) --------
        ratio_ar = _arch_take(NVLS_AR_RATIO, ai)
        nvls_intra = net["nvlink_bw_gbs"] * ratio_ar
        bus = _sel(is_ar, nvls_intra, net["nvlink_bw_gbs"] * _arch_take(NVLS_EFF, ai) * (k - 1) / k)
        ok = nvls_ok * (1.0 - multi) * (is_ar + is_agrs) * (bus > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = HW_LAT_NVL[NVLS][SIMPLE] * s_in + S_us * fbus / bus
        times.append(np.fmin(t, _BIG) + (1.0 - ok) * _BIG)
        codes.append((NVLS, SIMPLE))

        # ---- NVLS-tree: NVLS inside each node, tree of nodes over the NICs (all-reduce) ---------
        # each GPU carries 1/k of the node's data over its own NIC: busbw = k * NIC (x2 at N = 2)
        bus = np.minimum(nvls_intra, (1.0 + n2) * node_nic)
        bus = np.minimum(bus, N_CHANNELS_NVLS * _arch_take(PER_CH_NVLS_TREE, (ai, nidx)))
        ok = nvls_ok * multi * is_ar * (bus > 0)
        lat = HW_LAT_NVL[NVLS_TREE][SIMPLE] * s_in + 2.0 * log2N * HW_LAT_NET[NVLS_TREE][SIMPLE] * s_out
        with np.errstate(divide="ignore", invalid="ignore"):
            t = lat + S_us * fbus / bus
        times.append(np.fmin(t, _BIG) + (1.0 - ok) * _BIG)
        codes.append((NVLS_TREE, SIMPLE))

    small = np.zeros(shape, dtype=_DT)
    if "p2p" in families:
        # ---- point-to-point: send/recv and all-to-all (grouped send/recv) -----------------------
        per_peer = S / (1.0 + is_a2a * (n - 1.0))
        small = (per_peer < P2P_LL_THRESHOLD).astype(_DT)
        inv_eff = 1.0 + small  # LL carries half its line bytes
        hop_in = (HW_LAT_NVL[RING][SIMPLE] + small * (HW_LAT_NVL[RING][LL] - HW_LAT_NVL[RING][SIMPLE])) * s_in
        hop_out = (HW_LAT_NET[RING][SIMPLE] + small * (HW_LAT_NET[RING][LL] - HW_LAT_NET[RING][SIMPLE])) * s_out
        # send/recv: one peer, over NVLink or this GPU's NIC
        t_sr = P2P_BASE_US + _sel(multi, hop_out, hop_in) + S_us * inv_eff / _sel(multi, b_nic, b_nvl)
        # all-to-all: the off-node share (n-k)/n leaves through this GPU's NIC while the on-node
        # share (k-1)/n goes over NVLink, concurrently
        t_on = S_us * (k - 1.0) / n * inv_eff / (b_nvl * A2A_EFF)
        t_off = S_us * (n - k) / n * inv_eff / (b_nic * A2A_EFF)
        t_a2a = (P2P_BASE_US + hop_in + multi * hop_out + (n - 1.0) * A2A_PER_PEER_US
                 + np.maximum(t_on, t_off))
        times.append(_sel(is_a2a, t_a2a, t_sr) + pen_p2p)
        codes.append((P2P, -1))

    # ---- NCCL's choice: the lowest estimate --------------------------------------------------
    best_t = times[0]
    best_i = np.zeros(shape, dtype=_DT)
    for i in range(1, len(times)):
        better = (times[i] < best_t).astype(_DT)
        best_t = np.minimum(best_t, times[i])
        best_i = best_i + better * (i - best_i)

    if any_mesh and "ring" in families:
        # ---- RCCL's MSCCL all-pairs all-reduce on one 8-GPU mesh node ------------------------
        # MSCCL takes the call before the tuner does (msccl_lifecycle.cc): each GPU sends S/n
        # to every peer at once (reduce-scatter), then the reduced S/n back (all-gather), so
        # every link carries 2S/n in 2 steps instead of the ring's 2(n - 1) hops.
        ap = (mesh1 * is_ar * (n == MSCCL_GPUS) * (links + 1.0 == MSCCL_GPUS)
              * (S <= MSCCL_MAX))
        if bool(ap.any()):
            ll = (S <= MSCCL_LL_MAX).astype(_DT)
            hop = _sel(ll, RCCL_HW_LAT_XGMI[RING][LL], RCCL_HW_LAT_XGMI[RING][SIMPLE]) * s_in
            lat = _sel(ll, RCCL_BASE_LAT[LL], RCCL_BASE_LAT[SIMPLE]) + 2.0 * hop
            t_ap = lat + 2.0 * S_us / n / (link_bw * _sel(ll, LL_PAYLOAD, 1.0))
            times.append(t_ap)
            codes.append((ALLPAIRS, -2))
            best_t = _sel(ap, t_ap, best_t)
            best_i = _sel(ap, float(len(times) - 1), best_i)
    best_i = best_i.astype(np.int64)
    algo = np.array([c[0] for c in codes])[best_i]
    proto_tab = np.array([c[1] for c in codes])[best_i]
    proto = np.where(proto_tab == -1, np.where(small > 0, LL, SIMPLE), proto_tab)
    if (proto_tab == -2).any():  # all-pairs: LL up to MSCCL_LL_MAX, then Simple
        proto = np.where(proto_tab == -2, np.where(S <= MSCCL_LL_MAX, LL, SIMPLE), proto)
    return best_t.astype(float) * 1e-6, algo, proto


_FAMILIES = {AR: ("ring", "tree", "nvls"), AG: ("ring", "nvls"), RS: ("ring", "nvls"),
             BC: ("ring",), A2A: ("p2p",), SR: ("p2p",)}
_GROUPS = ((AR,), (AG, RS), (BC,), (A2A, SR))


def _by_family(op, S, n, N, net):
    """Evaluate each op group only with the algorithms that apply to it (NCCL has no tree
    all-gather, no ring all-to-all): one pass when all elements share an op, as the step
    composer calls it, else one pass per group on its subset."""
    counts = np.bincount(op, minlength=len(COLLECTIVES))
    present = [g for g in _GROUPS if counts[list(g)].sum() > 0]
    if len(present) == 1:
        fam = tuple(sorted({f for c in present[0] for f in _FAMILIES[c]}))
        return _analytical(op, S, n, N, net, fam)
    t = np.empty(op.shape)
    a = np.empty(op.shape, dtype=np.int64)
    p = np.empty(op.shape, dtype=np.int64)
    for g in present:
        idx = np.flatnonzero(np.isin(op, g))
        fam = tuple(sorted({f for c in g for f in _FAMILIES[c]}))
        sub = {key: v[idx] for key, v in net.items()}
        t[idx], a[idx], p[idx] = _analytical(op[idx], S[idx], n[idx], N[idx], sub, fam)
    return t, a, p


# Process-wide calibration (a named profile, `sweep calibrate nccl`): scales on the network
# parameters and measured nccl-tests curves used when a caller passes no profile of its own.
CALIBRATION_KEYS = {"nvlink_bw": "nvlink_bw_gbs", "nic_bw": "nic_bw_gbs",
                    "intra_latency": "intra_latency_us", "inter_latency": "inter_latency_us"}
_calibration: dict = {"scales": {}, "profile": None}


def set_calibration(scales: dict | None = None, profile=None) -> None:
    """Install (or, with no arguments, remove) a cluster calibration for every later call."""
    unknown = set(scales or {}) - set(CALIBRATION_KEYS)
    if unknown:
        raise ValueError(f"unknown NCCL calibration scales {sorted(unknown)}; "
                         f"allowed: {', '.join(CALIBRATION_KEYS)}")
    _calibration["scales"] = dict(scales or {})
    _calibration["profile"] = profile


def calibration() -> dict:
    return dict(_calibration)


def scale_net(net: dict | None, scales: dict) -> dict:
    """The network parameters with calibration scales applied (missing keys take defaults)."""
    net = dict(DEFAULT_NET if net is None else net)
    for s, key in CALIBRATION_KEYS.items():
        f = scales.get(s, 1.0)
        if f != 1.0:
            net[key] = np.asarray(net.get(key, DEFAULT_NET[key]), dtype=float) * f
    return net


def collective_time(op, nbytes, group, nodes, net, profile=None) -> dict:
    """Time of one NCCL collective per element, the (algorithm, protocol) NCCL would pick.

    op: int codes into COLLECTIVES (or one name); nbytes, group, nodes: arrays (broadcast);
    net: dict of arrays/scalars (see DEFAULT_NET for the keys and defaults); profile: optional
    `nccl_tests.Profile` whose measured busbw replaces the estimate for matching (op, group,
    nodes). Returns {"time_s", "algo", "proto", "busbw_gbs"} (algo -1 = measured profile).
    """
    if isinstance(op, str):
        op = _OP_CODE[op]
    if _calibration["scales"]:
        net = scale_net(net, _calibration["scales"])
    if profile is None:
        profile = _calibration["profile"]
    op, S, n, N = np.broadcast_arrays(np.asarray(op, dtype=np.int64), np.asarray(nbytes, dtype=float),
                                      np.asarray(group, dtype=float), np.asarray(nodes, dtype=float))
    shape = np.broadcast_shapes(op.shape, *(np.shape(v) for v in (net or {}).values()))
    op = np.broadcast_to(op, shape).ravel()
    S, n, N = (np.broadcast_to(x, shape).ravel().astype(_DT) for x in (S, n, N))
    N = np.clip(N, 1.0, np.maximum(n, 1.0))
    netb = {k: v.ravel() for k, v in _net_arrays(net, shape).items()}
    if distinct.enabled() and op.size >= distinct.MIN_ROWS:
        # a batch holds few distinct (collective, bytes, group, nodes, fabric): each is
        # estimated once and broadcast back (sim_core.distinct)
        first, inv = distinct.rows([op, S, n, N, *netb.values()])
        res = _estimate(op[first], S[first], n[first], N[first],
                        {k: v[first] for k, v in netb.items()}, profile)
        res = {k: v[inv] for k, v in res.items()}
    else:
        res = _estimate(op, S, n, N, netb, profile)
    return {k: v.reshape(shape) for k, v in res.items()}


def _estimate(op, S, n, N, netb, profile) -> dict:
    """collective_time on flat arrays of equal length."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t, a, p = _by_family(op, S, n, N, netb)
    if profile is not None:
        t_meas, hit = profile.lookup(op, S, n, N)
        t = np.where(hit, t_meas, t)
        a = np.where(hit, -1, a)
        p = np.where(hit, -1, p)
    idle = (n <= 1) | (S <= 0)
    t = np.where(idle, 0.0, t)
    fb = bus_factor(op, n)
    busbw = np.where(t > 0, S / np.where(t > 0, t, 1.0) * fb / 1e9, 0.0)
    return {"time_s": t, "algo": a, "proto": p, "busbw_gbs": busbw}


def p2p_time(nbytes, intra, net) -> np.ndarray:
    """Seconds to send `nbytes` to one peer (pipeline stage boundary): send_recv, 2 ranks."""
    intra = np.asarray(intra, dtype=bool)
    return collective_time(SR, nbytes, 2, np.where(intra, 1, 2), net)["time_s"]
