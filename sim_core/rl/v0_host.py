"""vLLM V0's host work per running sequence per decode step, read off a published profile.

Why: vLLM's V0 engine (the default up to vLLM 0.7.x) does its scheduling, input preparation
and output processing in Python over sequence groups, serially with the GPU step, so the
step grows with the running batch on the host side; V1 (the default from 0.8.0) keeps a
persistent batch and pays ~1 us per sequence. Small models at high concurrency on V0 (the
DeepScaleR / rllm rows, AReaL v0.1) are bound by it. generation.py prices it from two
constants in catalogs/rl.yaml (`vllm.v0_host_per_seq_s`, `vllm.v0_async_output_share`); this
module derives them from the published figures in data/rl/vllm_v0_host.csv (WukLab's vLLM
0.5.4 profile: scheduling time against the number of requests, and its breakdown by task)
and prints the fit's residuals and the cross-checks against the other published figures.

    python -m sim_core.rl.v0_host
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

from .inputs import constants


def load() -> pd.DataFrame:
    path = resources.files("sim_core").joinpath("data/rl/vllm_v0_host.csv")
    return pd.read_csv(str(path))


def derive(t: pd.DataFrame | None = None) -> dict:
    """Least squares of the scheduling time per iteration on the number of requests (a fixed
    part + a part per sequence), less the detokenization share RL rollouts turn off (verl and
    AReaL pass `detokenize=False`); the output-processing share of what is left (what V0's
    asynchronous output processor overlaps with the next GPU step)."""
    t = load() if t is None else t
    req = t[(t.figure == "schedule_vs_requests") & (t["item"] == "schedule")]
    n = req.requests.to_numpy(float)
    ms = req.ms.to_numpy(float)
    a = np.c_[np.ones_like(n), n]
    (fixed, slope), *_ = np.linalg.lstsq(a, ms, rcond=None)
    br = t[t.figure == "breakdown_1024_1024"]
    total = br.ms.sum()
    share = br.groupby("group").ms.sum() / total
    kept = 1.0 - share.get("detokenize", 0.0)
    return {"fixed_s": fixed * 1e-3, "per_request_s": slope * 1e-3,
            "per_seq_s": slope * 1e-3 * kept,
            "async_output_share": share.get("output", 0.0) / kept,
            "residual_ms": a @ np.array([fixed, slope]) - ms,
            "requests": n, "shares": share.to_dict()}


def main() -> None:
    d = derive()
    k = constants()["vllm"]
    print(f"WukLab vLLM 0.5.4: scheduling per iteration = {d['fixed_s'] * 1e3:.2f} ms + "
          f"{d['per_request_s'] * 1e6:.1f} us x requests; residuals "
          + ", ".join(f"{r:+.2f} ms at {n:.0f}" for r, n in zip(d["residual_ms"], d["requests"])))
    print("  breakdown shares: " + ", ".join(f"{g} {s:.1%}" for g, s in d["shares"].items()))
    print(f"  without detokenization: {d['per_seq_s'] * 1e6:.1f} us per sequence-step "
          f"(catalogs/rl.yaml {k['v0_host_per_seq_s'] * 1e6:.1f}); output processing "
          f"{d['async_output_share']:.3f} of it (catalogs/rl.yaml {k['v0_async_output_share']})")
    # cross-check: vllm-project/vllm issue 6801 (mpjlu, 2024-08-08): sampling, input
    # preparation, output processing and scheduling "can be 20ms" at batch 200
    at200 = (d["fixed_s"] + 200 * d["per_request_s"]) * 1e3
    print(f"  issue 6801 (20 ms at batch 200, with GPU sampling): this rule {at200:.1f} ms "
          f"({at200 / 20 - 1:+.0%})")
    # cross-check: the vLLM V1 alpha post (https://blog.vllm.ai/2025/01/27/v1-alpha-release.html):
    # V1 "up to 1.7x higher throughput" than V0 without multi-step, Llama 3.1 8B on one H100,
    # ShareGPT (~200 prompt + ~180 output tokens), the same kernels
    from . import generation, inputs
    row = dict(model="llama3.1-8b", gpu="h100-sxm", num_gpus=1, rollout_tp=1,
               prompts_per_step=256, responses_per_prompt=1, prompt_len=200, response_mean=180,
               response_max=1024, gpu_memory_utilization=0.9)
    b = inputs.to_batch(pd.DataFrame([row, {**row, "rollout_vllm_v0": True}]))
    st = generation.step_time(b, np.full(2, 256.0), np.full(2, 290.0),
                              generation.decode_constants())
    print(f"  V1 alpha post (V1 up to 1.7x V0, 8B on H100): V0 / V1 step at 256 sequences "
          f"{st[1] / st[0]:.2f}x; with V0's fixed {d['fixed_s'] * 1e3:.1f} ms too "
          f"{(st[1] + d['fixed_s']) / st[0]:.2f}x (not priced)")


if __name__ == "__main__":
    main()
