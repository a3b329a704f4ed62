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
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device", re.IGNORECASE)
_TEST_RE = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv)_perf")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _op_from_text(text: str) -> str | None:
    m = _TEST_RE.search(text)
    return _OP_NAMES[m.group(1)] if m else None


def parse_output(text: str, op: str | None = None) -> list[dict]:
    """Rows of one nccl-tests run: op, group, nodes, size, count, dtype, redop, root and, for
    the out-of-place (oop_) and in-place (ip_) halves, time_us, algbw, busbw, wrong."""
    if op:
        key = op.removesuffix("_perf")
        op = _OP_NAMES.get(key, key)
    else:
        op = _op_from_text(text)
    hosts, ranks = {}, set()
    rows = []
    for line in text.splitlines():
        m = _RANK_RE.match(line.strip())
        if m:
            ranks.add(int(m.group(1)))
            hosts[m.group(2)] = True
            continue
        if line.lstrip().startswith("#") or not line.strip():
            continue
        tok = line.split()
        if len(tok) < 10 or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        # size count type redop [root] time algbw busbw wrong time algbw busbw wrong
        if len(tok) == 12:  # no root column (old nccl-tests)
            nums, root = tok[4:], -1
        else:
            root = int(tok[4]) if re.fullmatch(r"-?\d+", tok[4]) else -1
            nums = tok[5:]
        vals = []
        for t in nums[:8]:
            vals.append(float(t) if re.fullmatch(_NUM, t) else np.nan)
        while len(vals) < 8:
            vals.append(np.nan)
        rows.append({
            "size": int(tok[0]), "count": int(tok[1]), "dtype": tok[2], "redop": tok[3],
            "root": root,
            "oop_time_us": vals[0], "oop_algbw": vals[1], "oop_busbw": vals[2],
            "oop_wrong": vals[3],
            "ip_time_us": vals[4], "ip_algbw": vals[5], "ip_busbw": vals[6], "ip_wrong": vals[7],
        })
    group = len(ranks) if ranks else None
    nodes = len(hosts) if hosts else None
    for r in rows:
        r.update(op=op, group=group, nodes=nodes)
    return rows


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


def load_profile(paths, op: str | None = None, column: str = "oop_busbw") -> Profile:
    """Profile from nccl-tests output files (one run each; op from the text or `op`).

    Uses the out-of-place busbw by default (what frameworks run: separate in/out buffers).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    prof = Profile()
    for path in paths:
        text = Path(path).read_text()
        rows = parse_output(text, op=op or _op_from_text(Path(path).name))
        if not rows:
            continue
        r0 = rows[0]
        if r0["op"] is None or r0["group"] is None:
            raise ValueError(f"{path}: cannot tell the collective or the ranks from the output")
        prof.add(r0["op"], r0["group"], r0["nodes"], [r["size"] for r in rows],
                 [r[column] for r in rows])
    return prof
