"""The host side of SkyRL's FSDP2 micro-batches: the eager floor, counted from SkyRL's code.

Why: SkyRL trains with micro-batches of one sequence by default (`micro_train_batch_size_per_
gpu` / `micro_forward_batch_size_per_gpu` 1), so a small model's pass is thousands of
micro-batches of a few hundred tokens, each issued kernel by kernel from Python by the eager
Hugging Face model under FSDP2. As for verl's workers (`host.py`), a micro-batch lasts at least
as long as the host takes to issue it, and the loops synchronise the host many times per
micro-batch, so the host cannot run ahead into the next one: a pass is
max(GPU time, micro-batches x host time) plus the host-device round trips it waits for.

Read at NovaSky-AI/SkyRL 27676c23 (the YottaLabs row's commit; uv.lock: torch 2.10.0,
transformers 4.57.1, flash-attn 2.8.3; `use_torch_compile` False, Liger off). Later SkyRL
(a9564572: torch 2.13, transformers 5.8, the workers rewritten) was not recounted; the one row
priced at it (marin 8653, a 235B MoE) is GPU-bound by far, so the floor does not bind.
Kernels are counted from code and priced with the figures `host.py` already uses
(`eager_host_s_per_kernel` 9.7 us, `eager_update_over_forward` 4.65, `dtensor_op_s` 90 us for
ops on FSDP2's sharded DTensor parameters, `host_sync_us` 20 us per round trip); nothing is
fitted on the validation rows.

**Per decoder layer** (transformers 4.57.1 `modeling_qwen2.py`,
`modeling_flash_attention_utils.py`): host.py's 51 forward kernels, less its 14 of the
varlen-from-position-ids attention path, plus what 4.57.1 runs instead. SkyRL unpads each
micro-batch into one row of packed tokens with position ids (`model_wrapper.py forward`,
`use_sample_packing` True) and passes no attention mask. `_flash_attention_forward` evaluates
`_is_packed_sequence` (arange, min, +, -, abs, sum, bool: 6 kernels) inside an `elif`, i.e.
`Tensor.__bool__`: **one host sync per layer forward** (and per checkpoint replay). One
sequence is not packed, so it takes the dense `flash_attn_func` (1); several take
`_prepare_from_posids` (3 `contiguous`, `== 0`, `nonzero`, `cat`, `torch.tensor`, `diff`,
`max`, `.item()`: 10 and a second sync) and `flash_attn_varlen_func`.

**FSDP2 per unit** (`fully_shard` per decoder layer plus the root, `apply_fsdp2`; torch
`_fully_shard/_fsdp_param_group.py`): per parameter P (host.PARAMS_PER_LAYER), every unshard
casts or copies each parameter into the all-gather input (bf16 `MixedPrecisionPolicy`; at
world size 1 `copy_` per parameter, pytorch PR 160135) and re-points it (`to_unsharded`), the
reshard after forward re-points it back: P + 3 (copy-in, all-gather, copy-out / events) per
unshard; the backward unshards again (`reshard_after_forward` True) and reduces:
`foreach_reduce` casts each gradient to the fp32 `reduce_dtype` (P), copy-in, pre-divide,
reduce-scatter, post-divide (4), and adds into or assigns each sharded gradient (P).
FSDP1's flat parameter (host.py: 2 + 9 per unit) is per unit; FSDP2 is per parameter.
(Qwen2's q/k/v biases are left out of P, as host.py leaves them out: ~2% of the floor.)

**Per forward micro-batch** (`Worker.forward` -> `PolicyWorkerBase._forward_micro_batch` ->
`HFModelWrapper.forward`, compute_entropy False): `micro_batch.to(device)` 2 blocking copies
(sequences, attention_mask: 2 syncs); position ids 5; flash-attn's `unpad_input` twice (sum,
sum, `nonzero`, `max().item()`, cumsum, pad, `index_first_axis` 2: 10 each, 2 syncs each:
`nonzero` and `.item()`); `torch.roll` 1; the HF model outside the layers 23 (embedding 1, rotary
table 9, `find_packed_sequence_indices` 4, final norm 8, LM head 1); `div_(temperature)` 1;
flash-attn's Triton cross-entropy for the log-probs 3; `pad_input` 2; `.to("cpu")` 1 (sync).
58 kernels, 7 syncs.

**Per update micro-batch** (`PolicyWorkerBase._forward_backward_micro`, RL path): the
Experience's 8 tensors to the GPU (8 blocking copies); the same model forward less the copies
(55) plus the chunked entropy (`chunked_entropy_from_logits`: zeros 1, per 1,024-token chunk
`log_softmax`, `exp`, `*`, `sum`, `neg`, slice copy 6, `pad_input` 2: 9 for one chunk); the
policy loss ~25 with its `clip_ratio` `.item()` (ppo_utils.py); the entropy's `masked_mean` 5;
the KL loss (`use_kl_loss`) `compute_approx_kl` + `masked_mean` + `mean` 13; the sum 3; their
backward ~35 and the head / final norm / embedding / unpad backward ~25 (host.py's counts for
verl's like loss); `valid_lens` `sum`, `int`, `tolist` 3 (sync); `detach().cpu()` 1 (sync);
`.item()` of final_loss, policy_loss, entropy, kl 4 (4 syncs); `all_reduce_metrics` on the 7
scalar metrics (`strategy.all_reduce` per key: a CPU tensor `.to(cuda)`, `/= world_size`,
`dist.all_reduce`, `.cpu()`: 4 kernels and 2 syncs each, even on one GPU). 214 kernels, 33 syncs.

**Per optimizer step** (`PolicyWorkerBase.optim_step`, `FSDPStrategy.optimizer_step`): the
Python loop `param.grad.mul_(1 / micro_batches)` over every parameter (one DTensor op each),
`fsdp2_clip_grad_norm_` and `torch.optim.AdamW`'s foreach path over the DTensor parameters
(~30 DTensor ops), `torch.isfinite(grad_norm)` and `grad_norm.cpu().item()` (2 syncs).

What is left out: FSDP2's per-call Python beyond the per-parameter steps (pytorch issue 173680
reports ~1 ms per `FSDP::pre_forward` at torch 2.10 on a module mix it does not state: no
per-unit figure), the Ray actors sharing the host's cores, the first step's warm-up. Each
count is good to about a fifth.
"""

from __future__ import annotations

import numpy as np

from . import host
from .inputs import constants

# per decoder layer, forward: host.py's count less its varlen-from-position-ids attention (14),
# plus transformers 4.57.1's `_is_packed_sequence` (6) and `flash_attn_func` (1)
LAYER_FORWARD = host.LAYER_FORWARD - 14 + 7
LAYER_SYNCS = 1
# several sequences per micro-batch: `_prepare_from_posids` (10, one more `.item()` sync)
PACKED_EXTRA = 10
PACKED_SYNCS = 1
# FSDP2 per unit: an unshard is P + 3; the backward's reduction 2 P + 4
UNSHARD_FIXED = 3
REDUCE_FIXED = 4
# outside the layers, per micro-batch: (kernels, syncs)
FORWARD_MB = (58, 7)
UPDATE_MB = (214, 33)
# per optimizer step: DTensor ops besides the per-parameter `grad.mul_`, and syncs
STEP_DT_OPS = 30
STEP_SYNCS = 2
# the root unit's parameters (embedding, final norm, an untied LM head)
ROOT_PARAMS = 3


def unit_kernels(layers) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2's kernels per micro-batch over all units (layers + the root): (forward: one
    unshard each; update: the forward's and the backward's unshard plus the reduction)."""
    units = np.asarray(layers, dtype=float) + 1.0
    p = float(host.PARAMS_PER_LAYER)
    unshard = p + UNSHARD_FIXED
    return units * unshard, units * (2 * unshard + 2 * p + REDUCE_FIXED)


def forward_host(layers, seqs_per_mb) -> tuple[np.ndarray, np.ndarray]:
    """(host seconds issuing, syncs) of one forward micro-batch (`Worker.forward`)."""
    layers = np.asarray(layers, dtype=float)
    packed = np.asarray(seqs_per_mb, dtype=float) > 1
    per_layer = LAYER_FORWARD + np.where(packed, PACKED_EXTRA, 0.0)
    kernels = layers * per_layer + unit_kernels(layers)[0] + FORWARD_MB[0]
    syncs = layers * (LAYER_SYNCS + np.where(packed, PACKED_SYNCS, 0.0)) + FORWARD_MB[1]
    return kernels * host.seconds_per_kernel(), syncs


def update_host(layers, seqs_per_mb, checkpointing) -> tuple[np.ndarray, np.ndarray]:
    """(host seconds issuing, syncs) of one update micro-batch: each layer's forward with
    autograd and backward as `eager_update_over_forward` forwards (host.py), the checkpoint
    replay's forward (syncs included), FSDP2's units, SkyRL's loss and metrics."""
    layers = np.asarray(layers, dtype=float)
    packed = np.asarray(seqs_per_mb, dtype=float) > 1
    fwd = LAYER_FORWARD + np.where(packed, PACKED_EXTRA, 0.0)
    passes = 1.0 + np.asarray(checkpointing, dtype=bool)   # the forward and its replay
    kernels = layers * fwd * (host.update_over_forward() + passes - 1.0) \
        + unit_kernels(layers)[1] + UPDATE_MB[0]
    syncs = layers * passes * (LAYER_SYNCS + np.where(packed, PACKED_SYNCS, 0.0)) \
        + UPDATE_MB[1]
    return kernels * host.seconds_per_kernel(), syncs


def step_host(layers) -> tuple[np.ndarray, np.ndarray]:
    """(host seconds, syncs) of one optimizer step over FSDP2's DTensor parameters."""
    params = np.asarray(layers, dtype=float) * host.PARAMS_PER_LAYER + ROOT_PARAMS
    return (params + STEP_DT_OPS) * float(constants()["dtensor_op_s"]), \
        np.full(np.shape(params), float(STEP_SYNCS))


def pass_seconds(gpu_s, host_per_mb, syncs_per_mb, micro_batches, extra_host=0.0,
                 extra_syncs=0.0) -> np.ndarray:
    """A pass (or one optimizer step) of `micro_batches` micro-batches: max(its GPU seconds,
    the host's) plus the round trips the host waits for."""
    n = np.asarray(micro_batches, dtype=float)
    host_s = n * host_per_mb + extra_host
    syncs = n * syncs_per_mb + extra_syncs
    return np.maximum(gpu_s, host_s) + syncs * host.sync_seconds()
