"""Session 12's audit of the timed rows whose mean response length is imputed (docs/rl.md,
"Stated response lengths of the imputed rows (session 12)").

No source stated its run's mean in readable text, so no row was filled; these tests pin the
audit: the rows validate reports with an imputed mean are exactly the audited ones (a row that
later gains a stated figure must leave the list), and a stated `mean_seq_len` is never reported
as imputed."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl

# (source, stated step seconds) of every timed row audited in session 12, and its finding
AUDITED = {
    ("verl one_step_off.md", 749.0): "images / W&B only",
    ("verl one_step_off.md", 520.0): "images / W&B only",
    ("verl one_step_off.md", 699.0): "images / W&B only",
    ("verl one_step_off.md", 566.0): "images / W&B only",
    ("marin issue 8653", 32423.0): "clip ratio stated, mean in an unreadable gist",
    ("vime issue 358", 31.5): "charts only",
    ("vime issue 358", 20.8): "charts only",
    ("vime issue 358", 178.3): "charts only",
    ("vime issue 358", 104.0): "charts only",
    ("rllm issue 29 (DeepScaleR 8k)", 396.0): "not stated",
    ("rllm issue 29 (DeepScaleR 8k)", 394.0): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 830.88): "not stated for 7B",
    ("AReaL paper (arXiv 2505.24298)", 365.76): "not stated for 7B",
    ("AReaL paper (arXiv 2505.24298)", 483.84): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 750.24): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 1998.0): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 2784.0): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 2196.0): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 985.5): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 3066.0): "not stated",
    ("AReaL paper (arXiv 2505.24298)", 1866.0): "not stated",
    ("AReaL v0.1 tutorial", 1350.0): "the log is the 7B run's",
    ("AReaL v0.1 tutorial", 450.0): "the log is the 7B run's",
    ("maxrl issue 2 (Qwen3-4B-Base, 32 H200)", 259.2): "not stated",
    ("NeMo RL nightly test suites (H100)", 12.0): "not stated",
    ("NeMo RL nightly test suites (H100)", 252.0): "not stated",
    ("NeMo RL nightly test suites (H100)", 13.7): "not stated",
    ("NeMo RL nightly test suites (H100)", 18.5): "not stated",
    ("SkyRL GLM-4.7-Flash H200 notes (PR 1280 branch)", 3780.0): "not stated",
    ("SimpleRL-Zoo README (hkust-nlp/simpleRL-reason)", 540.0): "Figure 1 only",
    ("cann-recipes-train SAM decoding report (Qwen3-235B DAPO, 64 Ascend A3)", 15441.45):
        "not stated",
    ("cann-recipes-train SAM decoding report (Qwen3-235B DAPO, 64 Ascend A3)", 13960.98):
        "not stated",
    ("NovaSky Sky-T1-7B blog: Sky-T1-mini RL (8 H100)", 847.06): "not stated",
    ("NovaSky Sky-T1-7B blog: Sky-T1-mini RL (8 H100)", 1080.0): "not stated",
}
SECTION = "## Stated response lengths of the imputed rows (session 12)"


@pytest.fixture(scope="module")
def table_and_cmp():
    t = rl.load()
    return t, rl.compare(t)


def _imputed_mean_rows(cmp: pd.DataFrame) -> pd.DataFrame:
    timed = np.isfinite(cmp.step_err.to_numpy(float))
    return cmp[timed & cmp.imputed.str.contains("response mean=").to_numpy()]


def test_audited_rows_are_still_imputed(table_and_cmp):
    """Every audited row is still reported with an imputed mean; rows added after the audit
    may impute theirs too, so the check is one way: a row that gains a stated figure must
    leave AUDITED."""
    _, cmp = table_and_cmp
    rows = _imputed_mean_rows(cmp)
    keys = {(s, round(float(x), 2)) for s, x in zip(rows.source, rows.step_time_s)}
    assert set(AUDITED) <= keys
    audited = [k in AUDITED for k in zip(rows.source, rows.step_time_s.astype(float).round(2))]
    assert sum(audited) == 35  # SimpleRL-Zoo's two rows share one key


def test_audited_rows_carry_no_stated_mean(table_and_cmp):
    t, cmp = table_and_cmp
    rows = _imputed_mean_rows(cmp).index
    assert t.loc[rows, "mean_seq_len"].isna().all()
    # marin's stated clip ratio stays the row's only length figure, and the mean follows from it
    marin = [i for i in rows if t.source[i] == "marin issue 8653"]
    assert str(t.response_clip_ratio[marin[0]]) == "55%"
    assert "from 55% of responses at the 8192 cap" in cmp.imputed[marin[0]]


def test_stated_means_are_not_reported_imputed(table_and_cmp):
    t, cmp = table_and_cmp
    stated = t.mean_seq_len.notna().to_numpy() & np.isfinite(cmp.step_err.to_numpy(float))
    assert stated.sum() >= 20
    assert not cmp.imputed[stated].str.contains("response mean=").any()
    # e.g. the AReaL v0.1 7B row's logged avg_seq_len less the prompt, and the AReaL 1.5B rows
    for src, step, mean in [("AReaL v0.1 tutorial", 2260.19, 7834.0),
                            ("AReaL paper (arXiv 2505.24298)", 590.4, 9184.0)]:
        i = np.flatnonzero((t.source == src).to_numpy()
                           & np.isclose(cmp.step_time_s.to_numpy(float), step))
        assert len(i) == 1 and float(t.mean_seq_len[i[0]]) == mean


def test_docs_record_every_audited_source():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "rl.md").read_text()
    assert doc.count(SECTION) == 1
    body = doc.split(SECTION, 1)[1].split("\n## ", 1)[0]
    for src in {s for s, _ in AUDITED}:
        short = src.split(" (")[0].split(":")[0]
        assert short in body, short
