"""Which configurations are valid: the divisibility rules of Megatron-style 5D parallelism.

Each rule is a vectorized predicate; the first rule a configuration breaks becomes its reason.
"""

from __future__ import annotations

import numpy as np

from . import distinct, finetune, fp4, frameworks, recompute
from .columns import Batch
from .specs import ATTENTION_KERNEL


def _divides(a, b):
    """a divides b (both float arrays of integers)."""
    return (a > 0) & (np.mod(b, np.where(a > 0, a, 1)) == 0)


def rules(b: Batch) -> list[tuple[str, np.ndarray]]:
    """(reason, violated mask) in the order they are checked."""
    return [*structural_rules(b), *setting_rules(b)]


def setting_rules(b: Batch) -> list[tuple[str, np.ndarray]]:
    """The rules after structural_rules, in order: ZeRO, MoE, framework, fine-tuning, FP8/FP4
    and attention settings."""
    return [
        ("zero must be 0, 1, 2 or 3", ~np.isin(b.zero, (0, 1, 2, 3))),
        *moe_rules(b, np.where(b.etp > 0, b.etp, b.tp)),
        *recompute.rules(b),
        *frameworks.rules(b),
        *finetune.rules(b),
        *fp8_rules(b),
        *fp4.rules(b),
        *attention_rules(b),
    ]


def attention_rules(b: Batch) -> list[tuple[str, np.ndarray]]:
    """Transformer Engine runs a sliding window under context parallelism only with
    all-gathered (or all-to-all) K/V: TE v2.8 attention/dot_product_attention/
    context_parallel.py attn_forward_func_with_cp asserts cp_comm_type in (a2a, all_gather)
    whenever a window is set."""
    win = np.asarray(b.get("sliding_window", 0 * b.tp)) > 0
    out = [("sliding-window attention with cp > 1 needs cp_comm allgather (TE refuses the "
            "p2p ring)", win & (b.cp > 1) & (b.cp_comm == 0))]
    out += a2a_rules(b)
    kernel = np.asarray(dict.get(b, "attention_kernel", 0 * b.tp))
    # Megatron-Core's unfused DotProductAttention asserts context_parallel_size == 1 (core_v0.15.3
    # megatron/core/transformer/dot_product_attention.py: "Context parallelism is only supported
    # by TEDotProductAttention!")
    out.append(("attention_kernel unfused needs cp = 1 (context parallelism runs only in "
                "Transformer Engine's attention)",
                (kernel == ATTENTION_KERNEL.index("unfused")) & (b.cp > 1)))
    # FlexAttention is priced from H100/H200 kernels only (efficiency.yaml 90/flex); no other
    # architecture has a measured or published flex figure, so it is refused there. The GPU is
    # read only where a configuration asks for flex (a space's count factors it out otherwise).
    flex = kernel == ATTENTION_KERNEL.index("flex")
    if flex.any():
        out.append(("attention_kernel flex is priced on Hopper GPUs only (sm_arch 90: H100, "
                    "H200, H800); use fa3 or fa2 here", flex & (b.sm_arch != 90)))
    return out


def a2a_rules(b: Batch) -> list[tuple[str, np.ndarray]]:
    """Ulysses CP (cp_comm a2a) scatters attention heads over the CP group: the heads of a TP
    rank must split evenly (TE v2.8 context_parallel.py AttnFuncWithCPAndQKVOA2A asserts "The
    number of attention heads needs to be divisible by CP size!" for q and k; verl v0.5.0
    models/transformers/monkey_patch.py asserts num_attention_heads % ulysses_sp_size == 0).
    KV heads: divided as Q's (TE, DeepSpeed), or, with cp_kv_repeat (verl), repeated up to cp,
    which needs kv_heads % cp == 0 or cp % kv_heads == 0. MLA carries a K per head."""
    a2a = (b.cp_comm == 2) & (b.cp > 1)
    if not np.any(a2a):
        return []
    t, c = b.tp, b.cp
    q = b.heads / t
    kv = np.where(b.kv_lora_rank > 0, b.heads, np.where(b.kv_heads > 0, b.kv_heads, b.heads)) / t
    rep = np.asarray(b.get("cp_kv_repeat", 0 * c)) > 0

    def split(n):  # n heads (a whole number) split evenly over cp
        return (np.mod(n, 1) == 0) & (np.mod(n, c) == 0)
    return [("cp_comm a2a needs the attention heads per TP rank (heads / tp) divisible by cp",
             a2a & ~split(q)),
            ("cp_comm a2a needs the KV heads per TP rank (kv_heads / tp) divisible by cp "
             "(TE and DeepSpeed split K/V heads as Q's)", a2a & ~rep & ~split(kv)),
            ("cp_comm a2a with repeated KV heads (verl) needs kv_heads % cp == 0 or "
             "cp % kv_heads == 0", a2a & rep & ~split(kv) & (np.mod(c, np.maximum(kv, 1e-9)) != 0))]


def fp8_rules(b: Batch) -> list[tuple[str, np.ndarray]]:
    """MXFP8 runs on Blackwell's block-scaled tensor cores (TE MXFP8BlockScaling; Megatron
    --fp8-recipe: "'mxfp8' for Blackwell architecture only"). The GPU is read only where an
    FP8 configuration asks for mxfp8, so that a space's count can factor the GPU out otherwise."""
    mx = (b.precision == 1) & (b.get("fp8_recipe", 0 * b.tp) == 5)
    if not mx.any():
        return []
    # CDNA2/CDNA3 (gfx90a, gfx942: MI250X, MI300X, MI325X) have no MX formats (CDNA 3 white
    # paper; Primus-Turbo v0.4.0 check_mxfp8_support: gfx950 or newer); CDNA4 has MXFP8
    no_mx = (b.sm_arch < 100) | ((b.sm_arch > 900) & (b.sm_arch < 950))
    return [("fp8_recipe mxfp8 needs MX tensor cores (Blackwell, sm_arch 100; CDNA4: mi350x, "
             "mi355x)", mx & no_mx)]


# The fields structural_rules reads: the parallel sizes, batch and model shape. A search can
# check them on arrays built straight from its configuration ids, before building any frame.
STRUCTURAL_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "etp", "dp", "micro_batch", "num_gpus",
                     "gpus_per_node", "global_batch", "seq_len", "heads", "kv_heads", "layers",
                     "experts", "sequence_parallel")


def structural_rules(b: Batch) -> list[tuple[str, np.ndarray]]:
    """The first rules, in order: divisibility of the parallel sizes, batch and model shape
    (reads only STRUCTURAL_FIELDS)."""
    t, p, c, e, v = b.tp, b.pp, b.cp, b.ep, b.vpp
    kv = np.where(b.kv_heads > 0, b.kv_heads, b.heads)
    etp = np.where(b.etp > 0, b.etp, t)
    world = t * p * c
    dp = np.where(b.dp > 0, b.dp, np.floor(b.num_gpus / np.maximum(world, 1)))
    moe = b.experts > 0
    positive = (t >= 1) & (p >= 1) & (c >= 1) & (e >= 1) & (v >= 1) & (b.micro_batch >= 1)
    return [
        ("parallel sizes must be positive integers", ~positive),
        ("num_gpus % (tp*pp*cp) != 0", ~_divides(world, b.num_gpus)),
        ("dp*tp*pp*cp != num_gpus", dp * world != b.num_gpus),
        ("heads % tp != 0", ~_divides(t, b.heads)),
        ("kv_heads and tp: neither divides the other", ~(_divides(t, kv) | _divides(kv, t))),
        ("tp > gpus_per_node * 8 (tp spans too many nodes)", t > 8 * b.gpus_per_node),
        # uneven splits are allowed (Megatron's first/last-stage layer counts, torchtitan's
        # splitter); the busiest rank gets ceil(layers / (pp*vpp)) layers per chunk
        ("layers < pp*vpp (a pipeline chunk would have no layer)", b.layers < p * v),
        ("vpp > 1 needs pp > 1", (v > 1) & (p == 1)),
        ("sequence_parallel needs tp > 1", b.sequence_parallel & (t == 1)),
        ("seq_len % (2*cp) != 0 (causal load balancing)", (c > 1) & ~_divides(2 * c, b.seq_len)),
        ("ep > 1 needs a MoE model", (e > 1) & ~moe),
        ("experts % ep != 0", moe & ~_divides(e, b.experts)),
        ("ep*etp must divide dp*cp*tp", moe & ~_divides(e * etp, dp * c * t)),
        ("global_batch % (dp*micro_batch) != 0", ~_divides(dp * b.micro_batch, b.global_batch)),
        ("interleaved schedule needs microbatches % pp == 0",
         (v > 1) & ~_divides(p, b.global_batch / np.maximum(dp * b.micro_batch, 1))),
    ]


# EP group sizes DeepEP has a kernel config for (deep_ep/buffer.py get_dispatch_config, v1.2.1)
DEEPEP_SIZES = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)


def moe_rules(b: Batch, etp) -> list[tuple[str, np.ndarray]]:
    """What Megatron-Core core_v0.15.3 refuses (transformer_config.py __post_init__ asserts)."""
    ov, disp = b.moe_a2a_overlap, b.moe_dispatcher  # specs.MOE_DISPATCHER codes
    alltoall, flex = disp == 0, disp == 2
    return [
        ("moe_a2a_overlap (--overlap-moe-expert-parallel-comm) needs ep > 1", ov & (b.ep <= 1)),
        ("moe_a2a_overlap needs the alltoall or flex dispatcher", ov & (disp == 1)),
        ("moe_a2a_overlap does not support full recompute", ov & (b.recompute == 2)),
        ("moe_a2a_overlap with pp > 1 needs vpp > 1 (interleaved schedule)",
         ov & (b.pp > 1) & (b.vpp <= 1)),
        ("moe_a2a_overlap and moe_shared_expert_overlap cannot both be on",
         ov & b.moe_shared_expert_overlap),
        ("moe_delay_wgrad (--delay-wgrad-compute) needs moe_a2a_overlap", b.moe_delay_wgrad & ~ov),
        ("moe_shared_expert_overlap needs the alltoall dispatcher",
         b.moe_shared_expert_overlap & ~alltoall),
        ("moe_shared_expert_overlap needs a model with shared experts",
         b.moe_shared_expert_overlap & (b.shared_experts <= 0)),
        ("moe_recompute needs recompute none (it is a selective recompute module)",
         (b.moe_recompute > 0) & (b.recompute != 0)),
        ("moe_recompute needs a MoE model", (b.moe_recompute > 0) & (b.experts <= 0)),
        ("flex dispatcher (DeepEP) supports ep*etp in " + ", ".join(map(str, DEEPEP_SIZES)),
         flex & (b.experts > 0) & ~np.isin(b.ep * etp, DEEPEP_SIZES)),
    ]


# columns the rules peek at without the batch's accessors (attention_rules and
# frameworks.rules read `rocm` and `attention_kernel` through dict.get, so that a space's count
# does not record them): part of the key whenever the rules are evaluated once per distinct input
PEEKED = ("attention_kernel", "rocm")


def check(b: Batch) -> tuple[np.ndarray, np.ndarray]:
    """Returns (valid mask, reason array of str; '' where valid): the same as `check_rows`,
    evaluated in two parts, each once per distinct tuple of the columns it reads
    (sim_core.distinct): the structural rules (the parallel sizes and the model's shape), then
    the settings' rules (ZeRO, framework, precision, ...), whose first broken rule is the
    reason where no structural rule is broken."""
    valid, reason = _part("rules.structural", b, structural_rules)
    ok, why = _part("rules.settings", b, setting_rules)
    later = valid & ~ok  # structurally sound, a setting refused: that setting's reason
    if later.any():
        reason[later] = why[later]
    return valid & ok, reason


def _part(name: str, b: Batch, part) -> tuple[np.ndarray, np.ndarray]:
    out = distinct.on_distinct(name, b, lambda sb: dict(
        zip(("valid", "reason"), _first_broken(part(sb), len(sb)))), seed=PEEKED)
    return out["valid"], out["reason"]


def check_rows(b: Batch) -> tuple[np.ndarray, np.ndarray]:
    """`check` row by row: every rule on every row."""
    return _first_broken(rules(b), len(b))


def _first_broken(checks, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, the first broken rule's text per row, '' where none)."""
    reason = np.full(n, "", dtype=object)
    valid = np.ones(n, dtype=bool)
    for text, bad in checks:
        new = bad & valid
        reason[new] = text
        valid &= ~bad
    return valid, reason
