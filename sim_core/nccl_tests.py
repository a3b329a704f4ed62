"""Read nccl-tests output and turn it into a measured profile for the NCCL model.

nccl-tests (github.com/NVIDIA/nccl-tests) prints, per size, one row with out-of-place and
in-place columns: size count type redop root time algbw busbw #wrong (time in us, bandwidths
in GB/s; older versions lack the root column and call #wrong "error"). The header lists every
rank with its host ("#  Rank  3 Group  0 Pid 123 on node1 device 3 [...] NVIDIA H100"), which
gives the group size and the number of nodes. A profile measured on the target cluster is the
best estimate there is: `nccl.collective_time(..., profile=load_profile(paths))` interpolates
the measured busbw over log(size) for matching (op, group, nodes), clamped at the ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .nccl import COLLECTIVES, bus_factor

_OP_NAMES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "broadcast": "broadcast", "sendrecv": "send_recv", "send_recv": "send_recv",
}
_TEST_RE = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv)_perf")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# What launchers put in front of every line: SkyPilot "(head, rank=0, pid=3808) ", OpenMPI's
# --tag-output and kubeflow MPIJob "[1,0]<stdout>:", srun -l "0: "; repeated prefixes stack.
_PREFIX_RE = re.compile(r"^(?:\([\w.-]+, rank=\d+, pid=\d+(?:, ip=[\d.]+)?\)\s*"
                        r"|\[\d+,\d+\]<std(?:out|err)>:\s?|\s*\d+:\s)")
# "#  Rank  0 Group  0 Pid 123 on host device  0 [0x86] NVIDIA H100" (2.x) and the older
# "#   Rank  0 Pid 123 on host device  0 [0x86] Tesla T4" (no Group)
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+"
                      r"device\s+\d+\s+\[[^\]]*\]\s+(.*?)\s*$", re.IGNORECASE)
# size count type redop [root] time algbw busbw #wrong|error [time algbw busbw #wrong]
_ROW_RE = re.compile(
    rf"^\s*(\d+)\s+(\d+)\s+([a-z][a-z0-9_]*)\s+([a-z]+)\s+(-?\d+\s+)?"
    rf"({_NUM})\s+({_NUM})\s+({_NUM})\s+(\S+)"
    rf"(?:\s+({_NUM})\s+({_NUM})\s+({_NUM})\s+(\S+))?\s*$", re.IGNORECASE)
_DTYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "half": 2, "float16": 2, "bfloat16": 2,
                "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "float": 4, "float32": 4, "int32": 4,
                "uint32": 4, "int": 4, "double": 8, "float64": 8, "int64": 8, "uint64": 8}


def strip_prefix(line: str) -> str:
    """A log line without the launcher's prefixes."""
    while True:
        m = _PREFIX_RE.match(line)
        if not m or not m.group(0):
            return line
        line = line[m.end():]


def _op_from_text(text: str) -> str | None:
    m = _TEST_RE.search(text)
    return _OP_NAMES[m.group(1)] if m else None


_MPI_NP_RE = re.compile(r"\b(?:mpirun|mpiexec|srun)\b(.*?)(?:\S*_perf\b|$)")
_NP_RE = re.compile(r"(?:^|\s)(?:-np|-n|--np|--ntasks)[\s=](\d+)")
_HOSTS_RE = re.compile(r"(?:^|\s)(?:-H|--host)[\s=]([\w.:,-]+)")
_SRUN_NODES_RE = re.compile(r"(?:^|\s)(?:-N|--nodes)[\s=](\d+)")
_GPUS_RE = re.compile(r"_perf\b.*?\s-g\s+(\d+)")


def _launch(text: str) -> dict:
    """What the launch command in a log says: processes (mpirun/mpiexec -np, srun -n), hosts
    (-H a,b / --host), nodes (srun -N) and GPUs per process (the test's -g). Continuation
    lines ("\\" at the end) are joined; the test's own -n (iterations) is not a rank count."""
    joined = re.sub(r"\\\s*\n\s*[>$]?\s*", " ", text)
    out: dict = {}
    for line in joined.splitlines():
        line = strip_prefix(line)
        m = _MPI_NP_RE.search(line)
        if m and "np" not in out:
            launcher = m.group(1)
            n = _NP_RE.search(launcher)
            if n:
                out["np"] = int(n.group(1))
            h = _HOSTS_RE.search(launcher)
            if h:
                out["hosts"] = len({x.split(":")[0] for x in h.group(1).split(",") if x})
            if "srun" in line:
                nn = _SRUN_NODES_RE.search(launcher)
                if nn:
                    out["nodes"] = int(nn.group(1))
        g = _GPUS_RE.search(line)
        if g and "g" not in out:
            out["g"] = int(g.group(1))
    return out


def _val(t: str | None) -> float:
    return float(t) if t is not None and re.fullmatch(_NUM, t) else np.nan


@dataclass
class Log:
    """One nccl-tests run read from a log: its rows, what it is, and how that was told."""

    rows: list = field(default_factory=list)
    op: str | None = None
    group: int | None = None
    nodes: int | None = None
    gpu_names: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # every inference, to print


def read_log(text: str, op: str | None = None, ranks: int | None = None,
             nodes: int | None = None) -> Log:
    """Parse nccl-tests output as users have it: launcher prefixes, NCCL INFO/WARN and MPI
    lines anywhere, old (error column, no root) and new (#wrong, N/A) formats, no header at
    all. What the text does not say is inferred from the rows (printed in `notes`):
    the collective from the reduction column and busbw/algbw, the rank count from that ratio
    and from size/count. `op`, `ranks`, `nodes` override."""
    log = Log()
    ranks_seen, hosts, names = set(), {}, {}
    for raw in text.splitlines():
        line = strip_prefix(raw.rstrip())
        m = _RANK_RE.match(line.strip())
        if m:
            ranks_seen.add(int(m.group(1)))
            hosts[m.group(2)] = True
            names[m.group(3).strip()] = True
            continue
        if line.lstrip().startswith("#") or "NCCL " in line:
            continue
        r = _ROW_RE.match(line)
        if not r:
            continue
        g = r.groups()
        log.rows.append({
            "size": int(g[0]), "count": int(g[1]), "dtype": g[2].lower(), "redop": g[3].lower(),
            "root": int(g[4]) if g[4] else -1,
            "oop_time_us": _val(g[5]), "oop_algbw": _val(g[6]), "oop_busbw": _val(g[7]),
            "oop_wrong": _val(g[8]), "ip_time_us": _val(g[9]), "ip_algbw": _val(g[10]),
            "ip_busbw": _val(g[11]), "ip_wrong": _val(g[12])})
    log.gpu_names = list(names)
    # the collective
    named = op or _op_from_text(text)
    if op:
        log.op = _OP_NAMES.get(op.removesuffix("_perf"), op.removesuffix("_perf"))
    elif named:
        log.op = named
        log.notes.append(f"collective {named}: named in the log")
    # rows that carry a precise ratio (large bandwidths: two decimals are enough)
    ratio = _ratio(log.rows)
    if log.op is None and log.rows:
        log.op, why = _infer_op(log.rows, ratio, len(ranks_seen) or ranks)
        log.notes.append(f"collective {log.op}: {why}")
    launch = _launch(text)
    # the ranks
    if ranks:
        log.group = int(ranks)
    elif ranks_seen:
        log.group = len(ranks_seen)
        log.notes.append(f"{log.group} ranks: the log's device lines")
    elif "np" in launch:
        log.group = launch["np"] * launch.get("g", 1)
        log.notes.append(f"{log.group} ranks: the launch command ({launch['np']} processes x "
                         f"{launch.get('g', 1)} GPU(s) each)")
    elif log.rows and log.op:
        hinted = {int(n) for n in _COUNT_HINT_RE.findall(text)}
        log.group, why = _infer_ranks(log.rows, log.op, ratio, hinted)
        if why:
            log.notes.append(f"{log.group} ranks: {why}" if log.group else f"ranks: {why}")
    # the nodes
    if nodes:
        log.nodes = int(nodes)
    elif hosts:
        log.nodes = len(hosts)
        log.notes.append(f"{log.nodes} node(s): distinct hosts in the device lines")
    elif "nodes" in launch or "hosts" in launch:
        log.nodes = launch.get("nodes") or launch["hosts"]
        log.notes.append(f"{log.nodes} node(s): the launch command's host list")
    return log


def _ratio(rows: list) -> float:
    """busbw / algbw, from the rows whose bandwidths are large enough to be precise."""
    r = np.array([(x["oop_busbw"], x["oop_algbw"]) for x in rows if x["oop_algbw"] > 0])
    if not len(r):
        return np.nan
    big = r[r[:, 1] >= 1.0]
    use = big if len(big) else r
    return float(np.median(use[:, 0] / use[:, 1]))


def _infer_op(rows: list, ratio: float, ranks: int | None) -> tuple[str, str]:
    red = rows[0]["redop"]
    root = rows[0]["root"]
    if red == "none":
        if root >= 0:
            return "broadcast", "no reduction and a root rank"
        return "all_gather", (f"no reduction, busbw/algbw {ratio:.3f} = (n-1)/n (alltoall reads "
                              "the same: pass --op alltoall if it was)")
    if np.isfinite(ratio) and ratio > 1.02:
        return "all_reduce", f"reduction {red}, busbw/algbw {ratio:.3f} = 2(n-1)/n"
    if np.isfinite(ratio) and ratio < 0.98:
        return "reduce_scatter", f"reduction {red}, busbw/algbw {ratio:.3f} = (n-1)/n"
    if ranks and ranks != 2:
        return "send_recv", f"reduction {red}, busbw = algbw with {ranks} ranks"
    return "all_reduce", (f"reduction {red}, busbw = algbw: an all-reduce over 2 ranks (sendrecv "
                          "reads the same: pass --op sendrecv if it was)")


# "128 GPU all reduce", "16 GPUs", "64 ranks" in what the user wrote around the table
_COUNT_HINT_RE = re.compile(r"\b(\d{1,6})[ -]?(?:GPUs?|gpus?|ranks?|Ranks?)\b")


def _infer_ranks(rows: list, op: str, ratio: float,
                 hinted: set = frozenset()) -> tuple[int | None, str]:
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        # these print the per-rank count: size = count x dtype bytes x ranks
        r = rows[-1]
        b = _DTYPE_BYTES.get(r["dtype"])
        if b and r["count"]:
            n = r["size"] / (r["count"] * b)
            if abs(n - round(n)) < 1e-6 and n >= 1:
                return int(round(n)), f"size / (count x {b} B) = {int(round(n))}"
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        return None, ""
    # busbw/algbw = f(n): n from each row's ratio, within the rounding of its two printed
    # decimals; the rows together must pin one rank count
    lo, hi = 1.0, np.inf
    for x in rows:
        a, b = x["oop_algbw"], x["oop_busbw"]
        if not (a > 0 and b > 0):
            continue
        r_lo, r_hi = (b - 0.005) / (a + 0.005), (b + 0.005) / max(a - 0.005, 1e-9)
        inv = (lambda r: 2 / (2 - r) if r < 2 else np.inf) if op == "all_reduce" else \
            (lambda r: 1 / (1 - r) if r < 1 else np.inf)
        lo, hi = max(lo, inv(r_lo)), min(hi, inv(r_hi))
    cand = [n for n in range(int(np.ceil(lo - 1e-9)), int(np.floor(min(hi, 1e6))) + 1)]
    form = "2(n-1)/n" if op == "all_reduce" else "(n-1)/n"
    if len(cand) == 1:
        return cand[0], f"busbw/algbw {ratio:.3f} = {form}"
    agree = sorted(set(cand) & set(hinted))
    if len(agree) == 1:
        return agree[0], (f"'{agree[0]} GPU(s)/ranks' in the log's text, which busbw/algbw "
                          f"{ratio:.3f} = {form} allows ({len(cand)} counts fit the ratio)")
    return None, (f"busbw/algbw {ratio:.3f} = {form} fits {len(cand) or 'no'} rank counts "
                  f"({int(lo)}-{'many' if not np.isfinite(hi) or hi > 1e6 else int(hi)})")


def parse_output(text: str, op: str | None = None) -> list[dict]:
    """Rows of one nccl-tests run: op, group, nodes, size, count, dtype, redop, root and, for
    the out-of-place (oop_) and in-place (ip_) halves, time_us, algbw, busbw, wrong."""
    log = read_log(text, op=op)
    for r in log.rows:
        r.update(op=log.op, group=log.group, nodes=log.nodes)
    return log.rows


@dataclass
class Profile:
    """Measured busbw curves keyed by (op, group, nodes): sorted sizes and busbw (GB/s)."""

    curves: dict = field(default_factory=dict)

    def add(self, op: str, group: int, nodes: int, sizes, busbw) -> None:
        sizes = np.asarray(sizes, dtype=float)
        busbw = np.asarray(busbw, dtype=float)
        key = (op, int(group), int(nodes))
        if key in self.curves:  # merge runs: average busbw at equal sizes
            s0, b0 = self.curves[key]
            sizes, busbw = np.concatenate([s0, sizes]), np.concatenate([b0, busbw])
        ok = (sizes > 0) & (busbw > 0) & np.isfinite(busbw)
        sizes, busbw = sizes[ok], busbw[ok]
        u, inv = np.unique(sizes, return_inverse=True)
        b = np.bincount(inv, weights=busbw) / np.bincount(inv)
        self.curves[key] = (u, b)

    def busbw(self, op: str, group: int, nodes: int, nbytes) -> np.ndarray:
        """Measured busbw interpolated over log(size), clamped at the measured ends."""
        s, b = self.curves[(op, int(group), int(nodes))]
        return np.interp(np.log(np.maximum(np.asarray(nbytes, dtype=float), 1.0)), np.log(s), b)

    def lookup(self, op_code, nbytes, group, nodes):
        """(time_s, hit) for arrays of op codes, bytes, group sizes, nodes (model override)."""
        op_code = np.asarray(op_code)
        t = np.zeros(np.shape(nbytes))
        hit = np.zeros(np.shape(nbytes), dtype=bool)
        for (op, g, nn), (s, b) in self.curves.items():
            m = (op_code == COLLECTIVES.index(op)) & (group == g) & (nodes == nn)
            if not m.any():
                continue
            idx = np.flatnonzero(m)
            x = np.asarray(nbytes, dtype=float)[idx]
            bw = np.interp(np.log(np.maximum(x, 1.0)), np.log(s), b)
            alg = bw / bus_factor(np.full(idx.shape, COLLECTIVES.index(op)), np.full(idx.shape, g))
            t[idx] = x / (alg * 1e9)
            hit[idx] = True
        return t, hit


def load_profile(paths, op: str | None = None, column: str = "oop_busbw",
                 curves: dict | None = None) -> Profile:
    """Profile from nccl-tests output files (one run each; op from the text or `op`).

    Uses the out-of-place busbw by default (what frameworks run: separate in/out buffers).
    `curves` ({file name: {op, group, nodes}}) gives what calibration resolved for a log that
    does not say it (given options or inferred nodes), as a saved profile records it.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    prof = Profile()
    for path in paths:
        text = Path(path).read_text(errors="replace")
        known = (curves or {}).get(Path(path).name, {})
        log = read_log(text, op=known.get("op") or op or _op_from_text(Path(path).name),
                       ranks=known.get("group"), nodes=known.get("nodes"))
        if not log.rows:
            continue
        if log.op is None or log.group is None or log.nodes is None:
            raise ValueError(f"{path}: cannot tell the collective, the ranks or the nodes from "
                             "the output")
        prof.add(log.op, log.group, log.nodes, [r["size"] for r in log.rows],
                 [r[column] for r in log.rows])
    return prof
