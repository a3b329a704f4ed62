"""The shipped RL phase scales (catalogs/rl.yaml nemo_rl_logprob_scale / nemo_rl_update_scale,
fitted by sim_core/calibration/rl_defaults.py on the NeMo RL rows of the shipped run table):
they match their fit, touch NeMo RL's training passes only, and the leave-one-source-out
figure never uses the source it predicts."""

from __future__ import annotations

import numpy as np
import pytest

from sim_core.accuracy import rl
from sim_core.calibration import rl_defaults, rl_phases
from sim_core.rl.phases import simulate_rl


@pytest.fixture(scope="module")
def shipped():
    return rl.load(), rl_defaults.fit()


def test_catalog_holds_the_fit(shipped):
    # the stored values are the fit at three significant digits: data and catalog cannot drift
    _, r = shipped
    for phase, v in r["scales"].items():
        assert rl_defaults.stored()[phase] == pytest.approx(float(f"{v:.3g}"), abs=1e-12)
    # both slower than the white-box model (the gap the fit stands in for)
    assert r["scales"]["update"] > r["scales"]["log-probs"] > 1.0


def test_only_nemo_rl_training_passes_move(shipped):
    t, _ = shipped
    df, _, reason = rl.to_frame(t)
    df = df[reason == ""].reset_index(drop=True)
    shipped_p = simulate_rl(df)
    white = simulate_rl(df, phase_scales={})
    nemo = (df.rl_framework == "nemo_rl").to_numpy()
    k = rl_defaults.stored()
    assert nemo.sum() >= 10 and (~nemo).sum() >= 10
    for col in shipped_p.columns:
        a, b = shipped_p[col].to_numpy(), white[col].to_numpy()
        if a.dtype.kind == "f":
            assert np.array_equal(a[~nemo], b[~nemo], equal_nan=True), col
    np.testing.assert_allclose(shipped_p.update_time_s[nemo], white.update_time_s[nemo]
                               * k["update"], rtol=1e-12)
    np.testing.assert_allclose(shipped_p.log_prob_time_s[nemo], white.log_prob_time_s[nemo]
                               * k["log-probs"], rtol=1e-12)
    np.testing.assert_array_equal(shipped_p.gen_time_s, white.gen_time_s)
    np.testing.assert_array_equal(shipped_p.weight_sync_time_s, white.weight_sync_time_s)
    assert (shipped_p.step_time_s[nemo] > white.step_time_s[nemo]).all()


def test_left_out_scales_are_fitted_without_the_source(shipped):
    t, r = shipped
    for src in ("NeMo RL v0.3 blog", "nemo-rl-on-gke (Gemma 3 1B, 8 RTX PRO 6000)"):
        assert src in r["folds"]
        without = rl_defaults.fit(t[t.source != src].reset_index(drop=True))
        for phase, v in without["scales"].items():
            assert r["folds"][src][phase] == pytest.approx(v, rel=1e-12)


def test_a_calibration_profile_replaces_the_shipped_scales(shipped, isolated_profiles):
    t, _ = shipped
    df, _, reason = rl.to_frame(t)
    df = df[(reason == "") & (df.rl_framework == "nemo_rl")].reset_index(drop=True)
    white = simulate_rl(df, phase_scales={})
    # explicit scales (what an installed profile passes): the shipped ones are not applied
    p = simulate_rl(df, phase_scales={"update": 2.0})
    np.testing.assert_allclose(p.update_time_s, white.update_time_s * 2.0, rtol=1e-12)
    np.testing.assert_allclose(p.log_prob_time_s, white.log_prob_time_s, rtol=1e-12)


def test_no_nemo_rows_no_fit():
    t = rl.load()
    with pytest.raises(rl_phases.RLCalibrationError, match="nemo_rl"):
        rl_defaults.fit(t[~t.rl_framework.astype(str).str.contains("nemo")].reset_index(drop=True))


def test_simulate_says_when_the_shipped_scales_apply(tmp_path, capsys):
    from sweep.cli.main import main

    from .conftest import RL_EXAMPLE

    text = open(RL_EXAMPLE).read()
    assert "train: {mini_batches: 4}" in text
    verl = tmp_path / "verl.yaml"
    verl.write_text(text)
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text(text.replace("train: {mini_batches: 4}",
                                 "train: {mini_batches: 4, rl_framework: nemo_rl}"))
    assert main(["simulate", str(nemo)]) == 0
    k = rl_defaults.stored()
    assert (f"shipped fitted scales x{k['log-probs']:.2f} / x{k['update']:.2f}"
            in capsys.readouterr().out)
    assert main(["simulate", str(verl)]) == 0
    assert "shipped fitted scales" not in capsys.readouterr().out
