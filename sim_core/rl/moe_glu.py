"""The routed experts' activation when Megatron-Core runs it eagerly, with the router's probabilities
in a wider dtype: the HBM traffic the pre-training step does not count.

Why a module of its own: the pre-training step prices the experts' SwiGLU as one fused pass
(sim_core/workload.py: 2 f-wide bf16 reads and one write per routed copy, twice that backward),
which is what Megatron-Core runs with `bias_activation_fusion` (the fused `weighted_bias_swiglu_impl`
that also applies the router probabilities). Two RL configurations differ from it:

- NeMo RL v0.3.0 builds its Qwen3 MoE models from NeMo's `Qwen3MoEConfig` (NVIDIA/NeMo 33259f25,
  nemo/collections/llm/gpt/model/qwen3.py via nemo/tron/converter/qwen.py), which, like its
  `GPTConfig`, leaves `bias_activation_fusion` at Megatron-Core's default False
  (megatron/core/transformer/transformer_config.py L201 at Megatron-LM 2ff0f099, NeMo RL v0.3.0's
  submodule; NeMo's DeepSeek configs set it True). `TEGroupedMLP.forward`
  (megatron/core/transformer/moe/experts.py at 2ff0f099) then runs the activation eagerly:
  `chunk`, `silu(x0) * x1`, `* permuted_probs`, `.to(original_dtype)`.
- NeMo RL sets `moe_router_dtype: "fp64"` for every Megatron run (examples/configs/
  grpo_math_1B_megatron.yaml at v0.3.0, applied in megatron_policy_worker.py L475). The router
  (`TopKRouter.gating`, router.py at 2ff0f099) computes the probabilities in fp64; TE's fused
  permute keeps their dtype (TransformerEngine v2.3, NeMo RL's pin, pytorch/triton/permutation.py
  `permuted_probs = torch.empty(..., dtype=probs.dtype)`), so the eager multiply promotes the
  [copies, ffn] activation to fp64 and casts it back (Megatron's own comment in moe_utils.py
  `unpermute`: "may promote permuted_tokens to higher precision (fp32/fp64) if probs is in higher
  precision due to moe_router_dtype").

Bytes per routed copy and per expert-FFN element (`eager_bytes`), counted from that code with
r = the probabilities' element size (2 bf16, 4 fp32, 8 fp64), w = max(2, r) the product's:
forward silu 2 + 2, gate multiply 4 + 2, probability multiply 2 + w, cast back w + 2 when w > 2;
backward (autograd of the same ops) cast 2 + w, the product's gradient w + w (+ w + 2 cast),
the probabilities' gradient 2w + 2 + w (product, reduction over ffn), the gate multiply's two
gradients 6 + 6, silu's 4 + 2, the chunk's concatenation 4 + 4. Less the fused pass the core
already prices (6 forward, 12 backward): 8 / 26 extra with bf16 probabilities, 16 / 48 with
fp32, 24 / 76 with fp64. Each count good to about a fifth (no profile); priced at the HBM
bandwidth times efficiency.yaml's `elementwise` efficiency. A full recompute replays the forward.

Nothing here is fitted. Optional row columns: `train_moe_glu_fusion` (blank: off for a Qwen3
MoE model under NeMo RL, whose configs differ by model family, on elsewhere: the core's
assumption) and `train_moe_router_dtype` (blank: NeMo RL fp64, else the activations' bf16;
slime's Qwen3 scripts state fp32, which matters only unfused).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import catalog, compute
from .inputs import RL_FRAMEWORK, recompute_mode, stated_flag, train_col
from .moe_host import rows as megatron_moe_rows

# element size of the router's probabilities (Megatron-Core `moe_router_dtype`; None = bf16)
ROUTER_DTYPES = {"bf16": 2.0, "fp32": 4.0, "fp64": 8.0}
# the bytes the pre-training step already prices for the fused activation (workload.py act_rw)
FUSED_FWD, FUSED_BWD = 6.0, 12.0


def eager_bytes(prob_bytes) -> dict:
    """HBM bytes per routed copy and expert-FFN element of the eager activation, forward and
    backward, counted from TEGroupedMLP's unfused path (module docstring)."""
    r = np.asarray(prob_bytes, dtype=float)
    w = np.maximum(r, 2.0)
    cast = w > 2.0
    fwd = 4.0 + 6.0 + (2.0 + w) + np.where(cast, w + 2.0, 0.0)
    bwd = (np.where(cast, 2.0 + w, 0.0) + 2.0 * w + np.where(cast, w + 2.0, 0.0)
           + (3.0 * w + 2.0) + 12.0 + 6.0 + 8.0)
    return {"fwd": fwd, "bwd": bwd}


def glu_fused(df: pd.DataFrame, b) -> np.ndarray:
    """`train_moe_glu_fusion` per row (Megatron's bias_activation_fusion); blank: off for a
    Qwen3 MoE model under NeMo RL (NeMo 33259f25's Qwen3MoEConfig leaves it at Megatron's
    False), on elsewhere (the core's assumption; NeMo's DeepSeek configs and slime's
    `--no-bias-swiglu-fusion`-free scripts turn it on)."""
    model = df["model"].astype(str).str.lower() if "model" in df.columns \
        else pd.Series("", index=df.index)
    nemo_qwen3 = ((np.asarray(b.rl_framework) == RL_FRAMEWORK.index("nemo_rl"))
                  & model.str.contains("qwen3").to_numpy() & (np.asarray(b.experts) > 0))
    return stated_flag(df, "train_moe_glu_fusion", ~nemo_qwen3)


def prob_bytes(df: pd.DataFrame, b) -> np.ndarray:
    """Element size of the router probabilities: `train_moe_router_dtype` (bf16, fp32, fp64),
    blank: NeMo RL's fp64, else bf16."""
    default = np.where(np.asarray(b.rl_framework) == RL_FRAMEWORK.index("nemo_rl"), 8.0, 2.0)
    if "train_moe_router_dtype" not in df.columns:
        return default
    col = df["train_moe_router_dtype"]
    s = col.astype(object).where(col.notna(), "").astype(str).str.strip().str.lower()
    s = s.replace({"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "nan": ""})
    bad = ~s.isin(["", *ROUTER_DTYPES])
    if bad.any():
        raise catalog.CatalogError(
            f"train_moe_router_dtype: '{col[bad].iloc[0]}' is not one of "
            f"{', '.join(ROUTER_DTYPES)}")
    stated = s.map(ROUTER_DTYPES).to_numpy(dtype=float)
    return np.where(np.isnan(stated), default, stated)


def exposed(b, df: pd.DataFrame, tf: pd.DataFrame, sim: pd.DataFrame, tok_ratio) -> dict:
    """Seconds the eager activation adds, per optimizer step of the training frame: `update_s`
    (forward + backward of its micro-batches, the forward again under a full recompute) and
    `log_prob_s` (one forward-only pass over the same tokens: `tok_ratio` times the training
    frame's, nemo_rl.dynamic_logprob_ratios). Also `extra_fwd_s`, `extra_bwd_s`: per MoE layer
    and training micro-batch."""
    on = megatron_moe_rows(b, tf) & ~glu_fused(df, b)
    extra = eager_bytes(prob_bytes(df, b))
    tp = np.maximum(train_col(tf, "tp"), 1.0)
    cp = np.maximum(train_col(tf, "cp"), 1.0)
    sp = tf["sequence_parallel"].astype(object).eq(True).to_numpy() \
        if "sequence_parallel" in tf else np.zeros(len(tf), dtype=bool)
    mb = train_col(tf, "micro_batch")
    # routed copies x expert-FFN elements on one rank: the MoE layer's input is the rank's
    # sequence-parallel shard; expert TP splits the FFN and gathers the copies alike
    tokens = tf["seq_len"].to_numpy(float) * mb / (cp * np.where(sp, tp, 1.0))
    elems = tokens * b.top_k * b.expert_ffn
    hbm = b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
    x_f = (extra["fwd"] - FUSED_FWD) * elems / hbm
    x_b = (extra["bwd"] - FUSED_BWD) * elems / hbm
    pp = np.maximum(train_col(tf, "pp"), 1.0)
    layers = np.maximum(np.ceil(b.layers / pp), 1.0)
    moe = np.minimum(np.ceil(b.moe_layers / pp), layers)  # on the busiest stage
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    rc = recompute_mode(tf)
    replay = np.where(rc == "full", x_f, 0.0)
    zero = np.zeros(len(tf))
    return {"update_s": np.where(on, m * moe * (x_f + x_b + replay), zero),
            "log_prob_s": np.where(on, m * moe * x_f * np.asarray(tok_ratio, dtype=float),
                                   zero),
            "extra_fwd_s": np.where(on, x_f, zero), "extra_bwd_s": np.where(on, x_b, zero)}
