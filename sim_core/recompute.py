"""Megatron-Core's selective recompute modules, one by one: what each drops, what each replays.

`recompute: selective` alone is op-level selective checkpointing (memory.activation_bytes_per_
layer keeps every other GEMM output; torchtitan's op SAC). With `recompute_modules` (Megatron-
Core --recompute-granularity selective --recompute-modules ...) the layer instead keeps every
activation but those the listed modules drop, and replays those modules' forward in backward.
The modules and what they do, from megatron/core (core_v0.15.3):

- core_attn (transformer/attention.py checkpoint_core_attention; TE te_checkpoint): the core
  attention is checkpointed on its inputs q, k, v: its softmax statistics (and, unfused, the
  s x s scores) are not kept; its forward is replayed.
- moe_act (moe/experts.py TEGroupedMLP, CheckpointWithoutOutput around the activation): the
  routed experts' activation output (FC2's input) is discarded and recomputed from FC1's output.
- layernorm (transformer_layer.py L377-396, CheckpointWithoutOutput): the outputs of
  input_layernorm and pre_mlp_layernorm where they are separate modules. In the TE layer specs
  (models/gpt/gpt_layer_specs.py get_gpt_layer_with_transformer_engine_spec) the input norm is
  fused into linear_qkv (IdentityOp) except for MLA, and the pre-MLP norm is a separate TENorm
  only in MoE layers (a dense MLP fuses it into linear_fc1): so MLA layers drop their attention
  norm's output and MoE layers their pre-MLP norm's output (the router's and dispatch's input).
- mla_up_proj (transformer/multi_latent_attention.py L656-800, CheckpointWithoutOutput around
  q/kv layernorm + q/kv up-projections + RoPE, output discarded after core attention): the
  up-projected, roped query, key and value are not kept (the compressed latents are); the two
  up-projection GEMMs and RoPE are replayed. MLA models only (transformer_config.py asserts).
- mlp (transformer_layer.py L397-399 and L587-602, tensor_parallel.checkpoint): a dense MLP
  keeps only its input; skipped in MoE layers (`if not isinstance(self.mlp, MoELayer)`).
- moe (moe/moe_layer.py, tensor_parallel.checkpoint of the whole MoE layer): only the layer's
  input is kept; router, dispatch, experts and combine are replayed (step.py replays the
  dispatch and combine transfers).
- shared_experts (moe/shared_experts.py, checkpoint of the shared-expert MLP): the shared
  experts keep only their input. Refused with --moe-shared-expert-overlap.

Module names are validated as Megatron does (transformer_config.py __post_init__, L943-1000):
the run's `recompute_modules` is a list of these names, stored in the Batch as a bit mask.
The older `moe_recompute` field (moe_act / moe with recompute none) is the same physics: it is
read here as those modules.
"""

from __future__ import annotations

import numpy as np

from . import frameworks
from .specs import FRAMEWORK, MOE_RECOMPUTE

# frameworks built on Megatron-Core's TransformerConfig (NeMo 2.x / Megatron-Bridge included)
MEGATRON_FRAMEWORKS = ("megatron-core", "nemo")

# transformer_config.py core_v0.15.3 L326-339 (allowed_modules, L946-955), in that order
MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
BIT = {name: 1 << i for i, name in enumerate(MODULES)}
ACT_BYTES = 2.0  # bf16 activations


class RecomputeModulesError(ValueError):
    """An unknown recompute module name (the message is one line)."""


def mask(value, field: str = "recompute_modules") -> int:
    """A list of module names (or one comma-separated string; '' / 'none' / [] = none) as the
    bit mask the core reads; a one-line error naming the field and the allowed names."""
    if value is None:
        return 0
    if isinstance(value, (int, np.integer, float)) and not isinstance(value, bool):
        if float(value) != int(value) or not 0 <= int(value) < 1 << len(MODULES):
            raise RecomputeModulesError(f"{field}: {value!r} is not a module bit mask")
        return int(value)
    if isinstance(value, str):
        items = [x.strip() for x in value.replace(";", ",").split(",")]
    elif isinstance(value, (list, tuple, set, np.ndarray)):
        items = [str(x).strip() for x in value]
    else:
        raise RecomputeModulesError(f"{field}: expected a list of module names, got "
                                    f"{type(value).__name__}; allowed: {', '.join(MODULES)}")
    out = 0
    for x in items:
        if x.lower() in ("", "none"):
            continue
        if x.lower() not in BIT:
            raise RecomputeModulesError(f"{field}: unknown module '{x}'; allowed: "
                                        f"{', '.join(MODULES)}")
        out |= BIT[x.lower()]
    return out


def names(m: int) -> list[str]:
    """The module names of a bit mask, in Megatron's order."""
    return [n for n in MODULES if int(m) & BIT[n]]


def column(b) -> np.ndarray:
    """The batch's module mask (int64), 0 where a hand-built batch leaves the column out."""
    if "recompute_modules" in b:
        return np.asarray(b.recompute_modules).astype(np.int64)
    return np.zeros(np.shape(b["tp"]), dtype=np.int64)


def effective(b) -> np.ndarray:
    """The modules in effect per configuration: the listed ones under recompute selective, the
    moe_recompute module under recompute none, none under full (full keeps only the layer
    input whatever the modules)."""
    rc = b.recompute
    legacy = np.where(b.moe_recompute == MOE_RECOMPUTE.index("moe_act"), BIT["moe_act"],
                      np.where(b.moe_recompute == MOE_RECOMPUTE.index("moe"), BIT["moe"], 0))
    return np.where(rc == 1, column(b), np.where(rc == 0, legacy, 0)).astype(np.int64)


def has(bits: np.ndarray, name: str) -> np.ndarray:
    return (bits & BIT[name]) > 0


def dropped_bytes(b, bits, T, t, rep, dims, load, g_in, fc1_out, moe_frac, parts) -> np.ndarray:
    """Bytes per (average) layer and micro-batch that the modules in `bits` do not keep, out of
    memory.activation_bytes_per_layer's terms (`parts`: attn_scores_lse, moe_mlp, dense_mlp)."""
    h = dims["h"]
    mla = np.asarray(dims["mla"], dtype=bool)
    norm_out = g_in * T * h / rep  # a norm's output as the next GEMM saves it
    # attention (every layer)
    attn = np.where(has(bits, "core_attn"), parts["attn_scores_lse"], 0.0)
    attn = attn + np.where(has(bits, "layernorm") & mla, norm_out, 0.0)
    qkv = dims["q_dim"] + 2 * dims["kv_dim"]
    attn = attn + np.where(has(bits, "mla_up_proj") & mla, ACT_BYTES * T * qkv / t, 0.0)
    # dense MLP layers: the checkpointed MLP keeps its input only
    dense = np.where(has(bits, "mlp"), parts["dense_mlp"] - ACT_BYTES * T * h / rep, 0.0)
    # MoE layers
    r = b.top_k * load  # routed copies on the busiest rank, per token
    s = b.shared_experts
    ffe = b.expert_ffn
    ln = has(bits, "layernorm")
    whole = parts["moe_mlp"] - 2 * ACT_BYTES * T * h / rep + np.where(ln, ACT_BYTES * T * h
                                                                       / rep, 0.0)
    act = np.where(has(bits, "moe_act"), g_in * T * r * ffe / t, 0.0)
    shared = np.where(has(bits, "shared_experts"),
                      g_in * T * s * h / t + ACT_BYTES * T * s * ffe * fc1_out / t
                      + g_in * T * s * ffe / t, 0.0)
    parts_moe = act + shared + np.where(ln, norm_out, 0.0)
    moe_layer = np.where(has(bits, "moe"), whole, parts_moe)
    return attn + (1 - moe_frac) * dense + moe_frac * moe_layer


def replay_seconds(b, bits, op_fwd: dict, attn_fwd, T, t, rep, dims, moe_frac, L_stage,
                   moe_mlp_fwd, hbm_elem, act_moe_bytes) -> np.ndarray:
    """Forward seconds per micro-batch on a stage that the modules replay in backward.
    `op_fwd`: forward seconds of each layer op over the stage (compute._stage_core);
    `act_moe_bytes`: HBM bytes of the routed experts' activation function over the stage."""
    h = dims["h"]
    mla = np.asarray(dims["mla"], dtype=bool)
    zero = np.zeros(np.shape(b.tp))
    get = lambda name: op_fwd.get(name, zero)  # noqa: E731
    out = np.where(has(bits, "core_attn"), attn_fwd, 0.0)
    # a norm reads and writes the hidden state: MLA's attention norm, the MoE pre-MLP norm
    norms = (np.where(mla, 1.0, 0.0) + moe_frac) * L_stage
    out = out + np.where(has(bits, "layernorm"), norms * 2 * ACT_BYTES * T * h / rep / hbm_elem,
                         0.0)
    qkv = dims["q_dim"] + 2 * dims["kv_dim"]
    rope = 2 * ACT_BYTES * T * qkv / t * L_stage / hbm_elem  # RoPE and the q/k/v copies
    out = out + np.where(has(bits, "mla_up_proj") & mla,
                         get("q_up_proj") + get("kv_up_proj") + rope, 0.0)
    glu = np.where(b.activation == 1, 3.0, 2.0)  # activation bytes per ffn element / 2
    dense_act = ACT_BYTES * glu * T * b.ffn / t * (1 - moe_frac) * L_stage / hbm_elem
    out = out + np.where(has(bits, "mlp"), get("fc1") + get("fc2") + dense_act, 0.0)
    shared_act = (ACT_BYTES * glu * T * b.shared_experts * b.expert_ffn / t * moe_frac * L_stage
                  / hbm_elem)
    parts_moe = (np.where(has(bits, "moe_act"), act_moe_bytes / hbm_elem, 0.0)
                 + np.where(has(bits, "shared_experts"),
                            get("shared_fc1") + get("shared_fc2") + shared_act, 0.0))
    return out + np.where(has(bits, "moe"), moe_mlp_fwd, parts_moe)


def rules(b) -> list[tuple[str, np.ndarray]]:
    """What Megatron-Core refuses (transformer_config.py core_v0.15.3 L943-1000). A batch with
    no module listed reads nothing else: `sweep check` factors out the axes no rule reads
    (the GPU, for one), and every rule here needs a module."""
    m = column(b)
    on = m > 0
    checks = [
        ("recompute_modules are Megatron-Core's (frameworks " + ", ".join(MEGATRON_FRAMEWORKS)
         + ")", lambda: ~np.isin(frameworks.column(b, "framework"),
                                 [FRAMEWORK.index(f) for f in MEGATRON_FRAMEWORKS])),
        ("recompute_modules needs recompute selective (--recompute-granularity selective)",
         lambda: b.recompute != 1),
        ("recompute_modules mla_up_proj needs a multi-latent-attention model",
         lambda: has(m, "mla_up_proj") & (b.kv_lora_rank <= 0)),
        ("recompute_modules moe_act, moe and shared_experts need a MoE model",
         lambda: (has(m, "moe_act") | has(m, "moe") | has(m, "shared_experts"))
         & ~(b.experts > 0)),
        ("recompute_modules shared_experts cannot work with moe_shared_expert_overlap",
         lambda: has(m, "shared_experts") & b.moe_shared_expert_overlap),
        ("recompute_modules moe_act and layernorm do not support the delayed FP8 recipe",
         lambda: (has(m, "moe_act") | has(m, "layernorm")) & (b.precision == 1)
         & (b.has_fp8 > 0) & (b.fp8_recipe == 0)),
    ]
    if not on.any():
        return [(msg, on) for msg, _ in checks]
    return [(msg, on & np.asarray(test())) for msg, test in checks]
