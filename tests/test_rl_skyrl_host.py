"""SkyRL's FSDP2 micro-batch host floor (sim_core/rl/skyrl_host.py): the counts read from
SkyRL 27676c23 / transformers 4.57.1 / torch FSDP2, and where the floor binds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import host, skyrl_host
from sim_core.rl.phases import simulate_rl

K = host.seconds_per_kernel()
P = host.PARAMS_PER_LAYER


def test_layer_forward_takes_the_dense_flash_path_with_one_sync():
    # host.py's 51 less its 14-kernel varlen-from-position-ids path, plus 4.57.1's
    # `_is_packed_sequence` (6) and `flash_attn_func` (1); the bool() is a sync
    assert skyrl_host.LAYER_FORWARD == 44
    s, y = skyrl_host.forward_host(np.array([28.0]), 1)
    units = 29
    assert s[0] == pytest.approx((28 * 44 + units * (P + 3) + 58) * K)
    assert y[0] == 28 + 7


def test_packed_micro_batches_add_the_varlen_path_and_its_item():
    one, four = (skyrl_host.forward_host(np.array([10.0]), m) for m in (1, 4))
    assert four[0][0] - one[0][0] == pytest.approx(10 * 10 * K)
    assert four[1][0] - one[1][0] == 10


def test_fsdp2_units_are_per_parameter():
    fwd, upd = skyrl_host.unit_kernels(np.array([0.0, 1.0]))
    # one unit (the root) / two: an unshard P + 3; update: two unshards + 2 P + 4
    assert list(fwd) == [P + 3, 2 * (P + 3)]
    assert list(upd) == [4 * P + 10, 2 * (4 * P + 10)]
    # more than FSDP1's flat parameter (host.py: 2 + 9 per unit)
    assert upd[0] > host.FSDP_UNIT_FORWARD + host.FSDP_UNIT_BACKWARD


def test_update_prices_layers_as_measured_forward_floors_and_replays_with_syncs():
    L = np.array([28.0])
    plain, y_plain = skyrl_host.update_host(L, 1, False)
    ckpt, y_ckpt = skyrl_host.update_host(L, 1, True)
    assert ckpt[0] - plain[0] == pytest.approx(28 * 44 * K)   # the replayed forward
    assert y_ckpt[0] - y_plain[0] == 28                      # and its per-layer syncs
    expect = (28 * 44 * host.update_over_forward() + 29 * (4 * P + 10) + 214) * K
    assert plain[0] == pytest.approx(expect)
    assert y_plain[0] == 28 + 33


def test_step_is_dtensor_ops_per_parameter():
    s, y = skyrl_host.step_host(np.array([28.0]))
    assert s[0] == pytest.approx((28 * P + 3 + 30) * 90e-6)
    assert y[0] == 2


def test_pass_is_max_of_gpu_and_host_plus_round_trips():
    sync = host.sync_seconds()
    # host-bound: n x host, plus the syncs
    t = skyrl_host.pass_seconds(np.array([0.1]), 0.01, 5, 100)
    assert t[0] == pytest.approx(1.0 + 500 * sync)
    # GPU-bound: the GPU time, plus the syncs
    t = skyrl_host.pass_seconds(np.array([5.0]), 0.01, 5, 100, 0.2, 2)
    assert t[0] == pytest.approx(5.0 + 502 * sync)


# a small model on one GPU, SkyRL's micro-batches of one sequence (the YottaLabs guide's shape)
SMALL = dict(model="qwen2.5-1.5b", gpu="h200", num_gpus=1, placement="colocated",
             rollout_tp=1, algorithm="grpo", use_ref=True, prompts_per_step=64,
             responses_per_prompt=5, prompt_len=92, response_mean=274, response_max=1024,
             prompt_max=512, train_tp=1, train_pp=1, train_zero=3, mini_batches=4,
             rl_framework="skyrl", sequence_packing=False, remove_padding=True,
             micro_batch_seqs=1, logprob_micro_batch_seqs=1, train_recompute="full")


def test_small_model_passes_are_host_bound():
    r = simulate_rl(pd.DataFrame([SMALL]))
    seqs = 64 * 5
    fwd_s, fwd_y = skyrl_host.forward_host(np.array([28.0]), 1)
    floor = seqs * (fwd_s[0] + fwd_y[0] * host.sync_seconds())
    # the policy's and the reference's forward each at the floor
    assert r.old_log_prob_time_s[0] == pytest.approx(floor)
    assert r.ref_time_s[0] >= floor * 0.999
    upd_s, upd_y = skyrl_host.update_host(np.array([28.0]), 1, True)
    assert r.update_time_s[0] >= seqs * upd_s[0]
    assert r.skyrl_host_floor_s[0] > 0


def test_verl_rows_do_not_get_skyrl_floor():
    r = simulate_rl(pd.DataFrame([{**SMALL, "rl_framework": "verl"}]))
    assert np.isnan(r.skyrl_host_floor_s[0]) or r.skyrl_host_floor_s[0] == 0
