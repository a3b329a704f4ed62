"""`--trace`: one simulated step as Chrome/Perfetto trace-event JSON. The file follows the
trace-event format (complete "X" events, metadata "M" events naming every track), the events of
each stage's critical path tile [0, step time] and add up to the predicted step time, and each
part of the breakdown appears with the breakdown's own number."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from sweep.cli import main
from sweep.config import load_space
from sweep.advice.trace import BREAKDOWN_PID, stage_pid

from .results_fixture import ROOT, make_results

GPT3_RUN = ROOT / "search_spaces" / "examples" / "gpt3-175b-1024xa100.yaml"
GPT3_SPACE = ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml"
META_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def check_trace_format(doc: dict) -> None:
    """The JSON Object Format of the Trace Event Format (Google's spec, as Perfetto and
    chrome://tracing read it)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    assert doc["displayTimeUnit"] in ("ms", "ns")
    named_pids, named_threads = set(), set()
    for ev in doc["traceEvents"]:
        assert {"ph", "name", "pid", "tid", "ts"} <= set(ev), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        assert isinstance(ev.get("args", {}), dict)
        if ev["ph"] == "M":
            assert ev["name"] in META_NAMES
            key = "name" if ev["name"].endswith("_name") else "sort_index"
            assert key in ev["args"]
            if ev["name"] == "process_name":
                named_pids.add(ev["pid"])
            elif ev["name"] == "thread_name":
                named_threads.add((ev["pid"], ev["tid"]))
        else:
            assert ev["ph"] == "X", ev
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] > 0
            assert isinstance(ev["name"], str) and ev["name"]
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} <= named_pids
    assert {(e["pid"], e["tid"]) for e in xs} <= named_threads
    # complete events on one track never overlap partially (the viewer nests them)
    by_track = defaultdict(list)
    for e in xs:
        by_track[(e["pid"], e["tid"])].append(e)
    for evs in by_track.values():
        evs.sort(key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-6, (a, b)


@pytest.fixture(scope="module")
def gpt3(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace") / "step.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["simulate", str(GPT3_RUN), "--json", "--trace", str(out)]) == 0
    return json.loads(out.read_text()), json.loads(buf.getvalue())


def test_gpt3_trace_follows_the_trace_event_format(gpt3):
    doc, _ = gpt3
    check_trace_format(doc)
    json.dumps(doc, allow_nan=False)  # no NaN/Infinity: strict JSON for the viewers


def test_critical_path_adds_up_to_the_step_time(gpt3):
    doc, rep = gpt3
    step_us = rep["step_time_s"] * 1e6
    assert doc["otherData"]["step_time_s"] == pytest.approx(rep["step_time_s"], rel=1e-12)
    crit = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["tid"] == 0:
            crit[e["pid"]].append(e)
    p = rep["config"]["pp"]
    # the breakdown track + one per stage
    assert sorted(crit) == sorted([BREAKDOWN_PID] + [stage_pid(s) for s in range(p)])
    for pid, evs in crit.items():
        evs.sort(key=lambda e: e["ts"])
        assert evs[0]["ts"] == 0
        for a, b in zip(evs, evs[1:]):  # no gap, no overlap
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-3)  # 1 ns
        assert sum(e["dur"] for e in evs) == pytest.approx(step_us, rel=1e-9)
        assert evs[-1]["ts"] + evs[-1]["dur"] == pytest.approx(step_us, rel=1e-9)
        assert all(e["args"]["critical_path"] for e in evs)


def test_events_are_the_breakdown(gpt3):
    doc, rep = gpt3
    bd = rep["breakdown"]
    m = int(rep["num_microbatches"])
    by = defaultdict(float)
    count = defaultdict(int)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == stage_pid(0) and e["tid"] == 0:
            by[e["cat"]] += e["dur"] / 1e6
            count[e["name"]] += 1
    assert by["forward"] + by["backward"] == pytest.approx(bd["compute"], rel=1e-6)
    assert by["recompute"] == pytest.approx(bd["recompute"], rel=1e-6)
    assert by["bubble"] == pytest.approx(bd["bubble"], rel=1e-6)
    assert by["optimizer"] == pytest.approx(bd["optimizer"], rel=1e-6)
    assert by["slowdown"] == pytest.approx(bd["slowdown"], rel=1e-6)
    exposed = sum(bd[k] for k in ("tp", "cp", "ep", "pp", "dp"))
    assert by["comm_exposed"] == pytest.approx(exposed, rel=1e-6)
    assert count["forward"] == count["backward"] == m
    assert rep["breakdown"]["recompute"] > 0 and count["recompute"] == m  # full recompute
    # the exposed communication also sits on its own stream, at the same time
    streams = defaultdict(float)
    names = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == stage_pid(0):
            names[e["tid"]] = e["args"]["name"]
        if e["ph"] == "X" and e["pid"] == stage_pid(0) and e["cat"] == "comm_exposed" \
                and e["tid"] != 0:
            streams[e["tid"]] += e["dur"] / 1e6
    assert {"compute (critical path)", "TP comm", "DP comm", "PP comm"} <= set(names.values())
    inv = {v: k for k, v in names.items()}
    assert streams[inv["TP comm"]] == pytest.approx(bd["tp"], rel=1e-6)
    assert streams[inv["PP comm"]] == pytest.approx(bd["pp"], rel=1e-6)
    assert streams[inv["DP comm"]] == pytest.approx(bd["dp"], rel=1e-6)


def test_1f1b_order_and_bubble_by_stage(gpt3):
    doc, rep = gpt3
    p = rep["config"]["pp"]
    for stage in (0, p // 2, p - 1):
        pid = stage_pid(stage)
        evs = sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid
                      and e["tid"] == 0 and e["cat"] in ("forward", "backward", "bubble")),
                     key=lambda e: e["ts"])
        kinds = [e["cat"] for e in evs if e["cat"] != "bubble"]
        # 1F1B: stage s runs p - 1 - s forwards before its first backward, then alternates
        warm = p - 1 - stage
        assert kinds[:warm + 1] == ["forward"] * (warm + 1) and kinds[warm + 1] == "backward"
        warmup = [e for e in evs if e["name"] == "bubble (warm-up)"]
        assert sum(e["dur"] for e in warmup) / 1e6 == pytest.approx(
            rep["breakdown"]["bubble"] * stage / (p - 1), abs=1e-9)


def test_recommend_trace_best_and_rule_of_thumb(tmp_path, capsys):
    cfg = load_space(GPT3_SPACE)
    cfg.space.update({"gpu": ["a100-80gb"], "num_gpus": [1024], "zero": [1],
                      "sequence_parallel": [True], "vpp": [1, 2]})
    run = make_results(cfg, tmp_path / "run")
    assert main(["recommend", str(run), "--no-write", "--trace", str(tmp_path / "tr")]) == 0
    best = json.loads((tmp_path / "tr" / "best.json").read_text())
    rot = json.loads((tmp_path / "tr" / "rule_of_thumb.json").read_text())
    for doc in (best, rot):
        check_trace_format(doc)
    assert best["otherData"]["config"]["tp"] != rot["otherData"]["config"]["tp"] \
        or best["otherData"]["config"]["pp"] != rot["otherData"]["config"]["pp"] \
        or best["otherData"]["config"]["micro_batch"] != rot["otherData"]["config"]["micro_batch"]
    assert rot["otherData"]["config"]["tp"] == 8 and rot["otherData"]["config"]["micro_batch"] == 1
    assert best["otherData"]["step_time_s"] < rot["otherData"]["step_time_s"]
    printed = capsys.readouterr().out
    assert f"{best['otherData']['step_time_s']:.3f}" in printed  # the table's best row


def test_trace_of_an_unwritable_path_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["simulate", str(GPT3_RUN), "--trace", str(blocker / "step.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --trace")
