"""Issue 40: the H20's compute priced against published H20 measurements (docs/rl.md, "The H20's
compute against published measurements"). A check, not a fit: nothing here is stored.

    PYTHONPATH=$PWD python benchmarks/h20_published_check.py

1. Qwen's SGLang speed table on one H20 (sim_core/data/rl/h20_sglang_speed.csv): batch 1, 2048
   generated tokens after inputs of 1 to 129k tokens. The batch-1 decode is not decode physics
   (docs/rl.md "Small models, long responses"), so each row is compared as its time beyond the
   same model's 1-token row: the prefill of the input (GEMMs and causal attention, compute-bound)
   plus the longer cache the 2048 decode steps read. pred / meas of that difference, per row and
   as a median, with the TFLOP/s the measured difference implies for the prefill's FLOPs.
2. FlashMLA's decode kernel on one H20 (sim_core/data/kernels/published/mla_decode_levels.csv):
   the kernel time the decode model charges for the MLA cache read against the published time.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

from sim_core import catalog
from sim_core.calibration import mla_decode_levels
from sim_core.rl import generation, inputs, mla_decode


def sglang_rows() -> pd.DataFrame:
    path = resources.files("sim_core").joinpath("data/rl/h20_sglang_speed.csv")
    return pd.read_csv(path, comment="#")


def frame(t: pd.DataFrame) -> pd.DataFrame:
    """Each published run as one sequence on one SGLang engine of tp GPUs."""
    return pd.DataFrame({
        "model": t.model, "gpu": t.gpu, "num_gpus": t.tp, "rollout_tp": t.tp,
        "rollout_engine": "sglang", "prompts_per_step": 1, "responses_per_prompt": 1,
        "prompt_len": t.input_len.astype(float), "response_mean": t.output_len.astype(float),
        "response_max": t.output_len.astype(float), "response_clip_ratio": 0.0,
        # the page's mem_fraction_static; SGLang's chunked_prefill_size on an H20 (server_args.py:
        # 8192 below 160 GB); no log-probabilities requested
        "gpu_memory_utilization": 0.85, "max_num_batched_tokens": 8192,
        "rollout_logprobs": False, "rollout_precision": t.precision,
    })


def prefill_flops(t: pd.DataFrame) -> np.ndarray:
    """Prefill FLOPs of each row's input: 2 x active params per token + causal attention
    (generation.prefill_time's count)."""
    b = inputs.to_batch(frame(t))
    L = t.input_len.to_numpy(dtype=float)
    return L * (2 * b.active_params + 2 * L * b.attn_dim * b.layers)


def sglang_check() -> pd.DataFrame:
    t = sglang_rows()
    b = inputs.to_batch(frame(t))
    g = generation.generate(b)
    t = t.assign(meas_s=(t.input_len + t.output_len) / t.speed_tok_s,
                 pred_s=g["gen_time_s"], pred_prefill_s=g["prefill_time_s"],
                 flops=prefill_flops(t))
    base = t[t.input_len == 1].set_index("model")
    rows = t[(t.input_len > 1) & t.model.isin(base.index)]
    rows = rows[rows.tp.to_numpy() == base.loc[rows.model, "tp"].to_numpy()].copy()
    rows["meas_delta_s"] = rows.meas_s.to_numpy() - base.loc[rows.model, "meas_s"].to_numpy()
    rows["pred_delta_s"] = rows.pred_s.to_numpy() - base.loc[rows.model, "pred_s"].to_numpy()
    rows["ratio"] = rows.pred_delta_s / rows.meas_delta_s
    peak = np.array([catalog.get_gpu(x).peak_tflops["bf16"] for x in rows.gpu]) * 1e12
    # the prefill's FLOPs over the measured difference less the model's own decode-side share
    # of it (the longer cache): the level the published run implies, as a fraction of peak
    extra_decode = rows.pred_delta_s - rows.pred_prefill_s
    rows["implied_frac"] = rows.flops / (rows.meas_delta_s - extra_decode) / (peak * rows.tp)
    rows["pred_frac"] = rows.flops / rows.pred_prefill_s / (peak * rows.tp)
    return rows


def one_scale_fits(rows: pd.DataFrame) -> list[tuple]:
    """Which single factor explains the rows' gap: (A) the prefill's compute slower by a, or (B)
    the decode's longer-cache read slower by b, or both; each fitted on all rows (least squares
    in log) and on all models but one (leave one model out). A diagnostic: nothing is stored."""
    P = rows.pred_prefill_s.to_numpy()
    D = (rows.pred_delta_s - rows.pred_prefill_s).to_numpy()
    Y = rows.meas_delta_s.to_numpy()
    mod = rows.model.to_numpy()
    grid = np.round(np.linspace(0.5, 5.0, 451), 2)

    def fit(m, which):
        A = grid if "A" in which else np.array([1.0])
        B = grid if "B" in which else np.array([1.0])
        e = np.log((A[:, None, None] * P[m] + B[None, :, None] * D[m]) / Y[m])
        i, j = np.unravel_index(np.argmin((e ** 2).mean(axis=2)), e.shape[:2])
        return A[i], B[j]

    out = []
    for which in ("A", "B", "AB"):
        a, b = fit(np.ones(len(Y), bool), which)
        ins = np.median(np.abs((a * P + b * D) / Y - 1))
        held = []
        for g in np.unique(mod):
            keep = mod != g
            aa, bb = fit(keep, which)
            held += list(np.abs((aa * P[~keep] + bb * D[~keep]) / Y[~keep] - 1))
        out.append((which, a, b, ins, float(np.median(held))))
    return out


def main() -> None:
    rows = sglang_check()
    pd.set_option("display.width", 200)
    print("1. Qwen3 on H20, SGLang 0.4.6.post1, batch 1: time beyond the 1-token row "
          "(prefill + longer cache)")
    print(rows[["model", "tp", "input_len", "meas_delta_s", "pred_delta_s", "ratio",
                "pred_frac", "implied_frac"]].round(3).to_string(index=False))
    r = rows.ratio.to_numpy()
    print(f"   pred / meas median {np.median(r):.3f} (|error| median "
          f"{np.median(np.abs(r - 1)):.1%}) over {len(r)} rows; at >= 30720 tokens "
          f"{np.median(r[rows.input_len >= 30720]):.3f}; prefill level implied by the runs: "
          f"median {np.median(rows.implied_frac):.3f} of peak, priced "
          f"{np.median(rows.pred_frac):.3f}")
    print(f"   none: |error| median {np.median(np.abs(r - 1)):.1%}")
    for which, a, b, ins, held in one_scale_fits(rows):
        print(f"   fit {which:2s}: prefill x{a:.2f}, longer-cache read x{b:.2f}: |error| median "
              f"{ins:.1%} in-sample, {held:.1%} leaving each model out")
    print("2. FlashMLA's decode kernel (data/kernels/published/mla_decode_levels.csv): "
          "priced = max(cache read, padded tiles at the GPU's level)")
    k = mla_decode_levels.check(generation.decode_constants()["hbm_efficiency"])
    print(k.round(3).to_string(index=False))
    h20 = k[k.gpu == "h20"]
    lv = mla_decode.levels()
    # the compute time scales as 1 / level: the same rows at the stored level, and at the H800's
    at_own = h20.compute_ms * h20.level_left_out / lv["h20"] / h20.meas_ms
    at_h800 = h20.compute_ms * h20.level_left_out / lv["h800"] / h20.meas_ms
    print(f"   H20 level {lv['h20']:.3f} of peak: priced / published median {np.median(at_own):.3f} "
          f"(|error| {np.median(np.abs(at_own - 1)):.1%}) in-sample, {np.median(h20.ratio):.3f} "
          f"(|error| {np.median(np.abs(h20.ratio - 1)):.1%}) leaving each row out, "
          f"{np.median(at_h800):.3f} leaving its source out (the H800's level {lv['h800']:.3f}); "
          f"the cache read alone (the model before): {np.median(h20.ratio_read_only):.3f}")


if __name__ == "__main__":
    main()
