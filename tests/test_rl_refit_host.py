"""NeMo RL's colocated refit, per tensor (sim_core/rl/refit_host.py): the counts read from the
v0.3.0 code and the direction of each cost."""

import numpy as np
import pandas as pd
import pytest

from sim_core.rl import inputs, refit_fit, refit_host
from sim_core.rl.phases import simulate_rl


def _points(**cols):
    base = {"point": "t", "model": "llama3.1-8b", "gpu": "h100-sxm", "num_gpus": 8,
            "train_backend": "megatron", "train_tp": 1, "rollout_tp": 1,
            "gpu_memory_utilization": 0.6, "max_total_len": 4096, "routing": "own_devices",
            "refit_s": 1.0}
    n = max(len(v) for v in cols.values() if isinstance(v, list)) if cols else 1
    rows = {k: (cols.get(k) if isinstance(cols.get(k), list) else [cols.get(k, v)] * n)
            for k, v in base.items()}
    return pd.DataFrame(rows)


def _frame(**cols):
    return refit_fit.frame(_points(**cols))


def test_hf_tensor_counts():
    df = _frame(model=["llama3.1-8b", "qwen3-30b-a3b", "qwen3-4b", "deepseek-v3"])
    b = inputs.to_batch(df)
    n = refit_host.hf_tensors(b)
    # Llama: 32 layers x (q, k, v, o, 2 norms, gate, up, down) + embed, final norm, LM head
    assert n[0] == 32 * 9 + 3
    # Qwen3-30B-A3B: 48 layers x (6 + router + 128 x 3) + 3
    assert n[1] == 48 * (6 + 1 + 128 * 3) + 3
    # tied embeddings: no LM head tensor
    assert n[2] == 36 * 9 + 2
    # DeepSeek-V3: MLA's 7 + 2 norms per layer, 3 dense layers, 58 MoE layers of a router,
    # 256 x 3 experts and a shared expert
    assert n[3] == 61 * 9 + 3 * 3 + 58 * (1 + 256 * 3 + 3) + 3


def test_megatron_keys_per_ep_rank():
    b = inputs.to_batch(_frame(model=["llama3.1-8b", "qwen3-30b-a3b"]))
    non_expert, expert = refit_host.megatron_keys(b, np.array([1.0, 8.0]))
    assert non_expert[0] == 32 * 6 + 3 and expert[0] == 0
    # 16 local experts x (fused gate/up, down) per MoE layer
    assert expert[1] == 48 * 2 * 16


def _host(df, free_gib=40.0):
    b = inputs.to_batch(df)
    dtensor = df["train_zero"].to_numpy() >= 3
    n = len(df)
    return refit_host.host_time(b, dtensor, np.full(n, free_gib * 2.0 ** 30), np.ones(n),
                                np.ones(n), np.ones(n), np.ones(n),
                                {"sm_arch": 90.0, "nvlink_bw_gbs": 450.0, "nvls": True,
                                 "mesh_links": 0.0, "nic_bw_gbs": 50.0,
                                 "intra_latency_us": 2.0, "inter_latency_us": 5.0})


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_moe_costs_more_per_gb_than_dense(backend):
    df = _frame(model=["qwen3-32b", "qwen3-30b-a3b"], train_backend=backend, num_gpus=64)
    h = _host(df)
    per_gb = h["refit_host_s"] / inputs.to_batch(df).params
    assert per_gb[1] > 5 * per_gb[0]


def test_handles_dtensor_per_tensor_megatron_per_buffer():
    df = _frame(model="llama3.1-70b", train_backend=["megatron", "dtensor"])
    h = _host(df)
    assert h["refit_handles"][1] == h["refit_tensors"][1]
    # Megatron packs each group into one buffer once it holds >= 32 tensors
    assert h["refit_handles"][0] == h["refit_groups"][0] < h["refit_tensors"][0]
    assert h["refit_host_s"][1] > h["refit_host_s"][0]


def test_more_buffer_groups_more_time():
    df = _frame(model=["llama3.1-70b"] * 2)
    b = inputs.to_batch(df)
    free = np.array([60.0, 15.0]) * 2.0 ** 30
    out = refit_host.host_time(b, np.zeros(2, bool), free, np.ones(2), np.ones(2), np.ones(2),
                               np.ones(2), {"sm_arch": 90.0, "nvlink_bw_gbs": 450.0,
                                            "nvls": True, "mesh_links": 0.0,
                                            "nic_bw_gbs": 50.0, "intra_latency_us": 2.0,
                                            "inter_latency_us": 5.0})
    # 0.2 x free memory per group (NRL_REFIT_BUFFER_MEMORY_RATIO): 141 GB in 12 vs 47 groups
    assert out["refit_groups"][1] > 3 * out["refit_groups"][0]
    assert out["refit_host_s"][1] > out["refit_host_s"][0]


def test_controller_entries_grow_with_training_workers():
    df = _frame(model="qwen3-30b-a3b", num_gpus=[8, 64])
    h = _host(df)
    assert h["refit_controller_s"][1] > 6 * h["refit_controller_s"][0]


def test_only_nemo_rl_colocated_rows():
    df = _frame(model="qwen3-30b-a3b", num_gpus=[16, 16, 16])
    df["rl_framework"] = ["nemo_rl", "verl", "nemo_rl"]
    df["placement"] = ["colocated", "colocated", "split"]
    df["rollout_gpus"] = [0, 0, 8]
    p = simulate_rl(df)
    assert p.refit_host_time_s[0] > 1.0
    assert p.refit_host_time_s[1] == 0.0 and p.refit_host_time_s[2] == 0.0


def test_stored_constants_are_the_published_fit():
    res = refit_fit.fit(refit_fit.points(), rounds=20)
    k = inputs.constants()["refit"]
    for key in refit_fit.KEYS:
        assert k[key] == pytest.approx(res[key], rel=5e-3), key
    # before/after PR #449 on each model: the fit ranks every pair and stays within 60%
    err = res["pred"] / res["measured"] - 1
    assert np.all(np.abs(err) < 0.6)
    assert res["pred"][0] > res["pred"][1] and res["pred"][2] > res["pred"][3]
    # a packed name -> offset entry costs a fraction of a pickled IPC handle tuple (the
    # blog's Part 3), and the trainer's conversion per tensor more than the engine's load
    assert 0 < k["meta_entry_s"] < k["controller_entry_s"] / 3
    assert k["megatron_tensor_s"] > k["tensor_s"] > 0


def test_the_blogs_deepseek_v3_refit_is_reproduced_step_by_step():
    """NeMo RL's refit blog, DeepSeek-V3 at v0.3 (EP64 PP8 -> TP64 on 512 H100): 12.2 s gather,
    33.5 s IPC transfer, 1.5 s update. With the derived constants the model's refit is their
    sum; before them (one entry cost for handles and names alike, fitted on PR #449's DTensor
    points) it was ~240 s, five times the published figure."""
    bd = refit_fit.breakdown_points()
    p = simulate_rl(refit_fit.frame(bd))
    r = bd.iloc[0]
    total = r.gather_s + r.ipc_s + r.update_s
    assert p.weight_sync_time_s[0] == pytest.approx(total, rel=0.02)
    # the IPC step: most of it the controller's entries and the Ray calls of 135 groups
    assert p.refit_ray_time_s[0] > 5.0
    assert p.refit_passes[0] == 2 * 512 + 2 * 64
    assert p.refit_meta_entries[0] == p.refit_tensors[0]


def test_ray_calls_per_group_follow_workers_and_engines():
    df = _frame(model="qwen3-30b-a3b", num_gpus=[64, 64], rollout_tp=[1, 8])
    h = _host(df)
    g = h["refit_groups"]
    # one call per training worker and per engine from the driver, and one per device from
    # each multi-GPU engine's leader (a single-GPU engine runs its own update in-process)
    assert h["refit_ray_calls"][0] == g[0] * (64 + 64)
    assert h["refit_ray_calls"][1] == g[1] * (64 + 8 + 8)


def test_store_constants_rewrites_only_the_values(tmp_path):
    """The fits' --write: each key's value replaced in place, comments and other keys kept."""
    from importlib import resources

    from sim_core import catalog_yaml
    from sim_core.rl import inputs

    src = resources.files("sim_core").joinpath("catalogs/rl.yaml").read_text()
    path = tmp_path / "rl.yaml"
    path.write_text(src)
    inputs.store_constants({"step_overhead_s": "0.001234", "controller_entry_s": "7e-06"}, path)
    out = path.read_text()
    new, old = catalog_yaml.read(out), catalog_yaml.read(src)
    assert new["decode"]["step_overhead_s"] == 0.001234
    assert new["refit"]["controller_entry_s"] == 7e-06
    assert new["decode"]["hbm_efficiency"] == old["decode"]["hbm_efficiency"]
    assert len(out.splitlines()) == len(src.splitlines())
    assert "# per decode step" in out


def test_from_v0_4_the_refit_streams_without_the_controller():
    """NeMo RL v0.4.0 on streams the colocated refit worker to executor over ZMQ
    (stream_weights_via_ipc_zmq_impl): one handle per ping-pong buffer, the names pickled once
    each way, one Ray call per worker and engine, the trainer's packing overlapping the
    engine's load. A blank release is the current one; 0.3 keeps the controller path."""
    bd = refit_fit.breakdown_points()
    old = refit_fit.frame(bd)
    new = old.assign(rl_framework_version=np.nan)
    p_old, p_new = simulate_rl(old), simulate_rl(new)
    k = inputs.constants()["refit"]
    n = p_new.refit_tensors[0]
    assert p_new.refit_handles[0] == p_new.refit_groups[0] < p_old.refit_groups[0] * 2
    rate = inputs.constants()["ray_calls"]["actor_call_async_per_s"]
    expect = (p_new.refit_chain_time_s[0]
              + max(n * k["megatron_tensor_s"], n * k["tensor_s"])
              + p_new.refit_handles[0] * k["ipc_handle_s"] + 2 * n * k["meta_entry_s"]
              + (512 + 512 / 64) / rate)
    assert p_new.refit_host_time_s[0] == pytest.approx(expect, rel=1e-9)
    # DeepSeek-V3 on 512 GPUs: the controller's entries and per-group calls were most of v0.3's
    assert p_new.weight_sync_time_s[0] < 0.4 * p_old.weight_sync_time_s[0]
    # releases read from a table cell
    from sim_core.accuracy import rl_table
    assert rl_table.parse_version("v0.3.1") == 0.3 and rl_table.parse_version("0.5") == 0.5
    assert np.isnan(rl_table.parse_version("main"))
