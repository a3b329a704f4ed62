"""Issue 40: the hypotheses about small models' decode, tested (docs/rl.md, "Small models, long
responses"). A diagnostic, not part of the model: it perturbs `generation.step_time` and
reports what each perturbation does to `sweep validate --rl` and to the decode fit.

    PYTHONPATH=$PWD python benchmarks/rl_decode_hypotheses.py

1. play-verl's per-step console lines (sim_core/data/rl/play_verl_gen_steps.csv): generation
   time against the step's longest response (the tail's step time is the slope) and its mean.
2. A uniform host cost per running sequence per decode step (vLLM and SGLang rows).
3. The decode attention's cache read at a fraction of the fitted bandwidth efficiency.
4. The per-sequence cost as a third constant fitted on the TensorRT-LLM rows of calibrate.py.
Nothing here is fitted on the RL rows or shipped in the model.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

from sim_core.accuracy import rl
from sim_core.rl import calibrate, generation, inputs

ORIGINAL = generation.step_time


def _patched(seq_s: float = 0.0, kv_scale: float = 1.0, every_engine: bool = False):
    """step_time plus `seq_s` per running sequence (vLLM and SGLang rows, or every engine)
    and the cache read at `kv_scale` x the fitted bandwidth efficiency."""
    def step_time(b, batch, ctx, k):
        t = ORIGINAL(b, batch, ctx, k)
        two = np.ndim(batch) == 2
        c = (lambda x: np.asarray(x, float)[:, None]) if two else (lambda x: np.asarray(x, float))
        bat = np.asarray(batch, float)
        host = np.where((c(b.rollout_engine) < 2) | every_engine, seq_s, 0.0) * bat
        kv = bat * ctx * c(b.layers) * c(b.kv_elems) * c(b.kv_cache_bytes) / (
            c(b.rollout_pp) * c(generation.kv_split(b)))
        bw = c(b.hbm_bw_gbs) * 1e9 * k["hbm_efficiency"]
        return t + host + kv / bw * (1.0 / kv_scale - 1.0)
    return step_time


def _validate(**kw) -> tuple[float, float, float]:
    generation.step_time = _patched(**kw)
    try:
        cmp = rl.compare(rl.load())
    finally:
        generation.step_time = ORIGINAL
    s = rl.summary(cmp)
    return s["median_abs_step_err"], s["median_abs_gen_share_pts"], float(cmp.step_err.iloc[1])


def play_verl_logs() -> None:
    path = resources.files("sim_core").joinpath("data/rl/play_verl_gen_steps.csv")
    t = pd.read_csv(path)
    t = t[t.step >= 2]
    print("1. play-verl generation per step: gen = a + b x longest response (+ c x mean)")
    for log, g in t.groupby("log", sort=False):
        a = np.c_[np.ones(len(g)), g.response_max]
        (i0, s0), *_ = np.linalg.lstsq(a, g.gen_s, rcond=None)
        fixed_max = g.response_max.nunique() == 1
        a2 = np.c_[np.ones(len(g)), g.response_mean] if fixed_max else np.c_[a, g.response_mean]
        c2, *_ = np.linalg.lstsq(a2, g.gen_s, rcond=None)
        line = (f"   {log:28s} {len(g):4d} steps, longest {g.response_max.min():.0f}-"
                f"{g.response_max.max():.0f}, mean gen {g.gen_s.mean():6.2f} s")
        if not fixed_max:
            line += f"; a {i0:5.2f} s, b {s0 * 1e3:5.1f} ms"
        print(line + f"; c {c2[-1] * 1e3:5.1f} ms per token of mean")


def host_and_attention() -> None:
    base = _validate()
    print(f"2-3. validate --rl: median |step error| {base[0]:.1%}, generation share "
          f"{base[1]:.1f} pts, one-step-off Qwen2.5-Math-7B row {base[2]:+.0%}")
    for us in (25, 50, 100):
        m, s, r1 = _validate(seq_s=us * 1e-6)
        print(f"   host {us:3d} us per sequence-step: {m:.1%}, {s:.1f} pts, row 1 {r1:+.0%}")
    for f in (0.7, 0.5):
        m, s, r1 = _validate(kv_scale=f)
        print(f"   cache read at {f:.1f} x efficiency: {m:.1%}, {s:.1f} pts, row 1 {r1:+.0%}")


def third_constant() -> None:
    bench = calibrate.load()
    b = inputs.to_batch(calibrate.frame(bench))
    meas = bench.output_tokens_per_s.to_numpy()
    n_tok = (bench.num_requests * bench.osl).to_numpy(float)
    E, O = calibrate.EFF_GRID, calibrate.OVH_GRID
    S = np.arange(0.0, 60.0001, 2.0) * 1e-6
    grid = np.empty((len(E), len(O), len(S), len(bench)))
    for i, e in enumerate(E):
        def gen(o, s):
            generation.step_time = _patched(seq_s=s, every_engine=True)
            try:
                return generation.generate(b, {"hbm_efficiency": e, "step_overhead_s": o})[
                    "gen_time_s"]
            finally:
                generation.step_time = ORIGINAL
        g0 = gen(0.0, 0.0)
        go, gs = gen(1.0, 0.0) - g0, gen(0.0, 1e-3) - g0  # both linear in the constant
        t = (g0[None, None] + O[:, None, None] * go[None, None]
             + (S[None, :, None] / 1e-3) * gs[None, None])
        grid[i] = np.log(n_tok / t / meas)
    loss = (grid ** 2).mean(axis=3)
    i, j, s = np.unravel_index(np.argmin(loss), loss.shape)
    held = np.empty(len(bench))
    for m in bench.model.unique():
        msk = (bench.model == m).to_numpy()
        lm = (grid[..., ~msk] ** 2).mean(axis=3)
        a, c, d = np.unravel_index(np.argmin(lm), lm.shape)
        held[msk] = np.abs(np.expm1(grid[a, c, d, msk]))
    print(f"4. third constant on the {len(bench)} TensorRT-LLM rows: eff {E[i]:.2f}, "
          f"{O[j] * 1e3:.1f} ms per step, {S[s] * 1e6:.0f} us per sequence; in-sample "
          f"{np.median(np.abs(np.expm1(grid[i, j, s]))):.1%}, leave one model out "
          f"{np.median(held):.1%}")


if __name__ == "__main__":
    play_verl_logs()
    host_and_attention()
    third_constant()
