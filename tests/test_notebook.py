"""examples/quickstart.ipynb runs top to bottom (nbclient, a fresh kernel, cells in order) on
the bundled quickstart space, and its first cell gives the top 10 configurations."""

from __future__ import annotations

import shutil

import pytest

from .results_fixture import ROOT

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # the notebook runs from a repository root: a copy of the space it reads, results there
    (tmp_path / "search_spaces").mkdir()
    shutil.copy(ROOT / "search_spaces" / "quickstart.yaml", tmp_path / "search_spaces")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    top = code[0]["outputs"][-1]["data"]["text/html"]  # a DataFrame, shown as a table
    body = top.split("<tbody>")[1].split("</tbody>")[0]
    assert body.count("<tr>") == 10 and "<th>rank</th>" in top
    out = tmp_path / "results" / "quickstart"
    for name in ("results.parquet", "report.html", "best_step.json", "rule_of_thumb_step.json"):
        assert (out / name).exists(), name
    printed = "".join(o.get("text", "") for c in code for o in c["outputs"])
    assert "recommendation for quickstart" in printed
    assert "error: cluster.gpu: unknown gpu 'h100-sxmm'" in printed
