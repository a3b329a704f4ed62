"""Fine-tuning physics: what LoRA, QLoRA and SFT change in a training step, vectorised.

The task (`sim_core/tasks.py`) is a column like any other; every function here takes the
batch's arrays and returns arrays, leaving pre-training rows exactly as they were (each change
is selected by the row's task, so a batch of pre-training rows takes the same values bit for
bit). The rules, with the code each comes from:

LoRA (Megatron-Bridge v0.6.0 src/megatron/bridge/peft/{lora.py,utils.py,base.py}, Hugging Face
peft v0.20.0 src/peft/tuners/lora/layer.py, torchtune v0.6.1 torchtune/modules/peft/lora.py):
- the base weights are frozen (`requires_grad = False`; Megatron-Bridge peft/base.py
  PEFT.freeze_model, peft `_mark_only_adapters_as_trainable`, torchtune
  `set_trainable_params`): every base linear still runs its forward GEMM and its input-gradient
  GEMM (the gradient must reach earlier layers' adapters), but no weight-gradient GEMM;
- each targeted linear (k -> n) gains x -> A (k -> r) -> B (r -> n), scaled by alpha / r and
  added to the base output (peft layer.py `result + lora_B(lora_A(dropout(x))) * scaling`;
  Megatron-Bridge LoRALinear): two GEMMs forward; backward B's weight and input gradients and
  A's weight and input gradients (four GEMMs, each as large as its forward), plus the
  elementwise scale-and-add. Under tensor parallelism Megatron-Bridge's ParallelLinearAdapter
  shards A like the base layer's input and B like its output (utils.py L1006-1054): the
  adapter's FLOPs divide by tp. The adapters run in bf16 under FP8 recipes (plain Megatron
  linears, not Transformer Engine ones);
- only the adapters carry gradients, main-grad buffers, Adam state, DP gradient reduction and
  the checkpoint (Megatron DDP allocates buffers only for parameters that require grad;
  torchtune saves adapter weights only with `save_adapter_weights_only`, peft
  `save_pretrained` saves the adapter). FSDP still all-gathers the frozen weights for the
  forward and the backward (they are sharded like any parameter) but reduce-scatters only the
  adapters' gradients;
- a frozen linear that no adapter reads needs no saved input (its weight gradient is not
  computed), so its input is dropped from the stored activations; an adapter saves its r-wide
  intermediate for B's weight gradient, and with dropout > 0 the dropped copy of its input
  (peft applies nn.Dropout to x before lora_A) and the mask.

QLoRA (bitsandbytes 0.50.1, Hugging Face peft + transformers BitsAndBytesConfig, torchtune
QLoRA): the frozen linears are stored as NF4, 4 bits per weight in blocks of 64 with one absmax
each (nn/modules.py Params4bit: blocksize 64, compress_statistics True); double quantisation
stores the absmax as 8 bits with one fp32 scale per 256 blocks (functional.py quantize_4bit:
quantize_blockwise(absmax - offset, blocksize=256)): 0.5 + 1/64 + 4/(64*256) bytes per weight.
Embeddings and the LM head stay bf16 (transformers skips the output embedding; torchtune
quantises only the adapted linears). For a training batch (M above the fused kernel's limit)
bitsandbytes dequantises the weight to bf16 and calls F.linear (backends/cuda/ops.py
gemm_4bit L951-955), and the backward dequantises it again for the input gradient
(autograd/_functions.py MatMul4Bit.backward): each base GEMM pass reads the NF4 weight and its
absmax and writes a bf16 copy, which the GEMM then reads. The GEMMs run in the compute dtype
(bf16): QLoRA has no FP8 path.

SFT and the data of fine-tuning: the compute is pre-training's. Samples are short and of
varying length (`mean_seq_len`): packed (`packing: true`, NeMo's packed sequences, torchtune
`dataset.packed`, TRL `packing=True`) several samples share one sequence of seq_len tokens and
attention runs per sample (Megatron's THD format with cu_seqlens; flash-attn varlen), so the
attention FLOPs scale with mean_seq_len / seq_len; unpacked, each sample is padded to seq_len
(NeMo `pad_to_max_length`, a fixed-shape collator) and the padding is real work: the step is
unchanged but only mean_seq_len of every seq_len tokens are useful (`useful_token_share`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import tasks
from .arrays import select
from .specs import ATTENTION_KERNEL

# bytes of a bf16 activation (workload.ACT_BYTES; the adapters run in bf16)
BF16 = 2.0
# bytes per NF4 weight with double-quantised absmax (bitsandbytes 0.50.1, see the module doc)
NF4_BYTES = 0.5 + 1.0 / 64 + 4.0 / (64 * 256)
# bytes one dequantisation moves per weight: the NF4 weight, its 8-bit absmax and the bf16 copy
# written (the GEMM's own read of the bf16 copy is in its roofline)
DEQUANT_BYTES = NF4_BYTES + 2.0
# base GEMMs (workload._gemm_shapes names) and the LoRA target each one is
TARGET_OF = {"qkv_proj": "qkv", "out_proj": "proj", "fc1": "fc1", "fc2": "fc2"}
# the base linears whose input is the layer's norm output (column-parallel: A sees the full
# hidden input, B writes n / tp) vs the row-parallel ones (A reads k / tp)
COLUMN_PARALLEL = ("qkv_proj", "fc1")


def col(b, name: str) -> np.ndarray:
    """A fine-tuning column, or its default where a hand-built batch leaves it out."""
    if name in b:
        return np.asarray(b[name])
    default = tasks.FINETUNE_COLUMNS[name]
    if name == "task":
        default = tasks.TASKS.index(default)
    return np.full(np.shape(b["tp"]), default)


def frozen(b) -> np.ndarray:
    return tasks.trait(col(b, "task"), "frozen_base")


def nf4(b) -> np.ndarray:
    return tasks.trait(col(b, "task"), "nf4_base")


def any_finetune(b) -> bool:
    """Whether a row of the batch is anything but pre-training on full sequences."""
    return bool(np.any(col(b, "task") != 0) or np.any(col(b, "mean_seq_len") > 0))


def linear_shapes(b, d: dict) -> dict:
    """(k, n) of each base linear of a dense layer, whole (before TP): in and out features."""
    h = d["h"]
    n_up = np.where(b.activation == 1, 2.0, 1.0)
    return {"qkv_proj": (h, d["q_dim"] + 2 * d["kv"] * d["hd"]),
            "out_proj": (d["a"] * d["dv"], h),
            "fc1": (h, n_up * b.ffn),
            "fc2": (b.ffn, h)}


def adapter_params_layer(b, d: dict) -> np.ndarray:
    """LoRA parameters of one layer per GPU (A and B of every targeted linear, sharded by tp);
    0 where the task trains no adapters. MoE expert linears take no adapters here."""
    r = col(b, "lora_rank").astype(np.float64)
    mask = col(b, "lora_targets")
    dense = 1.0 - np.where(b.layers > 0, d["n_moe_layers"] / b.layers, 0.0)
    total = 0.0
    for name, (k, n) in linear_shapes(b, d).items():
        share = dense if name in ("fc1", "fc2") else 1.0
        total = total + tasks.targeted(mask, TARGET_OF[name]) * share * r * (k + n) / b.tp
    return np.where(frozen(b), total, 0.0)


def adjust_ops(b, lay: dict, ops: list, Op) -> list:
    """workload._ops' list with the task's changes: frozen base GEMMs lose their weight
    gradient, adapters add their GEMMs and elementwise work, NF4 weights add their
    dequantisation, packed samples shorten attention. Pre-training rows keep every value.
    `Op` is workload.Op (passed in: workload imports this module)."""
    if not any_finetune(b):
        return ops

    d, T = lay["d"], lay["T"]
    L = lay["L_stage"]
    t = b.tp
    fz = frozen(b)
    q = nf4(b)
    r = col(b, "lora_rank").astype(np.float64)
    mask = col(b, "lora_targets")
    drop = col(b, "lora_dropout").astype(np.float64) > 0
    mean = col(b, "mean_seq_len").astype(np.float64)
    packed = col(b, "packing").astype(bool) & (mean > 0) & (mean < b.seq_len)
    shapes = linear_shapes(b, d)
    zero = 0 * T
    out = []
    dequant = zero
    for op in ops:
        if op.op_class == "gemm" and op.name in ("qkv_proj", "out_proj", "fc1", "fc2",
                                                 "lm_head", "router", "shared_fc1",
                                                 "shared_fc2", "expert_fc1", "expert_fc2"):
            # frozen: backward = the input gradient only (as large as the forward)
            bwd = select(fz, op.fwd_flops, op.bwd_flops)
            wgrad = select(fz, zero, op.bwd_wgrad_flops)
            out.append(replace(op, bwd_flops=bwd, bwd_wgrad_flops=wgrad))
            if op.where == "layer":
                # NF4: one dequantisation per pass (forward, input gradient) of each weight
                weights = op.fwd_flops / (2 * np.maximum(op.gemm_m, 1.0))  # n x k on this GPU
                dequant = dequant + np.where(q, DEQUANT_BYTES * weights, 0.0)
            continue
        if op.op_class == "attention" and op.attn_keys is None:
            # packed samples: attention within each sample (THD / varlen), mean_seq_len keys
            share = np.where(packed, mean / b.seq_len, 1.0)
            keys = np.where(packed, mean, b.seq_len)
            # (the kernel's curve at the samples' length; the unfused kernel has no such
            # curve, compute.py prices it from its passes over the whole sequence)
            unfused = np.asarray(b.attention_kernel) == ATTENTION_KERNEL.index("unfused")
            use_keys = np.any(packed) and not np.any(unfused)
            out.append(replace(op, fwd_flops=op.fwd_flops * share,
                               bwd_flops=op.bwd_flops * share,
                               attn_keys=keys if use_keys else None))
            continue
        out.append(op)
    # adapters: per targeted linear, A (k -> r) and B (r -> n), sharded by tp as the base layer
    for name, (k, n) in shapes.items():
        on = fz * tasks.targeted(mask, TARGET_OF[name])
        if name in ("fc1", "fc2"):
            on = on * (1.0 - lay["moe_frac"])
        if not np.any(on > 0):
            continue
        col_par = name in COLUMN_PARALLEL
        for part, (m_, n_, k_) in (("a", (T, np.where(col_par, r / t, r),
                                          np.where(col_par, k, k / t))),
                                   ("b", (T, n / t, r))):
            fwd = on * 2 * m_ * n_ * k_ * L
            out.append(Op(f"lora_{name}_{part}", "gemm", fwd, 2 * fwd, fwd, zero, zero,
                          m_, n_, k_))
        # scale the adapter output by alpha / r and add it to the base output (read 2, write 1
        # n-wide bf16 tensor; backward: the scaled gradient); dropout reads and writes x and a
        # 1-byte mask
        n_loc = n / t
        k_loc = np.where(col_par, k, k / t)
        elem = on * BF16 * T * (3 * n_loc + np.where(drop, 2.5 * k_loc, 0.0)) * L
        out.append(Op(f"lora_{name}_add", "elementwise", zero, zero, zero, elem, elem))
    if np.any(q):
        # (per stage already: the GEMMs' FLOPs carry the stage's layers)
        out.append(Op("nf4_dequant", "elementwise", zero, zero, zero, dequant, dequant))
    return out


def adapter_comms(b, wl, d: dict, tp_nodes, Comm) -> list:
    """The TP collectives LoRA adds (`Comm` is workload.Comm). Megatron-Bridge's adapter of a
    row-parallel linear (linear_proj, linear_fc2: input_is_parallel) has a ColumnParallel B with
    gather_output=True: B's output, T x hidden, is all-gathered over TP in every forward (and its
    replay under full recompute); its backward only splits the gradient (Megatron-Bridge v0.6.0
    peft/utils.py ParallelLinearAdapter L1034-1054, tensor_parallel mappings). A's own
    collectives are r wide, and a column-parallel target's A reads the input the base layer
    already gathered: neither is counted. Not exposed to TP-comm overlap (userbuffers serve the
    base layers only). Nothing where no row is LoRA with tp > 1."""
    fz = frozen(b)
    if not np.any(fz & (b.tp > 1)):
        return []
    mask = col(b, "lora_targets")
    dense = 1.0 - d["n_moe_layers"] / b.layers
    per_layer = tasks.targeted(mask, "proj") + dense * tasks.targeted(mask, "fc2")
    passes = 1.0 + (b.recompute == 2)
    calls = np.where(fz & (b.tp > 1), per_layer * wl.layers_per_stage * passes
                     * wl.num_microbatches, 0.0)
    return [Comm("tp", "all_gather", BF16 * wl.tokens * d["h"], b.tp, tp_nodes, calls, "none")]


def frozen_activation_bytes(b, d: dict, T, t, sp) -> np.ndarray:
    """Change of one layer's stored activations (bytes, per micro-batch) under the task:
    minus the inputs frozen, untargeted linears no longer save; plus each adapter's r-wide
    intermediate and, with dropout, its dropped input (bf16) and mask (1 byte)."""
    fz = frozen(b)
    if not np.any(fz):
        return np.zeros(np.shape(T))
    mask = col(b, "lora_targets")
    r = col(b, "lora_rank").astype(np.float64)
    drop = col(b, "lora_dropout").astype(np.float64) > 0
    g_in = np.where((b.precision == 1) & (b.has_fp8 > 0), 1.0, BF16)
    rep = np.where(sp, t, 1.0)
    dense = 1.0 - d["n_moe_layers"] / b.layers
    # inputs kept only for a weight gradient (activation_bytes_per_layer's g_in terms): the QKV
    # input (norm output), FC1's (norm output) and FC2's (the activation output); the
    # out-proj's input is the attention output, which flash attention saves for itself
    saved = {"qkv": g_in * T * d["h"] / rep, "proj": 0.0 * T,
             "fc1": dense * g_in * T * d["h"] / rep, "fc2": dense * g_in * T * b.ffn / t}
    ins = {"qkv": d["h"], "proj": d["a"] * d["dv"] / t, "fc1": d["h"], "fc2": b.ffn / t}
    delta = 0.0 * T
    for name in tasks.TARGETS:
        on = tasks.targeted(mask, name)
        share = dense if name in ("fc1", "fc2") else 1.0
        delta = delta - (1.0 - on) * saved[name]
        delta = delta + on * share * (BF16 * T * r + np.where(drop, 3.0 * T * ins[name],
                                                                   0.0))
    return np.where(fz, delta, 0.0)


def trainable_params(b, wl) -> np.ndarray:
    """Parameters one GPU trains (before ZeRO sharding): the adapters of its stage under
    LoRA/QLoRA, every parameter otherwise."""
    fz = frozen(b)
    if not np.any(fz):
        return wl.params_stage
    return np.where(fz, adapter_params_layer(b, wl.dims) * wl.layers_per_stage,
                    wl.params_stage)


def adapter_params_total(b, dims: dict) -> np.ndarray:
    """Adapter parameters of the whole model (for the checkpoint and model FLOPs)."""
    return adapter_params_layer(b, dims) * b.tp * b.layers


def base_weight_bytes(b, wl, P, embed) -> np.ndarray:
    """Bytes per GPU of the stage's base weights: bf16, or NF4 for QLoRA's linears (the
    embedding / LM head stay bf16). P and embed (one vocab x hidden shard) are this GPU's
    counts, sharded or not; with pp 1 the GPU holds both the embedding and the LM head
    (unless tied), as workload.build counts them."""
    mats = np.where(b.pp > 1, 1.0, np.where(b.tied_embeddings, 1.0, 2.0))
    embed = embed * mats
    return np.where(nf4(b), NF4_BYTES * (P - embed) + 2.0 * embed, 2.0 * P)


def useful_token_share(b) -> np.ndarray:
    """Share of the tokens a step computes that are samples' tokens: mean_seq_len / seq_len
    for unpacked (padded) samples, 1 otherwise (packing fills the sequence)."""
    mean = col(b, "mean_seq_len").astype(np.float64)
    padded = ~col(b, "packing").astype(bool) & (mean > 0) & (mean < b.seq_len)
    return np.where(padded, mean / b.seq_len, 1.0)


def rules(b) -> list[tuple[str, np.ndarray]]:
    """Fine-tuning settings that cannot run, one reason each."""
    if "task" not in b:
        return []
    task = col(b, "task")
    fz = frozen(b)
    q = nf4(b)
    r = col(b, "lora_rank").astype(np.float64)
    mean = col(b, "mean_seq_len").astype(np.float64)
    fp8 = (b.precision == 1)
    return [
        ("task lora/qlora needs lora_rank >= 1", fz & (r < 1)),
        ("mean_seq_len is longer than seq_len (the padded or packed length)",
         mean > b.seq_len),
        ("task qlora runs its GEMMs in bf16 (bitsandbytes dequantises NF4 to the compute "
         "dtype): precision fp8 is not available", q & fp8),
        ("task qlora shards its NF4 weights only with FSDP (bitsandbytes Linear4bit has no "
         "tensor, pipeline or context parallel layer): needs tp = pp = cp = 1",
         q & ((b.tp > 1) | (b.pp > 1) | (b.cp > 1))),
        ("task qlora has no expert-parallel NF4 layers: needs a dense model",
         q & (b.experts > 0)),
    ] if np.any(task != 0) else []
