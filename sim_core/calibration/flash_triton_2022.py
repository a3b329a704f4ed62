"""FlashAttention's 2022 Triton kernel, rebuilt for timing: what llm-foundry's `attn_impl:
triton` ran (llm-foundry v0.3.0 `llmfoundry/models/layers/flash_attn_triton.py`, vendored from
Dao-AILab/flash-attention `flash_attn/flash_attn_triton.py`, on triton-pre-mlir).

Why: the llm-foundry H100 rows that ran it hold the whole sequence-length trend of issue 36, and
the kernel has no published Hopper timing. Its old compiler cannot be installed any more, so this
module re-expresses the same algorithm for current Triton: what it does per tile is what the
simulator must price, and the measurement (calibration/measure.py `--only triton-attention`)
says which compiler path ran it. Written from the kernel's facts, not copied:

- forward: one program per 128-query block x (batch, head); 128 x 128 tiles, 8 warps at head
  dim 128, one pipeline stage; every key block (not only the diagonal ones) gets the causal mask
  added; with a bias the scores are scaled in a separate multiply and the bias row added
  (llm-foundry turns the batch's attention_mask into a (b, 1, 1, s) bias, so every row takes
  this `vector` path); the running rescale factor goes through a global scratch buffer (a store
  and a load per key block, the kernel's compiler-bug workaround; here with a barrier between
  them, which today's compiler needs); the log-sum-exp is stored.
- backward: a pass for delta = rowsum(O * dO); then, autotuned per sequence length, either one
  program per (batch, head) walking every key block (dq accumulated in fp32 with a load-add-store
  per tile), or one program per key block x (batch, head) with fp32 atomic adds into dq
  (`SEQUENCE_PARALLEL`); 128 x 128 tiles, 8 warps, one stage; a barrier before each bias load;
  dq's fp32 accumulator zeroed before and copied to bf16 after.

Only what the measured shapes need is kept: sequence lengths that are multiples of 128 and head
dim 128 (every MPT model of llm-foundry's tables), so the kernel's masked edge paths (which its
compile-time flags drop for such shapes) are left out. Needs Triton and a CUDA GPU; imported
only by the measurement suite.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 8  # head dim 128 (the original: 4 for head dim <= 64)


@triton.jit
def _fwd(Q, K, V, Bias, Out, Lse, Scratch, scale,
         sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sbb, sob, soh, som,
         nheads, seqlen, seqlen_rounded,
         HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, HEAD: tl.constexpr,
         ROUND_TRIP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    rows = pid_m * BM + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    dims = tl.arange(0, HEAD)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :])
    k_at = K + b * skb + h * skh + cols[:, None] * skn + dims[None, :]
    v_at = V + b * svb + h * svh + cols[:, None] * svn + dims[None, :]
    bias_at = Bias + b * sbb + cols
    scratch_at = Scratch + bh * seqlen_rounded + rows
    row_max = tl.zeros([BM], dtype=tl.float32) - float("inf")
    log_sum = tl.zeros([BM], dtype=tl.float32) - float("inf")
    acc = tl.zeros([BM, HEAD], dtype=tl.float32)
    stop = seqlen
    if CAUSAL:
        stop = tl.minimum((pid_m + 1) * BM, seqlen)
    for start in range(0, stop, BN):
        start = tl.multiple_of(start, BN)
        k = tl.load(k_at + start * skn)
        s = tl.dot(q, tl.trans(k))
        if CAUSAL:
            s += tl.where(rows[:, None] >= (start + cols)[None, :], 0, float("-inf"))
        if HAS_BIAS:
            bias = tl.load(bias_at + start).to(tl.float32)
            s = s * scale + bias[None, :]
            new_max = tl.maximum(tl.max(s, 1), log_sum)
            p = tl.exp(s - new_max[:, None])
        else:
            new_max = tl.maximum(tl.max(s, 1) * scale, log_sum)
            p = tl.exp(s * scale - new_max[:, None])
        block_sum = tl.sum(p, 1)
        rescale = tl.exp(row_max - new_max)
        if ROUND_TRIP:  # the kernel's store-then-load of the rescale factor
            tl.store(scratch_at, rescale)
            tl.debug_barrier()
            rescale = tl.load(scratch_at)
        acc = acc * rescale[:, None]
        v = tl.load(v_at + start * svn)
        acc += tl.dot(p.to(v.dtype), v)
        row_max = new_max
        log_sum = new_max + tl.log(tl.exp(log_sum - new_max) + block_sum)
    out_scale = tl.exp(row_max - log_sum)
    if ROUND_TRIP:
        tl.store(scratch_at, out_scale)
        tl.debug_barrier()
        out_scale = tl.load(scratch_at)
    acc = acc * out_scale[:, None]
    tl.store(Lse + bh * seqlen_rounded + rows, log_sum)
    tl.store(Out + b * sob + h * soh + rows[:, None] * som + dims[None, :], acc)


@triton.jit
def _bwd_delta(Out, DO, Delta, sob, soh, som, sdob, sdoh, sdom, nheads, seqlen_rounded,
               BM: tl.constexpr, HEAD: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    rows = pid_m * BM + tl.arange(0, BM)
    dims = tl.arange(0, HEAD)
    o = tl.load(Out + b * sob + h * soh + rows[:, None] * som + dims[None, :]).to(tl.float32)
    do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdom + dims[None, :]).to(tl.float32)
    tl.store(Delta + bh * seqlen_rounded + rows, tl.sum(o * do, axis=1))


@triton.jit
def _bwd_key_block(kb, Q, K, V, Bias, DO, DQ, DK, DV, Lse, Delta, scale,
                   sqm, skn, svn, sdom, sdqm, sdkn, sdvn, seqlen,
                   ATOMIC: tl.constexpr, HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr,
                   HEAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    first = 0
    if CAUSAL:
        first = ((kb * BN) // BM) * BM
    qrows = first + tl.arange(0, BM)
    cols = kb * BN + tl.arange(0, BN)
    local = tl.arange(0, BM)
    dims = tl.arange(0, HEAD)
    q_at = Q + qrows[:, None] * sqm + dims[None, :]
    do_at = DO + qrows[:, None] * sdom + dims[None, :]
    dq_at = DQ + qrows[:, None] * sdqm + dims[None, :]
    k = tl.load(K + cols[:, None] * skn + dims[None, :])
    v = tl.load(V + cols[:, None] * svn + dims[None, :])
    dk = tl.zeros([BN, HEAD], dtype=tl.float32)
    dv = tl.zeros([BN, HEAD], dtype=tl.float32)
    for start in range(first, tl.cdiv(seqlen, BM) * BM, BM):
        start = tl.multiple_of(start, BM)
        here = start + local
        q = tl.load(q_at)
        s = tl.dot(q, tl.trans(k))
        if CAUSAL:
            s = tl.where(here[:, None] >= cols[None, :], s, float("-inf"))
        lse = tl.load(Lse + here)
        if HAS_BIAS:
            tl.debug_barrier()
            bias = tl.load(Bias + cols).to(tl.float32)
            s = s * scale + bias[None, :]
            p = tl.exp(s - lse[:, None])
        else:
            p = tl.exp(s * scale - lse[:, None])
        do = tl.load(do_at)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        delta = tl.load(Delta + here)
        ds = (p * (dp - delta[:, None]) * scale).to(q.dtype)
        dk += tl.dot(tl.trans(ds), q)
        if ATOMIC:
            tl.atomic_add(dq_at, tl.dot(ds, k))
        else:
            dq = tl.load(dq_at, eviction_policy="evict_last")
            dq += tl.dot(ds, k)
            tl.store(dq_at, dq, eviction_policy="evict_last")
        q_at += BM * sqm
        do_at += BM * sdom
        dq_at += BM * sdqm
    tl.store(DV + cols[:, None] * sdvn + dims[None, :], dv)
    tl.store(DK + cols[:, None] * sdkn + dims[None, :], dk)


@triton.jit
def _bwd(Q, K, V, Bias, DO, DQ, DK, DV, Lse, Delta, scale,
         sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sbb,
         sdob, sdoh, sdom, sdqb, sdqh, sdqm, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
         nheads, seqlen, seqlen_rounded,
         HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, HEAD: tl.constexpr,
         SEQUENCE_PARALLEL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    Q += b * sqb + h * sqh
    K += b * skb + h * skh
    V += b * svb + h * svh
    DO += b * sdob + h * sdoh
    DQ += b * sdqb + h * sdqh
    DK += b * sdkb + h * sdkh
    DV += b * sdvb + h * sdvh
    Bias += b * sbb
    Lse += bh * seqlen_rounded
    Delta += bh * seqlen_rounded
    if SEQUENCE_PARALLEL:
        _bwd_key_block(tl.program_id(0), Q, K, V, Bias, DO, DQ, DK, DV, Lse, Delta, scale,
                       sqm, skn, svn, sdom, sdqm, sdkn, sdvn, seqlen, True, HAS_BIAS, CAUSAL,
                       HEAD, BM, BN)
    else:
        for kb in range(0, tl.cdiv(seqlen, BN)):
            _bwd_key_block(kb, Q, K, V, Bias, DO, DQ, DK, DV, Lse, Delta, scale,
                           sqm, skn, svn, sdom, sdqm, sdkn, sdvn, seqlen, False, HAS_BIAS,
                           CAUSAL, HEAD, BM, BN)


def _check(q: torch.Tensor) -> tuple[int, int, int, int]:
    batch, seqlen, heads, head = q.shape
    if head != 128 or seqlen % BLOCK:
        raise ValueError(f"flash_triton_2022 is kept for head dim 128 and sequences that are "
                         f"multiples of {BLOCK} (got head dim {head}, sequence {seqlen})")
    return batch, seqlen, heads, head


def forward(q, k, v, bias, causal: bool = True, round_trip: bool = True):
    """q, k, v: (batch, seq, heads, 128) views (any strides, last one 1); bias: (batch, 1, 1,
    seq) or None. Returns (out, lse, scale). `round_trip`: the rescale factors go through the
    global scratch buffer as in the original, with a barrier between the store and the load
    (today's Triton maps the two to different threads, so without it the output is wrong: seen
    on an H100, relative error 0.2-0.3); False keeps them in registers."""
    batch, seqlen, heads, head = _check(q)
    scale = 1.0 / math.sqrt(head)
    rounded = math.ceil(seqlen / BLOCK) * BLOCK
    lse = torch.empty((batch, heads, rounded), device=q.device, dtype=torch.float32)
    scratch = torch.empty((batch, heads, rounded), device=q.device, dtype=torch.float32)
    out = torch.empty((batch, seqlen, heads, head), device=q.device, dtype=q.dtype)
    has_bias = bias is not None
    sbb = bias.stride(0) if has_bias else 0
    _fwd[(triton.cdiv(seqlen, BLOCK), batch * heads)](
        q, k, v, bias if has_bias else q, out, lse, scratch, scale,
        q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1),
        v.stride(0), v.stride(2), v.stride(1), sbb,
        out.stride(0), out.stride(2), out.stride(1),
        heads, seqlen, rounded,
        HAS_BIAS=has_bias, CAUSAL=causal, HEAD=head, ROUND_TRIP=round_trip, BM=BLOCK,
        BN=BLOCK, num_warps=NUM_WARPS, num_stages=1)
    return out, lse, scale


def backward(do, q, k, v, out, lse, bias, sequence_parallel: bool, causal: bool = True):
    """dq, dk, dv for one of the kernel's two backward configurations (its autotuner times
    both per sequence length and keeps the faster)."""
    batch, seqlen, heads, head = _check(q)
    scale = 1.0 / math.sqrt(head)
    rounded = lse.shape[-1]
    do = do if do.stride(-1) == 1 else do.contiguous()
    dq = torch.empty((batch, seqlen, heads, head), device=q.device, dtype=q.dtype)
    dk, dv = torch.empty_like(dq), torch.empty_like(dq)
    dq_acc = torch.empty((batch, seqlen, heads, head), device=q.device, dtype=torch.float32)
    delta = torch.empty_like(lse)
    _bwd_delta[(triton.cdiv(seqlen, BLOCK), batch * heads)](
        out, do, delta, out.stride(0), out.stride(2), out.stride(1),
        do.stride(0), do.stride(2), do.stride(1), heads, rounded, BM=BLOCK, HEAD=head)
    dq_acc.zero_()  # the autotuner's pre_hook
    has_bias = bias is not None
    grid = (triton.cdiv(seqlen, BLOCK) if sequence_parallel else 1, batch * heads)
    _bwd[grid](
        q, k, v, bias if has_bias else q, do, dq_acc, dk, dv, lse, delta, scale,
        q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1),
        v.stride(0), v.stride(2), v.stride(1), bias.stride(0) if has_bias else 0,
        do.stride(0), do.stride(2), do.stride(1),
        dq_acc.stride(0), dq_acc.stride(2), dq_acc.stride(1),
        dk.stride(0), dk.stride(2), dk.stride(1), dv.stride(0), dv.stride(2), dv.stride(1),
        heads, seqlen, rounded,
        HAS_BIAS=has_bias, CAUSAL=causal, HEAD=head, SEQUENCE_PARALLEL=sequence_parallel,
        BM=BLOCK, BN=BLOCK, num_warps=NUM_WARPS, num_stages=1)
    dq.copy_(dq_acc)
    return dq, dk, dv


def llmfoundry_inputs(batch: int, seqlen: int, heads: int, head: int = 128,
                      device="cuda", dtype=torch.bfloat16, generator=None):
    """q, k, v as llm-foundry hands them over: chunks of the fused Wqkv output (b, s, 3 h d)
    viewed as (b, s, h, d), and the (b, 1, 1, s) bias its `_attn_bias` makes of an all-ones
    attention_mask."""
    qkv = torch.randn(batch, seqlen, 3 * heads * head, device=device, dtype=dtype,
                      generator=generator)
    q, k, v = (t.view(batch, seqlen, heads, head) for t in qkv.chunk(3, dim=2))
    bias = torch.zeros(batch, 1, 1, seqlen, device=device, dtype=dtype)
    return q, k, v, bias
