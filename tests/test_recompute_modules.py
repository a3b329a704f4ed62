"""Megatron-Core's selective recompute modules (sim_core/recompute.py): each module's dropped
activations by hand, its replay, Megatron's refusals, the run/space field and the export."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog, memory, recompute, rules, workload
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate_frame
from sweep.advice import export
from sweep.config import fixed_columns, parse_run, parse_space
from sweep.engine.space import Space
from sweep.errors import ConfigError

DSV3 = dict(model="deepseek-v3", seq_len=4096, global_batch=8192, gpu="h100-sxm",
            num_gpus=1024, tp=2, pp=8, vpp=4, ep=64, etp=1, micro_batch=1,
            sequence_parallel=True, precision="bf16", framework="megatron-core",
            moe_dispatcher="alltoall", moe_a2a_overlap=False)
QWEN = dict(DSV3, model="qwen3-235b-a22b", num_gpus=256, ep=32, global_batch=2048)
LLAMA = dict(model="llama3-70b", seq_len=8192, global_batch=128, gpu="h100-sxm", num_gpus=64,
             tp=4, pp=4, micro_batch=1, sequence_parallel=True, precision="bf16",
             framework="megatron-core")


def per_layer(row, **over):
    b = frame_to_batch(pd.DataFrame([{**row, **over}]))
    wl = workload.build(b)
    out = memory.activation_bytes_per_layer(b, wl.tokens, b.tp, b.sequence_parallel, wl.dims,
                                            wl.moe_load)
    return {k: float(np.asarray(v)[0]) for k, v in out.items()}


def test_module_names_mask_and_errors():
    m = recompute.mask(["mla_up_proj", "mlp"])
    assert recompute.names(m) == ["mla_up_proj", "mlp"]
    assert recompute.mask("moe_act, layernorm") == recompute.mask(["layernorm", "moe_act"])
    assert recompute.mask([]) == recompute.mask("none") == 0
    with pytest.raises(recompute.RecomputeModulesError) as ei:
        recompute.mask(["mla_up_proj", "attn"])
    msg = str(ei.value)
    assert "\n" not in msg and "'attn'" in msg
    assert "core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts" in msg
    with pytest.raises(catalog.CatalogError, match="unknown module 'bogus'"):
        frame_to_batch(pd.DataFrame([{**DSV3, "recompute": "selective",
                                      "recompute_modules": "bogus"}]))


def test_mla_up_proj_drops_the_up_projected_query_key_value():
    """DeepSeek-V3, tp 2: Q is 128 heads x 192, K and V 128 x (192 + 128) -> 65536 bf16 values
    per token over tp, T = 4096, in every layer (all 61 are MLA)."""
    live = per_layer(DSV3, recompute="selective")
    up = per_layer(DSV3, recompute="selective", recompute_modules=["mla_up_proj"])
    assert live["live"] - up["modules"] == pytest.approx(2 * 4096 * 65536 / 2)
    assert up["live"] == live["live"]  # the backward holds the layer again
    # + mlp: the 3 dense layers of 61 keep only their MLP's input (ffn 18432, SwiGLU, SP)
    T, h, f, t = 4096, 7168, 18432, 2
    dense_mlp = 4 * T * h / t + 2 * T * f * 2 / t + 2 * T * f / t
    both = per_layer(DSV3, recompute="selective", recompute_modules=["mla_up_proj", "mlp"])
    assert up["modules"] - both["modules"] == pytest.approx(3 / 61 * (dense_mlp - 2 * T * h / t))


def test_layernorm_drops_only_separate_norms():
    """TE fuses the attention norm into linear_qkv (non-MLA) and a dense MLP's norm into
    linear_fc1: a dense GQA model keeps everything; a MoE layer drops its pre-MLP norm output
    (Qwen3-235B: 94 layers all MoE, h 4096, tp 2 with SP)."""
    dense = per_layer(LLAMA, recompute="selective", recompute_modules=["layernorm"])
    assert dense["modules"] == pytest.approx(dense["live"])
    q = per_layer(QWEN, recompute="selective", recompute_modules=["layernorm"])
    assert q["live"] - q["modules"] == pytest.approx(2 * 4096 * 4096 / 2)


def test_legacy_moe_recompute_is_the_same_module():
    """moe_recompute (recompute none) and recompute_modules (recompute selective) price the
    same Megatron module the same way: memory, replay, dispatch replay."""
    for mod in ("moe_act", "moe"):
        rows = pd.DataFrame([{**DSV3, "recompute": "none", "moe_recompute": mod},
                             {**DSV3, "recompute": "selective", "recompute_modules": [mod]}])
        out = simulate_frame(rows)
        for c in ("peak_memory_gib", "time_recompute", "time_ep", "step_time_s"):
            assert out[c].iloc[0] == pytest.approx(out[c].iloc[1], rel=1e-12), (mod, c)


def test_each_module_replays_its_forward():
    mods = ([], ["mla_up_proj"], ["mla_up_proj", "moe_act"], ["mla_up_proj", "moe"])
    rows = [{**DSV3, "recompute": "none"}]
    rows += [{**DSV3, "recompute": "selective", "recompute_modules": m} for m in mods[1:]]
    rows += [{**DSV3, "recompute": "full"}]
    out = simulate_frame(pd.DataFrame(rows))
    rc, mem = out["time_recompute"].to_numpy(), out["peak_memory_gib"].to_numpy()
    assert rc[0] == 0 and 0 < rc[1] < rc[2] < rc[3] < rc[4]
    assert mem[0] > mem[1] > mem[2] > mem[3] > mem[4]
    # the whole MoE layer replays dispatch and combine (no EP overlap: 4 transfers + 2)
    assert out["time_ep"].iloc[3] == pytest.approx(out["time_ep"].iloc[0] * 6 / 4)
    assert out["time_ep"].iloc[2] == pytest.approx(out["time_ep"].iloc[0])


@pytest.mark.parametrize("over, reason", [
    (dict(recompute="none", recompute_modules=["mla_up_proj"]), "needs recompute selective"),
    (dict(model="qwen3-235b-a22b", recompute="selective", recompute_modules=["mla_up_proj"]),
     "multi-latent-attention"),
    (dict(model="llama3-70b", experts=None, recompute="selective",
          recompute_modules=["moe_act"]), "need a MoE model"),
    (dict(recompute="selective", recompute_modules=["shared_experts"],
          moe_shared_expert_overlap=True), "shared_experts cannot work"),
    (dict(precision="fp8", fp8_recipe="delayed", recompute="selective",
          recompute_modules=["moe_act"]), "delayed FP8 recipe"),
    (dict(model="llama3-70b", experts=None, framework="torchtitan", recompute="selective",
          recompute_modules=["layernorm"]), "Megatron-Core's"),
])
def test_megatron_refusals(over, reason):
    row = {**DSV3, **{k: v for k, v in over.items() if v is not None}}
    if row["model"] == "llama3-70b":
        row.update(ep=1, etp=0, vpp=1, num_gpus=64, pp=4, global_batch=128)
    ok, why = rules.check(frame_to_batch(pd.DataFrame([row])))
    assert not ok[0] and reason in why[0]
    ok, _ = rules.check(frame_to_batch(pd.DataFrame([{**row, "recompute": "selective",
                                                       "recompute_modules": []}])))
    assert ok[0]


def test_run_and_space_field_and_megatron_export():
    run = {"model": "deepseek-v3", "seq_len": 4096, "global_batch": 8192, "precision": "bf16",
           "cluster": {"gpu": "h100-sxm", "num_gpus": 1024},
           "parallel": {"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "recompute": "selective",
                        "recompute_modules": ["mla_up_proj", "mlp"]}}
    row = fixed_columns(parse_run(run))
    assert recompute.names(row["recompute_modules"]) == ["mla_up_proj", "mlp"]
    ns = export.megatron_parser().parse_args(export.megatron_args({**DSV3, **row, "dp": 64}))
    assert ns.recompute_granularity == "selective"
    assert ns.recompute_modules == ["mla_up_proj", "mlp"]
    # without modules, selective exports Megatron's default module
    plain = export.megatron_args({**DSV3, "recompute": "selective", "dp": 64})
    assert export.megatron_parser().parse_args(plain).recompute_modules == ["core_attn"]
    bad = dict(run, parallel=dict(run["parallel"], recompute_modules=["mla_up_proj", "attn"]))
    with pytest.raises(ConfigError) as ei:
        parse_run(bad)
    msg = str(ei.value)
    assert "\n" not in msg and "recompute_modules" in msg and "mla_up_proj" in msg
    space = {"name": "t", **{k: v for k, v in run.items() if k != "parallel"},
             "parallel": {"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "recompute": "selective"},
             "space": {"recompute_modules": [[], ["mla_up_proj"], ["mla_up_proj", "moe"]]}}
    sp = Space.from_config(parse_space(space))
    assert sp.size == 3
    with pytest.raises(ConfigError, match="unknown module 'moe_layer'"):
        parse_space(dict(space, space={"recompute_modules": [["moe_layer"]]}))


def test_imputation_falls_back_to_module_lists_where_only_full_or_nothing_fits():
    """DeepSeek-V3 on 256 H100 at tp 1 (pp 8, ep 32, bf16): none of the generic modes fits the
    memory model; Megatron's MLA up-projection + MoE-layer modules do."""
    from sim_core.accuracy import validation

    data = validation.load_published()
    row = data[data["id"].astype(str) == "117"].copy()
    row = row.assign(num_gpus=256, tp=1, ep=32, global_batch=2048, precision="bf16",
                     sequence_parallel=False, id="x")
    out = validation._impute(row)
    assert out["recompute"].iloc[0] == "selective"
    mods = recompute.mask(out["recompute_modules"].iloc[0])
    assert recompute.has(np.array([mods]), "mla_up_proj")[0]
    assert recompute.has(np.array([mods]), "moe")[0]
    assert "recompute (modules " in out["imputed"].iloc[0]
    pred = validation.simulate_frame(out.reset_index(drop=True))
    assert bool(pred["fits"][0]) and bool(pred["valid"][0])


def test_run_yaml_export_round_trips_the_module_list():
    row = {**DSV3, "recompute": "selective", "recompute_modules": recompute.mask(["mla_up_proj"]),
           "dp": 64}
    run = export.run_dict(row)
    assert run["parallel"]["recompute_modules"] == ["mla_up_proj"]
    back = fixed_columns(parse_run(run))
    assert back["recompute_modules"] == recompute.mask(["mla_up_proj"])
    assert "recompute_modules" not in export.run_dict({**DSV3, "dp": 64})["parallel"]
