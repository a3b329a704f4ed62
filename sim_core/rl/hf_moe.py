"""The Hugging Face sparse-MoE block under FSDP: what its expert path costs beyond the step.

Why a module of its own: FSDP trainers (verl's FSDP workers, NeMo RL's DTensor worker, SkyRL's
FSDP2 workers) run the model through the transformers modeling code, not Megatron-Core's MoE
layer (`moe_host.py`). The pre-training step prices an MoE layer's experts as grouped GEMMs
with a few launch gaps and one sync (sim_core/moe.py `launch_overhead_s`); the transformers
code the rows' frameworks pinned runs one of two expert paths, read from that code:

* **transformers 4.x: a Python loop over the experts** (`Qwen3MoeSparseMoeBlock.forward`,
  transformers v4.51.3 and v4.52.4 identical; `Qwen2MoeSparseMoeBlock`, `MixtralSparseMoeBlock`
  loop over the experts hit, `.nonzero().tolist()` once; `DeepseekV3MoE.moe` over all with a
  `numel()` check). Qwen3-MoE loops `for expert_idx in range(self.num_experts)`; per expert:
  `torch.where(expert_mask[expert_idx])` (`nonzero`: 2 kernels and a **device-to-host sync**,
  the output size is data dependent), `hidden_states[None, top_x]` (1), the expert MLP
  `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (5), `routing_weights[top_x, idx, None]` and
  the multiply (2), `index_add_` (1): `LOOP_FWD` = 11 kernels + 1 sync. Per layer outside the
  loop (`ROUTER_FWD` = 9): gate GEMM, softmax in fp32, topk, the norm's sum and `/=`, the cast,
  `zeros`, `one_hot` (zeros + scatter). Backward, the autograd nodes of one expert
  (`LOOP_BWD` = 20, no sync: the indices are saved): `index_add_`'s (index_select), the
  routing multiply's two grads (mul; mul + sum), the routing weights' IndexBackward (zeros +
  `index_put_` accumulate, and its accumulation), three Linear backward (6 GEMMs), SwiGLU's
  (2 mul, silu_backward), the two uses of the input accumulated (add), the input's
  IndexBackward (zeros + `index_put_`) and its accumulation into the hidden states' grad (add).
  That last pair writes a zeros tensor of the **whole** [tokens, hidden] input per expert
  (autograd `index_backward`: `zeros_like(self).index_put_(indices, grad, accumulate=True)`)
  and adds it into the running gradient: `INDEX_BWD_PASSES` = 4 passes of tokens x hidden x
  2 B per expert hit, GPU work the step does not price. Gradient checkpointing replays the
  forward, syncs included, inside the backward.
* **transformers 5.x: `grouped_mm`** (`Qwen3MoeExperts` under `@use_experts_implementation`,
  transformers v5.8.0 `integrations/moe.py grouped_mm_experts_forward`;
  `modeling_utils.get_correct_experts_implementation`: a config that names none gets
  "grouped_mm", which `_can_use_grouped_mm` runs on any SM80+ GPU). One sort of the routed
  pairs, the gathers, `histc` + `cumsum` offsets on the GPU, two `torch._grouped_mm` /
  `F.grouped_mm`, SwiGLU, the weighting, the sentinel masks, the inverse permutation and the
  top-k sum: `GROUPED_FWD` = 22 kernels per layer with the router, no sync, whatever the
  expert count; backward `GROUPED_BWD` = 26. The step's grouped-GEMM pricing is that path.

Which path a row ran (`TRANSFORMERS`): SkyRL a9564572 (the marin row's commit) locks
transformers 5.8.0 (`uv.lock`; pyproject `transformers>=5.6.1,<=5.8.0`) and sets no
`experts_implementation` (`workers/model_wrapper.py`: `from_pretrained` with the attention
implementation only, Liger off by default): grouped_mm. NeMo RL v0.3.0 locks transformers
4.52.4 (`uv.lock`; its DTensor `parallelize.py` has no MoE plan of its own): the loop. verl
v0.4-v0.5 (`setup.py` leaves transformers unpinned; the 2025 logs ran 4.47-4.53, host.py) with
`use_liger`/`use_fused_kernels` off swaps no MoE kernel in: the loop. OpenRLHF is not an
`rl_framework` of the table (DeepSpeed, not FSDP), slime's FSDP backend was not read: zero.

Pricing, per MoE layer and micro-batch (the host constants are the ones already declared:
`catalogs/rl.yaml eager_host_s_per_kernel`, 9.7 us; `catalogs/moe.yaml host_sync_us`, 20 us,
the CUDA Best Practices Guide's synchronisation + launch latency):

* loop forward: every sync drains the GPU's queue, so each expert is one segment of
  max(its host issue, its GPU work) + the sync, and the layer's segments add up. The experts'
  GEMMs are in the step already (grouped): what this adds is
  `hit x (max(LOOP_FWD x s - g_e, 0) + sync) + ROUTER_FWD x s` with g_e one expert's three
  GEMMs at `compute.gemm_curve` (tokens per expert = tokens x top_k / experts; the per-expert
  `nn.Linear` is a cuBLAS GEMM, split-K allowed), hit = experts x (1 - (1 - k/E)^tokens).
* loop backward: no sync, the autograd engine may run ahead: max(hit x LOOP_BWD x s - the
  layer's GPU backward, 0), plus the IndexBackward bytes at the elementwise HBM rate.
* grouped_mm: max(host - GPU, 0) per layer pass, which is zero unless a layer's GPU work is
  under ~0.2 ms.

Nothing is fitted; the counts are read from code, each good to about a fifth.
"""

from __future__ import annotations

import numpy as np

from .. import compute
from ..columns import Batch
from . import host
from .inputs import RL_FRAMEWORK, constants, fsdp

# kernels (module docstring)
LOOP_FWD = 11
LOOP_BWD = 20
ROUTER_FWD = 9
ROUTER_BWD = 8
GROUPED_FWD = 22
GROUPED_BWD = 26
INDEX_BWD_PASSES = 4.0
BF16 = 2.0

# the transformers release each framework's lock ran (module docstring): its expert path
TRANSFORMERS = {"skyrl": "5.8.0", "nemo_rl": "4.52.4", "verl": "4.52.4"}
LOOP, GROUPED = 1.0, 2.0


def path(b, tf) -> np.ndarray:
    """Per row: 0 (not an FSDP MoE row of a framework that runs the transformers code),
    LOOP (transformers 4.x) or GROUPED (transformers 5.x grouped_mm)."""
    out = np.zeros(len(b.experts))
    moe = (b.experts > 0) & (b.moe_layers > 0) & fsdp(tf)
    for fw, version in TRANSFORMERS.items():
        kind = LOOP if int(version.split(".")[0]) < 5 else GROUPED
        out = np.where(moe & (b.rl_framework == RL_FRAMEWORK.index(fw)), kind, out)
    return out


def rows_at(b, idx) -> Batch:
    """The batch's per-row arrays at rows `idx` (scalars kept): the phases that price a subset
    of rows hand it to this module."""
    out = Batch()
    for k, v in b.items():
        out[k] = np.asarray(v)[idx] if np.ndim(v) else v
    return out


def experts_hit(b, tokens) -> np.ndarray:
    """Expected experts with at least one of `tokens` tokens routed to them (top_k of E)."""
    e = np.maximum(b.experts, 1.0)
    k = np.minimum(np.maximum(b.top_k, 1.0), e)
    return e * (1.0 - (1.0 - k / e) ** np.maximum(tokens, 0.0))


def expert_gemm_s(b, tokens) -> np.ndarray:
    """GPU seconds of one expert's forward GEMMs (gate, up, down) in the loop."""
    t_e = np.maximum(tokens * b.top_k / np.maximum(b.experts, 1.0), 1.0)
    ffn = np.maximum(b.expert_ffn, 1.0)   # dense models: 0 (their rows price nothing here)
    hid = np.maximum(b.hidden, 1.0)
    arch = b.sm_arch
    emax = compute._by_arch(arch, "gemm_max", "bf16")
    k_half = compute._by_arch(arch, "gemm_k_half", "bf16")
    eff = compute.gemm_curve(t_e, ffn, hid, emax, k_half, b.sm_count, True)
    eff_d = compute.gemm_curve(t_e, hid, ffn, emax, k_half, b.sm_count, True)
    peak = b.peak_bf16 * 1e12
    flops = 2.0 * t_e * hid * ffn
    return 2.0 * flops / (peak * np.maximum(eff, 1e-6)) + flops / (peak * np.maximum(eff_d, 1e-6))


def layer_seconds(b, tf, tokens, gpu_fwd, gpu_bwd) -> dict:
    """Seconds one MoE layer adds per micro-batch of `tokens` tokens: `fwd` (a forward, and
    each checkpoint replay), `bwd` (its backward); `gpu_fwd` / `gpu_bwd`: the layer's GPU
    seconds the step prices for that micro-batch. Also `syncs` and the kernel counts."""
    kind = path(b, tf)
    s = float(constants()["eager_host_s_per_kernel"])
    sync = host.sync_seconds()
    tokens = np.asarray(tokens, dtype=float)
    hit = experts_hit(b, tokens)
    g_e = expert_gemm_s(b, tokens)
    loop_f = hit * (np.maximum(LOOP_FWD * s - g_e, 0.0) + sync) + ROUTER_FWD * s
    hbm = b.hbm_bw_gbs * 1e9 * compute._by_arch(b.sm_arch, "elementwise")
    index_bwd = hit * INDEX_BWD_PASSES * tokens * b.hidden * BF16 / hbm
    loop_b = np.maximum(hit * LOOP_BWD * s + ROUTER_BWD * s - gpu_bwd, 0.0) + index_bwd
    grp_f = np.maximum(GROUPED_FWD * s - gpu_fwd, 0.0)
    grp_b = np.maximum(GROUPED_BWD * s - gpu_bwd, 0.0)
    zero = np.zeros_like(tokens)
    fwd = np.select([kind == LOOP, kind == GROUPED], [loop_f, grp_f], zero)
    bwd = np.select([kind == LOOP, kind == GROUPED], [loop_b, grp_b], zero)
    return {"fwd": fwd, "bwd": bwd, "syncs_fwd": np.where(kind == LOOP, hit, 0.0),
            "kernels_fwd": np.select([kind == LOOP, kind == GROUPED],
                                     [hit * LOOP_FWD + ROUTER_FWD, GROUPED_FWD + zero], zero),
            "kernels_bwd": np.select([kind == LOOP, kind == GROUPED],
                                     [hit * LOOP_BWD + ROUTER_BWD, GROUPED_BWD + zero], zero),
            "path": kind}


def pass_seconds(b, tf, sim, tokens, n_mb, checkpointing, forward_only) -> np.ndarray:
    """Seconds the MoE layers add to a pass of `n_mb` micro-batches of `tokens` tokens each,
    priced on `sim` (the step of that frame: its compute per micro-batch and layer sets the GPU
    side, a third forward and two thirds backward, as moe_host.py). `checkpointing`: the
    backward replays each layer's forward; `forward_only`: a log-prob pass."""
    m = np.maximum(sim["num_microbatches"].to_numpy(float), 1.0)
    layers = np.maximum(b.layers, 1.0)
    compute_mb = sim["time_compute"].to_numpy() / (m * layers)
    k = layer_seconds(b, tf, tokens, compute_mb / 3.0, compute_mb * 2.0 / 3.0)
    replay = np.asarray(checkpointing, dtype=bool)
    per_mb = np.where(forward_only, k["fwd"], k["fwd"] * (1.0 + replay) + k["bwd"])
    return np.asarray(n_mb, dtype=float) * b.moe_layers * per_mb
