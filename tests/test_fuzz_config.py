"""Fuzzing the YAML loader and the run/space validators (hypothesis): random text and bytes,
random YAML documents and mutations of valid files never raise anything but a `ValueError`
(ConfigError / SweepError / CatalogError) with a one-line message, and through the command
line always exit 0 or 2, with exactly one `error: ...` line on stderr for 2."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweep.cli import main
from sweep.config import parse_run, parse_space, read_yaml
from sweep.engine.space import Space

# SWEEP_FUZZ_EXAMPLES=5000 for a longer, randomized hunt; CI runs a fixed, quick sample.
N = int(os.environ.get("SWEEP_FUZZ_EXAMPLES", "0")) or None
SETTINGS = settings(max_examples=N or 150, deadline=None, derandomize=N is None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
TMP = Path(tempfile.mkdtemp(prefix="sweep-fuzz-"))

RUN = {"model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64, "precision": "bf16",
       "cluster": {"gpu": "h100-sxm", "num_gpus": 8, "gpus_per_node": 8},
       "parallel": {"tp": 2, "pp": 1, "micro_batch": 1, "recompute": "selective", "zero": 1}}
INLINE = {**RUN, "model": {"name": "tiny", "layers": 4, "hidden": 256, "heads": 4, "ffn": 1024,
                           "vocab": 1000, "activation": "gelu"}}
SPACE = {"name": "fuzz", **{k: v for k, v in RUN.items() if k != "parallel"},
         "space": {"tp": [1, 2, 4, 8], "pp": {"pow2": [1, 4]}, "micro_batch": {"range": [1, 2]},
                   "recompute": ["none", "full"], "zero": [1, 3]},
         "search": {"strategy": "grid", "objectives": ["step_time"]}}
FIELDS = ["model", "seq_len", "global_batch", "global_batch_tokens", "precision", "cluster",
          "parallel", "gpu", "num_gpus", "nodes", "tp", "pp", "cp", "ep", "micro_batch",
          "recompute", "zero", "space", "search", "name", "strategy", "trials", "objectives",
          "range", "pow2", "values", "step", "layers", "hidden", "heads", "fsdp", "tpp",
          "inner", "inner_max", "patience", "improvement", "auto", "optuna"]

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
           | st.sampled_from(FIELDS) | st.sampled_from(["h100-sxm", "gpt3-175b", "full", "-1"]))
keys = st.sampled_from(FIELDS) | st.text(max_size=12) | st.integers(-3, 3) | st.booleans()
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25)


def _file(text: str | bytes) -> Path:
    fd, name = tempfile.mkstemp(suffix=".yaml", dir=TMP)
    with open(fd, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    return Path(name)


def assert_one_line(exc: BaseException) -> None:
    assert isinstance(exc, ValueError), f"{type(exc).__name__}: {exc}"
    msg = str(exc)
    assert msg.strip() and "\n" not in msg and "\r" not in msg, repr(msg)


def validate_all(path: Path) -> None:
    """read_yaml + parse_run + parse_space: ok, or a one-line ValueError."""
    try:
        data = read_yaml(path)
    except ValueError as exc:
        assert_one_line(exc)
        assert str(path) in str(exc)  # names the file
        return
    for parse in (parse_run, parse_space):
        try:
            parse(copy.deepcopy(data))
        except ValueError as exc:
            assert_one_line(exc)


def run_cli(argv, capsys) -> int:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
    return code


@SETTINGS
@given(st.text(max_size=300))
def test_random_text(text):
    validate_all(_file(text))


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes(data):
    validate_all(_file(data))


@SETTINGS
@given(documents)
def test_random_yaml_documents(doc):
    validate_all(_file(yaml.safe_dump(doc, allow_unicode=True)))


# ------------------------------------------------------------------ mutations of valid files
def _paths(d, prefix=()):
    """Every (path) into a nested dict/list document."""
    yield prefix
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _paths(v, prefix + (i,))


def _get(d, path):
    for p in path:
        d = d[p]
    return d


@st.composite
def mutated(draw, base):
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, last = _get(doc, path[:-1]), path[-1]
        op = draw(st.sampled_from(["drop", "retype", "negate", "zero", "unknown", "typo"]))
        if op == "drop":
            del parent[last]
        elif op == "retype":
            parent[last] = draw(scalars | st.lists(scalars, max_size=3)
                                | st.dictionaries(keys, scalars, max_size=2))
        elif op in ("negate", "zero"):
            v = parent[last]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                parent[last] = -v if op == "negate" else 0
        elif op == "unknown" and isinstance(parent, dict):
            parent[draw(keys)] = draw(scalars)
        elif op == "typo" and isinstance(parent, dict) and isinstance(last, str):
            i = draw(st.integers(0, max(0, len(last) - 1)))
            parent[last[:i] + last[i + 1:] + draw(st.sampled_from(["", "s", "_"]))] = \
                parent.pop(last)
    return doc


@SETTINGS
@given(mutated(RUN) | mutated(INLINE))
def test_mutated_run_file(doc):
    validate_all(_file(yaml.safe_dump(doc, allow_unicode=True)))


@SETTINGS
@given(mutated(SPACE))
def test_mutated_space_file(doc):
    validate_all(_file(yaml.safe_dump(doc, allow_unicode=True)))


@settings(max_examples=N or 100, deadline=None, derandomize=N is None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=mutated(RUN) | mutated(INLINE))
def test_mutated_run_file_cli(doc, capsys):
    run_cli(["simulate", _file(yaml.safe_dump(doc, allow_unicode=True)), "--json"], capsys)


@settings(max_examples=N or 100, deadline=None, derandomize=N is None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=mutated(SPACE) | documents)
def test_mutated_space_file_cli(doc, capsys):
    path = _file(yaml.safe_dump(doc, allow_unicode=True))
    try:
        size = Space.from_config(parse_space(read_yaml(path))).size
    except ValueError:
        size = 0
    if size <= 100_000:  # `check` enumerates the space: fuzz the validator, not a huge census
        run_cli(["check", path], capsys)


@settings(max_examples=N or 60, deadline=None, derandomize=N is None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.text(max_size=200) | st.binary(max_size=200))
def test_random_files_cli(data, capsys):
    path = _file(data)
    for command in ("check", "simulate"):
        assert run_cli([command, path], capsys) == 2


# ------------------------------------------------------------------ what fuzzing found once
# "billion laughs": 9**7 leaves if expanded; the error shows a bounded repr instead
BOMB = ("description: [&a [x, x, x, x, x, x, x, x, x], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a],"
        " &c [*b, *b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c, *c],"
        " &e [*d, *d, *d, *d, *d, *d, *d, *d, *d], &f [*e, *e, *e, *e, *e, *e, *e, *e, *e],"
        " [*f, *f, *f, *f, *f, *f, *f, *f, *f]]\n")


@pytest.mark.parametrize("text, expect", [
    (b"\x80\x81", "not a UTF-8 text file"),
    (yaml.safe_dump({**RUN, "\r": None}), "unknown field '\\r'"),
    (yaml.safe_dump({**RUN, "seq_len": 2**63}), "seq_len: expected a positive integer up to"),
    (yaml.safe_dump({**RUN, "parallel": {"tp": 2**40}}), "parallel.tp: expected a positive"),
    (yaml.safe_dump({**SPACE, "space": {"tp": {"range": [1, 2**31 - 1]}}}),
     "space.tp.range: 2,147,483,647 values; at most 100,000"),
    (yaml.safe_dump({**SPACE, "space": {"tp": [2**64]}}), "space.tp: expected a list of positive"),
    (yaml.safe_dump({**SPACE, "space": {"expert_skew": [float("nan")]}}), "space.expert_skew"),
    (yaml.safe_dump({**SPACE, "space": {"capacity_factor": [10**400]}}), "space.capacity_fac"),
    (yaml.safe_dump({**SPACE, "search": {"seed": 2**40}}), "search.seed: expected an integer"),
    (yaml.safe_dump({**RUN, "cluster": {**RUN["cluster"], "nic_bw_gbs": float("inf")}}),
     "cluster.nic_bw_gbs: expected a positive number"),
    (yaml.safe_dump({**SPACE, "space": {"tp\nx": [1]}}), "unknown field 'space.tp\\nx'"),
    (BOMB + yaml.safe_dump(RUN), "description: "),
])
def test_found_by_fuzzing(text, expect, capsys):
    path = _file(text)
    command = "check" if "space:" in str(text) else "simulate"
    code = main([command, str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert expect in err and len(err) < 400, err


def test_alias_bomb_in_a_space_field():
    from sweep.config import parse_axis

    bomb = ["x"] * 9
    for _ in range(8):
        bomb = [bomb] * 9  # shared references, as YAML aliases load
    for spec in (bomb, {"range": bomb}, {"values": bomb}, {"pow2": bomb}):
        with pytest.raises(ValueError) as ei:
            parse_axis("tp", spec)
        assert_one_line(ei.value)
        assert len(str(ei.value)) < 200
