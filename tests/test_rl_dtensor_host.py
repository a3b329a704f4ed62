"""What DTensor tensor parallelism costs NeMo RL's DTensor worker (sim_core/rl/dtensor_host.py):
DTensor ops counted from NeMo RL v0.3.0 / transformers 4.52.4 / torch 2.7.0 code, the host
floor of a micro-batch, the optimizer step over DTensor parameters, the SP plan's
per-projection all-gathers; TP 1 layers and Megatron rows untouched."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from sim_core.rl import dtensor_host, host, inputs
from sim_core.rl.inputs import RL_FRAMEWORK, constants
from sim_core.rl.phases import simulate_rl

from .rl_rows import NEMO_DTENSOR_8B, NEMO_DTENSOR_70B

# the blog's Llama 3.1-70B DTensor TP8 + SP row with dynamic batching (rl_runs.csv), an 8B
# TP1 DTensor row and the Megatron sibling
BASE = NEMO_DTENSOR_8B
BIG = {**NEMO_DTENSOR_70B, "train_sequence_parallel": True}


def test_layer_counts_read_from_the_code():
    c = dtensor_host.layer_counts(np.array([1.0, 0.0]))
    # 7 projections x (t, view, mm, _unsafe_view) + 2 SP RMSNorms x 8
    assert list(c["dt_fwd"]) == [7 * 4 + 16, 7 * 4]
    # 7 x (view grad, t+mm, t+mm+t, t bwd, view bwd, detach) + 2 x (14 + detach)
    assert list(c["dt_bwd"]) == [7 * 9 + 30, 7 * 9]
    # the plain rest of host.py's layer: never negative, and fewer with SP
    assert list(c["plain_fwd"]) == [host.LAYER_FORWARD - 7 - 16, host.LAYER_FORWARD - 7]
    assert list(c["plain_bwd"]) == [host.LAYER_BACKWARD - 14 - 28, host.LAYER_BACKWARD - 14]
    assert (c["plain_fwd"] > 0).all() and (c["plain_bwd"] > 0).all()


def test_host_seconds_per_micro_batch_and_optimizer_step():
    s_d, s_k = float(constants()["dtensor_op_s"]), float(constants()["eager_host_s_per_kernel"])
    assert s_d == 90e-6 and s_d > 5 * s_k  # PyTorch PR 159699's expected dispatch time
    fwd, upd = dtensor_host.micro_batch_host(np.array([80.0]), np.array([1.0]))
    want_fwd = 80 * (44 * s_d + (host.LAYER_FORWARD - 23) * s_k) + (6 + 8) * s_d
    assert np.isclose(fwd[0], want_fwd)
    want_bwd = 80 * (93 * s_d + (host.LAYER_BACKWARD - 42) * s_k) + (12 + 15) * s_d
    assert np.isclose(upd[0], want_fwd + want_bwd)
    # NeMo RL's checkpointing wraps the MLP only: its 3 projections and silu, * replay
    _, ck = dtensor_host.micro_batch_host(np.array([80.0]), np.array([1.0]), np.array([True]))
    assert np.isclose(ck[0] - upd[0], 80 * (12 * s_d + 2 * s_k))
    # single-tensor AdamW 8 + 2 detaches per DTensor parameter, 4 plain; 80 x 9 + 3 params
    opt = dtensor_host.optimizer_host(np.array([80.0, 32.0]))
    assert np.allclose(opt, np.array([723.0, 291.0]) * (10 * s_d + 4 * s_k))


def _synthetic(step, t_opt, tp_t, tp, sp, mb, fwd, framework="nemo_rl", zero=3):
    n = len(step)
    tf = pd.DataFrame({"tp": tp, "zero": [zero] * n, "sequence_parallel": sp,
                       "micro_batch": mb, "recompute": ["none"] * n})
    sim = pd.DataFrame({"num_microbatches": [10.0] * n, "step_time_s": step,
                        "time_optimizer": t_opt, "time_tp": tp_t})
    b = SimpleNamespace(rl_framework=np.full(n, RL_FRAMEWORK.index(framework)),
                        layers=np.full(n, 80.0), mini_batches=np.full(n, 4.0))
    return dtensor_host.seconds(b, tf, sim, np.ones(n), np.full(n, 0.5), np.asarray(fwd))


def test_floor_binds_only_when_the_host_is_slower_than_the_gpu():
    _, upd = dtensor_host.micro_batch_host(np.array([80.0]), np.array([1.0]))
    fast_gpu = upd[0] * 10 * 0.5  # the GPU half the host's time per step
    r = _synthetic(step=[fast_gpu, 100.0], t_opt=[0.0, 0.0], tp_t=[0.0, 0.0], tp=[8, 8],
                   sp=[True, True], mb=[1, 1], fwd=[0.0, 100.0])
    assert np.isclose(r["update_host_s"][0], 10 * upd[0] - fast_gpu)
    assert r["update_host_s"][1] == 0.0 and r["log_prob_s"][1] == 0.0
    assert r["log_prob_s"][0] > 0  # 0.5 x 10 x 4 log-prob micro-batches, no GPU time


def test_sp_gathers_only_with_several_sequences_per_micro_batch():
    r = _synthetic(step=[100.0] * 3, t_opt=[0.0] * 3, tp_t=[10.0] * 3, tp=[8, 8, 8],
                   sp=[True, True, False], mb=[6, 1, 6], fwd=[100.0] * 3)
    # +3 forward all-gathers, -2 backward re-gathers, of the 10 SP collectives per layer
    assert np.allclose(r["gather_update_s"], [1.0, 0.0, 0.0])
    # log-probs: +3 per forward, tok_ratio 1, 4 mini-batches
    assert np.allclose(r["gather_log_prob_s"], [3.0 * 4, 0.0, 0.0])


def test_tp1_layers_and_other_frameworks_untouched():
    r = _synthetic(step=[0.01] * 4, t_opt=[0.0] * 4, tp_t=[1.0] * 4, tp=[1, 8, 8, 8],
                   sp=[False, True, True, True], mb=[6] * 4, fwd=[0.0] * 4)
    # TP 1: no layer floor and no gathers, only the optimizer over FSDP2's DTensor shards
    assert r["update_host_s"][0] == 0.0 and r["log_prob_s"][0] == 0.0
    assert r["optimizer_host_s"][0] > 0 and r["update_host_s"][1] > 0
    for framework, zero in (("verl", 3), ("nemo_rl", 1)):  # verl FSDP; NeMo RL Megatron
        o = _synthetic(step=[0.01], t_opt=[0.0], tp_t=[1.0], tp=[8], sp=[True], mb=[6],
                       fwd=[0.0], framework=framework, zero=zero)
        assert all(np.all(v == 0) for v in o.values())


def test_end_to_end_only_nemo_dtensor_rows_move(monkeypatch):
    rows = [BASE, {**BASE, **BIG}, {**BASE, "train_zero": 1},
            {**BASE, **BIG, "train_zero": 1, "train_pp": 4, "train_tp": 4,
             "train_sequence_parallel": None, "dynamic_batching": None}]
    df = pd.DataFrame(rows)
    with_dt = simulate_rl(df, phase_scales={})  # the white-box model: the rule alone
    keys = ("update_s", "log_prob_s", "update_host_s", "optimizer_host_s", "gather_update_s",
            "gather_log_prob_s")
    monkeypatch.setattr(dtensor_host, "seconds",
                        lambda b, tf, *a: {k: np.zeros(len(tf)) for k in keys})
    without = simulate_rl(df, phase_scales={})
    d_up = with_dt["update_time_s"].to_numpy() - without["update_time_s"].to_numpy()
    d_lp = with_dt["log_prob_time_s"].to_numpy() - without["log_prob_time_s"].to_numpy()
    # 70B TP8 SP: the optimizer and the SP gathers add to both; Megatron rows do not move
    assert d_up[1] > 0 and d_lp[1] > 0
    assert d_up[2] == 0 and d_lp[2] == 0 and d_up[3] == 0 and d_lp[3] == 0
    # 8B TP1: only the optimizer step over the DTensor shards (4 mini-batches), no log-probs
    b = inputs.to_batch(df)
    opt = dtensor_host.optimizer_host(b.layers)[0]
    assert d_lp[0] == 0 and 0 < d_up[0] <= 4 * opt + 1e-9
