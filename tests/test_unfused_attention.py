"""The unfused attention kernel (`attention_kernel: unfused`, Megatron-Core's
`--attention-backend unfused`): the full s x s scores are written, softmaxed, dropped out and
multiplied by V (core_v0.15.3 megatron/core/transformer/dot_product_attention.py). Priced from
its passes, with the s x s tensors its backward keeps; refused with context parallelism and
by frameworks without that path; exported with the dropout it was priced with."""

import numpy as np
import pytest

from sim_core import compute, workload
from sim_core.simulate import frame_to_batch
from sweep.advice import export
from sweep.config import parse_run
from sweep.engine.evaluate import evaluate
from sweep.engine.space import Space
from tests.test_config import error_of

GIB = 2**30


def _evaluate(framework="megatron-core", seq_len=8192, **parallel):
    d = {"model": "llama3-8b", "seq_len": seq_len, "global_batch": 64, "framework": framework,
         "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
         "parallel": {"tp": 1, "micro_batch": 1, "recompute": "none", **parallel}}
    return evaluate(Space.from_config(parse_run(d)).frame(0, 1)).iloc[0]


def test_dropout_adds_exactly_its_passes_over_the_scores():
    """Forward and backward each gain 2.5 passes of 2 bytes per score element (read, write,
    1-byte mask / read gradient and mask, write) when dropout is on; nothing else moves."""
    frames = []
    for p in (0.0, 0.1):
        d = {"model": "llama3-8b", "seq_len": 4096, "global_batch": 64,
             "framework": "megatron-core", "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
             "parallel": {"attention_kernel": "unfused", "attention_dropout": p}}
        frames.append(Space.from_config(parse_run(d)).frame(0, 1))
    times = []
    for f in frames:
        b = frame_to_batch(f)
        wl = workload.build(b)
        hbm = b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
        peak = b.peak_bf16 * 1e12 * compute.power_clock_scale(b)
        times.append(compute.unfused_attention_times(b, wl.dims, peak, hbm) + (b, hbm))
    (f0, b0, b_, hbm), (f1, b1, _, _) = times[0], times[1]
    n_scores = 1 * 32 * 4096.0 ** 2  # micro-batch x heads x s x s
    assert (f1 - f0)[0] == pytest.approx(2.5 * 2 * n_scores / hbm[0], rel=1e-9)
    assert (b1 - b0)[0] == pytest.approx(2.5 * 2 * n_scores / hbm[0], rel=1e-9)
    # the flash kernels apply dropout inside the kernel: no change there
    assert (_evaluate(attention_kernel="fa3", attention_dropout=0.1)["step_time_s"]
            == _evaluate(attention_kernel="fa3")["step_time_s"])


def test_unfused_is_slower_than_flash_and_its_extra_grows_with_the_sequence():
    extra = {}
    for s in (2048, 8192):
        fa3 = _evaluate(attention_kernel="fa3", seq_len=s)["step_time_s"]
        unf = _evaluate(attention_kernel="unfused", seq_len=s)["step_time_s"]
        assert unf > fa3
        extra[s] = (unf - fa3) / fa3
    # per token, attention grows with s and its unfused passes with s too
    assert extra[8192] > 2 * extra[2048]


def test_memory_keeps_the_scores_two_bytes_each_five_with_dropout():
    """Without recompute every layer keeps micro-batch x heads x s x s probabilities (2 B);
    with dropout also the 1-byte mask and the dropped probabilities (5 B: Korthikanti et al.'s
    5as/h term). Selective and full recompute keep none of them."""
    base = _evaluate(attention_kernel="fa3")["peak_memory_gib"]
    plain = _evaluate(attention_kernel="unfused")["peak_memory_gib"] - base
    drop = _evaluate(attention_kernel="unfused", attention_dropout=0.1)["peak_memory_gib"] - base
    per_layer = 32 * 8192.0 ** 2 / GIB  # score elements per layer, in Gi
    assert plain > 32 * 2 * per_layer  # 32 layers x 2 B, plus the live layer and buffers
    assert plain < 1.25 * (32 + 3) * 2 * per_layer
    assert (drop - plain) == pytest.approx((5 - 2) * per_layer * (32 + 2), rel=0.15)
    full = (_evaluate(attention_kernel="unfused", recompute="full")["peak_memory_gib"]
            - _evaluate(attention_kernel="fa3", recompute="full")["peak_memory_gib"])
    assert full < 0.1 * plain  # only the live layer's scores remain


def test_unfused_is_refused_with_context_parallelism_and_by_torchtitan():
    bad = _evaluate(attention_kernel="unfused", cp=2)
    assert bad["status"] == "invalid"
    assert bad["invalid_reason"].startswith("attention_kernel unfused needs cp = 1")
    assert _evaluate(attention_kernel="unfused", cp=1)["status"] != "invalid"
    bad = _evaluate(framework="torchtitan", attention_kernel="unfused", zero=3)
    assert bad["status"] == "invalid" and "unfused" in bad["invalid_reason"]


def test_attention_dropout_outside_zero_one_is_a_one_line_error():
    run = {"model": "llama3-8b", "seq_len": 4096, "global_batch": 64,
           "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}
    for bad in (1.0, -0.1):
        msg = error_of(parse_run, {**run, "parallel": {"attention_dropout": bad}})
        assert msg.startswith("parallel.attention_dropout: expected a probability in [0, 1)")
        assert "\n" not in msg


def test_megatron_export_writes_the_unfused_backend_and_its_dropout():
    args = export.megatron_args(_evaluate(attention_kernel="unfused", attention_dropout=0.1))
    ns = export.megatron_parser().parse_args(args)
    assert ns.attention_backend == "unfused" and float(ns.attention_dropout) == 0.1
    args = export.megatron_args(_evaluate(attention_kernel="unfused"))
    assert float(export.megatron_parser().parse_args(args).attention_dropout) == 0.0
    args = export.megatron_args(_evaluate(attention_kernel="fa3"))
    assert "--attention-dropout" not in args
    assert args[args.index("--attention-backend") + 1] == "fused"
    assert np.isfinite(_evaluate(attention_kernel="unfused")["step_time_s"])


def test_unfused_pricing_matches_the_fa2_papers_standard_attention_on_a100():
    """The FlashAttention-2 paper's "PyTorch" series (data/kernels/published: baddbmm,
    a causal mask added as its own pass, softmax, bmm; fwd+bwd, no dropout) on an A100 80GB,
    against compute.unfused_attention_times plus that mask pass: median |error| under 10%,
    and no row beyond 25% (the shortest, 512 tokens, is launch-bound)."""
    import pandas as pd

    from sim_core import catalog
    from sim_core.columns import Batch

    d = pd.read_csv("sim_core/data/kernels/published/attention-papers.csv", comment="#")
    g = d[(d.kernel == "torch") & (d.gpu == "a100-80gb") & d.time_us.notna()]
    assert len(g) >= 16
    G = catalog.get_gpu("a100-80gb")
    n, pk = len(g), G.peak_tflops["bf16"]
    b = Batch(sm_arch=np.full(n, 80.0), micro_batch=g.batch.to_numpy(float),
              heads=g.heads.to_numpy(float), tp=np.ones(n), seq_len=g.seq.to_numpy(float),
              cp=np.ones(n), sm_count=np.full(n, float(G.sm_count)),
              attention_dropout=np.zeros(n), precision=np.zeros(n), has_fp8=np.zeros(n),
              peak_bf16=np.full(n, pk), peak_fp8=np.zeros(n), gemm_max_bf16=np.zeros(n),
              gemm_max_fp8=np.zeros(n))
    hd = g.head_dim.to_numpy(float)
    hbm = G.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
    fwd, bwd = compute.unfused_attention_times(b, {"a": b.heads, "dqk": hd, "dv": hd},
                                               pk * 1e12, hbm)
    mask = np.where(g.causal.to_numpy() == 1, 2 * 2 * b.micro_batch * b.heads * b.seq_len ** 2
                    / hbm, 0.0)
    err = (fwd + mask + bwd) * 1e6 / g.time_us.to_numpy() - 1
    assert np.median(np.abs(err)) < 0.10
    assert np.abs(err).max() < 0.25
