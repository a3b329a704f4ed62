"""What a row's log-prob timer holds (accuracy/rl_logprob_timer.py): the predicted side sums
only the passes the measured timer holds, in validate and in calibrate rl-runs."""

import numpy as np
import pandas as pd
import pytest

from sim_core.accuracy import rl, rl_logprob_timer as lpt
from sim_core.calibration import rl_phases

RLINF = "RLinf docs: comparison with verl"


@pytest.fixture(scope="module")
def table():
    return rl.load()


def _rlinf_1p5b(t):
    m = t.source.str.startswith(RLINF) & t.model.str.contains("1.5B")
    assert m.sum() == 1
    return t[m].reset_index(drop=True)


def test_held_defaults_and_cells():
    h = lpt.held(["", "", "", "policy+ref", "policy", None],
                 ["verl", "nemo_rl", "skyrl", "verl", "nemo_rl", "slime"],
                 [False, False, False, False, True, False])
    # verl's timing_s/old_log_prob alone; NeMo RL's and SkyRL's timers hold both; a cell
    # wins over the default; a stated ref_time_s (two timers summed) holds both
    assert list(h) == ["policy", "policy+ref", "policy+ref", "policy+ref", "policy+ref",
                       "policy"]
    with pytest.raises(lpt.LogProbTimerError):
        lpt.parse("reference only")


def test_predicted_sums_the_held_passes():
    p = lpt.predicted(np.array(["policy", "policy+ref"]), [2.0, 2.0], [3.0, 3.0], [0.0, 1.0])
    assert list(p) == [2.0, 6.0]


def test_rlinf_row_policy_only(table):
    """RLinf's verl 1.5B table times old_log_prob only: against policy + reference it read
    2.03x, against the policy pass ~1.0x."""
    row = _rlinf_1p5b(table)
    c = rl.compare(row)
    assert c.log_prob_timer.iloc[0] == "policy"
    ratio = c.pred_log_prob_time_s.iloc[0] / c.meas_log_prob_time_s.iloc[0]
    assert 0.8 < ratio < 1.25
    both = rl.compare(row.assign(log_prob_timer="policy+ref"))
    ratio_both = both.pred_log_prob_time_s.iloc[0] / both.meas_log_prob_time_s.iloc[0]
    assert ratio_both > 1.6  # the reference pass is as long as the policy's


def test_every_row_with_a_log_prob_time_states_its_timer(table):
    states = table.old_log_prob_time_s.notna() | table.ref_time_s.notna()
    cells = table.log_prob_timer.fillna("").astype(str)
    assert (cells[states] != "").all()
    assert (cells[~states] == "").all()
    assert set(cells[states]) <= set(lpt.TIMERS)


def test_calibrate_pairs_the_timer_and_accepts_the_column(table):
    """A user's run table: the optional column is read, the log-prob scale is fitted against
    the held passes, and the step still composes every pass."""
    row = _rlinf_1p5b(table)
    d = rl_phases.prepare(row)
    assert d.pred_lp_timer[0] < 0.7 * d.pred["log-probs"][0]
    r = rl_phases.log_ratios(d, "log-probs")
    assert abs(r[0]) < np.log(1.25)
    d2 = rl_phases.prepare(row.drop(columns=["log_prob_timer"]))  # blank: verl's timer
    assert d2.pred_lp_timer[0] == pytest.approx(d.pred_lp_timer[0])
    with pytest.raises(rl_phases.RLCalibrationError):
        rl_phases.prepare(row.assign(log_prob_timer="reference only"))


def _scale_line(out, phase="log-probs"):
    """The fitted scale's line and the phase's |error| line (white-box -> fitted)."""
    return [ln for ln in out.splitlines() if ln.strip().startswith(phase)]


@pytest.mark.usefixtures("isolated_profiles")
def test_user_table_through_the_cli(table, tmp_path, capsys):
    """`sweep calibrate rl-runs` on a user's CSV: the column is optional (blank or absent =
    the framework's timer), read in any listed spelling, selectable with --rows, changes the
    fitted log-prob scale when it changes a pairing, and a bad cell is one error line."""
    from sweep.cli.main import main

    rows = table[table.source.str.startswith(RLINF)
                 | table.source.str.startswith("NeMo RL v0.3 blog")].reset_index(drop=True)
    assert len(rows) == 9 and set(rows.log_prob_timer) == {"policy", "policy+ref"}

    def run(frame, name, *extra):
        p = tmp_path / f"{name}.csv"
        frame.to_csv(p, index=False)
        rc = main(["calibrate", "rl-runs", str(p), "--profile", name, *extra])
        return rc, capsys.readouterr()

    rc, with_col = run(rows, "with")
    assert rc == 0
    rc, absent = run(rows.drop(columns=["log_prob_timer"]), "absent")
    assert rc == 0 and _scale_line(absent.out) == _scale_line(with_col.out)
    spelled = rows.assign(log_prob_timer=rows.log_prob_timer.str.replace("policy+ref",
                                                                         "Policy + Reference"))
    rc, sp = run(spelled, "spelled")
    assert rc == 0 and _scale_line(sp.out) == _scale_line(with_col.out)
    # the wrong pairing (the RLinf 1.5B policy-only timer read as both passes): its 2x ratio
    # lifts the phase's white-box median |error| (15.1% -> 23.2% on these 9 rows)
    rc, wrong = run(rows.assign(log_prob_timer="policy+ref"), "wrong")
    assert rc == 0
    pct = [float(ln.split("rows")[1].split("%")[0]) for ln in
           (_scale_line(with_col.out)[1], _scale_line(wrong.out)[1])]
    assert pct[1] > pct[0] + 5
    rc, sel = run(rows, "sel", "--rows", "log_prob_timer == 'policy+ref'")
    assert rc == 0 and "8 selected by --rows" in sel.out
    rc, bad = run(rows.assign(log_prob_timer="ref only"), "bad")
    err = bad.err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "log_prob_timer 'ref only'" in err[0]
