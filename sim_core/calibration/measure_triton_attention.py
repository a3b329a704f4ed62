"""Time FlashAttention's 2022 Triton kernel (llm-foundry's `attn_impl: triton`) beside
FlashAttention-2 and cuDNN at the attention shapes of llm-foundry's H100 throughput tables, and
write them as a kernel table (the format of `measure.py`).

Why: 65 of the 77 H100 rows of those tables ran this kernel, and with no Hopper timing of it the
simulator priced it as a ratio to FA2 taken from an A100 benchmark, so the sequence-length trend
of those rows could not be told from the kernel's (issue 36). The kernel is rebuilt for current
Triton in `flash_triton_2022.py`; its original compiler (triton-pre-mlir, 2022) emitted Ampere's
mma.sync on Hopper, so the suite is meant to run twice: as Triton compiles it today (wgmma) and
with `DISABLE_MMA_V3=1` (Triton's switch back to mma.sync), each row saying which.

    python -m sim_core.calibration.measure_triton_attention --out t.csv [--budget-s 200]
    DISABLE_MMA_V3=1 python -m sim_core.calibration.measure_triton_attention --out t2.csv \
        --no-sdpa

Each shape is a (micro-batch, heads, sequence) that one of those rows ran on each GPU (FSDP, so
all of the model's heads, head dim 128). Rows: forward with the rescale factors through the
scratch buffer as the original (`rescale=scratch`) and in registers (`rescale=registers`);
backward of each of the kernel's two
autotuned configurations (`bwd=serial`: one program per batch x head, `bwd=seqpar`: one per key
block with atomic dq; the autotuner keeps the faster), timed directly (delta pass, dq zeroing and
copy included); FA2 and cuDNN through SDPA, backward = (forward + backward) - forward as in
measure.py. A correctness row first: the kernel against an fp32 reference on random inputs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from .measure import Timer, _row, _Writer, add_timed, failed_note, open_cuda, time_attention

# (micro-batch, heads, sequence) of the 77 H100 rows of llm-foundry's throughput tables
# (mosaicml/llm-foundry@8c8dd48 scripts/train/benchmarking/README.md; /shared/calibration/
# llmfoundry-h100/runs.csv: mbs, heads, seq_len), each distinct shape once, smallest work first.
LLMFOUNDRY_H100_SHAPES = (
    (96, 12, 512), (48, 12, 1024), (24, 12, 2048), (12, 12, 4096), (6, 12, 8192),
    (3, 12, 16384), (1, 12, 32768),
    (56, 16, 512), (18, 16, 1024), (12, 16, 2048), (14, 16, 2048), (20, 16, 2048),
    (7, 16, 4096), (2, 16, 8192), (3, 16, 8192), (2, 16, 16384), (1, 16, 32768),
    (1, 16, 65536),
    (40, 20, 512), (20, 20, 1024), (6, 20, 2048), (8, 20, 2048), (10, 20, 2048),
    (5, 20, 4096), (3, 20, 8192), (1, 20, 16384), (3, 20, 32768), (1, 20, 65536),
    (64, 32, 1024), (6, 32, 2048), (16, 32, 4096), (8, 32, 8192), (2, 32, 32768),
    (1, 32, 65536),
    (40, 40, 1024), (2, 40, 2048), (16, 40, 2048), (10, 40, 4096), (3, 40, 16384),
    (1, 40, 32768),
    (6, 56, 1024), (3, 56, 2048), (8, 56, 2048), (10, 56, 2048), (14, 56, 2048),
    (1, 56, 4096), (1, 56, 8192),
    (2, 64, 2048), (8, 64, 2048),
)
HEAD_DIM = 128


def causal_flops(batch: int, heads: int, seq: int, head: int = HEAD_DIM) -> float:
    """Useful forward FLOPs of causal attention: two GEMMs over half the s x s pairs."""
    return 2.0 * batch * heads * seq * seq * head


def mma_path() -> str:
    return "mma_v2" if os.environ.get("DISABLE_MMA_V3", "0") not in ("", "0") else "native"


def correctness(torch, ft) -> str:
    """Relative errors of forward and both backward configurations against fp32 autograd on
    random q, k, v, bias and dO (bf16 operands: expect about 1e-2 or less)."""
    g = torch.Generator(device="cuda").manual_seed(1234)
    q, k, v, bias = ft.llmfoundry_inputs(2, 1024, 4, generator=g)
    bias = torch.randn(bias.shape, device="cuda", generator=g).to(bias.dtype)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    s = (qf.transpose(1, 2) @ kf.permute(0, 2, 3, 1)) / math.sqrt(HEAD_DIM) + bias.float()
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = (s.softmax(-1) @ vf.transpose(1, 2)).transpose(1, 2)
    do = torch.randn(ref.shape, device="cuda", generator=g)
    ref.backward(do)

    def rel(a, x):
        return float((a.float() - x).norm() / x.norm())
    out, lse, _ = ft.forward(q, k, v, bias, round_trip=False)
    parts = [f"fwd registers {rel(out, ref.detach()):.1e}"]
    out, lse, _ = ft.forward(q, k, v, bias)
    parts.append(f"fwd scratch {rel(out, ref.detach()):.1e}")
    for sp in (False, True):
        dq, dk, dv = ft.backward(do.to(q.dtype), q, k, v, out, lse, bias, sp)
        parts.append(f"bwd {'seqpar' if sp else 'serial'} dq {rel(dq, qf.grad):.1e} "
                     f"dk {rel(dk, kf.grad):.1e} dv {rel(dv, vf.grad):.1e}")
    return "; ".join(parts)


def time_triton(torch, timer, ft, batch: int, heads: int, seq: int, sm_count: int,
                forward_only: bool = False) -> dict:
    """Forward and the backward configurations of the 2022 kernel on llm-foundry's inputs. The
    serial backward runs one program per (batch, head): with fewer of them than half the SMs it
    cannot be the one the autotuner keeps, so it is not timed there (it would cost device time
    for nothing: at (1, 16, 65,536) it leaves 116 of 132 SMs idle)."""
    q, k, v, bias = ft.llmfoundry_inputs(batch, seq, heads)
    out, lse, _ = ft.forward(q, k, v, bias)
    do = torch.randn_like(out)
    res = {"fwd scratch": timer(lambda _: ft.forward(q, k, v, bias)),
           "fwd registers": timer(lambda _: ft.forward(q, k, v, bias, round_trip=False))}
    if forward_only:
        return res
    for sp in ((False, True) if batch * heads >= sm_count // 2 else (True,)):
        res["bwd seqpar" if sp else "bwd serial"] = timer(
            lambda _, sp=sp: ft.backward(do, q, k, v, out, lse, bias, sp))
    return res


def run(out: Path, budget_s: float, sdpa: bool, forward_only: bool = False, log=print) -> int:
    torch, mods, dev, gpu, source = open_cuda("measure_triton_attention",
                                              "PyTorch with CUDA and Triton", "triton")
    triton = mods["triton"]
    from . import flash_triton_2022 as ft

    path = mma_path()
    w = _Writer(out, [
        f"attention kernel table measured by python -m sim_core.calibration.measure_triton_attention "
        f"on {time.strftime('%Y-%m-%d')}",
        f"device: {dev['name']}, {dev['sm_count']} SMs, L2 {dev['l2_bytes'] / 2**20:.0f} MiB; "
        f"torch {torch.__version__}, triton {triton.__version__}, cuDNN "
        f"{torch.backends.cudnn.version()}; Triton MMA path: {path}",
        "shapes: (micro-batch, heads, sequence) of llm-foundry's H100 rows, head dim 128, causal; "
        "triton = flash_triton_2022.py (llm-foundry v0.3.0 flash_attn_triton.py's algorithm)"])
    timer = Timer(torch)
    t0 = time.monotonic()
    check = correctness(torch, ft)
    log(f"correctness ({path}): {check}")
    w.add(_row(gpu, source, op_class="attention", dtype="bf16", batch=2, heads=4, seq=1024,
               head_dim=HEAD_DIM, causal=1, kernel="triton", op="correctness",
               note=f"mma={path}; {check}"))
    shapes = sorted(LLMFOUNDRY_H100_SHAPES, key=lambda s: causal_flops(*s))
    for batch, heads, seq in shapes:
        if time.monotonic() - t0 > budget_s:
            log(f"stopped at the {budget_s:.0f} s budget before {(batch, heads, seq)}")
            break
        base = dict(op_class="attention", dtype="bf16", batch=batch, heads=heads, seq=seq,
                    head_dim=HEAD_DIM, causal=1, op="attention", tokens=batch * seq)
        try:
            for name, (t, s) in time_triton(torch, timer, ft, batch, heads, seq,
                                                    dev["sm_count"], forward_only).items():
                direction, _, how = name.partition(" ")
                what = "bwd" if direction == "bwd" else "rescale"
                w.add(_row(gpu, source, **base, direction=direction, time_us=t, spread=s,
                           kernel="triton", note=f"mma={path}; {what}={how}"))
        except Exception as exc:  # a shape the kernel refuses: say so, keep going
            w.add(_row(gpu, source, **base, kernel="triton",
                       note=f"mma={path}; {failed_note(exc)}"))
        torch.cuda.empty_cache()
        if not sdpa or forward_only:
            continue
        for backend in ("flash", "cudnn"):
            try:
                res = time_attention(torch, timer, backend, heads, seq, HEAD_DIM,
                                     dev["l2_bytes"], batch=batch)
            except Exception as exc:
                w.add(_row(gpu, source, **base, kernel=backend, note=failed_note(exc)))
                continue
            add_timed(w, gpu, source, base, res, kernel=backend)
            torch.cuda.empty_cache()
        log(f"{(batch, heads, seq)} done, {time.monotonic() - t0:.0f} s")
    log(f"wrote {w.rows} rows to {out} in {time.monotonic() - t0:.0f} s")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim_core.calibration.measure_triton_attention",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="kernel table CSV to write")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="stop starting new shapes after this many seconds")
    p.add_argument("--no-sdpa", action="store_true",
                   help="time only the Triton kernel (FA2 and cuDNN were timed in another run)")
    p.add_argument("--forward-only", action="store_true",
                   help="time only the Triton kernel's forward (both rescale paths)")
    a = p.parse_args(argv)
    return run(a.out, a.budget_s, sdpa=not a.no_sdpa, forward_only=a.forward_only)


if __name__ == "__main__":
    sys.exit(main())
