"""The host side of training passes: the floor an eager Hugging Face model under FSDP1 puts
on each micro-batch, and the host memory an optimizer run on the CPU streams through.

verl's FSDP workers run the Hugging Face model in eager PyTorch (`verl.py` rule 6), and
their loops synchronise the host every micro-batch (`.item()` on the loss metrics in
`dp_actor.py update_policy`; `unpad_input`'s `max().item()` and flash-attention's
`cu_seqlens` built from `nonzero` in every forward). A micro-batch therefore lasts at least
as long as the host takes to issue its kernels: Python, the module calls, the dispatcher and
the CUDA launch, once per kernel. For a small model at a few thousand tokens the GPU finishes
each kernel before the host has issued the next one and the host sets the time:
micro-batch = max(GPU time, host time).

Host time = kernels issued x seconds per kernel. The kernels are counted from the code the
rows ran (below); the seconds per kernel are `catalogs/rl.yaml eager_host_s_per_kernel`,
read off a published host-bound eager measurement at the rows' versions (Qwen's transformers
speed benchmark: torch 2.6, transformers 4.51.3). Nothing is fitted on the validation rows.

Kernels per decoder layer, Qwen2 / Llama in transformers 4.47-4.53 (the releases verl v0.3-
v0.5 ran; `modeling_qwen2.py`, `modeling_llama.py`, `modeling_flash_attention_utils.py`):

* forward, 51: two RMSNorms of 8 each (`to(float32)`, `pow`, `mean`, `+ eps`, `rsqrt`, `*`,
  `to(input_dtype)`, `weight *`); q/k/v projections 3 (Qwen2's biases ride in `addmm`); RoPE
  on q and k, 5 each (`q * cos`, `rotate_half`'s `neg` and `cat`, `* sin`, `+`);
  flash-attention varlen from position ids, 14 (`_flash_attention_forward`'s
  `(torch.diff(position_ids) >= 0).all()` 3; `prepare_fa2_from_position_ids`: k/v
  `contiguous` 2, `arange` 1, `position_ids == 0` + boolean index 3, the `torch.tensor` size
  copy 1, `cat` 1, `max() + 1` 2; `flash_attn_varlen_func` 1) - the padded path
  (`_upad_input`: `_get_unpad_data` 5, three `index_first_axis`, `pad_input` 2, the kernel)
  is within one of it; o projection 1; SwiGLU 5 (`gate_proj`, `silu`, `up_proj`, `*`,
  `down_proj`); two residual adds.
* backward, 65: each RMSNorm 14 (cast, `pow` 2, `mean` 1, `rsqrt` 3, the two broadcast `mul`s
  3 each including the weight's reduction, the accumulated residual branch 1); the seven
  projections 2 GEMMs each plus Qwen2's three bias reductions (17); RoPE 5 each (two `mul`s,
  `neg`, the `cat`'s two slices accumulated); flash-attention backward 3 (`_flash_attn_varlen_
  backward`: the kernel, `dq` accumulation convert, the `contiguous`' copies folded in); SwiGLU
  3; the residual accumulations 2.
* gradient checkpointing (`gradient_checkpointing_enable(use_reentrant=False)`, verl
  `fsdp_workers.py`; a decoder layer per checkpoint) replays the forward in the backward: 51.

FSDP1 (`FullyShardedDataParallel(use_orig_params=False)`, verl `fsdp_workers.py` v0.4.0;
pytorch `torch/distributed/fsdp/_runtime_utils.py` and `_flat_param.py`, torch 2.x: the
functions named are those of the 2.1-2.6 releases), one unit
per decoder layer plus the root: forward 2 per unit (`FlatParamHandle.pre_unshard` casts the
fp32 shard to the bf16 `_mp_shard`, `unshard` all-gathers it); backward 9 (unshard again: 2,
`FULL_SHARD` reshards after forward; `SplitWithSizesBackward` builds the flat gradient 1;
`_post_backward_hook` casts it to `reduce_dtype` fp32 1; `_reduce_grad`: `_div_if_needed`
pre-divide, `reduce_scatter_tensor`, post-divide 3; the sharded gradient accumulated and
`_post_reduce_grad_callback`'s cast 2).

FSDP1 also runs Python per original parameter in every forward's unshard
(`_use_unsharded_views`: a view of the FlatParameter and a `setattr` per weight; with
`use_orig_params=False` only in forward, `_use_unsharded_flat_param`): `catalogs/rl.yaml
fsdp1_view_s_per_param` (pytorch PR 96958's measurement) x the layer's 9 weight tensors (q, k,
v, o, gate, up, down, two norms; Qwen2's three biases left out), per layer forward and per
checkpoint replay.

Per micro-batch, outside the layers (verl v0.4.0 `dp_actor._forward_micro_batch` with
`use_remove_padding`): forward 45 (`unpad_input` 7, the position ids' `index_first_axis` 2,
`torch.roll` 1, embedding 1, the rotary table 9, final norm 8, LM head 1, `div_(temperature)`
1, `logprobs_from_logits` 3, `entropy_from_logits` 7, two `pad_input` 4); an update
micro-batch 135 more (the loss: `compute_policy_loss` ~25, the low-variance KL and its
`agg_loss` ~9, their backward ~35; the head, loss, final norm and embedding backward ~25;
the forward again without the entropy ~38; the metrics' `.item()` copies 5). Per optimizer
step: FSDP1 `clip_grad_norm_` (a norm and a `mul_` per flat parameter: 2 x units, plus ~8)
and foreach AdamW over the flat parameters (~22 multi-tensor launches): 2 x units + 30.

The counts are read from code, not profiled: each is good to about a fifth. The update's
layers are not priced from the backward count: HF's own decoder layers timed host-bound on an
H100 (`catalogs/rl.yaml eager_update_over_forward`) cost 4.65 forward floors per update (forward
with autograd + backward), where 51 + 65 kernels at one price give 2.27. What they leave out
is said in docs/rl.md ("The host floor of a micro-batch").
"""

from __future__ import annotations

import numpy as np

from ..moe import table as moe_table
from .inputs import constants

# kernels issued per decoder layer (module docstring)
LAYER_FORWARD = 51
LAYER_BACKWARD = 65
# FSDP1 kernels per unit (a decoder layer, and the root)
FSDP_UNIT_FORWARD = 2
FSDP_UNIT_BACKWARD = 9
# per micro-batch outside the layers: a log-prob / values forward, an update micro-batch
MICRO_BATCH_FORWARD = 45
MICRO_BATCH_UPDATE = 135
# per optimizer step: 2 per FSDP unit (grad-norm clipping) + the foreach AdamW launches
STEP_PER_UNIT = 2
STEP_FIXED = 30
# weight tensors of a Llama-style decoder layer FSDP1 re-views in each forward
PARAMS_PER_LAYER = 9


def seconds_per_kernel() -> float:
    """Host seconds per kernel of eager PyTorch (`catalogs/rl.yaml eager_host_s_per_kernel`)."""
    return float(constants()["eager_host_s_per_kernel"])


def sync_seconds() -> float:
    """One host-device round trip with the queue drained: a `.item()` or any D2H copy the
    host waits for (`catalogs/moe.yaml host_sync_us`)."""
    return float(moe_table()["host_sync_us"]) * 1e-6


def view_seconds() -> float:
    """FSDP1's host seconds per decoder layer forward for its parameter views
    (`catalogs/rl.yaml fsdp1_view_s_per_param` x `PARAMS_PER_LAYER`)."""
    return float(constants()["fsdp1_view_s_per_param"]) * PARAMS_PER_LAYER


def forward_kernels(layers) -> np.ndarray:
    """Kernels one forward micro-batch issues (`compute_log_prob`, `compute_values`)."""
    layers = np.asarray(layers, dtype=float)
    units = layers + 1.0
    return layers * LAYER_FORWARD + units * FSDP_UNIT_FORWARD + MICRO_BATCH_FORWARD


def update_over_forward() -> float:
    """An eager layer's update host floor over its forward's (`catalogs/rl.yaml
    eager_update_over_forward`, measured on HF decoder layers)."""
    return float(constants()["eager_update_over_forward"])


def update_kernels(layers, checkpointing) -> np.ndarray:
    """Forward-kernel equivalents of one update micro-batch's host work: each layer's forward
    with autograd and backward as `update_over_forward()` plain forwards (measured: counting
    the backward's 65 kernels at a forward kernel's price leaves half of it out), the
    checkpointed layers' replay, FSDP1's gathers and gradient reduction, the loss and its
    metrics."""
    layers = np.asarray(layers, dtype=float)
    units = layers + 1.0
    replay = np.where(np.asarray(checkpointing, dtype=bool), LAYER_FORWARD, 0.0)
    return (layers * (LAYER_FORWARD * update_over_forward() + replay)
            + units * (FSDP_UNIT_FORWARD + FSDP_UNIT_BACKWARD) + MICRO_BATCH_UPDATE)


def step_kernels(layers) -> np.ndarray:
    """Kernels of one optimizer step over FSDP1's flat parameters (one per unit)."""
    return (np.asarray(layers, dtype=float) + 1.0) * STEP_PER_UNIT + STEP_FIXED


def forward_floor(layers, micro_batches) -> np.ndarray:
    """Host seconds of a forward pass of `micro_batches` micro-batches."""
    per_mb = forward_kernels(layers) * seconds_per_kernel() \
        + np.asarray(layers, dtype=float) * view_seconds()
    return np.asarray(micro_batches, dtype=float) * per_mb


def update_floor(layers, micro_batches, checkpointing) -> np.ndarray:
    """Host seconds of one optimizer step of `micro_batches` update micro-batches."""
    forwards = 1.0 + np.asarray(checkpointing, dtype=bool)  # the forward and its replay
    per_mb = update_kernels(layers, checkpointing) * seconds_per_kernel() \
        + np.asarray(layers, dtype=float) * forwards * view_seconds()
    return np.asarray(micro_batches, dtype=float) * per_mb \
        + step_kernels(layers) * seconds_per_kernel()


def memory_bytes_per_s(b) -> np.ndarray:
    """Host memory bandwidth one GPU's training process gets: the node's
    (`catalogs/rl.yaml host_dram_gbs`) shared by the GPUs that host serves
    (`host_gpus`: the DGX H100's 8), not the NVLink domain `gpus_per_node` counts (72 GPUs
    of a GB200 rack sit on 36 Grace CPUs)."""
    k = constants()
    return k["host_dram_gbs"] * 1e9 / float(k.get("host_gpus", 8)) * np.ones(np.shape(b.gpus_per_node))


def adam_seconds(params, bytes_per_s) -> np.ndarray:
    """One step of PyTorch's CPU AdamW over `params` parameters (single-tensor path on CPU
    tensors: `catalogs/rl.yaml host_adam_bytes_per_param` of memory traffic each): Megatron's
    CPU optimizer (HybridDeviceOptimizer) and SkyRL's FSDP2 `cpu_offload` both run it."""
    return params * constants()["host_adam_bytes_per_param"] / bytes_per_s
