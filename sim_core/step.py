"""Compose one training step: pipeline schedule, exposed communication, slowdown, optimizer.

Per micro-batch, a pipeline stage spends forward + backward (+ recompute) compute plus the
communication of TP, CP and EP that its overlap settings leave exposed. The pipeline runs m
micro-batches through p stages: 1F1B takes m * t_max + (p - 1) * t_avg; the interleaved
schedule with v model chunks per rank shrinks the bubble to (p - 1)/v * t_avg. After the
pipeline flush comes the data-parallel gradient synchronisation (partly hidden behind the last
micro-batch's backward), then the optimizer step.
"""

from __future__ import annotations

import numpy as np

from . import compute, distinct, moe, nccl, overlap, pp_split, recompute, terms
from .arrays import select, where
from .columns import Batch
from .workload import Workload

COLL_CODE = {name: i for i, name in enumerate(nccl.COLLECTIVES)}
# Megatron-Core's DDP splits gradients into buckets of max(40M, 1M x dp) elements
# (megatron/core/distributed/distributed_data_parallel.py, core_r0.8.0 L51-53, the same at
# core_v0.15.3 L58-61); the last bucket's reduction cannot overlap any backward compute.
BUCKET_PARAMS = 40e6
BUCKET_PARAMS_PER_DP = 1e6


def last_bucket_params(wl: Workload) -> np.ndarray:
    """Parameters in the DP bucket that nothing hides: the last one reduced after the backward
    and the first one gathered before the forward. Buckets are filled in reverse parameter
    order until they reach the bucket size (param_and_grad_buffer.py, core_r0.8.0 L305-345;
    core_v0.15.3 L626-659), so the input embedding, the first parameter of the forward and the
    last gradient of the backward, closes the final bucket: that bucket holds at least the
    first stage's embedding shard (vocab x hidden / tp), which at a large vocabulary and a
    small model is several buckets' worth (Llama-3's 128k x 4096 at tp 1: 525M elements)."""
    bucket = np.maximum(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP * wl.dp)
    return np.maximum(bucket, wl.params_embed)


def network(b: Batch) -> dict:
    """Per-configuration network parameters for the NCCL model."""
    return {
        "sm_arch": b.sm_arch,
        "nvlink_bw_gbs": b.nvlink_bw_gbs,
        "nvls": b.nvls > 0,
        "mesh_links": b.mesh_links,
        "nic_bw_gbs": b.nic_bw_gbs * b.nics_per_node / b.gpus_per_node,
        "intra_latency_us": b.intra_latency_us,
        "inter_latency_us": b.inter_latency_us,
    }


def comm_times(b: Batch, wl: Workload, profile=None, skip=()) -> list[tuple]:
    """(Comm, seconds per call) for every communication kind in the workload (but `skip`'s
    dimensions)."""
    net = network(b)
    # the fabric of every row as one code, so that each collective below is estimated once per
    # distinct (bytes, group, nodes, fabric) and broadcast back (sim_core.distinct)
    factor = distinct.enabled() and len(b) >= distinct.MIN_ROWS
    if factor:
        net_first, fabric = distinct.rows(list(net.values()))
    out = []
    seen = {}  # several collectives share their bytes, group and nodes arrays (TP's, DP's)
    for cm in wl.comms:
        if cm.dim in skip:
            continue
        issued = cm.calls_per_step > 0
        if not np.any(issued):  # issued by no configuration of the batch
            out.append((cm, np.zeros(np.shape(cm.calls_per_step))))
            continue
        if factor:
            # grouped by the inventory's own arrays (shared by several collectives, and the
            # group sizes often a batch column: their codes are found once)
            same = (id(cm.nbytes), id(cm.group), id(cm.nodes))
            if same not in seen:
                seen[same] = distinct.rows([cm.nbytes, cm.group, cm.nodes, fabric])
            first, inv = seen[same]
            group = np.maximum(cm.group[first], 1.0).astype(np.int64)
            nodes = np.maximum(cm.nodes[first], 1.0).astype(np.int64)
            rows_net = {k: v[net_first[fabric[first]]] for k, v in net.items()}
            res = nccl.collective_time(np.full(first.shape, COLL_CODE[cm.op]), cm.nbytes[first],
                                       group, nodes, rows_net, profile=profile)
            time_s = res["time_s"].take(inv)
        else:
            group = np.maximum(cm.group, 1.0).astype(np.int64)
            nodes = np.maximum(cm.nodes, 1.0).astype(np.int64)
            code = np.full(cm.group.shape, COLL_CODE[cm.op])
            time_s = nccl.collective_time(code, cm.nbytes, group, nodes, net,
                                          profile=profile)["time_s"]
        per_call = select(issued, time_s, 0.0)
        out.append((cm, per_call))
    return out


def fabric(b: Batch, wl: Workload, bubble_comm) -> dict:
    """Which groups cross nodes and how many collective calls per step do (terms.FABRIC_KEYS):
    what the calibration's tiered terms and network-latency term act on. A dimension spans
    nodes when any of its collectives does (the rank order of workload.span_nodes)."""
    span = {d: np.zeros(b.tp.shape, bool) for d in ("tp_cp_ep", "pp", "dp")}
    calls = np.zeros(b.tp.shape)
    for cm in wl.comms:
        net = (cm.nodes > 1) & (cm.calls_per_step > 0) & (cm.group > 1)
        key = "tp_cp_ep" if cm.dim in ("tp", "cp", "ep") else cm.dim
        span[key] = span[key] | net
        calls = calls + where(net, cm.calls_per_step, 0.0)
    return {"span_tp_cp_ep": span["tp_cp_ep"], "span_pp": span["pp"] & (b.pp > 1),
            "span_dp": span["dp"], "net_calls": calls, "bubble_comm": bubble_comm}


def last_stage_layers_s(b: Batch, wl: Workload, stage_mb) -> np.ndarray:
    """Seconds per micro-batch the last pipeline rank's transformer layers differ from the
    others': its MTP layers (specs mtp_layers: one transformer layer of the decoder's spec each,
    Megatron-Core transformer/multi_token_prediction.py L475-477, core_v0.15.3; its head, loss
    and eh_proj are last-stage ops, workload._ops) and, under a pipeline layout
    (pp_last_stage_layers > 0), the decoder layers it holds fewer or more than the even split.
    A layer costs the stage's average (dense and MoE layers mixed, with its recompute and
    exposed communication): the MTP layer of a MoE model is a MoE layer, a little dearer.
    Negative where the layout leaves the last rank lighter than the others."""
    mtp = np.asarray(b.mtp_layers, dtype=np.float64)
    last = np.asarray(b.pp_last_stage_layers, dtype=np.float64)
    L = np.maximum(wl.layers_per_stage, 1.0)
    moved = where((b.pp > 1) & (last > 0), last - wl.layers_per_stage, 0.0)
    return (mtp + moved) * stage_mb / L


def compose(b: Batch, wl: Workload, profile=None, with_fabric: bool = False) -> dict:
    """The step's breakdown; with_fabric adds terms.FABRIC_KEYS as `fabric_<key>` columns."""
    st = compute.stage_times(b, wl)
    m = wl.num_microbatches
    p, v, t = b.pp, b.vpp, b.tp
    arch = b.sm_arch

    per_mb = {dim: np.zeros_like(m) for dim in ("tp", "cp", "ep", "pp")}
    tp_edge = np.zeros_like(m)
    cp_edge = np.zeros_like(m)  # CP collectives that nothing hides (all-gather variant)
    dp_parts = {"backward": np.zeros_like(m), "forward": np.zeros_like(m)}
    dp_per_mb = {"backward": np.zeros_like(m), "forward": np.zeros_like(m)}
    # the largest message each dimension sends, and its group: features of its overlaps
    msg = {dim: np.zeros_like(m) for dim in ("tp", "cp", "ep", "dp", "pp")}
    grp = {dim: np.zeros_like(m) for dim in msg}
    # the EP dispatcher's transfers are priced and overlapped by moe.py, not here
    for cm, per_call in comm_times(b, wl, profile, skip=("ep",)):
        total = per_call * cm.calls_per_step
        if overlap.reads_features():  # (only a learned overlap model reads them)
            bigger = (cm.calls_per_step > 0) & (cm.nbytes > msg[cm.dim])
            msg[cm.dim] = select(bigger, cm.nbytes, msg[cm.dim])
            grp[cm.dim] = select(bigger, cm.group, grp[cm.dim])
        if cm.dim == "dp":
            z3 = b.zero >= 2
            if cm.overlap in dp_parts:
                # ZeRO-2/3 issue their collectives every micro-batch: count them per micro-batch
                each = z3 & (cm.calls_per_step >= m)
                dp_per_mb[cm.overlap] += select(each, total / m, 0.0)
                dp_parts[cm.overlap] += select(each, 0.0, total)
        elif cm.dim == "tp" and cm.overlap == "none":
            tp_edge += total / m
        elif cm.dim == "cp" and cm.overlap == "none":
            cp_edge += total / m
        else:
            per_mb[cm.dim] += total / m

    # ---- per micro-batch stage time ------------------------------------------------------
    lay_fwd, lay_bwd, lay_rc = st["layer_fwd"], st["layer_bwd"], st["layer_recompute"]
    gemm_window = st["layer_gemm_fwd"] * 3.0  # forward + backward GEMMs of the stage
    attn_window = st["layer_attn_fwd"] * 3.5
    # TP: exposed unless TP-comm overlap (userbuffers / AsyncTP) splits each collective into
    # tp chunks pipelined with the GEMM; the first chunk stays exposed
    tp_exp_ov, tp_extra = overlap.overlap_with(per_mb["tp"], gemm_window, arch, "gemm", "tp",
                                                  "all_gather", msg["tp"], grp["tp"])
    tp_exp_ov = tp_exp_ov + per_mb["tp"] / np.maximum(t, 2)
    ov = b.tp_comm_overlap
    tp_exposed = select(ov, tp_exp_ov, per_mb["tp"]) + tp_edge
    slow = select(ov, tp_extra, 0.0)
    # CP: the ring exchange of K/V blocks overlaps the attention of the block in hand
    cp_exposed, cp_extra = overlap.overlap_with(per_mb["cp"], attn_window, arch, "attention",
                                                  "cp", "send_recv", msg["cp"], grp["cp"])
    cp_exposed = cp_exposed + cp_edge
    slow = slow + cp_extra
    # EP: the dispatcher's dispatch/combine, exposed unless the shared experts or the combined
    # 1F1B schedule hide it (moe.exposed)
    moe_frac = wl.moe_stage_share  # the busiest rank's MoE share
    n_moe = wl.layers_per_stage * moe_frac
    d_times = distinct.on_distinct(
        "moe.dispatch_times", b, lambda sb: moe.dispatch_times(
            sb, sb.micro_batch * sb.seq_len / sb.cp / sb.tp, moe.expert_load_factor(sb),
            network(sb), profile))
    if (any(np.any(v != 0) for v in d_times.values()) or np.any(b.moe_a2a_overlap)
            or np.any(b.moe_shared_expert_overlap)):
        mlp_f, mlp_b = st["layer_moe_mlp_fwd"], st["layer_moe_mlp_bwd"]
        mlp_w = st["layer_moe_mlp_wgrad"]
        moe_parts = {"attn_f": (lay_fwd - mlp_f) * moe_frac,
                     "attn_b": (lay_bwd - mlp_b) * moe_frac,
                     "mlp_f": mlp_f, "mlp_dgrad": mlp_b - mlp_w, "mlp_wgrad": mlp_w,
                     "shared_f": st["layer_shared_fwd"], "shared_b": st["layer_shared_bwd"]}
        # a full recompute, or the MoE-layer recompute module, replays dispatch and combine
        replay = (b.recompute == 2) | recompute.has(recompute.effective(b), "moe")
        ep_exposed, ep_extra = moe.exposed(b, d_times, moe_parts, n_moe, m, replay)
    else:  # no EP transfer and no EP overlap in the batch (dense models): nothing to expose
        ep_exposed = ep_extra = np.zeros_like(m)
    slow = slow + ep_extra
    # ZeRO-2/3: per micro-batch gradient reduce-scatter behind backward, parameter all-gather
    # behind forward (prefetch); the first layer's gather cannot be hidden
    L_stage = wl.layers_per_stage
    z_bwd_exp, z_bwd_extra = overlap.overlap_with(dp_per_mb["backward"], lay_bwd, arch, "gemm",
                                                    "dp", "reduce_scatter", msg["dp"],
                                                    grp["dp"])
    z_fwd_exp, z_fwd_extra = overlap.overlap_with(dp_per_mb["forward"], lay_fwd + lay_bwd, arch,
                                                    "gemm", "dp", "all_gather", msg["dp"],
                                                    grp["dp"])
    z_exposed = z_bwd_exp + z_fwd_exp + dp_per_mb["forward"] / np.maximum(2 * L_stage, 1)
    slow = slow + z_bwd_extra + z_fwd_extra

    layers_mb = lay_fwd + lay_bwd + lay_rc
    comm_mb = tp_exposed + cp_exposed + ep_exposed + z_exposed
    stage_mb = layers_mb + comm_mb + slow
    first_extra = st["first_stage_fwd"] + st["first_stage_bwd"]
    last_extra = st["last_stage_fwd"] + st["last_stage_bwd"]
    single = p == 1
    last_extra = last_extra + last_stage_layers_s(b, wl, stage_mb)
    # Megatron-Core's split that counts the embedding / loss as a layer (sim_core/pp_split.py):
    # the first / last rank holds a layer fewer; a middle rank may become the busiest
    middle_extra = None
    if pp_split.any_on(b):
        d_first, d_last, middle_extra = pp_split.stage_extras(b, wl.layers_per_stage, stage_mb)
        first_extra, last_extra = first_extra + d_first, last_extra + d_last
    # m * t_max (t_max = stage_mb + the larger stage extra) plus the bubble; the step below
    # adds these up component by component
    t_avg = stage_mb + (first_extra + last_extra) / p
    if middle_extra is not None:  # the middle ranks' own extra (0 unless they hold more)
        t_avg = t_avg + where(np.isfinite(middle_extra), middle_extra * (p - 2) / p, 0.0)
    bubble = (p - 1) / v * t_avg

    # PP point-to-point: blocking in 1F1B's steady state; interleaving with overlapped p2p
    # leaves only the warm-up and cool-down transfers exposed
    p2p_each = where(p > 1, per_mb["pp"] / np.maximum(2 * v, 1), 0.0)  # one transfer
    pp_exposed = where(v > 1, 2 * p2p_each * 2 * (p - 1), 2 * p2p_each * (m + p - 1))
    pp_exposed = where(p > 1, pp_exposed, 0.0)

    # ---- data parallel after the flush -------------------------------------------------------
    # grads: reduce-scatter / all-reduce overlaps the last micro-batch's backward (bucketed),
    # except the last bucket; params: all-gather overlaps the first micro-batch's forward
    grad_c, param_c = dp_parts["backward"], dp_parts["forward"]
    last_bucket = np.minimum(1.0, last_bucket_params(wl) / np.maximum(wl.params_stage, 1.0))
    g_exp, g_extra = overlap.overlap_with(grad_c * (1 - last_bucket), lay_bwd, arch, "gemm",
                                          "dp", "reduce_scatter", msg["dp"], grp["dp"])
    g_exp = g_exp + grad_c * last_bucket
    g_exp = where(b.overlap_grad_reduce, g_exp, grad_c)
    p_exp, p_extra = overlap.overlap_with(param_c * (1 - last_bucket), lay_fwd, arch, "gemm",
                                          "dp", "all_gather", msg["dp"], grp["dp"])
    p_exp = p_exp + param_c * last_bucket
    p_exp = where(b.overlap_param_gather, p_exp, param_c)
    slow = slow * m + where(b.overlap_grad_reduce, g_extra, 0.0) + where(
        b.overlap_param_gather, p_extra, 0.0)
    dp_exposed = g_exp + p_exp + z_exposed * m

    # ---- optimizer ---------------------------------------------------------------------------
    ds = wl.dp * b.cp
    P_train = wl.params_stage if wl.params_trainable is None else wl.params_trainable
    P_opt = where(b.zero >= 1, P_train / ds, P_train)  # LoRA: the adapters (finetune.py)
    t_opt = compute.optimizer_time(b, P_opt)

    busiest_end = np.maximum(first_extra, last_extra)
    if middle_extra is not None:  # with the split on, a middle rank can be the busiest
        busiest_end = np.maximum(busiest_end, middle_extra)
    compute_t = m * (lay_fwd + lay_bwd) + m * where(single, first_extra + last_extra,
                                                       busiest_end)
    breakdown = {
        "time_compute": compute_t,
        "time_recompute": m * lay_rc,
        "time_tp": m * tp_exposed,
        "time_cp": m * cp_exposed,
        "time_ep": m * ep_exposed,
        "time_dp": dp_exposed,
        "time_pp": pp_exposed,
        "time_bubble": bubble,
        "time_optimizer": t_opt,
        "time_slowdown": slow,
    }
    # per-term scales, host overhead and node-count growth (sim_core/terms.py: the default
    # model's values, or a run calibration's)
    learned = terms.residual()
    # the fabric flags only matter to fitted terms, a learned residual or a caller that asks
    # (the default model's terms are neutral: it skips them and keeps its speed)
    if with_fabric or learned is not None or terms.active():
        # the bubble's seconds of exposed TP/CP/EP communication: scaled with the communication
        fab = fabric(b, wl, where(p > 1, (p - 1) / v * (tp_exposed + cp_exposed
                                                           + ep_exposed), 0.0))
    else:
        fab = terms.no_fabric(m)
    raw = terms.raw_parts(breakdown, fab) if learned is not None else None
    breakdown = terms.apply(breakdown, m, terms.nodes_of(b.num_gpus, b.gpus_per_node),
                            fabric=fab)
    extra = {f"fabric_{k}": np.asarray(v, float) for k, v in fab.items()} if with_fabric else {}
    if learned is not None:
        # a calibration's learned residual scales every part alike (outside its range: the
        # residual of the fitted edge, and the row is flagged)
        r, flag = learned(b, wl, raw, fab)
        f = np.exp(r)
        breakdown = {k: v * f for k, v in breakdown.items()}
        extra["residual_extrapolated"] = flag
    # the step is exactly the sum of its parts (the pipeline term above decomposes into them)
    step = sum(breakdown.values())
    iv = terms.interval()
    if iv is not None:
        flagged = np.asarray(extra.get("residual_extrapolated", 0.0), bool)
        sigma = where(flagged, iv[1], iv[0])
        extra["step_time_lo_s"] = step * np.exp(-terms.Z90 * sigma)
        extra["step_time_hi_s"] = step * np.exp(terms.Z90 * sigma)
    return {"step_time_s": step, **breakdown, **extra}
