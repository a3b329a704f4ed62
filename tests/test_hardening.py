"""Hardening of the results folder (issue 8): leftovers of an earlier run that are corrupt,
missing or from another space; a full disk; other schema versions; and the security
guarantees (safe YAML, no shell, escaped report).

Every fault ends in one of two ways: the sweep recovers (one `warning:` line on stderr) and its
final results.parquet equals that of an undisturbed run, or it stops with one `error:` line
naming the file (exit 2 at the command line) and deletes nothing that was finished.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

import sweep.results.store as results_mod
from sweep.cli import main
from sweep.config import parse_space
from sweep.errors import Interrupted, SweepError
from sweep.engine.execution import run_search
from sweep.results import SCHEMA_VERSION, open_results, read_results, write_parquet
from sweep.engine.space import Space
from tests.fakes import CountCalls, FullDiskAfter, fake_check, fake_simulate

from .results_fixture import ROOT, make_results

ray = pytest.importorskip("ray")

FAKE = dict(simulate=fake_simulate, check=fake_check)
SIZE = 648  # configurations of space_cfg(); 7 batches of 100


pytestmark = pytest.mark.usefixtures("local_ray")  # one local Ray per module (conftest)


def space_doc(batch_size=100):
    return {"name": "t", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
            "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
            "space": {"num_gpus": [8, 16, 32], "tp": [1, 2, 4, 8], "pp": [1, 2, 4],
                      "micro_batch": [1, 2, 4], "recompute": ["none", "selective", "full"],
                      "zero": [1, 3]},
            "search": {"strategy": "grid", "batch_size": batch_size}}


def space_cfg(batch_size=100):
    return parse_space(space_doc(batch_size))


def parquet(path: Path) -> pd.DataFrame:
    df = read_results(path)[0]
    return df.sort_values("config_id", kind="stable").reset_index(drop=True)


def assert_same_results(out: Path, reference: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(parquet(out / "results.parquet"), reference)


def digests(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.glob("*.parquet"))}


def remove_results(out: Path) -> None:
    """Delete the results.parquet dataset folder (the parts and manifest stay)."""
    shutil.rmtree(out / "results.parquet")


def temp_files(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def assert_manifest_consistent(out: Path) -> None:
    """Every batch the manifest lists has its intact part file."""
    m = manifest(out)
    for bid, entry in m["batches"].items():
        path = out / "parts" / entry["file"]
        assert path.name == f"{bid}.parquet"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        assert pq.read_metadata(path).num_rows == entry["rows"]


def one_line(text: str, prefix: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    run_search(space_cfg(), out, **FAKE)
    return parquet(out / "results.parquet")


@pytest.fixture
def finished(tmp_path):
    out = tmp_path / "out"
    run_search(space_cfg(), out, **FAKE)
    return out


def interrupted(out: Path, after: int = 2) -> None:
    def stop(batch_id, done):
        if done == after:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        run_search(space_cfg(), out, workers=1, on_batch=stop, **FAKE)


# ---------------------------------------------------------------------------------------------
# Corrupt or missing leftovers of an earlier run: detected, reported in one line, recomputed
# ---------------------------------------------------------------------------------------------
def test_corrupt_parts_are_dropped_and_recomputed(finished, undisturbed, tmp_path, capsys):
    parts = finished / "parts"
    truncated, garbage = parts / "g000001.parquet", parts / "g000003.parquet"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    garbage.write_bytes(b"this is not parquet" * 50)
    remove_results(finished)
    others = {k: v for k, v in digests(parts).items() if k not in (truncated.name, garbage.name)}
    capsys.readouterr()

    o = run_search(space_cfg(), finished, simulate=CountCalls(tmp_path / "calls"),
                   check=fake_check)
    warning = one_line(capsys.readouterr().err, "warning:")
    assert str(truncated) in warning and "(and 1 more)" in warning
    assert "recomputing them (the other finished batches are kept)" in warning
    assert o.evaluated == 200  # only the two bad batches
    after = digests(parts)
    assert all(after[k] == v for k, v in others.items())  # finished parts untouched
    assert_same_results(finished, undisturbed)
    assert_manifest_consistent(finished)


def test_part_with_wrong_content_is_caught_by_its_checksum(finished, undisturbed, capsys):
    """A readable parquet file that is not the batch recorded (e.g. copied over it)."""
    parts = finished / "parts"
    (parts / "g000000.parquet").write_bytes((parts / "g000006.parquet").read_bytes())
    capsys.readouterr()
    o = run_search(space_cfg(), finished, **FAKE)
    warning = one_line(capsys.readouterr().err, "warning:")
    assert "g000000.parquet: corrupt (checksum mismatch)" in warning
    assert o.evaluated == 100
    assert_same_results(finished, undisturbed)


def test_missing_part_is_recomputed(finished, undisturbed, capsys):
    (finished / "parts" / "g000004.parquet").unlink()
    o = run_search(space_cfg(), finished, **FAKE)
    assert "g000004.parquet: missing" in one_line(capsys.readouterr().err, "warning:")
    assert o.evaluated == 100
    assert_same_results(finished, undisturbed)


@pytest.mark.parametrize("text", ["{\"schema_version\": 1, \"batc", "", "[1, 2]", "\x00\xff",
                                  '{"batches": {}}'])
def test_unreadable_manifest_is_rebuilt_from_the_parts(finished, undisturbed, text, capsys):
    (finished / "manifest.json").write_text(text, errors="surrogateescape")
    capsys.readouterr()
    o = run_search(space_cfg(), finished, **FAKE)
    warning = one_line(capsys.readouterr().err, "warning:")
    assert "manifest.json: unreadable" in warning
    assert "rebuilt it from the 7 finished batches" in warning
    assert o.evaluated == 0  # nothing finished is lost
    assert_same_results(finished, undisturbed)
    assert manifest(finished)["complete"] and len(manifest(finished)["batches"]) == 7


def test_missing_manifest_after_interruption(tmp_path, undisturbed, capsys):
    out = tmp_path / "out"
    interrupted(out, after=3)
    (out / "manifest.json").unlink()
    capsys.readouterr()
    o = run_search(space_cfg(), out, **FAKE)
    warning = one_line(capsys.readouterr().err, "warning:")
    # workers write their own parts: a task in flight at the interrupt may have finished its
    # part after the driver recorded 3; the rebuild keeps every complete part on disk
    kept = int(re.search(r"rebuilt it from the (\d+) finished batches", warning).group(1))
    assert kept >= 3
    assert o.evaluated in (SIZE - 100 * kept, SIZE - 100 * (kept - 1) - 48)  # last batch: 48
    assert_same_results(out, undisturbed)


def test_unreadable_manifest_over_another_space_stops_and_deletes_nothing(tmp_path):
    out = tmp_path / "out"
    run_search(space_cfg(batch_size=500), out, **FAKE)
    (out / "manifest.json").write_text("{garbage")
    before = digests(out / "parts")
    with pytest.raises(SweepError) as ei:
        run_search(space_cfg(batch_size=400), out, **FAKE)
    msg = str(ei.value)
    assert "\n" not in msg and "manifest.json: unreadable" in msg
    assert "different space" in msg and "--fresh" in msg
    assert digests(out / "parts") == before and (out / "results.parquet").exists()


@pytest.mark.parametrize("where", ["file", "metadata", "unfinished"])
def test_corrupt_results_parquet_is_rewritten(finished, undisturbed, capsys, where):
    """recommend/report name the corrupt file (exit 2); re-running the search rewrites it
    from the finished parts without simulating anything."""
    res = finished / "results.parquet"
    if where == "file":  # a garbage file where the dataset folder should be
        remove_results(finished)
        res.write_bytes(b"PAR1 garbage PAR1")
    elif where == "metadata":
        (res / "_sweep.json").write_bytes(b"{garbage")
    else:  # killed before _sweep.json was written
        (res / "_sweep.json").unlink()
    for argv in (["recommend", finished, "--no-write"],
                 ["report", finished, "--out", finished / "rep"]):
        assert main([str(a) for a in argv]) == 2
        err = one_line(capsys.readouterr().err, "error:")
        assert f"{res}: " + ("not finished" if where == "unfinished" else "cannot read") in err
        assert "re-run `sweep search`" in err
    o = run_search(space_cfg(), finished, **FAKE)
    assert o.evaluated == 0
    assert_same_results(finished, undisturbed)


def test_temp_files_of_a_killed_write_are_removed(tmp_path, undisturbed):
    out = tmp_path / "out"
    interrupted(out)
    (out / "parts" / ".g000002.parquet.k3j2.tmp").write_bytes(b"PAR1 half")
    (out / ".manifest.json.x8q1.tmp").write_text('{"half": ')
    (out / ".results.parquet.a1b2.tmp").write_bytes(b"")
    (out / ".results.parquet.c3d4.tmp").mkdir()  # a dataset folder half built
    (out / ".results.parquet.c3d4.tmp" / "part-000000.parquet").write_bytes(b"PAR1")
    run_search(space_cfg(), out, **FAKE)
    assert temp_files(out) == []
    assert_same_results(out, undisturbed)


# ---------------------------------------------------------------------------------------------
# A results folder of another space, through the command line
# ---------------------------------------------------------------------------------------------
SMALL = {"name": "small", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
         "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
         "space": {"tp": [1, 2, 4, 8], "pp": [1, 2], "micro_batch": [1, 2],
                   "recompute": ["selective", "full"]},
         "search": {"strategy": "grid", "batch_size": 8}}


def write_space(tmp_path: Path, doc: dict, name="space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def search(argv, capsys):
    code = main(["search", *[str(a) for a in argv], "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_results_dir_of_another_space_cli(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = search([write_space(tmp_path, SMALL), "--out", out], capsys)
    assert code == 0, err
    before = digests(out / "parts")
    other = write_space(tmp_path, {**SMALL, "space": {**SMALL["space"], "tp": [1, 2]}}, "b.yaml")
    code, _, err = search([other, "--out", out], capsys)
    assert code == 2
    line = one_line(err, "error:")
    assert str(out) in line and "different space" in line and "--fresh" in line
    assert digests(out / "parts") == before  # nothing deleted
    code, _, err = search([other, "--out", out, "--fresh"], capsys)
    assert code == 0, err


# ---------------------------------------------------------------------------------------------
# Full disk: the writer fails with ENOSPC part-way through a sweep
# ---------------------------------------------------------------------------------------------
class DiskFull:
    """pq.write_table that writes a partial file and fails with ENOSPC after `ok` writes
    (only for file names starting with `prefix`), like a disk that fills up."""

    def __init__(self, ok: int, prefix: str = ".g"):
        self.ok, self.prefix, self.calls = ok, prefix, 0
        self.real = pq.write_table

    def __call__(self, table, where, *args, **kw):
        if Path(str(where)).name.startswith(self.prefix):
            self.calls += 1
            if self.calls > self.ok:
                Path(where).write_bytes(b"PAR1\x00partial")
                raise OSError(errno.ENOSPC, "No space left on device", str(where))
        return self.real(table, where, *args, **kw)


def test_full_disk_while_writing_parts(tmp_path, undisturbed):
    """Parts are written by the Ray workers: the disk fills up in the worker's process."""
    out = tmp_path / "out"
    full = FullDiskAfter(tmp_path / "writes", ok=3, parts_dir=out / "parts")
    with pytest.raises(SweepError) as ei:
        run_search(space_cfg(), out, workers=1, simulate=full, check=fake_check)
    msg = str(ei.value)
    assert "\n" not in msg and "No space left on device" in msg
    assert "kept 3 finished batches" in msg and "run the same command again" in msg
    assert temp_files(out) == []  # the partial file is gone
    assert not (out / "results.parquet").exists()
    assert len(manifest(out)["batches"]) == 3 and not manifest(out)["complete"]
    assert_manifest_consistent(out)
    # space freed (the same simulate, no longer failing: same fingerprint)
    o = run_search(space_cfg(), out, check=fake_check,
                   simulate=FullDiskAfter(tmp_path / "w2", ok=10**6, parts_dir=out / "parts"))
    assert o.evaluated == SIZE - 300
    assert_same_results(out, undisturbed)
    assert temp_files(out) == []


def test_full_disk_while_writing_the_manifest(tmp_path, undisturbed, monkeypatch):
    import os

    out = tmp_path / "out"
    real, n = os.replace, {"manifest": 0}

    def replace(src, dst, *a, **kw):
        if Path(dst).name == "manifest.json":
            n["manifest"] += 1
            if n["manifest"] > 3:  # the first: open; then two batches
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(results_mod.os, "replace", replace)
    monkeypatch.setattr(results_mod, "MANIFEST_EVERY_S", 0.0)  # a rewrite after every batch
    with pytest.raises(SweepError) as ei:
        run_search(space_cfg(), out, workers=1, **FAKE)
    monkeypatch.undo()
    assert "No space left on device" in str(ei.value) and "kept 2 finished" in str(ei.value)
    assert temp_files(out) == []
    assert len(manifest(out)["batches"]) == 2
    assert_manifest_consistent(out)
    o = run_search(space_cfg(), out, **FAKE)
    assert o.evaluated == SIZE - 200
    assert_same_results(out, undisturbed)


def test_full_disk_while_writing_results_parquet(finished, undisturbed, monkeypatch):
    remove_results(finished)
    real = results_mod._atomic_write_bytes

    def full(path, data):
        if Path(path).name == "_sweep.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(results_mod, "_atomic_write_bytes", full)
    with pytest.raises(SweepError, match="results.parquet: cannot write .No space left"):
        run_search(space_cfg(), finished, **FAKE)
    monkeypatch.undo()
    assert temp_files(finished) == [] and not (finished / "results.parquet").exists()
    assert len(manifest(finished)["batches"]) == 7
    o = run_search(space_cfg(), finished, **FAKE)
    assert o.evaluated == 0
    assert_same_results(finished, undisturbed)


def test_full_disk_cli_exit_2_then_resume(tmp_path, monkeypatch, capsys):
    """`sweep search` on the real simulator: ENOSPC after 2 parts -> one line, exit 2; the same
    command after freeing space finishes with the results of an undisturbed run."""
    space = write_space(tmp_path, SMALL)
    code, _, err = search([space, "--out", tmp_path / "ref"], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    # the parts are written by Ray workers: the fault is made in their process
    import sweep.cli.search as search_command
    from sim_core import simulate_frame

    real = search_command.run_search

    def disk(ok):
        full = FullDiskAfter(tmp_path / f"writes{ok}", ok, out / "parts", inner=simulate_frame)
        monkeypatch.setattr(search_command, "run_search",
                            lambda *a, **kw: real(*a, **{**kw, "simulate": full}))

    disk(2)
    code, stdout, err = search([space, "--out", out, "--workers", "1"], capsys)
    disk(10**6)  # space freed
    assert code == 2 and stdout == ""
    line = one_line(err, "error:")
    assert len(err.strip().splitlines()) == 1
    assert "No space left on device" in line and "kept 2 finished batches" in line
    assert temp_files(out) == []
    code, _, err = search([space, "--out", out], capsys)
    assert code == 0, err
    pd.testing.assert_frame_equal(parquet(out / "results.parquet"),
                                  parquet(tmp_path / "ref" / "results.parquet"))


# ---------------------------------------------------------------------------------------------
# Schema versions
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, SCHEMA_VERSION - 1])
def test_manifest_of_another_schema(tmp_path, version, capsys):
    out = tmp_path / "out"
    space = write_space(tmp_path, SMALL)
    assert search([space, "--out", out], capsys)[0] == 0
    doc = manifest(out)
    doc["schema_version"] = version
    (out / "manifest.json").write_text(json.dumps(doc))
    before = digests(out / "parts")
    code, _, err = search([space, "--out", out], capsys)
    assert code == 2
    line = one_line(err, "error:")
    assert (f"manifest.json was written by schema {version}; this sweep reads schema "
            f"{SCHEMA_VERSION}: ") in line
    assert ("upgrade sweep" in line) == (version > SCHEMA_VERSION) and "--fresh" in line
    assert digests(out / "parts") == before
    assert search([space, "--out", out, "--fresh"], capsys)[0] == 0


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return make_results(SMALL, tmp_path_factory.mktemp("small") / "run")


@pytest.fixture(scope="module")
def inline_run(tmp_path_factory):
    """An inline model: the rows carry the model shape, so any model name exports."""
    model = {"name": "tiny", "layers": 8, "hidden": 1024, "heads": 16, "ffn": 4096,
             "vocab": 32000}
    return make_results({**SMALL, "model": model}, tmp_path_factory.mktemp("inl") / "run")


def _rewrite(run: Path, dst: Path, version) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(run / "results.parquet")
    if version is None:  # no sweep metadata at all
        pq.write_table(table.replace_schema_metadata({}), dst / "results.parquet")
    else:
        write_parquet(dst / "results.parquet", table.to_pandas(), {"schema_version": version})
    return dst


@pytest.mark.parametrize("command", ["recommend", "report"])
@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, SCHEMA_VERSION - 1, None])
def test_results_parquet_of_another_schema(small_run, tmp_path, command, version, capsys):
    run = _rewrite(small_run, tmp_path / "run", version)
    extra = ["--no-write"] if command == "recommend" else ["--out", str(tmp_path / "rep")]
    assert main([command, str(run), *extra]) == 2
    line = one_line(capsys.readouterr().err, "error:")
    path = run / "results.parquet"
    if version is None:
        assert f"{path}: no sweep schema version in results.parquet" in line
    else:
        assert (f"{path}: results.parquet was written by schema {version}; this sweep reads "
                f"schema {SCHEMA_VERSION}: ") in line
        assert ("upgrade sweep to read it, or " in line) == (version > SCHEMA_VERSION)
    assert "re-run `sweep search` with --fresh" in line


def test_results_parquet_of_this_schema_reads(small_run, tmp_path, capsys):
    run = _rewrite(small_run, tmp_path / "run", SCHEMA_VERSION)
    assert main(["recommend", str(run), "--no-write"]) == 0, capsys.readouterr().err


def test_files_carry_the_schema_version(finished):
    assert manifest(finished)["schema_version"] == SCHEMA_VERSION
    assert open_results(finished / "results.parquet")[1]["schema_version"] == SCHEMA_VERSION
    for p in (finished / "parts").glob("*.parquet"):
        assert results_mod.read_metadata(p)["schema_version"] == SCHEMA_VERSION


# ---------------------------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------------------------
PYTHON_TAGS = [
    '!!python/object/apply:os.system ["touch {m}"]',
    'model: !!python/object/apply:os.system ["touch {m}"]\nseq_len: 8',
    "model: !!python/object/apply:subprocess.check_call [[touch, {m}]]",
    "model: !!python/object/new:subprocess.Popen [[touch, {m}]]",
    "model: !!python/name:os.system",
    "model: !!python/module:os",
    'cluster: !!python/object:argparse.Namespace {{gpu: "h100-sxm"}}',
    "space: {{tp: !!python/tuple [1, 2]}}",
]


@pytest.mark.parametrize("command", ["check", "simulate", "search"])
@pytest.mark.parametrize("template", PYTHON_TAGS)
def test_yaml_python_tags_are_rejected(template, command, tmp_path, capsys):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.yaml"
    p.write_text(template.format(m=marker) + "\n")
    extra = ["--out", str(tmp_path / "o"), "--no-progress"] if command == "search" else []
    assert main([command, str(p), *extra]) == 2
    line = one_line(capsys.readouterr().err, "error:")
    assert f"{p}: invalid YAML at line" in line and "python/" in line
    assert not marker.exists()


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else (
                f"{getattr(f.value, 'id', '?')}.{f.attr}" if isinstance(f, ast.Attribute)
                else "?")
            yield name, node


def test_no_shell_eval_or_unsafe_yaml_in_the_code():
    """Nothing in sweep/ or sim_core/ runs a shell, evaluates text, or loads YAML unsafely;
    the one subprocess (Chromium for the report screenshot) gets an argument list."""
    banned = {"eval", "exec", "compile", "os.system", "os.popen", "os.execv", "os.execl",
              "os.spawnl", "yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all",
              "pickle.loads", "pickle.load", "marshal.loads", "__import__"}
    files = sorted((ROOT / "sweep").rglob("*.py")) + sorted((ROOT / "sim_core").rglob("*.py"))
    assert len(files) > 20
    found, subprocesses = [], []
    for f in files:
        tree = ast.parse(f.read_text(), str(f))
        for name, node in _calls(tree):
            where = f"{f.relative_to(ROOT)}:{node.lineno} {name}"
            if name in banned:
                found.append(where)
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                              and kw.value.value is False):
                    found.append(where + " shell=")
            if name.startswith("subprocess."):
                subprocesses.append(where)
                if node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                    found.append(where + " (a command string)")
    assert found == []
    assert all("report.py" in s or "known_flags" in s for s in subprocesses), subprocesses


def test_report_escapes_user_strings(inline_run, tmp_path):
    """A model and space name with a script tag and quotes (possible only by editing a results
    file: the config allows plain names only) come out escaped in the HTML report.
    tests/test_report.py::test_user_strings_are_escaped covers markup in the space name."""
    from sweep.advice import report

    evil = "<script>alert(\"x\")</script>'&"
    run = tmp_path / "run"
    run.mkdir()
    df = pq.read_table(inline_run / "results.parquet").to_pandas()
    df["model"] = evil
    meta = results_mod.read_metadata(inline_run / "results.parquet")
    write_parquet(run / "results.parquet", df, {**meta, "space": evil})
    html = report.write_report(run, tmp_path / "out")["html"].read_text()
    assert "<script>alert" not in html.lower() and "alert(\"x\")" not in html
    # the only scripts are the report's own (plotly.js, the figures, the point YAMLs as JSON,
    # the toggles): as many as in the report of a plain run
    plain = report.write_report(inline_run, tmp_path / "plain")["html"].read_text()
    assert html.lower().count("<script") == plain.lower().count("<script")
    assert html.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#x27;&amp;") >= 2


def test_inline_model_name_cannot_carry_markup_or_a_line_break(tmp_path, capsys):
    doc = {k: v for k, v in SMALL.items() if k not in ("name", "space", "search")}
    for name in ["<script>alert(1)</script>", "x\nrm -rf ~ #", "a'b", "a b", "-x", ""]:
        model = {"name": name, "layers": 4, "hidden": 256, "heads": 4, "ffn": 1024,
                 "vocab": 1000}
        p = write_space(tmp_path, {**doc, "model": model}, "run.yaml")
        assert main(["simulate", str(p)]) == 2
        line = one_line(capsys.readouterr().err, "error:")
        assert line.startswith("error: model.name: expected a name of letters")


def test_megatron_comment_lines_cannot_break_out(inline_run):
    from sweep.advice import export

    df = pq.read_table(inline_run / "results.parquet").to_pandas()
    row = df[df["status"] == "ok"].iloc[0].copy()
    row["model"] = "llama3.1-8b\nrm -rf ~ #\u2028touch x"
    text = export.megatron_text(row)
    for line in text.splitlines():
        assert line.startswith(("#", "MEGATRON_ARGS=(", "    --", ")")), line
    assert not re.search(r"^\s*(rm|touch)\b", text, re.M)


# ---------------------------------------------------------------------------------------------
# Optuna: a corrupt part is re-evaluated from the study's trials (not replaced by new ones)
# ---------------------------------------------------------------------------------------------
def optuna_cfg():
    doc = space_doc(batch_size=16)
    doc["search"] = {"strategy": "optuna", "batch_size": 4, "trials": 24, "seed": 3,
                     "inner": ["zero"]}
    return parse_space(doc)


def test_optuna_corrupt_part_is_reevaluated(tmp_path, capsys):
    import optuna

    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    def _storage(path):
        return JournalStorage(JournalFileBackend(str(path)))

    ref, out = tmp_path / "ref", tmp_path / "out"
    run_search(optuna_cfg(), ref, **FAKE)
    run_search(optuna_cfg(), out, **FAKE)
    pd.testing.assert_frame_equal(parquet(out / "results.parquet"),
                                  parquet(ref / "results.parquet"))
    n_trials = len(optuna.load_study(study_name="t", storage=_storage(out / "optuna.journal"))
                   .trials)
    victim = sorted((out / "parts").glob("*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:100])
    capsys.readouterr()
    run_search(optuna_cfg(), out, **FAKE)
    assert victim.name in one_line(capsys.readouterr().err, "warning:")
    study = optuna.load_study(study_name="t", storage=_storage(out / "optuna.journal"))
    assert len(study.trials) == n_trials  # no new trials asked
    pd.testing.assert_frame_equal(parquet(out / "results.parquet"),
                                  parquet(ref / "results.parquet"))


def test_the_manifest_is_rewritten_at_intervals_not_per_batch(tmp_path, monkeypatch):
    """Recording a batch does not rewrite the whole manifest each time (quadratic in the
    number of batches); flush saves every recorded one."""
    import os

    real, n = os.replace, {"manifest": 0}

    def replace(src, dst, *a, **kw):
        n["manifest"] += Path(dst).name == "manifest.json"
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(results_mod.os, "replace", replace)
    monkeypatch.setattr(results_mod, "MANIFEST_EVERY_S", 3600.0)
    store = results_mod.ResultStore(tmp_path / "out", "fp").open()
    opened = n["manifest"]
    for i in range(200):
        store.record_part(f"g{i:06d}", {"file": "", "rows": 0, "sha256": "", "counts": {}})
    assert n["manifest"] - opened == 1  # the first batch, then nothing for an hour
    assert len(manifest(tmp_path / "out")["batches"]) == 1
    store.flush()
    assert len(manifest(tmp_path / "out")["batches"]) == 200
    store.flush()  # nothing new: no rewrite
    assert n["manifest"] - opened == 2
