"""Uneven expert-parallel load when an RL framework trains an MoE model without load balancing:
the training frame's routing skew (`expert_skew`), set from published per-rank measurements.

Why: the pre-training step prices balanced routing (expert_skew 0; pre-training runs train with
a balancing loss or force-balanced routing, sim_core/moe.py). RL frameworks train the router
without one, so the routed copies each EP rank receives follow the pretrained router's
preferences on the RL data, uneven across ranks; the layer runs at its busiest rank's pace
(Megatron-Core's alltoall dispatcher is one collective per dispatch / combine, and each rank's
TEGroupedMLP runs the rows it received: megatron/core/transformer/moe/token_dispatcher.py and
experts.py at Megatron-LM 2ff0f099). Read at the rows' versions:

- NeMo RL v0.3.0 (examples/configs/grpo_math_1B_megatron.yaml, every Megatron run):
  `moe_router_load_balancing_type: none`, `moe_router_bias_update_rate: 0`,
  `freeze_moe_router: true` (the router is not trained at all);
- slime 05370bf9 (scripts/models/qwen3-30B-A3B.sh), which LMSYS's Miles runs:
  `--moe-aux-loss-coeff 0` (the aux loss is computed and scaled by 0);
- SkyRL's GLM-4.7-Flash Megatron run (scripts/glm47_h200/02_train_4x8_h200.sh at 0355eb7d):
  `moe_aux_loss_coeff=0.0`, `moe_router_enable_expert_bias=true` with
  `moe_router_bias_update_rate=0` (the pretrained bias is kept, not updated);
- verl's Megatron workers build the model's TransformerConfig in
  verl/models/mcore/config_converter.py (same at v0.6.0, v0.7.0 and 448c6c35, the commit the
  Ascend recipes cherry-pick): `hf_to_mcore_config_qwen2moe`, `_mixtral` and `_qwen3moe` set
  `moe_router_load_balancing_type="none"` ("turn off aux_loss as it hurts perf in RL"):
  unbalanced; `hf_to_mcore_config_dpskv3` (DeepSeek-V3, MLA) sets `seq_aux_loss` and
  `moe_router_enable_expert_bias` with `moe_router_bias_update_rate` 0.001 (the
  aux-loss-free bias updated every step): left balanced, as the rule reads balancing terms.
None sets `moe_expert_capacity_factor`, so Megatron-Core routes dropless (its default None):
imbalance costs time, not tokens.

The measured imbalance (`published()`, data/rl/ep_load_published.csv): the busiest rank's load
over the mean, per measurement, with the catalog models whose router it stands for.
- Default: TensorRT-LLM's `examples/wide_ep/ep_load_balancer/README.md` (commit 2a595f81)
  counts the routed copies per EP rank of DeepSeek-R1 (256 experts, 8 per rank, aux-loss-free
  bias frozen at inference) over 100 iterations on 32-way EP, mean 1,024 copies per rank:
  imbalance ratio (max - mean) / mean averaged over layers and iterations **1.564** (per layer
  0.46 to 2.46), i.e. the busiest rank holds 2.56x the mean. At ~1,000 copies per rank the
  counting noise is ~3% (sqrt(1024) / 1024), so the figure is the router's systematic
  preference, which does not shrink with more tokens per micro-batch.
- Qwen3 MoE routers (qwen3-30b-a3b, qwen3-235b-a22b: 128 experts, top-8 softmax):
  hicann/cann-recipes-train's Qwen3-235B RL report (tag v0.1.0, sec. 2.3.2, experiment 1)
  prints the tokens each of 16 EP ranks' experts received during a Qwen3-30B rollout on gsm8k
  (real weights, 8 experts per rank, counts summed over ~1,000 iterations): max / mean 1.574,
  1.836 and 1.613 in layers 0, 20 and 47, **1.674** on average.

From a figure to other shapes with the core's own law (moe.expert_load_factor: Zipf
popularity over the experts, the hottest expert's rank carrying its share plus an average share
for its other local experts): the exponent that reproduces 2.564 at 256 experts / EP 32 is
0.637 (`exponent()`), which gives 1.58 for GLM-4.7-Flash (64 experts) on EP 8; the one that
reproduces 1.674 at 128 / EP 16 is 0.533 (`exponent("qwen3-30b-a3b")`), which gives 1.315 on
EP 8 and 2.394 on EP 32 (the DeepSeek-R1 exponent would give 1.45 and 3.01). The core then
prices the busiest rank's expert GEMM rows, permutation bytes and all-to-all bytes at that load
(workload.py, moe.dispatch_bytes), in the update and in the log-prob passes, and the busiest
rank's MoE activation memory.

Limits, said plainly: two measured models, both at inference over many sequences (a training
micro-batch of one or a few sequences is likely more uneven), carried to other EP sizes through
the Zipf law; no per-rank load at RL training shapes was found published. Optional row column
`train_moe_router_balanced` (true/false; blank: false for NeMo RL, slime and SkyRL Megatron
MoE rows and verl's non-MLA ones, true elsewhere) says a run balanced its router.
"""

from __future__ import annotations

import functools
from importlib import resources
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from .. import moe
from .inputs import RL_FRAMEWORK, fsdp, stated_flag, train_col

# published per-rank loads (data/rl/ep_load_published.csv): TensorRT-LLM's DeepSeek-R1 EP32 row
# is the default, cann-recipes-train's Qwen3-30B EP16 row stands for the Qwen3 MoE routers
PUBLISHED = "data/rl/ep_load_published.csv"
# frameworks whose Megatron MoE configs train the router without balancing (see the docstring);
# verl only for the models its config_converter builds with load balancing "none" (not MLA)
UNBALANCED_FRAMEWORKS = ("nemo_rl", "slime", "skyrl")
VERL_UNBALANCED = "verl"


@functools.lru_cache(maxsize=1)
def published() -> pd.DataFrame:
    """The published per-rank loads, one row per measurement; `routers` lists the catalog
    models each stands for (blank: the default for every other model)."""
    t = pd.read_csv(resources.files("sim_core").joinpath(PUBLISHED))
    need = {"experts", "ep", "busiest_over_mean", "routers", "url"}
    missing = need - set(t.columns)
    if missing:
        raise ValueError(f"{PUBLISHED}: missing columns {sorted(missing)}")
    if t["routers"].isna().sum() != 1:
        raise ValueError(f"{PUBLISHED}: exactly one row must leave `routers` blank (the default)")
    return t


def load_factor(experts, ep, alpha) -> np.ndarray:
    """The core's busiest-rank load (moe.expert_load_factor) at these experts, EP sizes and
    Zipf exponents, dropless."""
    e = np.atleast_1d(np.asarray(experts, dtype=float))
    shape = np.broadcast(e, np.asarray(ep), np.asarray(alpha)).shape
    b = SimpleNamespace(experts=np.broadcast_to(e, shape).astype(float),
                        ep=np.broadcast_to(np.asarray(ep, dtype=float), shape).astype(float),
                        expert_skew=np.broadcast_to(np.asarray(alpha, dtype=float),
                                                    shape).astype(float),
                        moe_dropless=np.ones(shape, dtype=bool),
                        capacity_factor=np.ones(shape))
    return moe.expert_load_factor(b)


@functools.lru_cache(maxsize=None)
def _fit(experts: float, ep: float, busiest: float) -> float:
    return float(brentq(lambda a: load_factor(experts, ep, a)[0] - busiest, 1e-3, 5.0,
                        xtol=1e-9))


def exponent(model: str | None = None) -> float:
    """The Zipf exponent at which the core's law gives the published busiest-rank load (max /
    mean) at that measurement's experts and EP size: the measurement whose `routers` name
    `model`, else the default row's (TensorRT-LLM's DeepSeek-R1)."""
    t = published()
    key = str(model).strip().lower() if model is not None else None
    hit = t[t["routers"].fillna("").str.lower().str.split(";").apply(lambda r: key in r)] \
        if key else t.iloc[:0]
    row = (hit if len(hit) else t[t["routers"].isna()]).iloc[0]
    return _fit(float(row.experts), float(row.ep), float(row.busiest_over_mean))


def unbalanced(df: pd.DataFrame, b, tf: pd.DataFrame) -> np.ndarray:
    """Rows whose router trains without load balancing: Megatron-Core (not FSDP) MoE rows with
    EP > 1 under NeMo RL, slime or SkyRL, and under verl for the models its config_converter
    builds with `moe_router_load_balancing_type="none"` (all but the MLA / DeepSeek-V3 ones),
    unless `train_moe_router_balanced` says otherwise."""
    fw = np.isin(b.rl_framework, [RL_FRAMEWORK.index(f) for f in UNBALANCED_FRAMEWORKS])
    verl_none = (np.asarray(b.rl_framework) == RL_FRAMEWORK.index(VERL_UNBALANCED)) \
        & (np.asarray(b.mla) == 0)
    ep = train_col(tf, "ep")
    default = (fw | verl_none) & ~fsdp(tf) & (np.asarray(b.experts) > 0) \
        & (np.nan_to_num(ep, nan=1.0) > 1)
    if "train_moe_router_balanced" not in df.columns:
        return default
    # a stated `train_moe_router_balanced: false` turns it on where the framework default is off
    on = ~stated_flag(df, "train_moe_router_balanced", ~default)
    return on & (np.asarray(b.experts) > 0) & (np.nan_to_num(ep, nan=1.0) > 1)


def skew(df: pd.DataFrame, b, tf: pd.DataFrame) -> np.ndarray:
    """The training frame's `expert_skew` per row: `exponent(model)` where the router is
    unbalanced (the measurement of that model's router family, else the default), 0 (the
    core's balanced routing) elsewhere."""
    models = df["model"].astype(str) if "model" in df.columns else pd.Series([""] * len(df))
    codes, uniq = pd.factorize(models)  # one lookup per distinct model
    alpha = np.array([exponent(m) for m in uniq], dtype=float)[codes] if len(uniq) \
        else np.zeros(len(df))
    return np.where(unbalanced(df, b, tf), alpha, 0.0)
