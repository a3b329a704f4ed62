"""What SkyRL's FSDP2 workers run in the training phases, priced from SkyRL's and PyTorch's code.

`training.py` prices the log-prob passes and the update as the pre-training step over packed
mean-length sequences with the training states on the GPU. SkyRL (NovaSky-AI/SkyRL at
a9564572, the commit the marin issue 8653 row cites for its engine defaults) trains with
PyTorch's `fully_shard` (FSDP2) and runs other micro-batches, and with `fsdp_config.cpu_offload`
keeps the parameters, gradients and optimizer on the host. On for `rl_framework: skyrl` rows
trained with FSDP (`zero >= 3`); each rule below is read from that code, nothing is fitted on
the validation rows.

1. **Micro-batches by count, unpadded** (`skyrl/train/config/config.py` TrainerConfig):
   `micro_train_batch_size_per_gpu` 1 and `micro_forward_batch_size_per_gpu` 1 (table columns
   `micro_batch_seqs`, `logprob_micro_batch_seqs`), `max_tokens_per_microbatch` -1 (no token
   packing: the table's `sequence_packing` False), `remove_microbatch_padding` True (THD, the
   real tokens only); `policy_mini_batch_size` prompts per optimizer step (`mini_batches`).
   Every micro-batch's forward all-gathers the model (FSDP2 `reshard_after_forward` True), its
   backward again, and every training micro-batch reduce-scatters the fp32 gradients
   (`reduce_dtype` float32, `fsdp_strategy.py _fsdp_init_model`; the worker's accumulation
   loop, `workers/worker.py forward_backward`, never turns gradient sync off).
2. **`cpu_offload` is FSDP2's `CPUOffloadPolicy(pin_memory=True)`** (`fsdp_strategy.py`; the
   table's `offload_params`): the sharded fp32 parameters, their gradients and the AdamW
   states live on the host.
   a. Before each all-gather the shard is copied to the GPU (`FSDPParam` all-gather inputs,
      `.to(device, non_blocking=True)` from pinned memory, on the all-gather stream): one fp32
      shard per forward and per backward, overlapped with the previous layer's compute, so
      only what exceeds the micro-batch's compute is exposed.
   b. After each reduce-scatter the fp32 gradient shard goes to the host
      (`torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce`): for the
      first micro-batch of an optimizer step without blocking; for every later one
      **blocking** ("Only overlap the D2H copy ... if not accumulating gradients since the CPU
      add kernel depends on the copy result"), then `grad._local_tensor += new_sharded_grad`
      on the host, on the thread that launches the backward. For those micro-batches the
      reduce-scatter, the copy and the host add (read two fp32 shards, write one: 12 B/param
      at the node's host memory bandwidth shared by its GPUs' processes, catalogs/rl.yaml
      `host_dram_gbs`) are serial with the backward.
   c. The optimizer is `torch.optim.AdamW` over the host parameters (`_fsdp_init_train_model`;
      PyTorch runs its single-tensor path on CPU tensors): catalogs/rl.yaml
      `host_adam_bytes_per_param` at the same bandwidth share, once per optimizer step, in
      place of the GPU optimizer step.
   d. Memory: weights, gradients and optimizer states leave the GPU; the training peak is the
      activations and the gathered layers (`train_peak_gib` less the three states).

3. **The eager host floor of a micro-batch** (`skyrl_host.py`, read at 27676c23 with its
   locked transformers 4.57.1 and torch 2.10): every micro-batch is issued kernel by kernel
   from Python and synchronises the host (blocking input copies, `unpad_input`'s `.item()`,
   flash-attention's packed-sequence check per layer, the loss metrics' `.item()` and
   all-reduce), so a pass is max(GPU time, micro-batches x host time) plus those round trips,
   an optimizer step likewise with the step's DTensor ops.

The reference pass runs only with `use_kl_loss` or `use_kl_in_reward` (`RefConfig`): DAPO
recipes set `use_kl_loss=false` (examples/train/algorithms/dapo/run_dapo_*.sh), the table's
`use_ref`. DAPO's dynamic-sampling filter (`trainer_utils.handle_dynamic_sampling`) regenerates
a whole `train_batch_size` batch per round until enough groups have a reward spread: priced
by `phases.py` from the table's `gen_rounds` where a run states it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..simulate import simulate_frame
from . import fsdp_experts, hf_moe, host, inputs, skyrl_host, verl

WEIGHT_BYTES = 4.0   # the fp32 parameter shard FSDP2 keeps (mixed precision casts to bf16)
GRAD_BYTES = 4.0     # reduce_dtype float32
HOST_ADD_BYTES = 12.0  # grad += new: read two fp32 shards, write one


def active(b, tf: pd.DataFrame) -> np.ndarray:
    """Rows priced by SkyRL's FSDP2 workers: `rl_framework: skyrl` trained with FSDP."""
    return verl.fsdp_rows(b, tf, "skyrl")


def offload_costs(shard_params, n_fwd_mb, n_upd_mb, fwd_compute_s, upd_compute_s,
                  rs_s, pcie, host_bw, offload):
    """Seconds rule 2 adds per log-prob pass (`lp_s`) and per optimizer step (`upd_s`), and
    the host AdamW step (`adam_s`, inside `upd_s`). shard_params: parameters per GPU;
    n_*_mb: micro-batches per GPU; *_compute_s: one micro-batch's GPU time; rs_s: one
    micro-batch's gradient reduce-scatter; offload: FSDP2 cpu_offload (0/1)."""
    h2d = shard_params * WEIGHT_BYTES / pcie
    # (a) one shard copy per forward, two per training micro-batch (forward, backward), hidden
    # behind the micro-batch's compute up to its length
    lp = n_fwd_mb * np.maximum(h2d - fwd_compute_s, 0.0)
    upd_h2d = n_upd_mb * np.maximum(2 * h2d - upd_compute_s, 0.0)
    # (b) every micro-batch after the first: reduce-scatter, blocking copy down, host add
    d2h = shard_params * GRAD_BYTES / pcie
    add = shard_params * HOST_ADD_BYTES / host_bw
    accum = np.maximum(n_upd_mb - 1, 0.0) * (rs_s + d2h + add)
    # (c) AdamW on the host
    adam = host.adam_seconds(shard_params, host_bw)
    on = offload > 0
    return {"lp_s": np.where(on, lp, 0.0), "upd_s": np.where(on, upd_h2d + accum + adam, 0.0),
            "adam_s": np.where(on, adam, 0.0), "accum_s": np.where(on, accum, 0.0)}


def phases(df: pd.DataFrame, b, tf: pd.DataFrame, dp: np.ndarray, pcie_bytes_per_s,
           gather_share: np.ndarray, profile=None) -> dict:
    """Per row, SkyRL's phase seconds where `active` (NaN elsewhere): `old_log_prob_s`, `ref_s`,
    `update_s`, `offload_s` (rule 2's share of them), `host_floor_s` (rule 3's: what the host
    adds over the GPU), `states_on_host` (rule 2d), and `on`."""
    n = len(df)
    on = active(b, tf)
    nan = np.full(n, np.nan)
    out = {k: nan.copy() for k in ("old_log_prob_s", "ref_s", "update_s", "offload_s",
                                   "adam_s", "host_floor_s")}
    out["on"] = on
    out["states_on_host"] = on & (b.offload_params > 0)
    if not on.any():
        return out
    idx = np.flatnonzero(on)
    real = b.prompt_len + b.response_mean
    padded = b.prompt_max + b.response_max
    run_len = np.where(b.remove_padding > 0, real, padded)
    mb_train = np.maximum(b.micro_batch_seqs, 1.0)
    mb_lp = np.where(b.logprob_micro_batch_seqs > 0, b.logprob_micro_batch_seqs, mb_train)
    dyn = b.sequence_packing > 0   # max_tokens_per_microbatch > 0: token bins
    budget = tf["seq_len"].to_numpy(float) * tf["micro_batch"].to_numpy(float)
    all_seqs = b.sequences / dp
    mini_seqs = all_seqs / b.mini_batches
    sims, scale, nmb = {}, {}, {}
    for key, seqs, mbs in (("lp", all_seqs, mb_lp), ("upd", mini_seqs, mb_train)):
        mb, n_mb = verl.micro_batching(seqs, real, dyn, budget, mbs)
        fr = verl._frame(tf, dp, run_len, mb, n_mb)
        sims[key] = simulate_frame(fr.iloc[idx].reset_index(drop=True), profile)
        scale[key] = (seqs / (n_mb * fr["micro_batch"].to_numpy(float)))[idx]
        nmb[key] = n_mb[idx]

    def put(arr):
        full = nan.copy()
        full[idx] = arr
        return full

    lp_sim, up_sim = sims["lp"], sims["upd"]
    lp = verl.forward(lp_sim, gather_share[idx]) * scale["lp"]
    step = up_sim["step_time_s"].to_numpy() * scale["upd"]
    shard = up_sim["params_per_gpu"].to_numpy(float) / np.maximum(dp[idx], 1.0)
    pcie = np.broadcast_to(pcie_bytes_per_s, (n,))[idx]
    host_bw = np.broadcast_to(host.memory_bytes_per_s(b), (n,))[idx]
    fwd_mb = lp_sim["time_compute"].to_numpy() / 3 / np.maximum(nmb["lp"], 1.0)
    upd_mb = (up_sim["time_compute"].to_numpy() + up_sim["time_recompute"].to_numpy()) \
        / np.maximum(nmb["upd"], 1.0)
    # one micro-batch's fp32 gradient reduce-scatter: the step's DP traffic per micro-batch
    # (simulate's collectives), its reduce-scatter share
    rs = _reduce_scatter_s(b, idx, shard, dp[idx])
    off = offload_costs(shard, nmb["lp"], nmb["upd"], fwd_mb, upd_mb, rs, pcie, host_bw,
                        b.offload_params[idx])
    gpu_opt = np.where(b.offload_params[idx] > 0, up_sim["time_optimizer"].to_numpy(), 0.0)
    minis = b.mini_batches[idx]
    epochs = b.ppo_epochs[idx]
    # the transformers MoE block's expert path (hf_moe.py; transformers 5.8.0: grouped_mm)
    sub = hf_moe.rows_at(b, idx)
    tf_i = tf.iloc[idx].reset_index(drop=True)
    ckpt = verl._checkpointing(tf_i)
    moe_lp = hf_moe.pass_seconds(sub, tf_i, lp_sim, run_len[idx] * mb_lp[idx], nmb["lp"], ckpt,
                                 True)
    moe_upd = hf_moe.pass_seconds(sub, tf_i, up_sim, run_len[idx] * mb_train[idx], nmb["upd"],
                                  ckpt, False)
    # FSDP2 gathers the experts too, every micro-batch (fsdp_experts.py)
    moe_lp = moe_lp + fsdp_experts.pass_seconds(sub, tf_i, lp_sim, nmb["lp"], True)
    moe_upd = moe_upd + fsdp_experts.pass_seconds(sub, tf_i, up_sim, nmb["upd"], False)
    # 3. the eager host floor of SkyRL's micro-batches (skyrl_host.py)
    layers = b.layers[idx]
    h_fwd, y_fwd = skyrl_host.forward_host(layers, mb_lp[idx])
    h_upd, y_upd = skyrl_host.update_host(layers, mb_train[idx], ckpt)
    h_step, y_step = skyrl_host.step_host(layers)
    lp_gpu = lp + moe_lp
    upd_gpu = step - gpu_opt + moe_upd
    lp_floor = skyrl_host.pass_seconds(lp_gpu, h_fwd, y_fwd, nmb["lp"])
    upd_floor = skyrl_host.pass_seconds(upd_gpu, h_upd, y_upd, nmb["upd"], h_step, y_step)
    upd = (upd_floor + off["upd_s"]) * minis * epochs
    lp_total = lp_floor + off["lp_s"]
    out["host_floor_s"] = put((lp_floor - lp_gpu) * (1 + b.use_ref[idx])
                              + (upd_floor - upd_gpu) * minis * epochs)
    out["hf_moe_s"] = put(moe_lp * (1 + b.use_ref[idx]) + moe_upd * minis * epochs)
    out["old_log_prob_s"] = put(lp_total)
    out["ref_s"] = put(lp_total * b.use_ref[idx])
    out["update_s"] = put(upd)
    out["offload_s"] = put(off["lp_s"] * (1 + b.use_ref[idx]) + off["upd_s"] * minis * epochs)
    out["adam_s"] = put(off["adam_s"] * minis * epochs)
    return out


def _reduce_scatter_s(b, idx, shard_params, dp) -> np.ndarray:
    """One fp32 gradient reduce-scatter of the whole model over the FSDP group (NCCL model)."""
    from .. import nccl
    net = {k: np.asarray(v)[idx] for k, v in inputs.network(b).items()}
    nodes = np.ceil(dp / np.maximum(b.gpus_per_node[idx], 1.0))
    nbytes = shard_params * dp * GRAD_BYTES
    return nccl.collective_time("reduce_scatter", nbytes, dp, nodes, net)["time_s"]

