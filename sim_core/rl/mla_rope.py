"""Megatron-Core's unfused RoPE on packed (THD) sequences in multi-latent attention: host syncs in
the middle of every attention layer's forward.

Why a module of its own: the pre-training step prices RoPE as fused elementwise traffic
(workload.py), and its one host sync per layer is the MoE dispatcher's (moe.py, moe_host.py).
RL workers that unpad their micro-batches hand Megatron-Core THD sequences (`PackedSeqParams`,
qkv_format "thd"); an MLA model built without RoPE fusion then applies RoPE through a reference
implementation that reads the sequence boundaries on the host, twice per layer forward.

What the code does (megatron-core 0.16.0, the wheel SkyRL f6bf2f91 pins in pyproject.toml):
- `multi_latent_attention.py` `qkv_up_proj_and_rope_apply`: with `apply_rope_fusion` False it
  calls `apply_rotary_pos_emb` on the query's and on the key's positional part
  (`cu_seqlens=cu_seqlens_q` / `cu_seqlens_kv`), which for THD input goes to
  `rope_utils._apply_rotary_pos_emb_thd`.
- `_apply_rotary_pos_emb_thd` per call: `((cu_seqlens[1:] - cu_seqlens[:-1]) // cp_size)
  .tolist()` (2 kernels, one D2H sync); `if freqs.dim() >= 1 and freqs.size(0) ==
  cu_seqlens[-1]` (an int compared with a CUDA tensor: 1 kernel, its truth value one sync);
  when equal (RoPE's length is `max(max_seqlen_q, max_seqlen_kv)`, rotary_pos_embedding.py
  `get_rotary_seq_len`, which for one sequence per micro-batch is its whole length) one
  `cu_seqlens[i].item()` per sequence (one sync each), the frequencies' `torch.cat` (1), and
  `_apply_rotary_pos_emb_bshd` with `multi_latent_attention`: the de-interleave `cat`, cos,
  `* mscale`, cast, sin, `* mscale`, cast, `t * cos_`, `_rotate_half` (neg, cat), `* sin_`,
  add, the final `cat` with the pass-through part: 13 kernels.
- So a layer forward adds 6 syncs (3 per call, one sequence per micro-batch; 4 with several
  sequences, whose RoPE length is then shorter than the packed total), and the host
  issues 18 kernels with the GPU's queue empty behind a sync (the comparison's 1 after the
  first sync of each call; the query's 14 RoPE kernels plus the key's 2 length kernels between
  the two calls), each at the host's per-kernel time: the GPU has nothing queued to hide them.
  The kernels after the key's last sync run ahead of a GPU busy with the rest of the layer.
- A full recompute replays each layer's forward, syncs included; the backward (autograd over
  the same ops) does not sync.

Which rows: SkyRL's Megatron worker unpads every micro-batch into THD
(skyrl/backends/skyrl_train/distributed/megatron/megatron_utils.py `preprocess_packed_seqs`,
`max_seqlen_q` the padded length as a Python int) and builds GLM-4.7-Flash with Megatron-
Bridge's `DeepSeekV3ModelProvider` (megatron_worker.py `_GLM47FlashBridge` at f6bf2f91; Megatron-
Bridge 02b5fccab5e5, SkyRL's lock: `DeepSeekModelProvider.apply_rope_fusion = False`). The GLM
script's `transformer_config_kwargs.no_rope_fusion=true` is `setattr` on the provider
(megatron_worker.py `init_configs`), an attribute Megatron's TransformerConfig does not read:
RoPE stays unfused. Optional row column `train_apply_rope_fusion` (blank: false for these rows).
Other frameworks' MLA rows are left as they are: their Megatron versions and RoPE settings were
not read for this.

Checked and not counted: Transformer Engine 2.10.0's `DotProductAttention.forward` (SkyRL's
pin) computes `pad_between_seqs` with `torch.equal(cu_seqlens_q_padded[:-1], cu_seqlens_q[:-1])`
(and kv) when not given, and Megatron-Core 0.16.0's PackedSeqParams has no such field; but
SkyRL passes one tensor as both (`preprocess_packed_seqs`), and PyTorch's `cuda_equal`
(aten/src/ATen/native/cuda/Equal.cpp) returns early for aliases of the same storage, offset and
strides: no sync.

Costs: `catalogs/moe.yaml host_sync_us` per sync and `catalogs/rl.yaml eager_host_s_per_kernel`
per kernel, both declared for the other host rules; the counts are from the code above. The
GPU time of the 18 small kernels (tens of thousands of elements each) is left in the core's
fused pricing. Nothing is fitted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import host
from .inputs import RL_FRAMEWORK, fsdp, recompute_mode, stated_flag, train_col

CALLS = 2            # query and key positional parts, per layer forward
# .tolist() and the length comparison; with one sequence per micro-batch RoPE's length equals
# cu_seqlens[-1], so the exact-offset branch adds one .item() (several sequences: the
# traditional branch, none)
SYNCS_PER_CALL, SYNCS_ONE_SEQUENCE = 2, 1
EXPOSED_KERNELS = 18  # issued with the queue empty: 1 + 1 after the comparisons' syncs, 14 + 2
#                       between the two calls


def rows(b, tf: pd.DataFrame, df: pd.DataFrame) -> np.ndarray:
    """SkyRL Megatron rows of an MLA model whose RoPE is not fused."""
    skyrl = (np.asarray(b.rl_framework) == RL_FRAMEWORK.index("skyrl")) & ~fsdp(tf)
    mla = np.asarray(b.kv_lora_rank, dtype=float) > 0
    return skyrl & mla & ~stated_flag(df, "train_apply_rope_fusion", False)


def layer_forward_seconds(seqs_per_micro_batch) -> np.ndarray:
    """Host seconds one layer forward adds: its syncs and the kernels issued behind them."""
    one = np.asarray(seqs_per_micro_batch, dtype=float) <= 1
    syncs = CALLS * (SYNCS_PER_CALL + np.where(one, SYNCS_ONE_SEQUENCE, 0))
    return syncs * host.sync_seconds() + EXPOSED_KERNELS * host.seconds_per_kernel()


def seconds(b, df: pd.DataFrame, tf: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """Seconds added per optimizer step of the training frame (`update_s`: each micro-batch's
    forward, and its replay under a full recompute) and per log-prob pass over the same
    sequences (`log_prob_s`: one forward per micro-batch, as the frame's)."""
    on = rows(b, tf, df)
    pp = np.maximum(train_col(tf, "pp"), 1.0)
    layers = np.maximum(np.ceil(np.asarray(b.layers, dtype=float) / pp), 1.0)
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    rc = recompute_mode(tf)
    forwards = np.where(rc == "full", 2.0, 1.0)
    per = m * layers * layer_forward_seconds(tf["micro_batch"].to_numpy(float))
    zero = np.zeros(len(tf))
    return {"update_s": np.where(on, per * forwards, zero), "log_prob_s": np.where(on, per, zero)}
