"""The `sweep` command line: one-line errors with exit code 2, check, simulate, search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from sweep.cli import main

ROOT = Path(__file__).resolve().parents[1]
SWEEP = Path(sys.executable).parent / "sweep"
QUICK = ROOT / "search_spaces" / "quickstart.yaml"
GPT3_RUN = ROOT / "search_spaces" / "examples" / "gpt3-175b-1024xa100.yaml"

GOOD = {"name": "t", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
        "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
        "space": {"tp": [1, 2, 4, 8], "micro_batch": [1, 2]}}


def write(tmp_path: Path, doc, name="space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


def run_main(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, expect):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    assert expect in lines[0], lines[0]


BAD_SPACES = {
    "malformed_yaml": ("name: t\nspace: {tp: [1, 2}\n", "invalid YAML at line"),
    "unknown_key": ({**GOOD, "space": {"tpp": [1, 2]}},
                    "unknown field 'space.tpp'; did you mean 'tp'?"),
    "unknown_top_key": ({**GOOD, "gloabl_batch": 8},
                        "unknown field 'gloabl_batch'; did you mean 'global_batch'?"),
    "wrong_type": ({**GOOD, "space": {"tp": ["abc"]}},
                   "space.tp: expected a list of positive integers, got 'abc'"),
    "wrong_type_fixed": ({**GOOD, "seq_len": "long"},
                         "seq_len: expected a positive integer, got 'long'"),
    "zero_size": ({**GOOD, "cluster": {"gpu": "h100-sxm", "num_gpus": 0}},
                  "cluster.num_gpus: expected a positive integer, got 0"),
    "negative_size": ({**GOOD, "space": {"micro_batch": [-1]}},
                      "space.micro_batch: expected a list of positive integers, got -1"),
    "impossible": ({**GOOD, "space": {"tp": [3, 5, 7]}},
                   "has no valid configuration: all 3 candidates break the rules"),
    "unknown_gpu": ({**GOOD, "cluster": {"gpu": "h100", "num_gpus": 8}},
                    "cluster.gpu: unknown gpu 'h100': did you mean 'h100-sxm'?"),
    "unknown_gpu_in_space": ({**GOOD, "space": {"gpu": ["a100", "h100-sxm"]}},
                             "space.gpu: unknown gpu 'a100'"),
    "unknown_model": ({**GOOD, "model": "llama3-7b"}, "model: unknown model 'llama3-7b'"),
    "not_a_mapping": ("- tp\n- pp\n", "expected a mapping of fields at the top level"),
}


@pytest.mark.parametrize("command", ["search", "check"])
@pytest.mark.parametrize("case", sorted(BAD_SPACES))
def test_bad_space(case, command, tmp_path, capsys):
    doc, expect = BAD_SPACES[case]
    p = write(tmp_path, doc)
    extra = ["--out", tmp_path / "out", "--no-progress"] if command == "search" else []
    code, out, err = run_main([command, p, *extra], capsys)
    assert_one_line_error(code, err, expect)


def test_missing_file(tmp_path, capsys):
    code, _, err = run_main(["search", tmp_path / "nope.yaml"], capsys)
    assert_one_line_error(code, err, "nope.yaml: no such file")


def test_unwritable_results_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = run_main(["search", write(tmp_path, GOOD), "--out", blocker / "results",
                             "--no-progress"], capsys)
    assert_one_line_error(code, err, "not writable")


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["search", "x.yaml", "--workers", "0"])
    assert ei.value.code == 2
    with pytest.raises(SystemExit) as ei:
        main(["frobnicate"])
    assert ei.value.code == 2


def test_check_counts(capsys):
    code, out, _ = run_main(["check", ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml"],
                            capsys)
    assert code == 0
    assert "configurations: 86,400" in out and "valid (pass the rules):" in out


def test_simulate_json(capsys):
    code, out, err = run_main(["simulate", GPT3_RUN, "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_gib", "fits",
              "breakdown", "memory"):
        assert k in rep
    assert rep["dp"] == 8 and rep["config"]["tp"] == 8 and rep["config"]["pp"] == 16
    assert rep["step_time_s"] > 0 and 0 < rep["mfu"] < 1 and isinstance(rep["fits"], bool)
    assert rep["breakdown"] and all(not k.startswith("time_") for k in rep["breakdown"])
    assert rep["memory"] and all(not k.startswith("mem_") for k in rep["memory"])
    assert rep["peak_allocated_gib"] <= rep["peak_reserved_gib"] < rep["peak_memory_gib"]


def test_simulate_table(capsys):
    code, out, _ = run_main(["simulate", GPT3_RUN], capsys)
    assert code == 0
    assert "step time" in out and "peak memory" in out and "time breakdown" in out


@pytest.mark.parametrize("change, expect", [
    ({"parallel": {"tp": 3}}, "configuration is invalid: num_gpus % (tp*pp*cp) != 0"),
    ({"parallel": {"tpp": 3}}, "unknown field 'parallel.tpp'; did you mean 'tp'?"),
    # b300 is in the catalog now (issue 26): a GPU that is not
    ({"cluster": {"gpu": "b100", "num_gpus": 8}}, "cluster.gpu: unknown gpu 'b100'"),
])
def test_simulate_errors(change, expect, tmp_path, capsys):
    doc = {k: v for k, v in GOOD.items() if k not in ("name", "space")}
    code, _, err = run_main(["simulate", write(tmp_path, {**doc, **change}, "run.yaml")], capsys)
    assert_one_line_error(code, err, expect)


def test_search_in_process(tmp_path, capsys):
    code, out, err = run_main(["search", QUICK, "--out", tmp_path / "q", "--workers", "2",
                               "--no-progress"], capsys)
    assert code == 0, err
    assert "top 10 by step_time" in out and "configurations:" in out and "time:" in out
    df = pq.read_table(tmp_path / "q" / "results.parquet").to_pandas()
    assert set(df["status"]) <= {"ok", "oom", "invalid"} and (df["status"] == "ok").any()
    assert (tmp_path / "q" / "ranking.csv").exists()


@pytest.mark.parametrize("ray", ["0", "1"])
def test_console_script_quickstart(tmp_path, ray):
    """The README's first command, as a real process: in the driver (a small grid, the
    default), and on a local Ray started for it (SWEEP_RAY=1, the path of large spaces)."""
    r = subprocess.run([SWEEP, "search", QUICK, "--out", tmp_path / "q"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env={**os.environ, "SWEEP_RAY": ray})
    assert r.returncode == 0, r.stderr
    assert "top 10 by step_time" in r.stdout
    assert "Traceback" not in r.stderr


def test_console_script_bad_input(tmp_path):
    p = write(tmp_path, {**GOOD, "space": {"tp": "abc"}})
    r = subprocess.run([SWEEP, "check", p], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("error: space.tp: expected a list of positive integers, "
                                "got 'abc'")


def test_ctrl_c_keeps_batches_and_rerun_resumes(tmp_path):
    """A real SIGINT to `sweep search`: exit 130, finished batches kept, re-run resumes.

    The signal is sent only once the search is known to be mid-way (3 of its 87 batches
    recorded, a state, never a time), and the batches are small on purpose, so that the
    search cannot finish before the signal lands however fast or loaded the machine is.
    (It once could: a signal sent after a time-out, while the search was still starting,
    or after it had finished, exited 0.)"""
    import json
    import signal
    import time

    doc = yaml.safe_load((ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml").read_text())
    doc["search"] = {"strategy": "grid", "batch_size": 1000}
    space = write(tmp_path, doc)
    out = tmp_path / "out"
    cmd = [SWEEP, "search", space, "--out", out, "--workers", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    manifest = out / "manifest.json"

    def recorded() -> int:
        try:
            return len(json.loads(manifest.read_text())["batches"])
        except (OSError, ValueError, KeyError):
            return 0

    while recorded() < 3:
        assert proc.poll() is None, f"the search ended before 3 batches: {proc.communicate()}"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted: kept ")
    kept = len(json.loads(manifest.read_text())["batches"])
    assert 3 <= kept < 87
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from sweep.results import read_results

    df, meta = read_results(out, columns=["config_id", "status"])
    c = meta["counts"]
    assert c["total"] == 86_400 and df["config_id"].is_unique
    # pruned by bound (sweep/engine/prune.py): counted, neither simulated nor stored
    assert len(df) == c["simulated"] == 86_400 - c["invalid"] - c.get("duplicate", 0) \
        - c["pruned"]
    doc_manifest = json.loads(manifest.read_text())
    assert doc_manifest["complete"] and len(doc_manifest["batches"]) == 87
