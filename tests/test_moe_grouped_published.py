"""The core's MoE expert GEMM pricing against Transformer Engine's published grouped GEMM throughput
on an H100 (data/kernels/published/te_grouped_gemm.csv, TE pull request #2045) and this
project's own H100 measurement at the RL shape (data/kernels/h100-sxm-moe.csv): at Qwen3-30B-A3B's
expert shapes the core is not faster than the kernels, so the RL rows' too-fast MoE update
(docs/rl.md, "Megatron MoE at RL shapes") does not come from the expert GEMMs."""

from importlib import resources

import numpy as np
import pandas as pd

from sim_core import catalog, compute
from sim_core.columns import Batch

DATA = resources.files("sim_core").joinpath("data/kernels")


def _core_tflops(m, n, k):
    """TFLOP/s the compute model gives a bf16 expert GEMM of one expert's shape on an H100:
    the curve without K-splitting (a grouped GEMM cannot split K) times grouped_gemm."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    b = Batch(sm_arch=np.full(m.shape, 90.0), sm_count=np.full(m.shape, 132.0))
    eff = compute.gemm_efficiency(b, m, n, k, np.zeros(m.shape, dtype=bool), split_k=False)
    return catalog.peak_tflops("h100-sxm") * eff * compute.efficiency_table()[90][
        "grouped_gemm"]["bf16"]


def test_published_table_is_cited_and_complete():
    t = pd.read_csv(DATA / "published/te_grouped_gemm.csv", comment="#")
    assert len(t) == 8 and t["source"].str.contains("TransformerEngine/pull/2045").all()
    assert set(t["backend"]) == {"multi_stream", "cutlass"}
    # the newer TE and the single-launch kernel are never slower than TE 2.2's multi-stream path
    ms22 = t[(t.te_version == "2.2") & (t.backend == "multi_stream")].set_index("groups")
    for _, r in t.iterrows():
        assert r.tflops >= ms22.loc[r.groups, "tflops"]


def test_core_is_not_faster_than_te_multi_stream_grouped_gemm():
    """TE 2.2's multi-stream cuBLAS path (the one TE 2.3, NeMo RL v0.3.0's pin, runs): 509 and
    399 TFLOP/s at 4,096 and 2,048 rows per expert; the core prices both shapes at ~323."""
    t = pd.read_csv(DATA / "published/te_grouped_gemm.csv", comment="#")
    ms = t[(t.te_version == "2.2") & (t.backend == "multi_stream")]
    core = _core_tflops(ms.m, ms.n, ms.k)
    ratio = core / ms["tflops"].to_numpy()
    assert (ratio <= 1.0).all() and (ratio > 0.55).all()


def test_core_is_not_faster_than_the_measured_grouped_mm_at_the_rl_shape():
    """NeMo RL's Qwen3-30B-A3B row (TP2 SP EP8) gives each of 16 local experts ~1,024 rows per
    micro-batch; this project's H100 measured one torch._grouped_mm at 1,024 rows x 32 experts
    (FC1 1536 x 2048, FC2 2048 x 768) above the core's price for those shapes."""
    t = pd.read_csv(DATA / "h100-sxm-moe.csv", comment="#")
    g = t[(t.model == "qwen3-30b-a3b") & (t.kernel == "grouped_mm") & (t.m == 1024)]
    assert len(g) == 4
    measured = 2 * g.m * g.n * g.k * g.batch / (g.time_us * 1e-6) / 1e12
    core = _core_tflops(g.m, g.n, g.k)
    assert (core < measured.to_numpy()).all()
