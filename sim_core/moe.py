"""Mixture-of-experts dispatch path: routing, permutation, dispatch/combine, overlap, buffers.

Everything a MoE layer adds on top of its GEMMs, as Megatron-Core (core_v0.15.3,
megatron/core/transformer/moe/) runs it, in arrays over configurations:
- routing skew: the busiest EP rank's load (`expert_load_factor`);
- dispatch and combine of each token dispatcher (token_dispatcher.py): `allgather` gathers all
  tokens of the expert tp x ep group and reduce-scatters the outputs; `alltoall` sends each
  routed copy to its expert's rank with NCCL all-to-all; `flex` runs DeepEP's fused kernels
  (fused_a2a.py), which send a token once per destination node over RDMA and forward it over
  NVLink to each destination rank, priced with DeepEP's published bandwidth tables;
- permutation and unpermutation as HBM traffic, fused (--moe-permute-fusion, TE kernels) or
  not (moe_utils.py permute/unpermute), router scores/top-k/aux-loss traffic (fused with
  --moe-router-fusion), and the launch-bound cost of the layer's extra kernels and its one
  device-to-host sync;
- what stays exposed under the combined 1F1B EP overlap (--overlap-moe-expert-parallel-comm,
  megatron/core/models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run,
  with --delay-wgrad-compute) and under shared-expert overlap (--moe-shared-expert-overlap);
- DeepEP's NVL/RDMA communication buffers (csrc/config.hpp buffer size hints, DeepEP v1.2.1).

Figures come from catalogs/moe.yaml (cited there). Nothing in this module is fitted.
Default routing is balanced (expert_skew 0): Megatron-Bridge's MoE benchmarks force-balance
routing (--moe-router-force-load-balancing), and DeepSeek-V3's aux-loss-free balancing
(expert bias, --moe-router-enable-expert-bias) keeps the skew small in real training.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
from scipy.special import gammaln

from . import catalog_yaml, nccl, overlap
from .columns import Batch

ACT_BYTES = 2.0  # bf16 hidden states (Megatron's DeepEP dispatch sends bf16 too)
ALLTOALL, ALLGATHER, FLEX = 0, 1, 2  # specs.MOE_DISPATCHER order
MLP_OPS = ("router", "shared_fc1", "shared_fc2", "expert_fc1", "expert_fc2", "moe_permute")
SHARED_OPS = ("shared_fc1", "shared_fc2")


@functools.lru_cache(maxsize=1)
def table() -> dict:
    text = resources.files("sim_core").joinpath("catalogs/moe.yaml").read_text()
    return catalog_yaml.read(text)


# ---- routing -------------------------------------------------------------------------------
def expert_load_factor(b: Batch) -> np.ndarray:
    """How much more work the busiest EP rank gets than a balanced one (>= 1).

    Routing skew is a Zipf law with exponent `expert_skew` over the experts (0 = balanced, as
    in force-balanced benchmarks). The rank holding the hottest expert carries that expert's
    share plus an average share for its other experts. Token dropping (not dropless) caps any
    expert at `capacity_factor` times its balanced share, so the factor cannot exceed it.
    """
    E = np.maximum(b.experts, 1.0)
    alpha = b.expert_skew
    out = np.ones_like(E)
    skewed = (alpha > 0) & (b.experts > 0)
    if skewed.any():
        # harmonic numbers H(E, alpha) for the distinct (E, alpha) pairs only
        pairs, inv = np.unique(np.stack([E[skewed], alpha[skewed]]), axis=1, return_inverse=True)
        top = np.array([1.0 / np.sum(np.arange(1, int(n) + 1) ** -a) for n, a in pairs.T])[inv]
        local = E[skewed] / b.ep[skewed]
        rank_share = top + (local - 1) * (1 - top) / np.maximum(E[skewed] - 1, 1)
        out[skewed] = np.maximum(rank_share * b.ep[skewed], 1.0)
    capped = ~b.moe_dropless & (b.experts > 0)
    return np.where(capped, np.minimum(out, np.maximum(b.capacity_factor, 1.0)), out)


def _p_group_hit(E, k, per_group) -> np.ndarray:
    """P(a token's top-k experts, drawn without replacement from E, include one of a given
    group of `per_group` experts) = 1 - C(E - g, k) / C(E, k)."""
    miss = np.ones_like(E)
    for i in range(int(np.max(k, initial=0))):
        step = np.clip((E - per_group - i) / np.maximum(E - i, 1.0), 0.0, 1.0)
        miss = np.where(i < k, miss * step, miss)
    return 1.0 - miss


def ep_layout(b: Batch, gpn=None) -> dict:
    """Where the EP group's ranks live. Megatron orders expert ranks etp-ep-dp-pp
    (core_v0.15.3 parallel_state.py, expert RankGenerator order "tp-ep-dp-pp"), so EP ranks are
    etp apart: ep_local of them share a node, spread over `nodes` nodes."""
    gpn = b.gpus_per_node if gpn is None else gpn
    etp = np.where(b.etp > 0, b.etp, b.tp)
    ep_local = np.minimum(b.ep, np.maximum(np.floor(gpn / np.minimum(etp, gpn)), 1.0))
    nodes = np.ceil(b.ep / ep_local)
    return {"etp": etp, "ep_local": ep_local, "nodes": nodes}


def _p_unit_hit(E, k, units, groups, gtopk) -> np.ndarray:
    """P(a token reaches one of `units` equal contiguous blocks of the experts: an EP rank or
    a node). Unrestricted top-k (groups 0): k experts drawn from E. Group-limited routing
    (Megatron-Core core_v0.15.3 moe_utils.py group_limited_topk: `groups` contiguous expert
    groups, the token's k experts drawn from its `gtopk` best): the gtopk groups are taken
    as uniform over the groups and the k experts as uniform over theirs, as DeepEP's own
    benchmark draws them (v1.2.1 tests/test_internode.py, node groups). A block inside one
    group is hit when its group is chosen; a block of c whole groups when j >= 1 of them are
    (hypergeometric in j)."""
    free = _p_group_hit(E, k, E / units)
    if not np.any(groups > 0):
        return free
    G = np.maximum(groups, 1.0)
    gk = np.clip(gtopk, 1.0, G)
    pool = gk * E / G  # experts a token chooses from
    inside = gk / G * _p_group_hit(pool, k, E / units)  # units >= G: a block within a group
    c = np.maximum(np.floor(G / units), 1.0)  # units < G: whole groups per block
    whole = np.zeros_like(free)
    log_all = _log_comb(G, gk)
    for j in range(1, int(np.max(gk)) + 1):
        pj = np.exp(_log_comb(c, j) + _log_comb(G - c, gk - j) - log_all)
        pj = np.where((j <= c) & (j <= gk) & (gk - j <= G - c), pj, 0.0)
        whole = whole + pj * _p_group_hit(pool, k, j * E / G)
    limited = np.where(units >= G, inside, whole)
    return np.where(groups > 0, limited, free)


def _log_comb(n, r):
    """log C(n, r) over arrays (-inf where r is outside 0..n)."""
    n, r = np.asarray(n, dtype=float), np.asarray(r, dtype=float)
    ok = (r >= 0) & (r <= n)
    out = gammaln(n + 1) - gammaln(np.clip(r, 0, None) + 1) - gammaln(np.clip(n - r, 0, None) + 1)
    return np.where(ok, out, -np.inf)


def routing_fanout(b: Batch) -> dict:
    """Expected destinations of one token under balanced top-k routing (group-limited where
    the model has router groups): EP ranks hit and nodes hit (DeepEP sends a token once per
    rank and once per node, whatever k), and P(its own node is one of them)."""
    lay = ep_layout(b)
    E = np.maximum(b.experts, 1.0)
    k = np.where(b.experts > 0, b.top_k, 0.0)
    zero = np.zeros_like(E)
    G = np.asarray(b.get("router_groups", zero), dtype=np.float64) * (b.experts > 0)
    gk = np.asarray(b.get("router_group_topk", zero), dtype=np.float64)
    ranks = b.ep * _p_unit_hit(E, k, b.ep, G, gk)
    p_node = _p_unit_hit(E, k, lay["nodes"], G, gk)
    return {"ranks_hit": ranks, "nodes_hit": lay["nodes"] * p_node, "own_node": p_node, **lay}


# ---- dispatch and combine ------------------------------------------------------------------
def dispatch_bytes(b: Batch, tokens_rank, load) -> dict:
    """Bytes one rank moves per MoE layer, micro-batch and direction (forward dispatch; combine
    moves the same back), by dispatcher:
    - alltoall: every routed copy (k per token) in one NCCL all-to-all; the busiest rank
      receives `load` times the average (`a2a`, nccl-tests size of the call);
    - allgather: all tokens of the etp x ep group gathered (hidden states plus the routing map
      and fp32 probabilities, E per token), combine reduce-scatters the hidden states
      (`ag`, output size of the all-gather);
    - flex (DeepEP): one copy per destination node over RDMA (`rdma`) and one per destination
      rank over NVLink, less the rank it lands on (`nvl`).
    """
    h, E = b.hidden, np.maximum(b.experts, 1.0)
    fan = routing_fanout(b)
    row = ACT_BYTES * h
    a2a = tokens_rank * b.top_k * row * load
    group = b.ep * fan["etp"]
    ag = tokens_rank * group * (row + 5.0 * E)  # bf16 hidden + bool routing map + fp32 probs
    # tokens to other nodes: nodes hit, less the own node when it is hit
    own_node = fan["own_node"]
    remote_nodes = np.maximum(fan["nodes_hit"] - own_node, 0.0) * (fan["nodes"] > 1)
    rdma = tokens_rank * row * remote_nodes * load
    nvl = tokens_rank * row * fan["ranks_hit"] * (fan["ep_local"] - 1) / fan["ep_local"] * load
    return {"a2a": a2a, "ag": ag, "ag_group": group, "rdma": rdma, "nvl": nvl, **fan}


def _deepep_eff(b: Batch, kind: str) -> tuple[np.ndarray, np.ndarray]:
    t = table()["deepep"]
    intra = np.full(b.ep.shape, t["intranode"][kind])
    xs = np.log2(np.asarray(t["internode_ep"], dtype=float))
    inter = np.interp(np.log2(np.maximum(b.ep, 1.0)), xs, np.asarray(t["internode"][kind]))
    return intra, inter


def dispatch_times(b: Batch, tokens_rank, load, net: dict, profile=None) -> dict:
    """Seconds per MoE layer and micro-batch of the four transfers the 1F1B overlap schedules
    separately: dispatch and combine forward (`d_f`, `c_f`), and their gradients backward
    (`d_b`: the dispatch's backward is a combine, `c_b`: the combine's is a dispatch)."""
    by = dispatch_bytes(b, tokens_rank, load)
    zero = np.zeros_like(b.ep, dtype=np.float64)
    ep_on = (b.ep > 1) & (b.experts > 0)
    disp = b.moe_dispatcher

    def coll(op, nbytes, group, nodes, used):
        if not used.any():  # no configuration runs this dispatcher: skip the NCCL model
            return np.zeros_like(zero)
        code = np.full(b.ep.shape, nccl.COLLECTIVES.index(op))
        res = nccl.collective_time(code, nbytes, np.maximum(group, 1).astype(np.int64),
                                   np.maximum(nodes, 1).astype(np.int64), net, profile=profile)
        return res["time_s"]

    # NCCL all-to-all of the routed copies; the same call back for combine
    moe_on = b.experts > 0
    a2a = coll("all_to_all", by["a2a"], b.ep, by["nodes"], moe_on & (disp == ALLTOALL) & ep_on)
    # all-gather over the etp x ep group; combine is a reduce-scatter of the hidden states
    g = by["ag_group"]
    g_local = np.minimum(g, b.gpus_per_node)
    g_nodes = np.ceil(g / g_local)
    ag_on = moe_on & (disp == ALLGATHER) & (g > 1)
    ag = coll("all_gather", by["ag"], g, g_nodes, ag_on)
    rs = coll("reduce_scatter", by["ag"] * ACT_BYTES * b.hidden
              / (ACT_BYTES * b.hidden + 5.0 * np.maximum(b.experts, 1.0)), g, g_nodes, ag_on)
    # DeepEP: the slower of its RDMA and NVLink legs, plus a notify round and the kernel's own
    # launch (one intra- or inter-node latency each)
    nvl_bw = net["nvlink_bw_gbs"] * 1e9
    nic_bw = net["nic_bw_gbs"] * 1e9
    lat = np.where(by["nodes"] > 1, net["inter_latency_us"], net["intra_latency_us"]) * 2e-6

    def deepep(kind):
        intra, inter = _deepep_eff(b, kind)
        t_nvl = by["nvl"] / (nvl_bw * intra)
        t_rdma = np.where(by["nodes"] > 1, by["rdma"] / (nic_bw * inter), 0.0)
        return np.maximum(t_nvl, t_rdma) + lat

    dd, dc = deepep("dispatch"), deepep("combine")
    d_f = np.select([disp == ALLTOALL, disp == ALLGATHER, disp == FLEX], [a2a, ag, dd], zero)
    c_f = np.select([disp == ALLTOALL, disp == ALLGATHER, disp == FLEX], [a2a, rs, dc], zero)
    out = {"d_f": d_f, "c_f": c_f, "d_b": c_f, "c_b": d_f}
    on = np.where(disp == ALLGATHER, (b.experts > 0) & (by["ag_group"] > 1), ep_on)
    return {k: np.where(on, v, 0.0) for k, v in out.items()}


# ---- permutation, router, launches ---------------------------------------------------------
def elementwise_bytes(b: Batch, tokens_rank, load) -> np.ndarray:
    """HBM bytes of one MoE layer's forward outside its GEMMs (backward moves about as much):
    permute + unpermute of the routed copies and the router's score/top-k/aux-loss passes.

    Counted from Megatron core_v0.15.3 moe_utils.py: unfused `permute` index-selects the copies
    (read + write each) after building sorted indices from the [E, T] routing map; unfused
    `unpermute` multiplies by the probabilities (a new tensor), zero-fills the output and
    scatter-adds; TE's fused kernels (--moe-permute-fusion) read each copy once and write it
    once, unpermute merging the probabilities in flight. The alltoall dispatcher also sorts the
    received chunks by local expert (sort_chunks_by_idxs) before and after the experts; the
    allgather dispatcher's unpermute scatters into all gathered tokens of its group.
    """
    h, E = b.hidden, np.maximum(b.experts, 1.0)
    row = ACT_BYTES * h
    copies = tokens_rank * b.top_k * load
    fused = b.moe_permute_fusion
    permute = 2 * copies * row + np.where(fused, 0.0, tokens_rank * E * 9.0)  # map + int64 idx
    unpermute = np.where(fused, copies * row + tokens_rank * row,
                         2 * copies * row + copies * row + 3 * tokens_rank * row)
    sort_chunks = np.where((b.moe_dispatcher == ALLTOALL) & (b.experts / b.ep > 1),
                           2 * 2 * copies * row, 0.0)
    fan = ep_layout(b)
    gathered = tokens_rank * b.ep * fan["etp"]
    ag_scatter = np.where(b.moe_dispatcher == ALLGATHER, 2 * gathered * row, 0.0)
    # router: scores, top-k, probabilities, aux-loss statistics over [T, E] fp32: ~8 passes
    # eager (softmax/sigmoid, topk, scatter, normalisation, aux-loss sums), ~2 fused
    router = tokens_rank * E * 4.0 * np.where(b.moe_router_fusion, 2.0, 8.0)
    out = permute + unpermute + sort_chunks + ag_scatter + router
    return np.where(b.experts > 0, out, 0.0)


def launch_overhead_s(b: Batch) -> dict:
    """Launch-bound seconds per MoE layer, forward and backward: the layer's extra kernels at
    kernel_gap_us each, and one device-to-host sync per forward (host_sync_us).

    Kernels counted from the code paths (core_v0.15.3): router ~12 eager ops or 3 fused;
    permute + unpermute ~10 eager or 2 fused (+2 chunk sorts for alltoall); dispatcher
    collectives ~4; TE GroupedLinear launches one GEMM per local expert for FC1 and FC2 (x2 in
    backward: dgrad and wgrad) plus the activation.
    """
    t = table()
    gap, sync = t["kernel_gap_us"] * 1e-6, t["host_sync_us"] * 1e-6
    local = np.maximum(b.experts / np.maximum(b.ep, 1.0), 1.0)
    router = np.where(b.moe_router_fusion, 3.0, 12.0)
    perm = np.where(b.moe_permute_fusion, 2.0, 10.0) + np.where(
        b.moe_dispatcher == ALLTOALL, 2.0, 0.0)
    kernels_fwd = router + perm + 4.0 + 2 * local + 1
    kernels_bwd = router + perm + 4.0 + 4 * local + 1
    moe = b.experts > 0
    return {"fwd": np.where(moe, kernels_fwd * gap + sync, 0.0),
            "bwd": np.where(moe, kernels_bwd * gap, 0.0)}


# ---- overlap -------------------------------------------------------------------------------
def overlapped_fraction(b: Batch, m) -> np.ndarray:
    """Share of a rank's forward and backward chunk passes that the combined 1F1B schedule
    pairs up. Alone: the first forward (combined_1f1b.py, no pipelining) or, with pp > 1, the
    interleaved schedule's warm-up of (pp - 1) * 2 + (vpp - 1) * pp chunk passes on the first
    rank (schedules.py) plus the first, and as many cool-down backward passes."""
    p, v = b.pp, b.vpp
    alone = np.where(p > 1, (p - 1) * 2 + (v - 1) * p + 1, 1.0)
    return np.clip(1.0 - alone / np.maximum(m * v, 1.0), 0.0, 1.0)


def exposed(b: Batch, times: dict, parts: dict, n_moe, m, full_rc) -> tuple:
    """(exposed EP seconds, extra compute seconds) per micro-batch on a stage.

    `times`: dispatch_times (per MoE layer); `parts`: the stage's MoE-layer compute per
    micro-batch, keys attn_f, attn_b (everything but the MoE MLP), mlp_f, mlp_dgrad, mlp_wgrad,
    shared_f, shared_b. `n_moe`: MoE layers on the stage.

    - No overlap: every transfer is on the critical path (a full recompute replays the
      forward's dispatch and combine).
    - Shared-expert overlap (alltoall): the shared experts run while the dispatch and combine
      are in flight, forward and backward.
    - Combined 1F1B overlap: per layer pair (forward of one micro-batch, backward of another)
      the schedule runs, comm stream | compute stream,
          combine_bwd | attn_fwd ;  dispatch_fwd, dispatch_bwd | mlp_bwd, mlp_bwd_dw, mlp_fwd ;
          combine_fwd | attn_bwd
      (model_chunk_schedule_plan.py). Without --delay-wgrad-compute the expert wgrad runs inside
      mlp_bwd, so dispatch_bwd can only hide behind mlp_fwd. Compute that overlaps a transfer
      is slowed: DeepEP holds deepep_num_sms SMs; NCCL kernels follow overlap.py's prior.
    """
    d_f, c_f, d_b, c_b = (times[k] * n_moe for k in ("d_f", "c_f", "d_b", "c_b"))
    a_f, a_b = parts["attn_f"], parts["attn_b"]
    m_f, m_d, m_w = parts["mlp_f"], parts["mlp_dgrad"], parts["mlp_wgrad"]
    base = d_f + c_f + d_b + c_b
    replay = np.where(full_rc, d_f + c_f, 0.0)  # recompute's forward, outside the pairing
    serial = base + replay
    # SM contention while a transfer runs under compute
    flex = b.moe_dispatcher == FLEX
    sms = table()["deepep_num_sms"]
    factor = np.where(flex, b.sm_count / np.maximum(b.sm_count - sms, 1.0),
                      overlap.slowdown(b.sm_arch, "gemm"))
    # shared-expert overlap
    sh_hidden = (np.minimum(d_f + c_f, parts["shared_f"]) + np.minimum(d_b + c_b,
                                                                       parts["shared_b"]))
    sh_on = b.moe_shared_expert_overlap & ~b.moe_a2a_overlap
    # 1F1B pair
    delay = b.moe_delay_wgrad
    phase_b = np.where(delay, np.maximum(d_f, m_d) + np.maximum(d_b, m_w + m_f),
                       np.maximum(d_f, m_d + m_w) + np.maximum(d_b, m_f))
    pair = np.maximum(c_b, a_f) + phase_b + np.maximum(c_f, a_b)
    pair_exposed = np.maximum(pair - (a_f + a_b + m_f + m_d + m_w), 0.0)
    pair_hidden = np.minimum(base, np.maximum(base - pair_exposed, 0.0))
    f = overlapped_fraction(b, m)
    ov = b.moe_a2a_overlap & (b.ep > 1)
    exp = np.where(ov, f * pair_exposed + (1 - f) * base + replay,
                   np.where(sh_on, serial - sh_hidden, serial))
    hidden = np.where(ov, f * pair_hidden, np.where(sh_on, sh_hidden, 0.0))
    extra = (factor - 1.0) * hidden
    return exp, extra


# ---- memory --------------------------------------------------------------------------------
def _deepep_buffer(b: Batch) -> np.ndarray:
    """Bytes of DeepEP's NVL + RDMA buffers (+ its 32 MiB workspace) as Megatron sizes them:
    the larger of the dispatch and combine configs' size hints (csrc/config.hpp, v1.2.1) for
    hidden_bytes = hidden * 2 and num_sms = deepep_num_sms (channels = num_sms / 2)."""
    t = table()
    ch = t["deepep_num_sms"] / 2
    hb = ACT_BYTES * b.hidden
    ep = np.maximum(b.ep, 1.0)
    nvl_ranks = np.minimum(ep, 8.0)
    rdma_ranks = np.maximum(ep // 8, 1.0)
    meta, topk, scales = 8.0, 128.0, 128.0  # SourceMeta bytes, kNumMaxTopK, kNumMaxScales
    sizes = np.array(sorted(t["deepep_config"]["dispatch"]), dtype=float)
    idx = np.clip(np.searchsorted(sizes, ep), 0, len(sizes) - 1)  # next supported size
    nvl = np.zeros_like(ep)
    rdma = np.zeros_like(ep)
    for kind in ("dispatch", "combine"):
        cfg = np.array([t["deepep_config"][kind][int(s)] for s in sizes], dtype=float)[idx]
        nvl_recv, rdma_recv = cfg[:, 1], cfg[:, 3]
        n = (ch * nvl_ranks * (2 * rdma_ranks + 3) * 4
             + ch * nvl_ranks * nvl_recv * (hb + meta + topk * 8 + topk * 4 + scales * 4))
        r = (ch * rdma_ranks * (8 * 2 + 2) * 2 * 4
             + ch * rdma_ranks * rdma_recv * 2 * (hb + meta + topk * 8 + topk * 4 + scales * 4
                                                  + 16))
        nvl = np.maximum(nvl, n)
        rdma = np.maximum(rdma, np.where(ep > 8, r, 0.0))
    return nvl + rdma + 32 * 1024.0**2


def buffer_bytes(b: Batch) -> np.ndarray:
    """Device memory the dispatcher holds for the whole run (flex: DeepEP's buffers)."""
    on = (b.moe_dispatcher == FLEX) & (b.experts > 0) & (b.ep > 1)
    return np.where(on, _deepep_buffer(b), 0.0)


def transient_bytes(b: Batch, tokens_rank, load) -> np.ndarray:
    """Working buffers of one MoE layer in flight: the permuted copies sent and the copies
    received (alltoall, flex), or the gathered tokens of the group (allgather)."""
    row = ACT_BYTES * b.hidden
    copies = tokens_rank * b.top_k * load
    gathered = tokens_rank * b.ep * ep_layout(b)["etp"] * row
    out = np.where(b.moe_dispatcher == ALLGATHER, gathered + copies * row, 2 * copies * row)
    return np.where(b.experts > 0, out, 0.0)
