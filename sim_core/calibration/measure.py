"""Measure the GEMM, attention and elementwise kernels the simulator prices, on the GPU at hand,
and write them as a kernel table (the input of `sweep calibrate compute`).

Why: the compute model's efficiency curves (catalogs/efficiency.yaml) come from papers and
from fitting whole training runs; a table of real kernel times on real shapes is what tells
whether the curve's shape (wave quantization, short-K loss, attention at short sequences) is
right, and lets a user train a learned kernel model for their own GPU and software stack.

Run on a machine with PyTorch and a CUDA GPU (the rest of `sweep` need not be installed):

    python -m sim_core.calibration.measure --out kernels.csv [--models llama3-8b,llama3-70b]
        [--tp 1,2,4,8] [--tokens 2048,4096,8192,16384] [--fp8] [--budget-s 420]

Shapes are the simulator's own (workload.build for each model x tp x tokens per micro-batch):
for each layer GEMM its forward (X W^T), input-gradient (dY W) and weight-gradient (dY^T X)
products in the layouts a Linear layer runs; causal attention through PyTorch's SDPA with the
FlashAttention-2 backend ("flash") and cuDNN's fused attention ("cudnn", the FA3-class kernel
Transformer Engine runs on Hopper), forward and backward; a few memory-bound ops (copy,
residual add, RMSNorm and SwiGLU, eager and fused) with the bytes they must move. Each time is
the median over blocks of back-to-back launches, timed with CUDA events after a warm-up, with
inputs rotated when they would fit in L2. Rows are written as they are measured, so a run cut
short keeps what it measured.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .kernels import KERNEL_COLUMNS

DEFAULT_MODELS = ("llama3-8b", "llama3-70b", "llama3.1-405b", "gpt3-175b", "mpt-30b")
DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_TOKENS = (2048, 4096, 8192, 16384)
ATTN_SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
ATTN_HEAD_DIM = 128
EXTRA_COLUMNS = ("kernel", "model", "tp", "tokens", "op", "phase", "bytes", "spread", "note")


# =============================================================================================
# Shapes: what the simulator prices (no GPU needed)
# =============================================================================================
def _workload_frame(models, tps, tokens) -> pd.DataFrame:
    rows = []
    for model in models:
        for tp in tps:
            for t in tokens:
                # one sequence of t tokens per micro-batch; the shapes depend on T and tp only
                rows.append(dict(model=model, seq_len=int(t), micro_batch=1, global_batch=64,
                                 gpu="h100-sxm", num_gpus=int(tp), tp=int(tp), pp=1,
                                 recompute="none"))
    return pd.DataFrame(rows)


def gemm_shapes(models=DEFAULT_MODELS, tps=DEFAULT_TP, tokens=DEFAULT_TOKENS) -> pd.DataFrame:
    """One row per (model, tp, tokens, op, phase): the GEMM (m, n, k) the simulator prices,
    as forward (m=T, n, k), input gradient (T, k, n) and weight gradient (n, k, T)."""
    from .. import workload
    from ..columns import frame_to_batch

    frame = _workload_frame(models, tps, tokens)
    b = frame_to_batch(frame)
    wl = workload.build(b)
    out = []
    for op in wl.ops:
        if op.op_class != "gemm" or op.name.startswith(("expert_", "router", "shared_")):
            continue  # MoE grouped GEMMs are a different kernel family: not measured here
        m, n, k = (np.broadcast_to(np.asarray(x, dtype=float), (len(frame),))
                   for x in (op.gemm_m, op.gemm_n, op.gemm_k))
        present = np.broadcast_to(np.asarray(op.fwd_flops, dtype=float), (len(frame),)) > 0
        for i in np.flatnonzero(present):
            base = dict(model=frame.model[i], tp=int(frame.tp[i]), tokens=int(frame.seq_len[i]),
                        op=op.name)
            mi, ni, ki = int(round(m[i])), int(round(n[i])), int(round(k[i]))
            out.append({**base, "phase": "fwd", "m": mi, "n": ni, "k": ki})
            out.append({**base, "phase": "dgrad", "m": mi, "n": ki, "k": ni})
            out.append({**base, "phase": "wgrad", "m": ni, "n": ki, "k": mi})
    return pd.DataFrame(out)


MOE_MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b", "gpt-oss-120b")
GROUP_ALIGN = 16  # rows per expert group: torch._grouped_mm's alignment (torchtitan pads to it)


def moe_gemm_shapes(models=MOE_MODELS, eps=(1, 2, 4, 8, 16, 32, 64), tokens=(4096, 8192)
                    ) -> pd.DataFrame:
    """Forward expert GEMMs of one MoE layer on one GPU under balanced routing: `groups` local
    experts (experts / ep), each with m = tokens x top_k x ep / experts rows (rounded up to 16),
    n x k of FC1 (gate + up for SwiGLU) and FC2; expert tensor parallelism not applied."""
    from .. import catalog

    out = []
    for name in models:
        spec = catalog.get_model(name)
        n_up = 2 if spec.activation == "swiglu" else 1
        for ep in eps:
            if ep > spec.experts:
                continue
            groups = spec.experts // ep
            for t in tokens:
                m = max(GROUP_ALIGN, math.ceil(t * spec.top_k * ep / spec.experts / GROUP_ALIGN)
                        * GROUP_ALIGN)
                base = dict(model=name, ep=ep, tokens=t, batch=groups, m=m)
                out.append({**base, "op": "expert_fc1", "n": n_up * spec.expert_ffn,
                            "k": spec.hidden})
                out.append({**base, "op": "expert_fc2", "n": spec.hidden, "k": spec.expert_ffn})
    return pd.DataFrame(out)


def attention_shapes(models=DEFAULT_MODELS, tps=DEFAULT_TP, seqs=ATTN_SEQS) -> pd.DataFrame:
    """Query heads per GPU (heads / tp) x sequence length, head_dim 128, one sequence."""
    from .. import catalog

    heads = sorted({max(catalog.get_model(m).heads // tp, 1) for m in models for tp in tps})
    return pd.DataFrame([dict(heads=h, seq=s) for h in heads for s in seqs])


# =============================================================================================
# Timing (needs torch and a CUDA GPU)
# =============================================================================================
class Timer:
    """Median kernel time of fn(i) (i rotates input sets), from CUDA events around blocks of
    back-to-back launches; `spread` is (max - min) / median over the blocks."""

    def __init__(self, torch, min_block_ms: float = 15.0, blocks: int = 5):
        self.torch, self.min_block_ms, self.blocks = torch, min_block_ms, blocks

    def __call__(self, fn) -> tuple[float, float]:
        cuda = self.torch.cuda
        fn(0)
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn(1)
        end.record()
        end.synchronize()
        est_ms = max(start.elapsed_time(end), 1e-3)
        reps = int(min(max(self.min_block_ms / est_ms, 1), 2000))
        times = []
        for _ in range(self.blocks):
            start.record()
            for i in range(reps):
                fn(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        med = float(np.median(times))
        return med * 1e3, float((max(times) - min(times)) / med)


def _copies(nbytes: float, l2_bytes: float) -> int:
    """Input sets to rotate so that repeated launches do not run out of L2."""
    return int(min(8, max(1, math.ceil(3 * l2_bytes / max(nbytes, 1)))))


def time_gemm(torch, timer, m, n, k, dtype: str, l2_bytes: float) -> tuple[float, float]:
    """C[m,n] = A[m,k] B[k,n] with A row-major and B column-major (a Linear layer's weight
    W[n,k] used as W^T): torch.matmul in bf16; in fp8 the per-tensor-scaled torch._scaled_mm
    of time_fp8_recipe_gemm (e4m3, bf16 output, as Transformer Engine's delayed scaling)."""
    if dtype == "fp8":
        return time_fp8_recipe_gemm(torch, timer, m, n, k, "tensorwise", l2_bytes)
    sets = _copies(2 * (m * k + n * k), l2_bytes)
    a = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    b = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    return timer(lambda i: torch.matmul(a[i % sets], b[i % sets].t()))


def time_grouped_gemm(torch, timer, groups, m, n, k, how: str, l2_bytes: float):
    """`groups` GEMMs of (m, n, k), bf16: one torch._grouped_mm launch over the stacked rows
    (what torchtitan's MoE runs), or a loop of torch.matmul (a framework without a grouped
    kernel). Weights are [groups, n, k] used transposed, as a Linear layer's."""
    dev = "cuda"
    sets = _copies(2 * groups * (m * k + n * k), l2_bytes)
    x = [torch.randn(groups * m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    w = [torch.randn(groups, n, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    offs = torch.arange(m, groups * m + 1, m, device=dev, dtype=torch.int32)
    if how == "grouped_mm":
        def fn(i):
            torch._grouped_mm(x[i % sets], w[i % sets].transpose(-2, -1), offs=offs)
    else:
        def fn(i):
            xs, ws = x[i % sets], w[i % sets]
            for g in range(groups):
                torch.matmul(xs[g * m:(g + 1) * m], ws[g].t())
    return timer(fn)


LAYER_MODELS = ("llama3-8b", "llama3-70b", "llama3.1-405b")
LAYER_SEQS = (2048, 4096, 8192)


def time_layer(torch, timer, model: str, seq: int, backend: str, compiled: bool = False,
               batch: int = 1) -> dict:
    """One decoder layer on one GPU (tp 1), `batch` sequences, bf16 weights, as eager PyTorch
    (torchtitan or llm-foundry without compile): Llama-style (SwiGLU models: nn.RMSNorm, fused
    QKV, rotary, causal SDPA with GQA, output projection, SwiGLU MLP) or MPT-style (GeLU
    models: LayerNorm without bias, fused QKV, causal SDPA, output projection, GeLU MLP; no
    position term, as ALiBi is a bias inside the kernel), residual adds. Forward, and backward
    as (forward + backward) - forward."""
    from torch import nn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import catalog

    spec = catalog.get_model(model)
    h, heads = spec.hidden, spec.heads
    kv = spec.kv_heads or heads
    hd = spec.head_dim or h // heads
    f = torch.nn.functional
    dev, bf = "cuda", torch.bfloat16

    swiglu = spec.activation == "swiglu"

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            if swiglu:
                self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
            else:
                self.n1, self.n2 = nn.LayerNorm(h, bias=False), nn.LayerNorm(h, bias=False)
            self.wqkv = nn.Linear(h, (heads + 2 * kv) * hd, bias=False)
            self.wo = nn.Linear(heads * hd, h, bias=False)
            self.w13 = nn.Linear(h, (2 if swiglu else 1) * spec.ffn, bias=False)
            self.w2 = nn.Linear(spec.ffn, h, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, v = self.wqkv(self.n1(x)).split([heads * hd, kv * hd, kv * hd], dim=-1)
            q, k, v = (t.view(b, s, -1, hd) for t in (q, k, v))

            def rope(t):
                t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
                return t * cos + torch.cat([-t2, t1], dim=-1) * sin
            if swiglu:
                q, k = rope(q), rope(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            o = f.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)
            x = x + self.wo(o.transpose(1, 2).reshape(b, s, heads * hd))
            if swiglu:
                g, u = self.w13(self.n2(x)).chunk(2, dim=-1)
                return x + self.w2(f.silu(g) * u)
            return x + self.w2(f.gelu(self.w13(self.n2(x)), approximate="tanh"))

    layer = Layer().to(dev, bf)
    step = torch.compile(layer) if compiled else layer
    x = torch.randn(batch, seq, h, device=dev, dtype=bf, requires_grad=True)
    ang = torch.randn(seq, 1, hd, device=dev, dtype=bf)
    cos, sin = ang.cos(), ang.sin()
    g = torch.randn(batch, seq, h, device=dev, dtype=bf)
    kind = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    with sdpa_kernel(kind):
        def fwd(_):
            with torch.no_grad():
                step(x, cos, sin)

        def both(_):
            out = step(x, cos, sin)
            torch.autograd.grad(out, [x, *layer.parameters()], g)
        t_fwd, s_fwd = timer(fwd)
        t_both, s_both = timer(both)
    return {"fwd": (t_fwd, s_fwd), "bwd": (max(t_both - t_fwd, 1e-3), s_both)}


def time_attention(torch, timer, backend: str, heads: int, seq: int, head_dim: int,
                   l2_bytes: float, batch: int = 1) -> dict:
    """Causal SDPA forward, and backward as (forward + backward) - forward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    f = torch.nn.functional.scaled_dot_product_attention
    kind = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    nbytes = 4 * 2 * batch * heads * seq * head_dim
    sets = _copies(nbytes, l2_bytes)
    qkv = [[torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(3)] for _ in range(sets)]
    g = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(kind):
        def fwd(i):
            with torch.no_grad():
                f(*qkv[i % sets], is_causal=True)

        def both(i):
            q, k, v = qkv[i % sets]
            out = f(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), g)
        t_fwd, s_fwd = timer(fwd)
        t_both, s_both = timer(both)
    return {"fwd": (t_fwd, s_fwd), "bwd": (max(t_both - t_fwd, 1e-3), s_both)}


def elementwise_ops(torch, tokens: int, hidden: int, ffn: int) -> dict:
    """Memory-bound ops of a layer: (fn, bytes the op must move at least), bf16 tensors."""
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(tokens, hidden, device=dev, dtype=bf)
    r = torch.randn(tokens, hidden, device=dev, dtype=bf)
    w = torch.randn(hidden, device=dev, dtype=bf)
    gate = torch.randn(tokens, ffn, device=dev, dtype=bf)
    up = torch.randn(tokens, ffn, device=dev, dtype=bf)
    out = torch.empty_like(x)
    act = 2 * tokens * hidden  # bytes of one bf16 activation
    big = 2 * tokens * ffn

    def rms_eager(_):
        xf = x.float()
        (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf) * w

    return {
        "copy": (lambda _: out.copy_(x), 2 * act),
        "residual_add": (lambda _: torch.add(x, r, out=out), 3 * act),
        "rmsnorm_eager": (rms_eager, 2 * act),
        "rmsnorm_fused": (lambda _: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-5), 2 * act),
        "swiglu_eager": (lambda _: torch.nn.functional.silu(gate) * up, 3 * big),
    }


# =============================================================================================
# Edges of the range users sweep (--only edges): small models, short sequences, launch costs,
# FP8 recipes' GEMMs
# =============================================================================================
SMALL_MODELS = ("mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b", "llama3.2-1b")
SMALL_TOKENS = (512, 2048, 8192, 32768)
SHORT_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
SHORT_ATTN = ((64, 12), (64, 16), (128, 8), (128, 16), (128, 32))  # (head_dim, heads)
SHORT_ATTN_TOKENS = 16384  # batch = tokens / seq sequences, as an FSDP micro-batch packs them
FP8_RECIPE_MODELS = ("llama3-8b", "llama3-70b")
FP8_RECIPE_TP = (1, 4, 8)
FP8_RECIPE_TOKENS = (4096, 8192)


def time_launch(torch, timer, how: str) -> tuple[float, float]:
    """Time per launch of a kernel that does no work: `eager` is what back-to-back eager
    PyTorch ops cost (the host's dispatch, when it is slower than the GPU), `graph` the
    device-side floor (100 launches replayed from a CUDA graph), `gemm` an eager 16x16x16
    bf16 matmul (cuBLAS dispatch)."""
    x = torch.zeros(1, device="cuda")
    if how == "eager":
        return timer(lambda _: x.add_(1.0))
    if how == "gemm":
        a = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
        return timer(lambda _: torch.matmul(a, a))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            x.add_(1.0)
    t, spread = timer(lambda _: graph.replay())
    return t / 100, spread


def _fp8_operands(torch, m, n, k, sets):
    a = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
         for _ in range(sets)]
    b = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
         for _ in range(sets)]
    return a, b


def time_fp8_recipe_gemm(torch, timer, m, n, k, recipe: str, l2_bytes: float):
    """One FP8 GEMM as each recipe runs it on Hopper, bf16 output: `tensorwise` (one scale
    per tensor: TE delayed/current, torchao tensorwise), `rowwise` (a scale per row of A and
    per column of B: torchao rowwise, a CUTLASS kernel in PyTorch), `blockwise` (1x128 scales
    for A, 128x128 for B, DeepSeek-V3 style: cuBLAS 12.9+ through F.scaled_mm, as torchao's
    blockwise_fp8_training calls it). A recipe the stack cannot run raises."""
    sets = _copies(m * k + n * k, l2_bytes)
    a, b = _fp8_operands(torch, m, n, k, sets)
    f32 = dict(device="cuda", dtype=torch.float32)
    if recipe == "tensorwise":
        sa = sb = torch.ones((), **f32)
        return timer(lambda i: torch._scaled_mm(a[i % sets], b[i % sets].t(), scale_a=sa,
                                                scale_b=sb, out_dtype=torch.bfloat16))
    if recipe == "rowwise":
        sa, sb = torch.ones(m, 1, **f32), torch.ones(1, n, **f32)
        return timer(lambda i: torch._scaled_mm(a[i % sets], b[i % sets].t(), scale_a=sa,
                                                scale_b=sb, out_dtype=torch.bfloat16))
    if recipe == "blockwise":
        F = torch.nn.functional
        st = getattr(F, "ScalingType", None) or getattr(torch._C, "_ScalingType")
        kb, nb = math.ceil(k / 128), math.ceil(n / 128)
        sa = torch.ones(kb, m, **f32).t()  # (m, k/128), column-major
        kb4 = (kb + 3) // 4 * 4  # cuBLASLt's 128x128 layout: K-major, K blocks padded to 4
        sb = torch.ones(nb, kb4, **f32).t()  # (k/128 padded to 4, n/128), K-major
        return timer(lambda i: F.scaled_mm(a[i % sets], b[i % sets].t(), scale_a=sa,
                                           scale_recipe_a=st.BlockWise1x128, scale_b=sb,
                                           scale_recipe_b=st.BlockWise128x128,
                                           output_dtype=torch.bfloat16))
    raise ValueError(recipe)


def quantize_ops(torch, tokens: int, hidden: int) -> dict:
    """The memory-bound passes of FP8 scaling in eager PyTorch, bf16 input: a tensor's amax
    (tensorwise), per-row amax (rowwise), and the scaled cast to e4m3 (read 2, write 1 byte)."""
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    s = torch.ones((), device="cuda", dtype=torch.float32)
    n = tokens * hidden
    return {
        "amax_tensor": (lambda _: x.abs().amax(), 2 * n),
        "amax_rows": (lambda _: x.abs().amax(dim=-1), 2 * n),
        "cast_fp8": (lambda _: (x * s).to(torch.float8_e4m3fn), 3 * n),
    }


def time_flex_attention(torch, timer, heads, seq, head_dim, batch):
    """Causal attention through FlexAttention (a Triton flash kernel generated by
    torch.compile; torchtitan's `flex` attention), forward and (forward + backward) - forward."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device="cuda")
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    g = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)

    def fwd(_):
        with torch.no_grad():
            flex(q, k, v, block_mask=mask)

    def both(_):
        out = flex(q, k, v, block_mask=mask)
        torch.autograd.grad(out, (q, k, v), g)
    t_fwd, s_fwd = timer(fwd)
    t_both, s_both = timer(both)
    return {"fwd": (t_fwd, s_fwd), "bwd": (max(t_both - t_fwd, 1e-3), s_both)}


SMALL_LAYER_MODELS = ("mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b", "llama3.2-1b")
SMALL_LAYER_SHAPES = ((512, 8), (512, 32), (2048, 2), (2048, 8), (8192, 1), (8192, 2))  # seq, mb


def time_layers(torch, timer, w, gpu, source, cases, over) -> None:
    """Whole decoder layers, one row per direction: `cases` yields (model, seq, micro-batch,
    attention backend, note); a layer that fails is written with its reason, the rest go on."""
    for model, seq, mb, backend, note in cases:
        if over():
            return
        row = dict(op_class="layer", dtype="bf16", batch=mb, seq=seq, kernel=backend,
                   model=model, tp=1, tokens=seq * mb, op="decoder_layer_eager", note=note)
        try:
            res = time_layer(torch, timer, model, seq, backend, batch=mb)
        except Exception as exc:
            w.add(_row(gpu, source, **{**row, "note": failed_note(exc)}))
            continue
        add_timed(w, gpu, source, row, res)
        torch.cuda.empty_cache()


def run_small_layers(torch, timer, w, gpu, source, over, log, t0) -> None:
    """Whole eager decoder layers of small models at the micro-batches FSDP frameworks run
    (4k-16k tokens): where launch gaps and small kernels decide the time."""
    cases = ((model, seq, mb, backend, "small") for model in SMALL_LAYER_MODELS
             for seq, mb in SMALL_LAYER_SHAPES for backend in ("flash", "cudnn"))
    time_layers(torch, timer, w, gpu, source, cases, over)
    log(f"small layers: {w.rows} rows, {time.monotonic() - t0:.0f} s")


def run_edges(torch, timer, w, gpu, source, l2_bytes, over, log, t0) -> None:
    """The --only edges suite; each part is caught on its own so that one refusal keeps the rest."""
    def failed(exc):
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"

    # launches
    for how in ("eager", "graph", "gemm"):
        try:
            t, s = time_launch(torch, timer, how)
            w.add(_row(gpu, source, op_class="elementwise", dtype="fp32", m=1, n=1, k=1,
                       time_us=t, spread=s, op=f"launch_{how}", bytes=4, kernel="torch"))
        except Exception as exc:
            w.add(_row(gpu, source, op_class="elementwise", op=f"launch_{how}", note=failed(exc)))
    log(f"launch: {w.rows} rows, {time.monotonic() - t0:.0f} s")

    # memory-bound ops from launch-bound to bandwidth-bound sizes, and FP8 quantisation passes
    for tokens_e in (512, 2048, 8192, 32768):
        for hidden in (768, 2048, 4096):
            try:
                for name, (fn, nbytes) in elementwise_ops(torch, tokens_e, hidden,
                                                          4 * hidden).items():
                    t, s = timer(fn)
                    w.add(_row(gpu, source, op_class="elementwise", dtype="bf16", m=tokens_e,
                               n=hidden, k=4 * hidden, time_us=t, spread=s, op=name,
                               bytes=nbytes, kernel="torch"))
                for name, (fn, nbytes) in quantize_ops(torch, tokens_e, hidden).items():
                    t, s = timer(fn)
                    w.add(_row(gpu, source, op_class="elementwise", dtype="bf16", m=tokens_e,
                               n=hidden, time_us=t, spread=s, op=name, bytes=nbytes,
                               kernel="torch"))
            except Exception as exc:
                w.add(_row(gpu, source, op_class="elementwise", m=tokens_e, n=hidden,
                           note=failed(exc)))
        torch.cuda.empty_cache()
    log(f"elementwise: {w.rows} rows, {time.monotonic() - t0:.0f} s")

    # small-model GEMMs (bf16), smallest first
    g = gemm_shapes(SMALL_MODELS, (1,), SMALL_TOKENS)
    uniq = g.drop_duplicates(["m", "n", "k"]).assign(
        flops=lambda d: 2.0 * d.m * d.n * d.k).sort_values("flops")
    for r in uniq.itertuples():
        if over():
            break
        row = dict(op_class="gemm", dtype="bf16", m=r.m, n=r.n, k=r.k, batch=1, kernel="cublas",
                   model=r.model, tp=r.tp, tokens=r.tokens, op=r.op, phase=r.phase)
        try:
            t, s = time_gemm(torch, timer, r.m, r.n, r.k, "bf16", l2_bytes)
            w.add(_row(gpu, source, **row, time_us=t, spread=s, note="small"))
        except Exception as exc:
            w.add(_row(gpu, source, **row, note=failed(exc)))
    torch.cuda.empty_cache()
    log(f"small gemm: {w.rows} rows, {time.monotonic() - t0:.0f} s")

    # short-sequence attention: a micro-batch of SHORT_ATTN_TOKENS tokens in batch x seq
    for backend in ("cudnn", "flash"):
        for head_dim, heads in SHORT_ATTN:
            for seq in SHORT_SEQS:
                if over():
                    break
                batch = max(SHORT_ATTN_TOKENS // seq, 1)
                row = dict(op_class="attention", dtype="bf16", batch=batch, heads=heads, seq=seq,
                           head_dim=head_dim, causal=1, kernel=backend, note="short")
                try:
                    res = time_attention(torch, timer, backend, heads, seq, head_dim, l2_bytes,
                                         batch=batch)
                except Exception as exc:
                    w.add(_row(gpu, source, **{**row, "note": failed(exc)}))
                    continue
                for direction, (t, s) in res.items():
                    w.add(_row(gpu, source, **row, direction=direction, time_us=t, spread=s))
        torch.cuda.empty_cache()
    log(f"short attention: {w.rows} rows, {time.monotonic() - t0:.0f} s")

    # FP8 recipes on the same shapes, with the bf16 GEMM beside them (same card, same clocks)
    g = gemm_shapes(FP8_RECIPE_MODELS, FP8_RECIPE_TP, FP8_RECIPE_TOKENS)
    uniq = g.drop_duplicates(["m", "n", "k"]).assign(
        flops=lambda d: 2.0 * d.m * d.n * d.k).sort_values("flops")
    uniq = uniq[(uniq.n % 128 == 0) & (uniq.k % 128 == 0)]
    for r in uniq.itertuples():
        if over():
            break
        base = dict(op_class="gemm", m=r.m, n=r.n, k=r.k, batch=1, model=r.model, tp=r.tp,
                    tokens=r.tokens, op=r.op, phase=r.phase)
        for recipe in ("bf16", "tensorwise", "rowwise", "blockwise"):
            row = dict(base, dtype="bf16" if recipe == "bf16" else "fp8",
                       kernel="cublas" if recipe == "bf16" else f"scaled_mm_{recipe}",
                       note=f"fp8_recipe {recipe}")
            try:
                t, s = (time_gemm(torch, timer, r.m, r.n, r.k, "bf16", l2_bytes)
                        if recipe == "bf16" else
                        time_fp8_recipe_gemm(torch, timer, r.m, r.n, r.k, recipe, l2_bytes))
                w.add(_row(gpu, source, **row, time_us=t, spread=s))
            except Exception as exc:
                w.add(_row(gpu, source, **{**row, "note": f"fp8_recipe {recipe} " + failed(exc)}))
    torch.cuda.empty_cache()
    log(f"fp8 recipes: {w.rows} rows, {time.monotonic() - t0:.0f} s")

    # the Triton flash kernel (FlexAttention), a few shapes: each compiles
    for head_dim, heads, seq in ((128, 16, 1024), (128, 16, 4096), (64, 12, 2048),
                                 (128, 16, 16384)):
        if over():
            break
        batch = max(SHORT_ATTN_TOKENS // seq, 1)
        row = dict(op_class="attention", dtype="bf16", batch=batch, heads=heads, seq=seq,
                   head_dim=head_dim, causal=1, kernel="flex", note="short")
        try:
            res = time_flex_attention(torch, timer, heads, seq, head_dim, batch)
        except Exception as exc:
            w.add(_row(gpu, source, **{**row, "note": failed(exc)}))
            continue
        for direction, (t, s) in res.items():
            w.add(_row(gpu, source, **row, direction=direction, time_us=t, spread=s))
    log(f"flex attention: {w.rows} rows, {time.monotonic() - t0:.0f} s")


# =============================================================================================
# The run
# =============================================================================================
def _device(torch) -> dict:
    from .kernels import gpu_from_device

    p = torch.cuda.get_device_properties(0)
    gpu = gpu_from_device(p.name, p.total_memory)
    return {"name": p.name, "gpu": gpu, "sm_count": p.multi_processor_count,
            "l2_bytes": float(getattr(p, "L2_cache_size", 50 * 2**20)),
            "total_memory": p.total_memory}


def _row(gpu, source, **kw) -> dict:
    row = {c: kw.get(c) for c in (*KERNEL_COLUMNS, *EXTRA_COLUMNS)}
    row["gpu"], row["source"] = gpu, source
    return row


def failed_note(exc: Exception) -> str:
    """A row's note for a measurement that raised: the exception's type and first line."""
    return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


def add_timed(w, gpu, source, row: dict, res: dict, **extra) -> None:
    """One row per direction of `res` ({direction: (time_us, spread)}) on top of `row`."""
    for direction, (t, s) in res.items():
        w.add(_row(gpu, source, **row, **extra, direction=direction, time_us=t, spread=s))


class _Writer:
    """Appends rows to the CSV as they come (a cut run keeps what it measured)."""

    def __init__(self, path: Path, header: list[str]):
        self.path, self.cols = path, [*KERNEL_COLUMNS, *EXTRA_COLUMNS]
        path.write_text("".join(f"# {line}\n" for line in header) + ",".join(self.cols) + "\n")
        self.rows = 0

    def add(self, row: dict) -> None:
        pd.DataFrame([row], columns=self.cols).to_csv(self.path, mode="a", header=False,
                                                      index=False)
        self.rows += 1


def open_cuda(prog: str, needs: str, *modules: str):
    """PyTorch with a visible CUDA GPU (and the named modules), or a one-line exit naming what
    is missing. Returns (torch, {module: module}, device dict, the table's gpu name, the rows'
    source tag: the device and the versions of torch and the modules)."""
    import importlib

    try:
        import torch
        mods = {m: importlib.import_module(m) for m in modules}
    except ImportError:
        raise SystemExit(f"{prog}: needs {needs}") from None
    if not torch.cuda.is_available():
        raise SystemExit(f"{prog}: no CUDA GPU visible (torch.cuda.is_available() is False)")
    dev = _device(torch)
    source = (f"measure:{dev['name'].replace(' ', '_')}:torch{torch.__version__}"
              + "".join(f":{m}{mod.__version__}" for m, mod in mods.items()))
    return torch, mods, dev, dev["gpu"] or dev["name"], source


def run(out: Path, models, tps, tokens, seqs, fp8: bool, budget_s: float, moe: bool = False,
        dense: bool = True, layers: bool = False, edges: bool = False, small_layers: bool = False,
        log=print) -> int:
    torch, _, dev, gpu, source = open_cuda("measure", "PyTorch with CUDA (pip install torch)")
    header = [f"kernel table measured by python -m sim_core.calibration.measure on {time.strftime('%Y-%m-%d')}",
              f"device: {dev['name']}, {dev['sm_count']} SMs, "
              f"{dev['total_memory'] / 2**30:.1f} GiB, L2 {dev['l2_bytes'] / 2**20:.0f} MiB",
              f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
              f"{torch.backends.cudnn.version()}, python {platform.python_version()}",
              "time_us: median over blocks of back-to-back launches (CUDA events); "
              "spread: (max-min)/median over blocks",
              "attention: causal, batch x heads x seq x head_dim, bwd = (fwd+bwd) - fwd; elementwise: bytes = the "
              "least the op must move"]
    w = _Writer(out, header)
    timer = Timer(torch)
    t0 = time.monotonic()
    over = lambda: time.monotonic() - t0 > budget_s  # noqa: E731
    torch.backends.cuda.matmul.allow_tf32 = False

    if dense:
        # 1. memory-bound ops (quick, first): achieved fraction of HBM bandwidth
        for tokens_e, hidden, ffn in ((8192, 4096, 14336), (8192, 8192, 28672)):
            for name, (fn, nbytes) in elementwise_ops(torch, tokens_e, hidden, ffn).items():
                t, s = timer(fn)
                w.add(_row(gpu, source, op_class="elementwise", dtype="bf16", m=tokens_e, n=hidden,
                           k=ffn, time_us=t, spread=s, op=name, bytes=nbytes, kernel="torch"))
            torch.cuda.empty_cache()
        log(f"elementwise: {w.rows} rows, {time.monotonic() - t0:.0f} s")

        # 2. attention: both backends, forward and backward
        shapes = attention_shapes(models, tps, seqs)
        for backend in ("cudnn", "flash"):
            for r in shapes.itertuples():
                if over():
                    break
                try:
                    res = time_attention(torch, timer, backend, r.heads, r.seq, ATTN_HEAD_DIM,
                                         dev["l2_bytes"])
                except Exception as exc:  # a backend that refuses a shape: say so, keep going
                    w.add(_row(gpu, source, op_class="attention", dtype="bf16", batch=1,
                               heads=r.heads, seq=r.seq, head_dim=ATTN_HEAD_DIM, causal=1,
                               kernel=backend, note=f"failed: {type(exc).__name__}: "
                                                    f"{str(exc).splitlines()[0][:120]}"))
                    continue
                for direction, (t, s) in res.items():
                    w.add(_row(gpu, source, op_class="attention", dtype="bf16", batch=1,
                               heads=r.heads, seq=r.seq, head_dim=ATTN_HEAD_DIM, causal=1,
                               direction=direction, time_us=t, spread=s, kernel=backend))
            torch.cuda.empty_cache()
        log(f"attention: {w.rows} rows, {time.monotonic() - t0:.0f} s")

        # 3. GEMMs: every distinct shape once per dtype, smallest first (a cut run covers the range)
        g = gemm_shapes(models, tps, tokens)
        uniq = g.drop_duplicates(["m", "n", "k"]).assign(
            flops=lambda d: 2.0 * d.m * d.n * d.k).sort_values("flops")
        dtypes = ["bf16", "fp8"] if fp8 else ["bf16"]
        done = 0
        for dtype in dtypes:
            for r in uniq.itertuples():
                if over():
                    break
                try:
                    t, s = time_gemm(torch, timer, r.m, r.n, r.k, dtype, dev["l2_bytes"])
                except Exception as exc:
                    w.add(_row(gpu, source, op_class="gemm", dtype=dtype, m=r.m, n=r.n, k=r.k,
                               batch=1, kernel="cublas", model=r.model, tp=r.tp, tokens=r.tokens,
                               op=r.op, phase=r.phase, note=f"failed: {type(exc).__name__}"))
                    continue
                w.add(_row(gpu, source, op_class="gemm", dtype=dtype, m=r.m, n=r.n, k=r.k, batch=1,
                           time_us=t, spread=s, kernel="cublas" if dtype == "bf16" else "scaled_mm",
                           model=r.model, tp=r.tp, tokens=r.tokens, op=r.op, phase=r.phase))
                done += 1
            torch.cuda.empty_cache()
            log(f"gemm {dtype}: {done} of {len(uniq) * len(dtypes)} shapes, "
                f"{time.monotonic() - t0:.0f} s")
    # 5. whole decoder layers (with --layers): what the compute model predicts end to end
    if layers:
        cases = ((model, seq, 1, backend, None) for model in LAYER_MODELS
                 for seq in LAYER_SEQS for backend in ("cudnn", "flash"))
        time_layers(torch, timer, w, gpu, source, cases, over)
        log(f"layers: {w.rows} rows, {time.monotonic() - t0:.0f} s")

    # 4. MoE expert GEMMs (with --moe): grouped kernel and a per-expert loop, bf16
    if moe:
        shapes = moe_gemm_shapes()
        for how in ("grouped_mm", "loop"):
            for r in shapes.itertuples():
                if over():
                    break
                if how == "loop" and r.batch > 64:
                    continue  # a launch per expert: hundreds of launches say nothing new
                row = dict(op_class="gemm", dtype="bf16", m=r.m, n=r.n, k=r.k, batch=r.batch,
                           kernel=how, model=r.model, tp=1, tokens=r.tokens, op=r.op,
                           phase="fwd", note=f"moe ep={r.ep}")
                try:
                    t, s = time_grouped_gemm(torch, timer, r.batch, r.m, r.n, r.k, how,
                                             dev["l2_bytes"])
                except Exception as exc:
                    w.add(_row(gpu, source, **{**row, "note": f"moe ep={r.ep} failed: "
                                                               f"{type(exc).__name__}"}))
                    continue
                w.add(_row(gpu, source, **row, time_us=t, spread=s))
            torch.cuda.empty_cache()
        log(f"moe: {w.rows} rows, {time.monotonic() - t0:.0f} s")
    if edges:
        run_edges(torch, timer, w, gpu, source, dev["l2_bytes"], over, log, t0)
    if small_layers:
        run_small_layers(torch, timer, w, gpu, source, over, log, t0)
    if over():
        log(f"stopped at the {budget_s:.0f} s budget: the table is partial (smallest shapes first)")
    log(f"wrote {w.rows} rows to {out}")
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim_core.calibration.measure",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="kernel table CSV to write")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="catalog models whose layer shapes to measure (comma-separated)")
    p.add_argument("--tp", default=",".join(map(str, DEFAULT_TP)), help="tensor-parallel sizes")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                   help="tokens per micro-batch per GPU (micro_batch x seq / cp)")
    p.add_argument("--seqs", default=",".join(map(str, ATTN_SEQS)),
                   help="attention sequence lengths")
    p.add_argument("--fp8", action="store_true", help="also time every GEMM in FP8 (Hopper+)")
    p.add_argument("--moe", action="store_true",
                   help="also time MoE expert GEMMs (torch._grouped_mm and a per-expert loop)")
    p.add_argument("--layers", action="store_true",
                   help="also time whole eager Llama decoder layers (forward, backward)")
    p.add_argument("--only", choices=["moe", "layers", "edges", "small-layers"], help="measure only this part")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="stop starting new measurements after this many seconds")
    p.add_argument("--shapes-only", action="store_true",
                   help="print the GEMM and attention shapes and exit (no GPU needed)")
    a = p.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    if a.shapes_only:
        g = gemm_shapes(models, _ints(a.tp), _ints(a.tokens))
        print(f"{len(g)} GEMM rows, {len(g.drop_duplicates(['m', 'n', 'k']))} distinct shapes; "
              f"{len(attention_shapes(models, _ints(a.tp), _ints(a.seqs)))} attention shapes")
        return 0
    return run(a.out, models, _ints(a.tp), _ints(a.tokens), _ints(a.seqs), a.fp8, a.budget_s,
               moe=a.moe or a.only == "moe", dense=a.only is None,
               layers=a.layers or a.only == "layers", edges=a.only == "edges",
               small_layers=a.only == "small-layers")


if __name__ == "__main__":
    sys.exit(main())
