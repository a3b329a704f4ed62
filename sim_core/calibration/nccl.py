"""nccl-tests logs for `sweep calibrate nccl`: the GPU and the layout of each log, and the
per-cluster scales of the white-box NCCL model (sim_core/nccl.py) fitted to them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import catalog, nccl
from ..nccl_tests import _op_from_text, read_log
from .training import _gpu_row

# =============================================================================================
# NCCL: per-cluster scales of the white-box model, fitted to nccl-tests output
# =============================================================================================
SCALES = ("nvlink_bw", "nic_bw", "intra_latency", "inter_latency")
_NET_KEY = nccl.CALIBRATION_KEYS
def guess_gpu(text: str) -> str | None:
    """Catalog GPU from the device names in an nccl-tests header ("NVIDIA H100 80GB HBM3")."""
    return gpu_from_names(re.findall(r"device\s+\d+\s+\[[^\]]*\]\s+(.+)$", text, re.M))


def base_network(gpu: str, cluster: str | None = None) -> dict:
    """The NCCL model's network dict for a GPU's default cluster (or a named cluster)."""
    r = _gpu_row(gpu)
    cl = catalog.get_cluster(cluster) if cluster else None

    def field(name):
        return float(getattr(cl, name)) if cl is not None else float(r[name])

    gpn = field("gpus_per_node")
    return {"sm_arch": float(r["sm_arch"]), "nvlink_bw_gbs": float(r["nvlink_bw_gbs"]),
            "nvls": bool(r["nvls"]), "mesh_links": float(r["mesh_links"]),
            "nic_bw_gbs": field("nic_bw_gbs") * field("nics_per_node") / gpn,
            "intra_latency_us": field("intra_latency_us"),
            "inter_latency_us": field("inter_latency_us")}


def scale_net(net: dict | None, scales: dict) -> dict:
    return nccl.scale_net(net, scales)


def gpu_from_names(names) -> str | None:
    """Catalog GPU id for the device names of an nccl-tests header, or None."""
    for name in names:  # sim_core/gpu_names.py: product names as rocm-smi/nvidia-smi print them
        gpu = catalog.resolve_gpu(name)
        if gpu:
            return gpu
    return None


DEFAULT_NCCL_GPU = "h100-sxm"


def nccl_gpu(paths, given: str | None = None, notes: dict | None = None) -> str:
    """The catalog GPU of the logs: --gpu, else the device lines. A GPU named but outside the
    catalog is a one-line error naming --gpu; a log that names none (a pasted table) is
    fitted against h100-sxm's catalog network, said in `notes` (the fitted scales absorb the
    difference; --gpu fits against another)."""


    if given:  # a catalog id or a product name ("MI300X VF"): its catalog id
        return catalog.get_gpu(given).name
    names = []
    for p in paths:
        names += read_log(Path(p).read_text(errors="replace")).gpu_names
    gpu = gpu_from_names(names)
    if gpu:
        return gpu
    known = ", ".join(catalog.gpu_table().index)
    if names:
        from .. import gpu_names

        named = gpu_names.resolve(names[0])
        what = f"is {named}, which is" if named else "is"
        raise ValueError(f"GPU '{names[0]}' (the log's device lines) {what} not in the catalog; "
                         f"give --gpu with the nearest catalog GPU ({known})")
    if notes is not None:
        notes.setdefault("*", []).append(
            f"GPU: the logs name none; fitted against {DEFAULT_NCCL_GPU}'s catalog network "
            f"(give --gpu for another: {known})")
    return DEFAULT_NCCL_GPU


def _infer_nodes(log, gpu: str) -> tuple[int, str]:
    """Nodes of a log that does not list its hosts: ranks packed gpus_per_node to a node,
    unless the packing puts them on one node and the measured busbw is far below NVLink's
    (then the ring crossed the network: one rank per node)."""
    r = _gpu_row(gpu)
    gpn = int(r["gpus_per_node"])
    peak = max((x["oop_busbw"] for x in log.rows if np.isfinite(x["oop_busbw"])), default=0.0)
    packed = -(-log.group // gpn)
    if packed == 1 and log.group > 1 and peak < 0.4 * float(r["nvlink_bw_gbs"]):
        return log.group, (f"peak busbw {peak:.0f} GB/s is far below {gpu}'s NVLink "
                           f"{r['nvlink_bw_gbs']:.0f} GB/s: one rank per node")
    return packed, f"{log.group} ranks packed {gpn} to a node"


def nccl_rows(paths, op: str | None = None, ranks: int | None = None,
              nodes: int | None = None, notes: dict | None = None,
              gpu: str | None = None) -> pd.DataFrame:
    """All rows of nccl-tests logs (out-of-place time), with the file as source. What a log
    does not state is inferred (nccl_tests.read_log; nodes from the GPU's node size) and the
    inferences go to `notes` ({file: [lines]}); what cannot be told is a one-line ValueError
    naming the option to pass."""


    frames = []
    for p in paths:
        text = Path(p).read_text(errors="replace")
        log = read_log(text, op=op or _op_from_text(Path(p).name), ranks=ranks, nodes=nodes)
        if not log.rows:
            # a run that failed says so in the tests' own failure line (common.cu
            # "Test NCCL failure <file>:<line> '<error>'"): name it rather than the empty table
            failed = re.search(r"Test (?:NCCL|CUDA|HIP) failure \S+ '([^']*)'", text)
            why = f": the run failed ({failed.group(1).strip(' /')})" if failed else ""
            raise ValueError(f"{p}: no nccl-tests result rows in the file{why}")
        if log.op is None:
            raise ValueError(f"{p}: cannot tell the collective; pass --op")
        if log.group is None:
            why = next((n for n in log.notes if n.startswith("ranks:")), "")
            raise ValueError(f"{p}: cannot tell the number of ranks ({why.removeprefix('ranks: ')}"
                             f"); pass --ranks".replace(" ()", ""))
        if log.nodes is None:
            if gpu is None:
                raise ValueError(f"{p}: the log does not say how many nodes ran it; pass --nodes")
            log.nodes, why = _infer_nodes(log, gpu)
            log.notes.append(f"{log.nodes} node(s): not in the log; {why} (pass --nodes if not)")
        if notes is not None:
            notes[str(p)] = log.notes
        df = pd.DataFrame(log.rows).assign(op=log.op, group=log.group, nodes=log.nodes,
                                           source=Path(p).name,
                                           gpu_names="; ".join(log.gpu_names))
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    df = df[(df["size"] > 0) & (df["oop_time_us"] > 0)].reset_index(drop=True)
    return df


def nccl_file_fits(df: pd.DataFrame, net: dict, min_bytes: float = 2**20) -> pd.DataFrame:
    """Each log fitted on its own: median |model/measured - 1| over its sizes >= min_bytes,
    with the catalog values and with the scales fitted to that log alone."""
    out = []
    for src, g in df.groupby("source", sort=False):
        big = g["size"] >= min_bytes
        if not big.any():
            big = g["size"] == g["size"].max()
        sc = fit_nccl_scales(g[big], net)
        meas = g["oop_time_us"].to_numpy(float)[big.to_numpy()]
        e0 = nccl_model_us(g[big], net) / meas - 1
        e1 = nccl_model_us(g[big], net, sc) / meas - 1
        out.append({"source": src, "rows": len(g), "rows_fitted_error": int(big.sum()),
                    "median_abs_err_default": float(np.median(np.abs(e0))),
                    "median_abs_err_fitted": float(np.median(np.abs(e1)))})
    return pd.DataFrame(out)


def nccl_model_us(df: pd.DataFrame, net: dict, scales: dict | None = None) -> np.ndarray:
    code = np.array([nccl.COLLECTIVES.index(o) for o in df["op"]])
    res = nccl.collective_time(code, df["size"].to_numpy(float), df["group"].to_numpy(float),
                               df["nodes"].to_numpy(float), scale_net(net, scales or {}))
    return res["time_s"] * 1e6


def _identifiable(df: pd.DataFrame) -> list[str]:
    multi = (df["nodes"] > 1).any()
    single = ((df["nodes"] == 1) & (df["group"] > 1)).any()
    out = []
    if single or ((df["group"] / df["nodes"]) > 1).any():
        out += ["nvlink_bw", "intra_latency"]
    if multi:
        out += ["nic_bw", "inter_latency"]
    return out


def fit_nccl_scales(df: pd.DataFrame, net: dict, prior_weight: float = 0.02,
                    robust_scale: float = 0.05) -> dict:
    """Scales minimising the log-time error over all rows (plus a weak pull to 1, so that
    scales the data cannot see stay 1). The loss is Cauchy beyond `robust_scale` (5% in log
    time): real curves carry protocol-switch dips and noisy points that a squared loss would
    chase at the expense of the rest. Multi-start: NCCL's algorithm choice makes the error
    piecewise smooth."""
    from scipy.optimize import least_squares

    free = _identifiable(df)
    if not free:
        return {s: 1.0 for s in SCALES}
    meas = np.log(df["oop_time_us"].to_numpy(float))
    prior = prior_weight * math.sqrt(len(meas))

    def resid(x):
        sc = dict(zip(free, np.exp(x)))
        r = np.log(nccl_model_us(df, net, sc)) - meas
        return np.concatenate([r, prior * x])

    best = None
    starts = [np.zeros(len(free))] + [np.full(len(free), v) for v in (-1.5, -0.5, 0.5, 1.5)]
    for x0 in starts:
        res = least_squares(resid, x0, bounds=(-3.0, 3.0), diff_step=1e-3, x_scale=0.3,
                            loss="cauchy", f_scale=robust_scale)
        if best is None or res.cost < best.cost:
            best = res
    out = {s: 1.0 for s in SCALES}
    out.update({s: float(np.exp(v)) for s, v in zip(free, best.x)})
    return out


def _size_bucket(s):
    return np.where(s < 64 * 1024, "<64KiB", np.where(s < 16 * 2**20, "64KiB-16MiB", ">=16MiB"))


def nccl_fit_report(df: pd.DataFrame, net: dict, scales: dict) -> pd.DataFrame:
    """Per row: measured, default-model and fitted-model times and relative errors."""
    out = df[["source", "op", "group", "nodes", "size", "oop_time_us"]].copy()
    out = out.rename(columns={"oop_time_us": "measured_us"})
    out["default_us"] = nccl_model_us(df, net)
    out["fitted_us"] = nccl_model_us(df, net, scales)
    out["err_default"] = out["default_us"] / out["measured_us"] - 1
    out["err_fitted"] = out["fitted_us"] / out["measured_us"] - 1
    out["size_bucket"] = _size_bucket(out["size"].to_numpy())
    return out


def nccl_loso(df: pd.DataFrame, net: dict) -> pd.DataFrame:
    """Leave one nccl-tests file out: fit the scales on the others, error on it."""
    rows = []
    srcs = sorted(df["source"].unique())
    if len(srcs) < 2:
        return pd.DataFrame()
    for s in srcs:
        tr, te = df[df["source"] != s], df[df["source"] == s]
        sc = fit_nccl_scales(tr, net)
        e = nccl_model_us(te, net, sc) / te["oop_time_us"].to_numpy() - 1
        seen = set(_identifiable(tr))
        rows.append({"held_out": s, "rows": len(te), "median_abs_err": float(np.median(np.abs(e))),
                     "max_abs_err": float(np.max(np.abs(e))),
                     "unseen_scales": ",".join(x for x in _identifiable(te) if x not in seen)})
    return pd.DataFrame(rows)


# =============================================================================================
# Synthetic examples (known ground truth; no GPU was available to measure real kernels)
# =============================================================================================
