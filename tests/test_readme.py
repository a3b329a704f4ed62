"""The README is short and keeps exactly the two set-up commands (run a search, run the tests);
the docs' generated blocks (the accuracy table, the GPT-3 flags) are what their commands print,
not typed by hand; every doc the README links to exists."""

import re
from pathlib import Path

from sim_core.accuracy import validation
from sim_core.accuracy.published import held_out_medians, markdown_summary

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"


def test_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for link in re.findall(r"\]\(((?:docs|examples|search_spaces)/[^)#]+)", text):
        assert (README.parent / link).exists(), link


def test_accuracy_table_matches_the_command():
    text = (DOCS / "accuracy.md").read_text()
    block = re.search(r"<!-- accuracy:begin -->\n(.*?)\n<!-- accuracy:end -->", text, re.S)
    assert block, "accuracy markers missing from docs/accuracy.md"
    expected = markdown_summary(validation.validate(), held_out_medians())
    assert block.group(1).strip() == expected.strip(), (
        "docs/accuracy.md's table is stale: run `python scripts/update_readme.py` "
        "(= `sweep validate --markdown --loso`)")


def test_two_setup_commands():
    text = README.read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, re.S)
    assert len(commands) == 2
    assert "sweep search search_spaces/quickstart.yaml" in commands[0]
    assert "pytest" in commands[1]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pytest -q" in commands[1] and "python -m pytest -q" in ci


def test_gpt3_flags_block_is_the_export(tmp_path):
    """docs/recipes.md's Megatron-LM flags are what `sweep recommend --format megatron` prints for
    the best GPT-3 175B configuration on 1024 A100 in the bundled space."""
    from sweep.advice import export, recommend
    from tests.results_fixture import ROOT, make_results

    out = make_results(ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml", tmp_path / "r")
    df, _ = recommend.load_run(out)
    rec = recommend.recommend(df, "step_time",
                              recommend.Constraints(gpus=["a100-80gb"], num_gpus=[1024]))
    expected = export.megatron_text(rec.best).strip()
    text = (DOCS / "recipes.md").read_text()
    block = re.search(r"<!-- gpt3-flags:begin -->\n```bash\n(.*?)\n```\n<!-- gpt3-flags:end -->",
                      text, re.S)
    assert block and block.group(1).strip() == expected


def test_python_api_section_names_what_exists():
    """The README's Python API lines call functions and methods that exist, on files that
    exist (the notebook test runs the same calls)."""
    import sweep

    text = README.read_text()
    section = text.split("### Python API", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    assert len(block.splitlines()) <= 6
    for name in re.findall(r"\bsweep\.(\w+)\(", section):
        assert callable(getattr(sweep, name)), name
    methods = set(re.findall(r"\bres\.(\w+)\(", section))
    methods |= set(re.findall(r"\b(best|frontier|to_pandas)\(\)", section))
    assert {"top", "recommend", "best", "frontier", "to_pandas", "report", "trace"} <= methods
    for name in methods:
        assert callable(getattr(sweep.Results, name)), name
    for path in re.findall(r'"((?:search_spaces|examples)/[^"]+)"', section):
        assert (README.parent / path).exists(), path
    assert (README.parent / "examples" / "quickstart.ipynb").exists()
