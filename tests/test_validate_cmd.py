"""`sweep validate`: per-row table, summaries, CSV + plot, and one-line errors."""

import pandas as pd

from sweep.cli import main


def test_validate_writes_table_plot_and_summaries(tmp_path, capsys):
    assert main(["validate", "--subset", "dense", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for heading in ("by source family:", "by GPU:", "by model family:",
                    "unstated fields were filled as follows:"):
        assert heading in out
    table = pd.read_csv(tmp_path / "validation.csv")
    assert len(table) >= 90 and {"measured_step_s", "predicted_step_s", "step_error",
                                 "source"} <= set(table.columns)
    assert (tmp_path / "validation.png").stat().st_size > 10_000


def test_validate_on_a_user_dataset(tmp_path, capsys):
    from sim_core import validation

    raw = pd.read_csv(validation.dataset_path(), dtype=str, keep_default_na=False)
    mine = tmp_path / "mine.csv"
    raw[raw["id"].isin(["22", "112", "192"])].to_csv(mine, index=False)
    assert main(["validate", str(mine)]) == 0
    out = capsys.readouterr().out
    assert "GPT-3 175B" in out and "LLAMA3-70B" in out


def test_validate_bad_dataset_is_a_one_line_error(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dataset") and "\n" not in err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["validate", str(bad)]) == 2
    assert "published_runs format" in capsys.readouterr().err
