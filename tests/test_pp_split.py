"""Megatron-Core's uneven pipeline split (account_for_embedding_in_pipeline_split,
account_for_loss_in_pipeline_split; sim_core/pp_split.py): the layers each rank builds
(transformer_block.py get_num_layers_to_build, core_v0.15.0), the first rank's activations,
the busiest rank's time, and nothing changed where the flags are off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim_core import pp_split, workload
from sim_core.columns import frame_to_batch
from sim_core.simulate import simulate_frame

EMB, LOSS = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"
# Qwen3-235B-A22B: 94 layers, which PP8 (x VPP4) does not divide
Q235 = dict(model="qwen3-235b-a22b", seq_len=4096, global_batch=2048, gpu="h100-sxm",
            num_gpus=256, tp=2, pp=8, vpp=1, ep=32, etp=1, micro_batch=1,
            sequence_parallel=True, precision="bf16", framework="megatron-core",
            recompute="selective")


def _batch(rows):
    b = frame_to_batch(pd.DataFrame(rows))
    return b, workload.build(b)


def test_94_layers_pp8_both_flags_build_11_12_11():
    """(94 + 2) / 8 = 12 per rank; the first and last build one fewer: 11, 12 x 6, 11 (the
    split verl's run_qwen3-235b_megatron_96gb.sh asks for). VPP4: 3 per chunk, the first and
    last chunk 2: the same per rank. pp 1: every layer on the one rank."""
    rows = [dict(Q235, **{EMB: True, LOSS: True}), dict(Q235, vpp=4, **{EMB: True, LOSS: True}),
            dict(Q235, pp=1, num_gpus=32, **{EMB: True, LOSS: True}), dict(Q235)]
    b, wl = _batch(rows)
    s = pp_split.stage_layers(b, wl.layers_per_stage)
    assert s["first"].tolist() == [11, 11, 94, 12]
    assert s["middle"].tolist() == [12, 12, 94, 12]
    assert s["last"].tolist() == [11, 11, 94, 12]
    # one flag: only its own end loses a layer ((94 + 1) / 5 = 19 per rank)
    b1, wl1 = _batch([dict(Q235, pp=5, num_gpus=160, **{EMB: True}),
                      dict(Q235, pp=5, num_gpus=160, **{LOSS: True})])
    s1 = pp_split.stage_layers(b1, wl1.layers_per_stage)
    assert wl1.layers_per_stage.tolist() == [19, 19]
    assert s1["first"].tolist() == [18, 19] and s1["last"].tolist() == [19, 18]
    assert s1["middle"].tolist() == [19, 19]


def test_stage_extras_price_the_missing_layer_and_the_middle_rank():
    b, wl = _batch([dict(Q235, **{EMB: True, LOSS: True}), dict(Q235, pp=2, num_gpus=64,
                                                                 **{EMB: True, LOSS: True})])
    first, last, middle = pp_split.stage_extras(b, wl.layers_per_stage, np.array([1.2, 1.2]))
    L = wl.layers_per_stage
    assert first[0] == pytest.approx(-1.2 / L[0]) and last[0] == pytest.approx(-1.2 / L[0])
    assert middle[0] == 0.0  # PP8: the middle ranks hold the full 12
    assert middle[1] == -np.inf  # PP2: no middle rank


def test_first_stage_holds_one_layer_fewer_activations():
    """PP8 1F1B: the first rank keeps 8 micro-batches of 11 layers instead of 12 (it is the
    worst rank here); VPP4: 8 + 7/4 chunks-worth of 11 layers, but the second rank (12 layers,
    2 chunks = 1/2 micro-batch fewer in flight) is then the worst."""
    rows = [dict(Q235), dict(Q235, **{EMB: True}), dict(Q235, vpp=4), dict(Q235, vpp=4, **{EMB: True})]
    out = simulate_frame(pd.DataFrame(rows))
    act = out["mem_activations"].to_numpy()
    assert act[1] == pytest.approx(act[0] * 11 / 12, rel=1e-9)
    f = 8 + 7 / 4
    assert act[3] == pytest.approx(act[2] * max(11 * f, 12 * (f - 0.5)) / (12 * f), rel=1e-9)
    assert out["peak_memory_gib"][1] < out["peak_memory_gib"][0]
    assert out["peak_memory_gib"][3] < out["peak_memory_gib"][2]


def test_loss_flag_unloads_the_busiest_last_rank():
    """The last rank runs the output head and the loss (151936-word vocabulary): it is the
    busiest; a layer fewer there shortens every micro-batch's critical path. With pp 1 the
    flags change nothing."""
    rows = [dict(Q235), dict(Q235, **{LOSS: True}), dict(Q235, pp=1, num_gpus=32),
            dict(Q235, pp=1, num_gpus=32, **{EMB: True, LOSS: True})]
    out = simulate_frame(pd.DataFrame(rows))
    t = out["step_time_s"].to_numpy()
    assert t[1] < 0.97 * t[0]
    assert t[3] == t[2]


def test_flags_off_change_nothing_and_rows_do_not_mix():
    """Stated false == unstated, and a row with the flags on does not move its neighbours."""
    plain = simulate_frame(pd.DataFrame([dict(Q235), dict(Q235, vpp=4)]))
    off = simulate_frame(pd.DataFrame([dict(Q235, **{EMB: False, LOSS: False}),
                                       dict(Q235, vpp=4, **{EMB: False, LOSS: False})]))
    mixed = simulate_frame(pd.DataFrame([dict(Q235), dict(Q235, **{EMB: True, LOSS: True}),
                                         dict(Q235, vpp=4)]))
    num = [c for c in plain.columns if pd.api.types.is_numeric_dtype(plain[c])]
    pd.testing.assert_frame_equal(plain[num], off[num])
    pd.testing.assert_frame_equal(plain[num], mixed[num].iloc[[0, 2]].reset_index(drop=True))


def test_run_fields_parse_and_refuse_bad_values():
    from sweep.config import fixed_columns, parse_run
    from sweep.errors import ConfigError
    run = {"model": "qwen3-235b-a22b", "seq_len": 4096, "global_batch": 2048,
           "precision": "bf16", "cluster": {"gpu": "h100-sxm", "num_gpus": 256},
           "parallel": {"tp": 2, "pp": 8, "ep": 32, EMB: True, LOSS: True}}
    row = fixed_columns(parse_run(run))
    assert row[EMB] is True and row[LOSS] is True
    with pytest.raises(ConfigError) as ei:
        parse_run(dict(run, parallel=dict(run["parallel"], **{LOSS: "yes"})))
    msg = str(ei.value)
    assert "\n" not in msg and LOSS in msg


def test_verl_235b_recipe_row_carries_the_split():
    """verl v0.7.0 examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh L162-163 set both
    flags on the actor: its training peak drops by the first rank's 12th layer."""
    from sim_core.accuracy import rl
    from sim_core.rl.phases import simulate_rl
    table = rl.load(Path(__file__).parent / "data" / "rl_recipes.csv")
    row = table[table.url.str.endswith("run_qwen3-235b_megatron_96gb.sh")]
    assert len(row) == 1 and row[f"train_{EMB}"].iloc[0] and row[f"train_{LOSS}"].iloc[0]
    assert table[f"train_{EMB}"].notna().sum() == 1
    df, _, reason = rl.to_frame(row.reset_index(drop=True))
    cleared = row.assign(**{f"train_{EMB}": np.nan, f"train_{LOSS}": np.nan})
    df0, _, _ = rl.to_frame(cleared.reset_index(drop=True))
    on, off = simulate_rl(df), simulate_rl(df0)
    assert float(on.train_peak_gib[0]) < float(off.train_peak_gib[0]) - 3.0
