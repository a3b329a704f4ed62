"""The architecture as tests: no import circles between the project's modules (imports inside
functions count), the simulator never imports the accuracy tooling, the layers of sweep only
import downwards, and every subpackage says its role."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim_core", "sweep")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module `name` imports, at any depth of its code (functions too). An import
    of a package's name counts as an import of its __init__; `from pkg import mod` of the
    submodule."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    found.add(a.name)
                elif a.name.rpartition(".")[0] in known:
                    found.add(a.name.rpartition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def reachable(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in g.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_checker_finds_a_circle_and_resolves_relative_imports(tmp_path):
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    mods = {"pkg", "pkg.x", "pkg.sub", "pkg.sub.y"}
    src = tmp_path / "y.py"
    src.write_text("def f():\n    from ..x import thing\n    from . import y\n    import pkg\n")
    assert imports_of("pkg.sub.y", src, mods) == {"pkg.x", "pkg"}


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_simulator_does_not_import_the_accuracy_tooling():
    g = graph()
    reach = reachable(g, "sim_core.simulate")
    assert not {m for m in reach if m.startswith(("sim_core.accuracy", "sim_core.calibration"))}
    assert not any(m.startswith("sweep") for m in reachable(g, "sim_core.simulate"))


# what each layer of sweep may import from sweep (itself always)
ALLOWED = {
    "sweep.errors": set(),
    "sweep.config": {"sweep.errors"},
    "sweep.results": {"sweep.errors", "sweep.config"},
    "sweep.engine": {"sweep.errors", "sweep.config", "sweep.results"},
    "sweep.advice": {"sweep.errors", "sweep.config", "sweep.results", "sweep.engine"},
    "sweep.api": {"sweep.errors", "sweep.config", "sweep.results", "sweep.engine",
                  "sweep.advice"},
    "sweep.cli": {"sweep.errors", "sweep.config", "sweep.results", "sweep.engine",
                  "sweep.advice"},
}


def layer(mod: str) -> str | None:
    for name in ALLOWED:
        if mod == name or mod.startswith(name + "."):
            return name
    return None


def test_sweep_layers_import_only_downwards():
    bad = []
    for mod, deps in graph().items():
        own = layer(mod)
        if own is None:
            continue
        for d in deps:
            other = layer(d)
            if other and other != own and other not in ALLOWED[own]:
                bad.append(f"{mod} -> {d}")
    assert bad == []


def test_sim_core_imports_nothing_of_sweep():
    assert [f"{m} -> {d}" for m, deps in graph().items() if m.startswith("sim_core")
            for d in deps if d.startswith("sweep")] == []


@pytest.mark.parametrize("pkg", ["sweep.config", "sweep.engine", "sweep.results", "sweep.advice",
                                 "sweep.cli", "sim_core.accuracy", "sim_core.calibration"])
def test_every_subpackage_says_its_role_and_what_it_may_import(pkg):
    doc = importlib.import_module(pkg).__doc__ or ""
    assert len(doc.split()) >= 15
    assert "import" in doc  # what it may import, or who imports it


def test_test_fakes_are_not_in_the_package():
    assert not (ROOT / "sweep" / "testing.py").exists()
