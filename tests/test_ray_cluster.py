"""A sweep against a real two-node local Ray cluster (loopback only).

The head and the second node are started with `ray start --block` as child processes of the
test; teardown kills exactly the processes they started (their process trees, by pid) rather
than `ray stop --force`, which would also stop unrelated Ray instances on a shared machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sweep.cli import main
from sweep.config import parse_space
from sweep.engine.evaluate import evaluate
from sweep.engine.execution import run_search
from sweep.results import read_results
from sweep.engine.space import Space
from tests.fakes import RecordNode, fake_check, fake_simulate

ray = pytest.importorskip("ray")
RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"Ray head did not open port {port}")


@pytest.fixture(scope="module")
def two_node_cluster():
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    addr = f"127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    # Loopback-only test cluster: no token authentication, unless an earlier ray.init() in
    # this process already switched it on (Ray then keeps it process-wide); the nodes inherit
    # the driver's mode either way.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        _wait_port(port)
        procs.append(subprocess.Popen(
            [RAY, "start", f"--address={addr}", *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        ray.init(address=addr, log_to_driver=False, logging_level="ERROR")
        deadline = time.time() + 60
        while sum(n["Alive"] for n in ray.nodes()) < 2:
            if time.time() > deadline:
                raise TimeoutError("second Ray node did not join")
            time.sleep(0.3)
        ray.shutdown()  # the sweep connects by itself
        yield addr
    finally:
        if ray.is_initialized():
            ray.shutdown()
        pids = [p for proc in procs for p in _descendants(proc.pid)]
        for p in reversed(pids):  # leaves first, so that live parents reap their children
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.05)
        for proc in procs:
            proc.wait(timeout=30)
        # the head wrote its address here; a stale entry would make a later ray.init() try it
        current = Path("/tmp/ray/ray_current_cluster")
        try:
            if current.read_text().strip().endswith(f":{port}"):
                current.unlink()
        except OSError:
            pass
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _space():
    return parse_space({
        "name": "two-node", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
        "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
        "space": {"num_gpus": [8, 16, 32], "tp": [1, 2, 4, 8], "pp": [1, 2, 4],
                  "micro_batch": [1, 2, 4], "recompute": ["none", "selective", "full"]},
        "search": {"batch_size": 40}})


def test_sweep_on_two_nodes(two_node_cluster, tmp_path):
    cfg = _space()
    log = tmp_path / "nodes.log"
    o = run_search(cfg, tmp_path / "out", address=two_node_cluster,
                   simulate=RecordNode(log), check=fake_check)
    assert not ray.is_initialized()  # the sweep disconnected again
    nodes = set(log.read_text().split())
    assert len(nodes) == 2, "tasks should run on both nodes"
    space = Space.from_config(cfg)
    ref = evaluate(space.frame(0, space.size), fake_simulate, fake_check)
    ref = ref[ref["status"] != "invalid"].reset_index(drop=True)
    # the workers of both nodes wrote their parts into the results folder (a shared path)
    got, meta = read_results(tmp_path / "out")
    assert space.size == o.counts["total"] and len(got) == len(ref) == o.counts["simulated"]
    assert len(meta["files"]) == -(-space.size // 40)
    pd.testing.assert_frame_equal(got[ref.columns].reset_index(drop=True), ref,
                                  check_dtype=False, rtol=1e-6)


def test_cli_with_address(two_node_cluster, tmp_path, capsys):
    root = Path(__file__).resolve().parents[1]
    code = main(["search", str(root / "search_spaces" / "quickstart.yaml"), "--address",
                 two_node_cluster, "--workers", "2", "--out", str(tmp_path / "q"),
                 "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "top 10" in out
    assert (tmp_path / "q" / "results.parquet").exists()
