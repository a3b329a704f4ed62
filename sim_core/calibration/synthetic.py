"""Synthetic calibration examples with known ground truth (no GPU was available to measure
real kernels): `python -m sim_core.calibration.synthetic make-examples [DIR]` writes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .. import nccl
from .kernels import KERNEL_CLASSES, KERNEL_COLUMNS, _wave_eff
from .nccl import base_network, scale_net
from .training import _gpu_row

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "data" / "calibration_examples"


# =============================================================================================
# Synthetic examples (known ground truth; no GPU was available to measure real kernels)
# =============================================================================================
SYNTH_GPU = "h100-sxm"
# ground-truth efficiency surface of the synthetic GEMMs (not the simulator's curve on purpose)
SYNTH_GEMM = {"emax_bf16": 0.80, "emax_fp8": 0.66, "k_half": 320.0, "mn_half": 96.0}
SYNTH_ATTN = {"fwd": 0.62, "bwd": 0.48, "seq_half": 768.0, "d_half": 24.0}
# ground-truth slowdowns: base by (arch, class), collective multiplier, size saturation
SYNTH_SLOW_BASE = {(80, "gemm"): 0.26, (80, "attention"): 0.20, (80, "elementwise"): 0.40,
                   (90, "gemm"): 0.15, (90, "attention"): 0.12, (90, "elementwise"): 0.28}
SYNTH_SLOW_COLL = {"all_reduce": 1.0, "all_gather": 0.8, "reduce_scatter": 0.9,
                   "all_to_all": 1.2, "send_recv": 0.5}
SYNTH_SLOW_HALF = 8 * 2**20  # bytes at which half the base slowdown is reached
# perturbed cluster used for the synthetic nccl-tests outputs (the fit should recover these)
SYNTH_NCCL_SCALES = {"nvlink_bw": 0.88, "nic_bw": 0.80, "intra_latency": 1.6,
                     "inter_latency": 1.3}


def synth_gemm_eff(m, n, k, fp8):
    g = SYNTH_GEMM
    emax = np.where(fp8, g["emax_fp8"], g["emax_bf16"])
    mn = np.minimum(m, n)
    return emax * _wave_eff(m, n, 132) ** 0.7 * k / (k + g["k_half"]) * mn / (mn + g["mn_half"])


def synth_attn_eff(seq, head_dim, backward):
    a = SYNTH_ATTN
    base = np.where(backward, a["bwd"], a["fwd"])
    return base * seq / (seq + a["seq_half"]) * head_dim / (head_dim + a["d_half"])


def synth_slowdown(sm_arch, kernel_class, collective, nbytes, group):
    base = np.array([SYNTH_SLOW_BASE[(int(a), c)] for a, c in zip(sm_arch, kernel_class)])
    coll = np.array([SYNTH_SLOW_COLL[c] for c in collective])
    size = nbytes / (nbytes + SYNTH_SLOW_HALF)
    return 1.0 + base * coll * size * (1.0 + 0.03 * np.log2(group))


def make_kernel_table(seed: int = 0, noise: float = 0.02, scale: float = 1.0) -> pd.DataFrame:
    """Synthetic H100 GEMM + attention kernel times from the known surfaces above (efficiency
    multiplied by `scale`: tests use a deliberately slow GPU)."""
    rng = np.random.default_rng(seed)
    r = _gpu_row(SYNTH_GPU)
    rows = []
    dims = [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 28672]
    for _ in range(700):
        m, n, k = (float(rng.choice(dims)) for _ in range(3))
        fp8 = bool(rng.random() < 0.25)
        eff = synth_gemm_eff(m, n, k, fp8) * scale
        peak = (r["peak_fp8"] if fp8 else r["peak_bf16"]) * 1e12
        t = 2 * m * n * k / (eff * peak) * rng.lognormal(0, noise)
        rows.append({"gpu": SYNTH_GPU, "op_class": "gemm", "dtype": "fp8" if fp8 else "bf16",
                     "m": m, "n": n, "k": k, "batch": 1, "time_us": t * 1e6,
                     "source": f"sweep{rng.integers(3)}"})
    for bsz in (1, 2, 4):
        for heads in (8, 16, 32, 64):
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                for d in (64, 128):
                    for bwd in (False, True):
                        flops = 4.0 * bsz * heads * s * s * d * 0.5 * (2.5 if bwd else 1.0)
                        eff = synth_attn_eff(s, d, bwd) * scale
                        t = flops / (eff * r["peak_bf16"] * 1e12) * rng.lognormal(0, noise)
                        rows.append({"gpu": SYNTH_GPU, "op_class": "attention", "dtype": "bf16",
                                     "batch": bsz, "heads": heads, "seq": s, "head_dim": d,
                                     "causal": 1, "direction": "bwd" if bwd else "fwd",
                                     "time_us": t * 1e6, "source": f"sweep{rng.integers(3)}"})
    df = pd.DataFrame(rows)
    for c in KERNEL_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    df["time_us"] = df["time_us"].round(3)
    return df[list(KERNEL_COLUMNS)]


def make_overlap_table(n: int = 1200, seed: int = 0, noise: float = 0.005,
                       scale: float = 1.0) -> pd.DataFrame:
    """Synthetic kernel times alone and overlapped, from SYNTH_SLOW_* (Ampere and Hopper);
    `scale` multiplies the slowdown above 1 (tests)."""
    rng = np.random.default_rng(seed)
    gpus = {80: "a100-80gb", 90: "h100-sxm"}
    arch = rng.choice([80, 90], n)
    kc = rng.choice(list(KERNEL_CLASSES), n)
    co = rng.choice(list(SYNTH_SLOW_COLL), n)
    nbytes = 2.0 ** rng.integers(16, 31, n)
    group = 2.0 ** rng.integers(1, 5, n)
    alone = np.exp(rng.uniform(np.log(5), np.log(5000), n))
    f = 1.0 + scale * (synth_slowdown(arch, kc, co, nbytes, group) - 1.0)
    over = alone * f * rng.lognormal(0, noise, n)
    return pd.DataFrame({"gpu": [gpus[a] for a in arch], "sm_arch": arch, "kernel_class": kc,
                         "collective": co, "nbytes": nbytes.astype(np.int64),
                         "group": group.astype(np.int64), "time_alone_us": alone.round(3),
                         "time_overlap_us": over.round(3),
                         "source": [f"run{i % 4}" for i in range(n)]})


_NCCL_TESTS = (("all_reduce", 8, 1), ("all_reduce", 16, 2), ("all_gather", 16, 2),
               ("reduce_scatter", 8, 1))


def nccl_tests_text(op: str, group: int, nodes: int, net: dict, scales: dict, seed: int = 0,
                    noise: float = 0.01, device: str = "NVIDIA H100 80GB HBM3") -> str:
    """nccl-tests stdout (2.13+ format, with the root column) generated from the model."""
    rng = np.random.default_rng(seed)
    binary = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
              "reduce_scatter": "reduce_scatter_perf"}[op]
    ppn = group // nodes
    lines = [f"# SYNTHETIC: generated by `python -m sim_core.calibration.synthetic make-examples` from the NCCL "
             f"model with scales {json.dumps(scales)} and {noise:.0%} noise; not a measurement.",
             f"# command: {binary} -b 8 -e 8G -f 2 -g 1 (one process per GPU, {group} ranks)",
             "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
             "iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    for rk in range(group):
        host = f"node{rk // ppn + 1:02d}"
        lines.append(f"#  Rank {rk:2d} Group  0 Pid {4000 + rk:6d} on {host:>8} device "
                     f"{rk % ppn:2d} [0x{(rk % ppn) * 16 + 0x18:02x}] {device}")
    lines += ["#", "#                                                              out-of-place "
              "                      in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
              "          (us)  (GB/s)  (GB/s)       "]
    sizes = [2 ** i for i in range(3, 34)]
    code = np.full(len(sizes), nccl.COLLECTIVES.index(op))
    t = nccl.collective_time(code, np.array(sizes, float), group, nodes,
                             scale_net(net, scales))["time_s"] * 1e6
    fb = float(nccl.bus_factor(np.array([code[0]]), np.array([group]))[0])
    for s, tt in zip(sizes, t):
        row = [f"{s:12d}", f"{s // 4:12d}", "   float", "    sum" if op != "all_gather" else "   none",
               "     -1"]
        for _ in range(2):  # out-of-place, in-place (independent noise)
            ti = tt * rng.lognormal(0, noise)
            alg = s / (ti * 1e-6) / 1e9
            row += [f"{ti:8.2f}", f"{alg:7.2f}", f"{alg * fb:7.2f}", "     0"]
        lines.append(" ".join(row))
    avg = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : (see rows)\n#"
    return "\n".join(lines) + "\n" + avg + "\n"


def _nsys_example() -> str:
    return "\n".join([
        '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)",'
        '"StdDev (ns)","Name"',
        '41.2,824000000,2000,412000.0,411000.0,405000,430000,3000.1,'
        '"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"',
        '22.5,450000000,1000,450000.0,449000.0,440000,470000,4000.2,'
        '"void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, true>(flash::Flash_fwd_params)"',
        '15.1,302000000,500,604000.0,600000.0,590000,650000,9000.5,'
        '"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"',
        '8.0,160000000,4000,40000.0,39800.0,39000,42000,500.0,'
        '"void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, '
        'at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"',
    ]) + "\n"


def _torch_trace_example() -> dict:
    """A minimal chrome trace in the PyTorch profiler's layout (synthetic times)."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 100,
           "dur": 60, "args": {"External id": 1, "Input Dims": [[8192, 4096], [11008, 4096], []],
                               "Input type": ["c10::BFloat16", "c10::BFloat16", ""]}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 110,
           "dur": 40, "args": {"External id": 2, "Input Dims": [[8192, 4096], [4096, 11008]],
                               "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
           "ts": 120, "dur": 5, "args": {"correlation": 11}},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
           "pid": 0, "tid": 7, "ts": 130, "dur": 1010.5, "args": {"correlation": 11,
                                                                  "External id": 2}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention",
           "pid": 1, "tid": 1, "ts": 300, "dur": 50,
           "args": {"External id": 3, "Input Dims": [[2, 32, 4096, 128], [2, 32, 4096, 128],
                                                      [2, 32, 4096, 128], [], []],
                    "Input type": ["c10::BFloat16"] * 3}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::_flash_attention_forward", "pid": 1,
           "tid": 1, "ts": 305, "dur": 40,
           "args": {"External id": 4, "Input Dims": [[2, 4096, 32, 128], [2, 4096, 32, 128],
                                                      [2, 4096, 32, 128]],
                    "Input type": ["c10::BFloat16"] * 3}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
           "ts": 310, "dur": 5, "args": {"correlation": 12}},
          {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "pid": 0, "tid": 7,
           "ts": 1200, "dur": 980.0, "args": {"correlation": 12, "External id": 4}}]
    return {"schemaVersion": 1, "traceEvents": ev,
            "note": "SYNTHETIC example in the PyTorch profiler chrome-trace layout"}


SYNTH_HEADER = ("# SYNTHETIC data generated by `python -m sim_core.calibration.synthetic make-examples` from the "
                "known ground truth in sim_core/calibration/synthetic.py ({what}); NOT a measurement.\n")


def make_examples(out: Path = EXAMPLES_DIR) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def write(name, text):
        p = out / name
        p.write_text(text)
        written.append(p)

    write("kernels_h100_synthetic.csv",
          SYNTH_HEADER.format(what=f"SYNTH_GEMM={SYNTH_GEMM}, SYNTH_ATTN={SYNTH_ATTN}, 2% "
                                   "lognormal noise") + make_kernel_table().to_csv(index=False))
    write("overlap_synthetic.csv",
          SYNTH_HEADER.format(what="synth_slowdown(): SYNTH_SLOW_BASE x SYNTH_SLOW_COLL x "
                                   "size saturation x group term, 0.5% noise")
          + make_overlap_table().to_csv(index=False))
    net = base_network(SYNTH_GPU)
    for i, (op, g, nn) in enumerate(_NCCL_TESTS):
        write(f"{op}_perf_{g}gpu_{nn}node_synthetic.txt",
              nccl_tests_text(op, g, nn, net, SYNTH_NCCL_SCALES, seed=i))
    write("nsys_kern_sum_synthetic.csv", _nsys_example())
    write("torch_trace_synthetic.json", json.dumps(_torch_trace_example(), indent=1) + "\n")
    return written


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "make-examples":
        print("usage: python -m sim_core.calibration.synthetic make-examples [DIR]")
        return 2
    for p in make_examples(Path(argv[1]) if len(argv) > 1 else EXAMPLES_DIR):
        print(f"wrote {p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
