"""One simulated training step as a Chrome / Perfetto trace (trace-event JSON).

Why: a step time is easier to trust, and two configurations easier to compare, when the step
can be read as a timeline. The numbers are the simulator's breakdown (`time_*` columns of a
simulated row), laid out on tracks; nothing is re-estimated here.

Layout (open the file in https://ui.perfetto.dev or chrome://tracing):
- process "step breakdown": the breakdown's parts end to end (they add up to the step time),
  and on a second thread, after the step, what failures cost per step on average: the
  checkpoint's blocking time over its interval and the rest of 1/goodput - 1 (lost work and
  restarts; sim_core/goodput.py), off the critical path;
- one process per pipeline stage, with threads (streams):
  - "compute (critical path)": forward, recompute, backward of each micro-batch in 1F1B order
    (all forwards, then all backwards, under pp_schedule afab), the communication that the
    overlap settings leave exposed (the stream waits for it), the overlap slowdown, the pipeline
    bubble (warm-up before, cool-down after, by stage position), then the data-parallel
    gradient sync that is left exposed and the optimizer step. Its events tile [0, step time]
    with no gap: their durations add up to the predicted step time;
  - "TP comm", "CP comm", "EP comm", "DP comm", "PP comm": the same exposed communication on its
    own stream, plus the communication hidden behind compute ("overlapped", off the critical
    path; TP, CP and DP, from the simulator's NCCL model of the same configuration; the
    hidden part of EP dispatch and of PP transfers is not drawn).

The simulator treats every stage as the slowest one, so all stages carry the same totals;
per micro-batch, forward and backward share `time_compute` in the ratio of the simulator's
layer forward and backward times, and exposed communication is split evenly between a
micro-batch's forward and backward (the breakdown gives their sum).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .simulation import plain_value
from ..errors import SweepError

US = 1e6  # trace-event timestamps are microseconds
BREAKDOWN_PID = 1  # pid 0 is the idle task to some viewers: processes start at 1


def stage_pid(stage: int) -> int:
    """The trace process of pipeline stage `stage` (0-based)."""
    return stage + 2

STREAMS = [  # tid, name, breakdown column of its exposed time
    (0, "compute (critical path)", None),
    (1, "TP comm", "time_tp"),
    (2, "CP comm", "time_cp"),
    (3, "EP comm", "time_ep"),
    (4, "DP comm", "time_dp"),
    (5, "PP comm", "time_pp"),
]
BREAKDOWN = [  # column, event name, category
    ("time_compute", "forward + backward", "compute"),
    ("time_recompute", "recompute", "recompute"),
    ("time_tp", "TP comm (exposed)", "comm_exposed"),
    ("time_cp", "CP comm (exposed)", "comm_exposed"),
    ("time_ep", "EP comm (exposed)", "comm_exposed"),
    ("time_pp", "PP send/recv (exposed)", "comm_exposed"),
    ("time_slowdown", "overlap slowdown", "slowdown"),
    ("time_bubble", "pipeline bubble", "bubble"),
    ("time_dp", "DP grad sync (exposed)", "comm_exposed"),
    ("time_optimizer", "optimizer", "optimizer"),
    ("time_host", "host overhead", "host"),
    ("time_latency", "network latency", "comm_exposed"),
    ("time_nodes", "node-count slowdown", "host"),
]
CONFIG_FIELDS = ("model", "gpu", "num_gpus", "framework", "tp", "pp", "vpp", "cp", "ep", "dp",
                 "micro_batch", "num_microbatches", "recompute", "sequence_parallel", "zero",
                 "pp_schedule", "seq_len", "global_batch", "precision")


def _num(row, col) -> float:
    v = row.get(col, 0.0)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return 0.0
    return v if np.isfinite(v) else 0.0


def model_parts(row: pd.Series) -> dict:
    """From the simulator itself, for the same configuration: the forward share of a
    micro-batch's compute, and the communication time per step of each dimension (TP, CP, DP:
    exposed + hidden; the EP dispatcher is priced elsewhere and shown exposed only)."""
    from sim_core import compute, step, workload
    from sim_core.columns import frame_to_batch

    from ..engine.space import sim_frame

    frame = sim_frame(row.to_frame().T.infer_objects())
    b = frame_to_batch(frame)
    with np.errstate(divide="ignore", invalid="ignore"):
        wl = workload.build(b)
        st = compute.stage_times(b, wl)
        totals = {d: 0.0 for d in ("tp", "cp", "dp")}
        for cm, per_call in step.comm_times(b, wl, skip=("ep", "pp")):
            if cm.dim in totals:
                totals[cm.dim] += float((per_call * cm.calls_per_step)[0])
    f, bw = float(st["layer_fwd"][0]), float(st["layer_bwd"][0])
    share = f / (f + bw) if f + bw > 0 and np.isfinite(f + bw) else 1.0 / 3.0
    return {"forward_share": share, "comm_total": totals}


def build(row: pd.Series, label: str = "") -> dict:
    """The trace-event JSON object of one simulated row (a `sweep search` results row or the
    row `sweep simulate` computes)."""
    if str(row.get("status", "ok")) == "invalid" or not np.isfinite(_num(row, "step_time_s")) \
            or _num(row, "step_time_s") <= 0:
        raise SweepError(f"trace: configuration {row.get('config_id', '')} has no simulated "
                         f"step ({row.get('invalid_reason') or row.get('status')})")
    step_s = _num(row, "step_time_s")
    t = {c: _num(row, c) for c, _, _ in BREAKDOWN}
    p = max(int(_num(row, "pp") or 1), 1)
    m = max(int(round(_num(row, "num_microbatches") or 1)), 1)
    parts = model_parts(row)
    share = parts["forward_share"]
    afab = str(row.get("pp_schedule", "1f1b")) == "afab"

    events: list[dict] = []
    config = {k: plain_value(row[k]) for k in CONFIG_FIELDS if k in row.index}
    title = label or "step"

    def meta(pid, tid, kind, value):
        ev = {"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": kind, "args": {}}
        ev["args"]["name" if kind.endswith("_name") else "sort_index"] = value
        events.append(ev)

    def span(pid, tid, name, cat, start_s, dur_s, **args):
        if dur_s <= 0:
            return
        # rounded to the nanosecond from the ends, so that back-to-back events share a
        # timestamp exactly (no overlap for the viewer's nesting)
        ts, end = round(start_s * US, 3), round((start_s + dur_s) * US, 3)
        if end <= ts:
            return  # under half a nanosecond
        events.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
                       "ts": ts, "dur": round(end - ts, 3),
                       "args": {"seconds": dur_s, **args}})

    # ---- the breakdown, end to end ----------------------------------------------------------
    meta(BREAKDOWN_PID, 0, "process_name", f"{title}: step breakdown ({step_s:.3f} s)")
    meta(BREAKDOWN_PID, 0, "process_sort_index", 0)
    meta(BREAKDOWN_PID, 0, "thread_name", "breakdown (critical path)")
    now = 0.0
    for col, name, cat in BREAKDOWN:
        span(BREAKDOWN_PID, 0, name, cat, now, t[col], column=col, critical_path=True)
        now += t[col]

    # ---- failures, amortized per step (sim_core/goodput.py), after the step -----------------
    good, every = _num(row, "goodput"), _num(row, "ckpt_every_steps")
    if np.isfinite(good) and 0 < good <= 1 and np.isfinite(every) and every > 0:
        meta(BREAKDOWN_PID, 1, "thread_name", f"failures, amortized per step "
                                             f"(goodput {good:.1%}; not in the step time)")
        ckpt = _num(row, "ckpt_block_s") / every
        rest = max(step_s * (1.0 / good - 1.0) - ckpt, 0.0)
        span(BREAKDOWN_PID, 1, "checkpoint (amortized)", "checkpoint", step_s, ckpt,
             critical_path=False, every_steps=every)
        span(BREAKDOWN_PID, 1, "lost work + restarts (amortized)", "failures", step_s + ckpt,
             rest, critical_path=False,
             interruptions_per_day=plain_value(row.get("interruptions_per_day")))

    # ---- per stage ------------------------------------------------------------------------------
    f_mb = t["time_compute"] * share / m
    b_mb = t["time_compute"] * (1 - share) / m
    r_mb = t["time_recompute"] / m
    slow_mb = t["time_slowdown"] / m
    pp_half = t["time_pp"] / (2 * m)
    exposed = {"tp": t["time_tp"] / (2 * m), "cp": t["time_cp"] / (2 * m),
               "ep": t["time_ep"] / (2 * m)}
    hidden = {d: max(parts["comm_total"][d] - t[f"time_{d}"], 0.0) / (2 * m)
              for d in ("tp", "cp")}
    tid_of = {"tp": 1, "cp": 2, "ep": 3, "dp": 4, "pp": 5}
    used_tids = {0}
    for stage in range(p):
        pid = stage_pid(stage)
        meta(pid, 0, "process_name", f"{title}: pipeline stage {stage}")
        meta(pid, 0, "process_sort_index", pid)
        now = 0.0

        def crit(name, cat, dur, stream=None, **args):
            nonlocal now
            span(pid, 0, name, cat, now, dur, critical_path=True, **args)
            if stream is not None and dur > 0:
                span(pid, tid_of[stream], name, cat, now, dur, critical_path=False, **args)
                used_tids.add(tid_of[stream])
            now += dur

        def comm_after(mb, phase):
            for d in ("tp", "cp", "ep"):
                crit(f"{d.upper()} comm (exposed)", "comm_exposed", exposed[d], d,
                     microbatch=mb, phase=phase)
            crit("PP send/recv (exposed)", "comm_exposed", pp_half, "pp", microbatch=mb,
                 phase=phase)

        def hide(window_start, window, mb, phase):
            for d in ("tp", "cp"):
                if hidden[d] > 0:
                    span(pid, tid_of[d], f"{d.upper()} comm (overlapped)", "comm_overlapped",
                         window_start, min(hidden[d], window), critical_path=False,
                         microbatch=mb, phase=phase, total_seconds=hidden[d])
                    used_tids.add(tid_of[d])

        def forward(mb):
            hide(now, f_mb, mb, "forward")
            crit("forward", "forward", f_mb, microbatch=mb)
            comm_after(mb, "forward")

        def backward(mb):
            crit("recompute", "recompute", r_mb, microbatch=mb)
            hide(now, b_mb, mb, "backward")
            crit("backward", "backward", b_mb, microbatch=mb)
            crit("overlap slowdown", "slowdown", slow_mb, microbatch=mb)
            comm_after(mb, "backward")
            return now

        if p > 1:
            crit("bubble (warm-up)", "bubble", t["time_bubble"] * stage / (p - 1))
        warm = m if afab else min(p - 1 - stage, m)
        for mb in range(warm):
            forward(mb)
        last_bwd_end = 0.0
        for i in range(m - warm):
            forward(warm + i)
            last_bwd_end = backward(i)
        for mb in range(m - warm, m):
            last_bwd_end = backward(mb)
        if p > 1:
            crit("bubble (cool-down)", "bubble", t["time_bubble"] * (p - 1 - stage) / (p - 1))
        dp_hidden = max(parts["comm_total"]["dp"] - t["time_dp"], 0.0)
        if dp_hidden > 0:  # gradient reduce behind the last backward, parameter gather ahead
            dur = min(dp_hidden, last_bwd_end)
            span(pid, 4, "DP comm (overlapped)", "comm_overlapped", last_bwd_end - dur, dur,
                 critical_path=False, total_seconds=dp_hidden)
            used_tids.add(4)
        crit("DP grad sync (exposed)", "comm_exposed", t["time_dp"], "dp")
        crit("optimizer", "optimizer", t["time_optimizer"])
    for stage in range(p):
        for tid, name, _ in STREAMS:
            if tid in used_tids:
                meta(stage_pid(stage), tid, "thread_name", name)
                meta(stage_pid(stage), tid, "thread_sort_index", tid)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"label": title, "step_time_s": step_s,
                      "breakdown": {c[5:]: t[c] for c, _, _ in BREAKDOWN},
                      "config": config, "stages": p, "microbatches": m,
                      "forward_share": share, "source": "sweep (sim_core breakdown)"},
    }


def write(trace: dict, path: str | Path) -> Path:
    """Write the JSON; a one-line error when the file cannot be written."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
    except OSError as exc:
        raise SweepError(f"--trace {path}: cannot write ({exc.strerror or exc})") from None
    return path


def write_trace_for_row(row: pd.Series, path: str | Path, label: str = "") -> Path:
    return write(build(row, label), path)
