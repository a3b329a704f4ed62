"""Issue 40: what the engine's host work per running sequence (sim_core/rl/engine_host.py,
vLLM V1 serial, SGLang overlapped) does to `sweep validate --rl`, row by row, and how the
figures move with the cost per loop body. A diagnostic: nothing is fitted on the RL rows.

    PYTHONPATH=$PWD python benchmarks/rl_engine_host.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim_core.accuracy import rl
from sim_core.rl import engine_host, generation, inputs
from sim_core.rl.inputs import constants


def _run(unit: float) -> pd.DataFrame:
    k = constants()["engine_host"]
    old = k["loop_body_s"]
    k["loop_body_s"] = unit
    try:
        return rl.compare(rl.load())
    finally:
        k["loop_body_s"] = old


def _host_at_concurrency() -> pd.DataFrame:
    t = rl.load()
    df, _, reason = rl.to_frame(t)
    ok = np.flatnonzero(reason == "")
    b = inputs.to_batch(df.iloc[ok].reset_index(drop=True))
    conc = generation.generate(b)["concurrency"]
    ser, ovl = engine_host.per_seq_s(b)
    out = pd.DataFrame(index=range(len(t)), columns=["conc", "host_ms", "how"], dtype=object)
    out.loc[ok, "conc"] = conc
    out.loc[ok, "host_ms"] = (ser + ovl) * conc * 1e3
    v0 = np.asarray(b.rollout_vllm_v0, float) > 0
    out.loc[ok, "how"] = np.where(ser > 0, "V1 +", np.where(ovl > 0, "SGL max", np.where(
        v0, "V0", "-")))
    return out


def main() -> None:
    unit = float(constants()["engine_host"]["loop_body_s"])
    before, after = _run(0.0), _run(unit)
    t = rl.load()
    meas_gen = pd.to_numeric(t.gen_time_s, errors="coerce")
    h = _host_at_concurrency()
    rows = pd.DataFrame({
        "model": before.model.astype(str).str.slice(-22), "src": before.source.str.slice(0, 16),
        "mode": before.policy_mode.str.slice(0, 6), "how": h.how, "conc": h.conc,
        "host_ms": pd.to_numeric(h.host_ms),
        "gen_meas": meas_gen,
        "gen_before": before.pred_gen_share * before.pred_step_s,
        "gen_after": after.pred_gen_share * after.pred_step_s,
        "err_before%": before.step_err * 100, "err_after%": after.step_err * 100,
        "share_meas": before.gen_share, "share_before": before.pred_gen_share,
        "share_after": after.pred_gen_share})
    with pd.option_context("display.width", 250, "display.max_rows", 100):
        print(rows.to_string(float_format=lambda x: f"{x:.2f}"))
    sb, sa = rl.summary(before), rl.summary(after)
    print(f"\nmedian |step error| {sb['median_abs_step_err']:.1%} -> "
          f"{sa['median_abs_step_err']:.1%}; generation share {sb['median_abs_gen_share_pts']:.2f} -> "
          f"{sa['median_abs_gen_share_pts']:.2f} points ({sa['gen_share_rows']} sync rows)")
    for s in sb["by_source"]:
        print(f"  {s[:48]:48s} {sb['by_source'][s]:6.1%} -> {sa['by_source'][s]:6.1%}")
    print("\nsensitivity to the cost per loop body (not fitted; the shipped one is PR 46112's):")
    for label, u in [("the measured loop alone (x 1/6)", unit / 6), ("shipped", unit),
                     ("issue 10634's 5.5 ms at 256 (x 3.2)", unit * 3.2)]:
        c = _run(u)
        s = rl.summary(c)
        print(f"  {label:38s} {u * 1e6:5.2f} us: median |step| {s['median_abs_step_err']:.1%}, "
              f"share {s['median_abs_gen_share_pts']:.2f} pts, Llama-3.2-1B gen / measured "
              f"{c.pred_gen_share[13] * c.pred_step_s[13] / meas_gen[13]:.2f}, NeMo RL 8B "
              f"{c.pred_gen_share[5] * c.pred_step_s[5] / meas_gen[5]:.2f}")


if __name__ == "__main__":
    main()
