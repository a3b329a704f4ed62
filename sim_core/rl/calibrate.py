"""Fit the decode model's two declared efficiencies on published inference benchmarks.

    python -m sim_core.rl.calibrate            # in-sample and leave-one-model-out errors
    python -m sim_core.rl.calibrate --write    # also store the fit in catalogs/rl.yaml

The two constants (catalogs/rl.yaml `decode`): the fraction of HBM bandwidth a decode step
reads at, and a per-step overhead. Everything else (bytes per step, GEMM efficiency, TP
all-reduces, KV cache, continuous batching, prefill) is the white-box model of generation.py.
A benchmark row is an offline max-throughput run: N requests of ISL prompt and OSL output
tokens on one engine of tp GPUs; its predicted output throughput is N x OSL over the
generation time of one replica, with the engine's own admission rule (TensorRT-LLM reserves
prompt + max output per request) and trtllm-bench's max batch size (`trtllm_max_batch`). TensorRT-LLM sizes its KV cache as a fraction (0.90, the
page's default) of the memory free after the weights, converted here into vLLM's
`gpu_memory_utilization` of the total.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

import numpy as np
import pandas as pd

from . import generation, inputs

# the grid the fit searches (both constants are physical: a fraction of bandwidth, seconds)
EFF_GRID = np.round(np.arange(0.40, 0.9501, 0.01), 4)  # ~0.9 is what HBM streams reach
OVH_GRID = np.round(np.arange(0.0, 0.0300001, 0.0005), 6)
KV_FREE_FRACTION = 0.90  # trtllm-bench's kv_cache_free_gpu_mem_fraction default (the page)


def trtllm_max_batch(kv_requests, pp=1):
    """trtllm-bench's max batch size: the requests of ISL + OSL tokens 95% of the memory left
    by the weights holds, capped at 4096, rounded up (NVIDIA/TensorRT-LLM 04cba88
    tensorrt_llm/bench/build/tuning.py calc_engine_setting / finetune_setting: up to 32 below
    256, 128 below 1024, 256 above; at least 64)."""
    raw = np.minimum(kv_requests, 4096) / pp
    return np.where(raw < 256, np.maximum(64, 32 * np.ceil(raw / 32)),
                    np.where(raw < 1024, 128 * np.ceil(raw / 128), 256 * np.ceil(raw / 256)))


def load(path=None) -> pd.DataFrame:
    path = path or resources.files("sim_core").joinpath("data/rl/decode_benchmarks.csv")
    return pd.read_csv(path)


def frame(bench: pd.DataFrame) -> pd.DataFrame:
    """Benchmark rows as RL configurations (one replica = the whole engine)."""
    from .. import catalog

    hbm = np.array([catalog.get_gpu(g).hbm_gib for g in bench.gpu])
    w = np.array([catalog.param_count(m) for m in bench.model]) * np.where(
        bench.precision == "fp8", 1, 2) / bench.tp / 2**30
    spec = [catalog.get_model(m) for m in bench.model]
    kv_tok = np.array([2 * m.layers * max(tp, m.kv_heads) * (m.head_dim or m.hidden // m.heads)
                       for m, tp in zip(spec, bench.tp)]) * bench.kv_cache_bytes / 2**30
    kv_req = 0.95 * (hbm - w) * bench.tp / (kv_tok * (bench.isl + bench.osl))
    df = pd.DataFrame({
        "model": bench.model, "gpu": bench.gpu, "num_gpus": bench.tp, "rollout_tp": bench.tp,
        "prompts_per_step": bench.num_requests, "responses_per_prompt": 1,
        "prompt_len": bench.isl, "response_mean": bench.osl, "response_max": bench.osl,
        "rollout_precision": bench.precision, "kv_cache_bytes": bench.kv_cache_bytes,
        "rollout_engine": "tensorrt-llm", "max_num_seqs": trtllm_max_batch(kv_req),
        # fixed output lengths (OSL): no truncated-response point mass beyond the cap itself
        "response_clip_ratio": 0.0,
        # trtllm-bench asks for no log-probabilities (the sampler's plain cost)
        "rollout_logprobs": False,
    })
    df["gpu_memory_utilization"] = (w + KV_FREE_FRACTION * (hbm - w)) / hbm
    return df


def predict(bench: pd.DataFrame, eff: float, ovh: float) -> np.ndarray:
    b = inputs.to_batch(frame(bench))
    g = generation.generate(b, {"hbm_efficiency": eff, "step_overhead_s": ovh})
    return bench.num_requests.to_numpy() * bench.osl.to_numpy() / g["gen_time_s"]


def _errors_grid(bench: pd.DataFrame) -> np.ndarray:
    """log(predicted / measured) for every (eff, ovh) on the grid: shape (E, O, rows)."""
    meas = bench.output_tokens_per_s.to_numpy()
    out = np.empty((len(EFF_GRID), len(OVH_GRID), len(bench)))
    big = pd.concat([bench] * len(OVH_GRID), ignore_index=True)
    ovh = np.repeat(OVH_GRID, len(bench))
    b = inputs.to_batch(frame(big))
    for i, e in enumerate(EFF_GRID):
        # the overhead enters step_time as a scalar: one pass per overhead is vectorised by
        # evaluating each grid point's rows with its own constant
        t = _gen_time_rows(b, e, ovh)
        pred = big.num_requests.to_numpy() * big.osl.to_numpy() / t
        out[i] = np.log(pred / np.tile(meas, len(OVH_GRID))).reshape(len(OVH_GRID), len(bench))
    return out


def _gen_time_rows(b, eff, ovh_rows) -> np.ndarray:
    """generation time with a per-row overhead (the overhead is additive per decode step)."""
    g0 = generation.generate(b, {"hbm_efficiency": eff, "step_overhead_s": 0.0})
    g1 = generation.generate(b, {"hbm_efficiency": eff, "step_overhead_s": 1.0})
    steps = g1["gen_time_s"] - g0["gen_time_s"]  # decode steps taken (time is linear in it)
    return g0["gen_time_s"] + ovh_rows * steps


def fit(bench: pd.DataFrame, grid=None) -> tuple[float, float]:
    """The (eff, ovh) minimising the mean squared log error."""
    err = _errors_grid(bench) if grid is None else grid
    loss = (err ** 2).mean(axis=2)
    i, j = np.unravel_index(np.argmin(loss), loss.shape)
    return float(EFF_GRID[i]), float(OVH_GRID[j])


def report(bench: pd.DataFrame) -> dict:
    grid = _errors_grid(bench)
    eff, ovh = fit(bench, grid)
    i, j = int(np.where(EFF_GRID == eff)[0][0]), int(np.where(OVH_GRID == ovh)[0][0])
    ins = np.abs(np.expm1(grid[i, j]))
    held = np.empty(len(bench))
    groups = bench.model.to_numpy()
    for g in np.unique(groups):
        m = groups == g
        e2, o2 = fit(bench[~m], grid[:, :, ~m])
        a, c = int(np.where(EFF_GRID == e2)[0][0]), int(np.where(OVH_GRID == o2)[0][0])
        held[m] = np.abs(np.expm1(grid[a, c, m]))
    return {"hbm_efficiency": eff, "step_overhead_s": ovh, "rows": len(bench),
            "in_sample_median": float(np.median(ins)), "loso_median": float(np.median(held)),
            "in_sample": ins, "held_out": held}


# ShareGPT context held by a running request (prompt + half its answer), a declared order of
# magnitude: at these concurrencies (5-30 requests) the cache read is a few % of a step
TPOT_CONTEXT = 500


def tpot_frame(t: pd.DataFrame, prompt_len) -> pd.DataFrame:
    """Published latency rows (model, gpu, tp, precision, engine; `vllm_v0` where a table
    has it) as one-request RL frames whose step `generation.step_time` prices: the decode
    checks here, the MoE ones and the per-stack fits (calibrate_stacks.py) share it.
    prompt_len: the prompt tokens, one number or one per row."""
    df = pd.DataFrame({"model": t.model, "gpu": t.gpu, "num_gpus": t.tp, "rollout_tp": t.tp,
                       "prompts_per_step": 1, "prompt_len": prompt_len,
                       "response_mean": 1, "response_max": 1,
                       "rollout_precision": t.precision, "rollout_engine": t.engine,
                       "rollout_logprobs": False})  # serving benchmarks: no logprobs
    if "vllm_v0" in t.columns:
        df["rollout_vllm_v0"] = t.vllm_v0.astype(bool)
    return df


def load_tpot(path=None) -> pd.DataFrame:
    return pd.read_csv(path or resources.files("sim_core").joinpath("data/rl/decode_tpot.csv"))


def leave_one_source_out() -> dict:
    """The two sources, each predicted with the constants fitted on the other alone: the
    TensorRT-LLM throughput rows from a fit on the SGLang/vLLM TPOT rows, and back."""
    bench, t = load(), load_tpot()
    b = inputs.to_batch(tpot_frame(t, TPOT_CONTEXT))
    conc = (t.rps * t.median_e2e_ms / 1000.0).to_numpy(float)
    ctx = np.full(len(t), float(TPOT_CONTEXT))
    loss = np.empty((len(EFF_GRID), len(OVH_GRID)))
    for i, e in enumerate(EFF_GRID):
        base = generation.step_time(b, conc, ctx, {"hbm_efficiency": e, "step_overhead_s": 0.0})
        pred = (base[None, :] + OVH_GRID[:, None]) * 1e3
        loss[i] = (np.log(pred / t.median_tpot_ms.to_numpy()[None, :]) ** 2).mean(axis=1)
    i, j = np.unravel_index(np.argmin(loss), loss.shape)
    e_t, o_t = float(EFF_GRID[i]), float(OVH_GRID[j])
    trt_err = np.abs(predict(bench, e_t, o_t) / bench.output_tokens_per_s.to_numpy() - 1)
    e_b, o_b = fit(bench)
    tp_err = np.abs(generation.step_time(b, conc, ctx, {"hbm_efficiency": e_b,
                                                          "step_overhead_s": o_b}) * 1e3
                    / t.median_tpot_ms.to_numpy() - 1)
    return {"tpot_fit": (e_t, o_t), "trt_from_tpot": float(np.median(trt_err)),
            "trt_fit": (e_b, o_b), "tpot_from_trt": float(np.median(tp_err))}


def tpot_check(path=None) -> pd.DataFrame:
    """Out-of-sample check of one decode step: online serving benchmarks of other engines
    (SGLang, vLLM; bf16; A100 and H100) give the median time per output token at a request
    rate; the running batch is the rate x the median end-to-end latency (Little's law). Not
    fitted: the constants are the TensorRT-LLM fit's. TPOT includes the prefill steps that
    interleave with decode, so the model (decode only) is expected a little below it."""
    t = load_tpot(path)
    conc = t.rps * t.median_e2e_ms / 1000.0
    b = inputs.to_batch(tpot_frame(t, TPOT_CONTEXT))
    pred = generation.step_time(b, conc.to_numpy(float), np.full(len(t), float(TPOT_CONTEXT)),
                                generation.decode_constants()) * 1e3
    return t.assign(batch=conc.round(1), pred_tpot_ms=pred.round(2),
                    err=pred / t.median_tpot_ms - 1)


def load_moe_tpot(path=None) -> pd.DataFrame:
    return pd.read_csv(path or resources.files("sim_core").joinpath(
        "data/rl/decode_moe_tpot.csv"))


def _moe_step_ms(t: pd.DataFrame, xnode_s=None) -> np.ndarray:
    """Predicted decode step (ms) of each MoE TPOT row at its concurrency; each request's
    cache holds its prompt + half its output."""
    b = inputs.to_batch(tpot_frame(t, t.isl))
    k = generation.decode_constants()
    if xnode_s is not None:
        k["internode_collective_s"] = xnode_s
    ctx = (t.isl + t.osl / 2).to_numpy(float)
    return generation.step_time(b, t.concurrency.to_numpy(float), ctx, k) * 1e3


XNODE_GRID = np.round(np.arange(0.0, 0.0005000001, 0.000005), 7)  # s per cross-node collective


def fit_internode(t: pd.DataFrame) -> float:
    """The latency per cross-node decode collective minimising the mean squared log error of
    the multi-node rows of `t` (the dense constants held at their fit). The step time is
    linear in it: slope = the step's cross-node collectives, read off two evaluations."""
    m = _multi_node(t)
    base = _moe_step_ms(t[m], 0.0)
    slope = _moe_step_ms(t[m], 1e-3) - base  # ms per ms of added latency
    pred = base[None, :] + XNODE_GRID[:, None] * 1e3 * slope[None, :]
    loss = (np.log(pred / t[m].tpot_ms.to_numpy()[None, :]) ** 2).mean(axis=1)
    return float(XNODE_GRID[int(np.argmin(loss))])


def _multi_node(t: pd.DataFrame) -> np.ndarray:
    return (t.nodes > 1).to_numpy()


def moe_tpot_check(path=None) -> pd.DataFrame:
    """Check of the MoE decode step on published TPOT at a fixed concurrency
    (decode_moe_tpot.csv): DeepSeek-R1 (MLA, 256 routed experts, TP16 across two nodes) and
    DeepSeek-R1 TP8 on one H200 node, Qwen3-30B-A3B (GQA, 128 experts) on one A100. The dense
    constants are the TensorRT-LLM fit's (out of sample for every row);
    `internode_collective_s` is fitted on the multi-node rows, so those are in-sample for it
    (leave_one_engine_out gives their held-out figure) and the single-node rows, which it
    does not touch, are out of sample."""
    t = load_moe_tpot(path)
    pred = _moe_step_ms(t)
    return t.assign(pred_tpot_ms=pred.round(2), err=pred / t.tpot_ms - 1)


def leave_one_engine_out(path=None) -> pd.DataFrame:
    """The multi-node rows of each engine predicted with `internode_collective_s` fitted on
    the other engines' multi-node rows alone (one source holds them all, so the engine is the
    held-out axis)."""
    t = load_moe_tpot(path)
    m = _multi_node(t)
    out = []
    for eng in np.unique(t.engine[m]):
        held = m & (t.engine == eng).to_numpy()
        c = fit_internode(t[m & ~held])
        pred = _moe_step_ms(t[held], c)
        out.append(t[held].assign(xnode_s=c, pred_tpot_ms=pred.round(2),
                                  err=pred / t[held].tpot_ms - 1))
    return pd.concat(out)


def write_constants(eff: float, ovh: float, xnode: float | None = None) -> None:
    vals = {"hbm_efficiency": f"{eff:.4f}", "step_overhead_s": f"{ovh:.6f}"}
    if xnode is not None:
        vals["internode_collective_s"] = f"{xnode:.6f}"
    inputs.store_constants(vals)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="store the fit in catalogs/rl.yaml")
    a = p.parse_args(argv)
    bench = load()
    res = report(bench)
    print(f"decode fit on {res['rows']} published rows: hbm_efficiency {res['hbm_efficiency']:.2f}, "
          f"step_overhead {res['step_overhead_s'] * 1e3:.1f} ms")
    print(f"median |throughput error|: in-sample {res['in_sample_median']:.1%}, "
          f"leave-one-model-out {res['loso_median']:.1%}")
    for (m, gpu), part in bench.assign(ins=res["in_sample"], held=res["held_out"]).groupby(
            ["model", "gpu"]):
        print(f"  {m:14s} {gpu:9s} in-sample {np.median(part.ins):6.1%}  "
              f"held out {np.median(part.held):6.1%}")
    chk = tpot_check()
    print(f"out of sample, decode step vs median TPOT of online SGLang/vLLM runs "
          f"({len(chk)} rows, bf16, A100/H100): median |error| {np.median(np.abs(chk.err)):.1%}")
    for _, r in chk.iterrows():
        print(f"  {r.model:13s} {r.gpu:9s} tp{r.tp} {r.engine:6s} batch {r.batch:5.1f}: "
              f"{r.median_tpot_ms:6.2f} ms measured, {r.pred_tpot_ms:6.2f} predicted ({r.err:+.0%})")
    moe = moe_tpot_check()
    x_fit = fit_internode(load_moe_tpot())
    x_now = generation.decode_constants().get("internode_collective_s", 0.0)
    print(f"MoE decode step vs published TPOT ({len(moe)} rows): latency per cross-node "
          f"collective fitted on the multi-node rows {x_fit * 1e6:.0f} us (catalogs/rl.yaml: "
          f"{x_now * 1e6:.0f} us)")
    for _, r in moe.iterrows():
        print(f"  {r.model:13s} {r.gpu:9s} tp{r.tp} ({r.nodes} nodes) {r.engine:6s} batch "
              f"{r.concurrency:3d} isl {r.isl:5d}: {r.tpot_ms:6.2f} ms measured, "
              f"{r.pred_tpot_ms:6.2f} predicted ({r.err:+.0%})")
    for src, part in moe.groupby(moe.url):
        print(f"  median |error| {np.median(np.abs(part.err)):.1%} on {len(part)} rows of {src}")
    lo_e = leave_one_engine_out()
    print(f"  leave one engine out (multi-node rows, fitted on the other engine's): "
          f"median |error| {np.median(np.abs(lo_e.err)):.1%}")
    for _, r in lo_e.iterrows():
        print(f"    {r.engine:6s} batch {r.concurrency:3d}: fit {r.xnode_s * 1e6:.0f} us -> "
              f"{r.pred_tpot_ms:6.2f} predicted vs {r.tpot_ms:6.2f} ({r.err:+.0%})")
    held = np.concatenate([lo_e.err.to_numpy(), moe.err[~_multi_node(moe)].to_numpy()])
    print(f"  MoE out of sample (multi-node rows held out by engine + single-node rows): median |error| "
          f"{np.median(np.abs(held)):.1%} over {len(held)} rows")
    lo = leave_one_source_out()
    print(f"leave one source out: TensorRT-LLM throughput from a fit on the SGLang/vLLM rows "
          f"(eff {lo['tpot_fit'][0]:.2f}, {lo['tpot_fit'][1] * 1e3:.1f} ms): median |error| "
          f"{lo['trt_from_tpot']:.1%}; SGLang/vLLM TPOT from the TensorRT-LLM fit: "
          f"{lo['tpot_from_trt']:.1%}")
    if a.write:
        write_constants(res["hbm_efficiency"], res["step_overhead_s"], x_fit)
        print("wrote catalogs/rl.yaml decode constants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
