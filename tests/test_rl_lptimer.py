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
