"""RL memory verdicts against published OOM reports (`sweep validate --rl-memory`,
sim_core/accuracy/rl_memory.py) on the shipped rows of data/rl/rl_memory.csv."""

from __future__ import annotations

import numpy as np
import pytest

from sim_core.accuracy import rl, rl_memory
from sweep.cli.main import main


@pytest.fixture(scope="module")
def table():
    return rl_memory.load()


@pytest.fixture(scope="module")
def cmp(table):
    return rl_memory.compare(table)


def test_reader_parses_the_shipped_rows(table):
    assert len(table) >= 6
    assert set(table.outcome) == {"oom", "fits"}
    assert set(table.oom_phase) <= {"", "rollout", "training", "refit"}
    # every row cites where it comes from and says what is stated and what is imputed
    assert table.url.str.startswith("https://github.com/").all()
    assert (table.notes.str.len() > 200).all()
    # the pairs: the same setup OOM and then fitting after the stated change
    miles = table[table.source.str.startswith("miles PR 580")]
    assert sorted(zip(miles.gpu_memory_utilization, miles.outcome)) == [("0.7", "fits"),
                                                                         ("0.8", "oom")]
    nemo = table[table.source.str.startswith("NeMo RL issue 604")]
    assert sorted(zip(nemo.num_gpus, nemo.train_seq_len, nemo.outcome)) == [
        ("1", "12288", "oom"), ("8", "3072", "fits")]
    # rllm issue 30 states the phase
    assert table[table.url.str.endswith("rllm/issues/30")].oom_phase.tolist() == ["training"]


def test_verdicts_follow_the_simulators_own(table, cmp):
    """Each row's predicted verdict is the one `sweep validate --rl` gives the same row."""
    base = rl.compare(table.drop(columns=["outcome", "oom_phase"]))
    for i in range(len(table)):
        if base.skipped[i]:
            assert cmp.predicted[i] == "-" and cmp.verdict[i] == "not predicted"
        else:
            assert cmp.predicted[i] == ("fits" if bool(base.fits[i]) else "oom")
            assert cmp.oom_reason[i] == base.oom_reason[i]


def test_summary_counts_match_a_hand_count(cmp):
    s = rl_memory.summary(cmp)
    # hand count over the table's rows
    stated, pred = cmp.outcome.tolist(), cmp.predicted.tolist()
    right = sum(p == o for o, p in zip(stated, pred) if p != "-")
    false_fit = sum(o == "oom" and p == "fits" for o, p in zip(stated, pred))
    false_oom = sum(o == "fits" and p == "oom" for o, p in zip(stated, pred))
    assert (s["right"], s["false_fits"], s["false_ooms"]) == (right, false_fit, false_oom)
    assert s["rows"] == len(cmp) == s["predicted"] + s["not_predicted"]
    assert s["right"] + s["false_fits"] + s["false_ooms"] == s["predicted"]
    # rows checked by hand: the A6000 row cannot be priced (no such GPU in the catalog); the
    # miles pair's 0.7 row fits with its generation peak as SGLang sizes it
    # (rl/sglang_memory.py): the TP8 engine's start-up 2 GiB + 0.7 of the memory free at its
    # start + SGLang's reserve for an H100 TP8 engine (14848 MiB) + the trainer's CUDA context
    a6000 = cmp[cmp.gpu == "RTX A6000"].iloc[0]
    assert a6000.verdict == "not predicted" and "unknown gpu" in a6000.why
    fit = cmp[(cmp.source.str.startswith("miles")) & (cmp.outcome == "fits")].iloc[0]
    assert fit.verdict == "right"
    expected = 2.0 + 0.7 * (fit.hbm_gib - 2.0) + 14848 / 1024 + 0.5
    assert fit.pred_rollout_peak_gib == pytest.approx(expected, rel=1e-6)
    # a verdict is `fits` only when both peaks are under the GPU's memory
    priced = cmp[cmp.predicted != "-"]
    under = (priced.pred_rollout_peak_gib <= priced.hbm_gib) & \
        (priced.pred_train_peak_gib <= priced.hbm_gib)
    assert ((priced.predicted == "fits") <= under).all()


def test_verdict_labels_on_a_made_up_outcome(table):
    """Flip a row's stated outcome: the same prediction becomes the other kind of error."""
    t = table.copy()
    i = int(np.flatnonzero(t.source.str.startswith("miles PR 580").to_numpy()
                           & t.outcome.eq("fits").to_numpy())[0])
    t.loc[i, "outcome"] = "oom"
    c = rl_memory.compare(t)
    assert c.verdict[i] == ("false fit" if c.predicted[i] == "fits" else "right")
    t.loc[i, "outcome"] = "fits"
    assert rl_memory.compare(t).verdict[i] == ("right" if c.predicted[i] == "fits"
                                               else "false oom")


def test_cli_prints_the_summary(capsys):
    assert main(["validate", "--rl-memory"]) == 0
    out = capsys.readouterr().out
    s = rl_memory.summary(rl_memory.compare(rl_memory.load()))
    assert f"{s['right']} verdicts right, {s['false_fits']} false fits" in out
    assert "rllm issue 30" in out and "stated oom in training" in out


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace(",oom,", ",crashed,", 1), "outcome 'crashed' is not one of oom, fits"),
    (lambda s: s.replace(",oom,training\n", ",oom,generation\n", 1),
     "oom_phase 'generation' is not one of rollout, training, refit"),
    (lambda s: s.replace(",outcome,", ",result,", 1), "outcome: required column is missing"),
])
def test_bad_input_is_one_line(tmp_path, capsys, edit, message):
    from importlib import resources

    src = resources.files("sim_core").joinpath("data/rl/rl_memory.csv").read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text(edit(src))
    assert main(["validate", "--rl-memory", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_missing_file_is_one_line(tmp_path, capsys):
    assert main(["validate", "--rl-memory", str(tmp_path / "none.csv")]) != 0
    err = capsys.readouterr().err.strip()
    assert "none.csv" in err and len(err.splitlines()) == 1


def test_a_table_without_step_times_reads(tmp_path):
    """A memory table needs no step_time_s column: the same rows, the same verdicts."""
    from importlib import resources

    import pandas as pd

    src = resources.files("sim_core").joinpath("data/rl/rl_memory.csv")
    t = pd.read_csv(src, dtype=str).drop(columns=["step_time_s"])
    path = tmp_path / "mine.csv"
    t.head(3).to_csv(path, index=False)
    mine = rl_memory.compare(rl_memory.load(path))
    shipped = rl_memory.compare(rl_memory.load()).head(3)
    assert mine.verdict.tolist() == shipped.verdict.tolist()
    assert np.allclose(mine.pred_train_peak_gib, shipped.pred_train_peak_gib)


def test_missing_model_column_is_one_line(tmp_path, capsys):
    from importlib import resources

    import pandas as pd

    src = resources.files("sim_core").joinpath("data/rl/rl_memory.csv")
    path = tmp_path / "nomodel.csv"
    pd.read_csv(src, dtype=str).drop(columns=["model"]).to_csv(path, index=False)
    assert main(["validate", "--rl-memory", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "model: required column is missing" in err and len(err.splitlines()) == 1
