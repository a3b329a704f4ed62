"""`sweep report` and `sweep recommend` on an RL search's folder (sweep/advice/rl_report.py):
the frontier, the phases of the best, constraints and recipes, from the stored files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sweep.cli.main import main
from sweep.config import load_space
from sweep.engine import rl as engine

SPACE = "search_spaces/rl-grpo-qwen3-32b-64xh100.yaml"


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    cfg = load_space(SPACE)
    cfg.space = {"num_gpus": [32, 64, 128], "placement": ["colocated", "split"],
                 "rollout_gpus": [16, 32, 64], "rollout_tp": [4, 8], "train_pp": [1, 2]}
    out = tmp_path_factory.mktemp("rl")
    engine.search(cfg, out)
    return out


def test_report_of_an_rl_folder(searched, capsys):
    assert main(["report", str(searched)]) == 0
    said = capsys.readouterr().out
    ranking = pd.read_csv(searched / "ranking.csv")
    front = pd.read_csv(searched / "pareto.csv")
    assert f"({len(front)} frontier points" in said
    md = (searched / "report.md").read_text()
    html = (searched / "report.html").read_text()
    best = ranking.iloc[0]
    assert f"{best['step_time_s']:.1f}" in md and "nan" not in md
    assert "data:image/png;base64," in html and html.count("<img") == 2
    for name in ("frontier", "phases"):
        assert (searched / "report_plots" / f"{name}.png").stat().st_size > 1000
    # the frontier table lists every frontier point, fastest first
    assert md.count("\n| ") >= len(front) + 1


def test_recommend_under_a_cluster_size_limit(searched, capsys, tmp_path):
    ranking = pd.read_csv(searched / "ranking.csv")
    assert main(["recommend", str(searched), "--max-gpus", "64", "--format", "json",
                 "--out", str(tmp_path)]) == 0
    best = json.loads(capsys.readouterr().out)
    expect = ranking[ranking.num_gpus <= 64].iloc[0]
    assert best["config_id"] == int(expect.config_id) and best["num_gpus"] <= 64
    assert (tmp_path / "verl.sh").exists() and (tmp_path / "nemo_rl.yaml").exists()
    assert main(["recommend", str(searched), "--objective", "cost", "--no-write"]) == 0
    cheapest = ranking.sort_values("cost_per_1000_steps").iloc[0]
    assert f"${cheapest.cost_per_1000_steps:,.0f}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--format", "megatron"], "--format megatron: RL results print a table or json"),
    (["--tokens", "1T"], "--tokens: not for RL results"),
    (["--objective", "days"], "--objective days: RL results rank by"),
])
def test_recommend_rl_bad_flags_are_one_line(searched, capsys, argv, says):
    assert main(["recommend", str(searched), "--no-write", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
