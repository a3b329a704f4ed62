"""Fine-tuning (issue 39): the task field, LoRA / QLoRA / SFT physics, the published fine-tuning
rows and the bundled spaces. Expected values are derived by hand from the rules in
sim_core/finetune.py (each cites the framework code it comes from)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim_core import finetune, tasks
from sim_core.accuracy import validation
from sim_core.simulate import simulate_frame
from sweep.config.files import fixed_columns, parse_run
from sweep.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024.0**3
FT_RUNS = ROOT / "sim_core" / "data" / "finetune_runs.csv"

BASE = dict(model="llama3.1-70b", seq_len=4096, global_batch=8, precision="bf16",
            gpu="h100-sxm", num_gpus=8, gpus_per_node=8, tp=8, pp=1, cp=1, micro_batch=1,
            recompute="full", zero=0, sequence_parallel=True)


def sim(rows: list[dict]) -> pd.DataFrame:
    return simulate_frame(pd.DataFrame(rows))


def test_task_enum_is_one_table_and_pretrain_is_the_default():
    assert tasks.TASKS[0] == "pretrain" == tasks.FINETUNE_COLUMNS["task"]
    assert tuple(tasks.TASK_TRAITS) == tasks.TASKS
    assert list(tasks.trait(np.arange(len(tasks.TASKS)), "frozen_base")) == [
        False, False, True, True]


def test_pretrain_rows_are_unchanged_bit_for_bit():
    # a row that says task pretrain (and a fine-tuning row beside it) prices exactly as a row
    # without any fine-tuning column
    plain = sim([BASE, dict(BASE, tp=4, recompute="selective")])
    mixed = sim([dict(BASE, task="pretrain"), dict(BASE, tp=4, recompute="selective",
                                                   task="pretrain", lora_rank=8)])
    both = sim([BASE, dict(BASE, task="lora")])
    for col in ("step_time_s", "peak_memory_gib", "mfu", "time_dp", "mem_optimizer"):
        assert np.array_equal(plain[col].to_numpy(), mixed[col].to_numpy()), col
        assert plain[col].iloc[0] == both[col].iloc[0], col


def test_targets_mask_reads_names_groups_and_framework_names():
    assert tasks.targets_mask("all_linear") == 15
    assert tasks.targets_mask(["linear_qkv"]) == 1
    assert tasks.targets_mask("q_proj,v_proj,output_proj,w1,w2,w3") == 15
    assert tasks.targets_mask("attention") == 3
    with pytest.raises(tasks.TaskError, match="unknown target module 'qkvz'"):
        tasks.targets_mask(["qkvz"])


def test_adapter_count_is_rank_times_in_plus_out_of_each_targeted_linear():
    # Llama 3.1 70B, r = 16 on qkv, proj, fc1 (gate+up), fc2: per layer
    # 16 * [(8192 + 10240) + (8192 + 8192) + (8192 + 57344) + (28672 + 8192)]
    per_layer = 16 * ((8192 + 10240) + (8192 + 8192) + (8192 + 57344) + (28672 + 8192))
    out = sim([dict(BASE, task="lora", lora_rank=16, lora_targets=15, tp=1, num_gpus=1,
                    zero=0, sequence_parallel=False)])
    # adapters only: bf16 main grads (4 B, grad_reduce_fp32 default), Adam + master 12 B
    assert out["mem_optimizer"].iloc[0] * GIB == pytest.approx(12 * 80 * per_layer)
    assert out["mem_grads"].iloc[0] * GIB == pytest.approx(4 * 80 * per_layer)


def test_lora_backward_drops_weight_gradients():
    pre, lora = sim([dict(BASE), dict(BASE, task="lora", lora_targets="qkv")]).itertuples()
    # backward = dgrad only for every base linear: compute falls by about a third of the
    # GEMM time, no weight-gradient reduction, optimizer over the adapters only
    assert 0.6 < lora.time_compute / pre.time_compute < 0.8
    assert lora.time_optimizer < 1e-3 * pre.time_optimizer
    assert lora.mem_optimizer < 1e-3 * pre.mem_optimizer


def test_fsdp_lora_still_gathers_frozen_weights_but_reduces_adapters_only():
    fsdp = dict(BASE, tp=1, zero=3, sequence_parallel=False, framework="torchtitan")
    pre, lora = sim([fsdp, dict(fsdp, task="lora")]).itertuples()
    assert lora.time_dp > 0.3 * pre.time_dp  # the all-gathers of the frozen weights stay
    # weights sharded over 8 GPUs in both; LoRA keeps no gradient/optimizer shard of the base
    assert lora.mem_weights == pytest.approx(pre.mem_weights, rel=0.02)
    assert lora.mem_grads < 0.01 * pre.mem_grads


def test_qlora_weights_are_nf4_with_double_quantised_scales():
    one = dict(BASE, tp=1, num_gpus=1, zero=0, sequence_parallel=False, framework="torchtune")
    lora, qlora = sim([dict(one, task="lora"), dict(one, task="qlora")]).itertuples()
    embed = 2 * 128256 * 8192  # input embedding + LM head stay bf16
    total = 70_553_706_496
    adapters = 32 * 80 * ((8192 + 10240) + (8192 + 8192) + (8192 + 57344) + (28672 + 8192))
    expect = (0.5 + 1 / 64 + 4 / (64 * 256)) * (total - embed) + 2 * embed + 2 * adapters
    assert qlora.mem_weights * GIB == pytest.approx(expect, rel=0.01)
    assert 0.25 < qlora.mem_weights / lora.mem_weights < 0.32
    # the dequantisation of every weight, forward and input-gradient passes, costs time
    assert qlora.time_compute > lora.time_compute


def test_qlora_70b_fits_one_80gb_gpu():
    row = dict(BASE, tp=1, num_gpus=1, zero=0, sequence_parallel=False, framework="torchtune",
               task="qlora", lora_rank=16, micro_batch=1, recompute="full", global_batch=8,
               attention_kernel="fa2")
    out = sim([row]).iloc[0]
    assert out["valid"] and out["fits"]
    assert 40 < out["peak_memory_gib"] < 60


def test_qlora_rules_name_what_is_missing():
    out = sim([dict(BASE, task="qlora"), dict(BASE, task="qlora", tp=1, precision="fp8",
                                              sequence_parallel=False)])
    assert "needs tp = pp = cp = 1" in out["invalid_reason"].iloc[0]
    assert "precision fp8 is not available" in out["invalid_reason"].iloc[1]


def test_packing_shortens_attention_and_padding_wastes_tokens():
    sft = dict(BASE, task="sft", seq_len=8192)
    full, packed, padded = sim([sft, dict(sft, packing=True, mean_seq_len=1024),
                                dict(sft, packing=False, mean_seq_len=1024)]).itertuples()
    assert packed.step_time_s < full.step_time_s  # attention within 1k-token samples
    assert padded.step_time_s == full.step_time_s  # padding is real work
    assert padded.tokens_per_s_per_gpu == pytest.approx(full.tokens_per_s_per_gpu / 8)


def test_checkpoint_of_lora_is_the_adapters():
    pre, lora = sim([BASE, dict(BASE, task="lora")]).itertuples()
    assert lora.ckpt_total_gb < 0.01 * pre.ckpt_total_gb


def test_run_file_fields_and_one_line_errors():
    base = {"model": "llama3.1-8b", "seq_len": 4096, "global_batch": 8,
            "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}
    cfg = parse_run({**base, "task": "lora", "peft": {"rank": 8, "alpha": 16,
                                                      "targets": ["q_proj", "down_proj"]},
                     "data": {"packing": False, "mean_seq_len": 900}})
    row = fixed_columns(cfg)
    assert (row["task"], row["lora_rank"], row["lora_targets"], row["packing"],
            row["mean_seq_len"]) == ("lora", 8, 1 | 8, False, 900)
    assert fixed_columns(parse_run(base))["task"] == "pretrain"
    # Megatron's disable_parameter_transpose_cache, as a run field under parallel:
    assert fixed_columns(parse_run({**base, "parallel": {"fp8_weight_cache": False}}))[
        "fp8_weight_cache"] is False
    bad = [({**base, "task": "sft", "peft": {"rank": 8}}, "peft: adapters need task lora"),
           ({**base, "task": "lora", "peft": {"targets": "mlp2"}}, "peft.targets: unknown"),
           ({**base, "task": "lorra"}, "task: expected one of"),
           ({**base, "data": {"mean_seq_len": 5000}}, "data.mean_seq_len: expected at most"),
           ({**base, "task": "lora", "peft": {"rank": 0}}, "peft.rank: expected a positive"),
           ({**base, "parallel": {"fp8_weight_cache": "maybe"}},
            "parallel.fp8_weight_cache: expected true or false")]
    for data, msg in bad:
        with pytest.raises(ConfigError, match=msg) as e:
            parse_run(data)
        assert "\n" not in str(e.value)


def test_cli_bad_peft_exits_2_with_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model: llama3.1-8b\nseq_len: 2048\nglobal_batch: 8\ntask: lora\n"
                 "peft: {targets: [qkvz]}\ncluster: {gpu: h100-sxm, num_gpus: 8}\n")
    p = subprocess.run([sys.executable, "-m", "sweep", "simulate", str(f)], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "peft.targets" in p.stderr


def test_run_tables_read_the_task_columns():
    data = validation.load_published(FT_RUNS)
    assert (data["skip"] == "").all()
    assert set(data["task"]) == {"sft", "lora"}
    assert (data.loc[data["task"] == "lora", "lora_targets"].dropna() > 0).all()
    # a row without `task` is pre-training; `peft` names the method when `task` is empty;
    # a bad target list is a skip reason, not a traceback
    raw = pd.read_csv(FT_RUNS, dtype=str, keep_default_na=False).head(3).copy()
    raw.loc[0, "task"] = ""
    raw.loc[0, "peft"] = ""
    raw.loc[1, "task"] = ""
    raw.loc[1, "peft"] = "QLoRA"
    raw.loc[2, "lora_targets"] = "qkv,bogus"
    rows = [validation._task_fields(r) for _, r in raw.iterrows()]
    assert rows[0][0]["task"] == "pretrain" and rows[0][1] == ""
    assert rows[1][0]["task"] == "qlora"
    assert "unknown target module 'bogus'" in rows[2][1]


def test_published_finetuning_rows_step_error():
    """Nothing is fitted on these rows: every error is out of sample. Guards the figures the
    docs report (docs/finetune.md)."""
    t = validation.validate(validation.load_published(FT_RUNS))
    step = t[t["step_error"].notna()]
    lora = step.loc[step["task"] == "lora", "step_error"].abs()
    sft = step.loc[step["task"] == "sft", "step_error"].abs()
    assert len(lora) == 8 and len(sft) == 8
    assert lora.median() <= 0.10
    assert sft.median() <= 0.10
    mem = t[t["mem_error"].notna()]
    assert len(mem) == 1 and mem["mem_error"].abs().max() <= 0.10


@pytest.mark.parametrize("name", ["lora-llama3.1-70b-8k", "qlora-llama3.1-70b-1node",
                                  "sft-llama3.1-8b"])
def test_bundled_spaces_parse(name):
    from sweep.config.files import load_space

    cfg = load_space(ROOT / "search_spaces" / f"{name}.yaml")
    assert cfg.task in ("lora", "qlora", "sft")


def test_calibrate_runs_sizes_rows_that_name_a_catalog_model():
    # the fine-tuning table names catalog models (no inline shape): `sweep calibrate runs`
    # sizes them from the catalog instead of failing on a missing `layers` column
    from sim_core.calibration import runs

    size = runs.model_size(pd.DataFrame({"model": ["llama3.1-70b", "llama3.1-8b"]}))
    assert size == pytest.approx(np.log2([80 * 8192.0**2, 32 * 4096.0**2]))
    inline = runs.model_size(pd.DataFrame({"layers": [2.0], "hidden": [64.0]}))
    assert inline == pytest.approx([np.log2(2 * 64.0**2)])


def test_run_tables_name_targets_and_methods_as_people_write_them():
    assert tasks.targets_mask("['q_proj', 'k_proj', 'v_proj', 'o_proj']") == 3
    assert tasks.targets_mask("attention_qkv;attention_dense") == 3
    assert tasks.targets_mask("model.layers.0.self_attn.qkv_proj, mlp.down_proj") == 1 | 8
    row = pd.Series({"task": "fine-tuning", "peft": "QLoRA", "lora_rank": "16",
                     "lora_targets": "['q_proj','v_proj']"})
    fields, skip = validation._task_fields(row)
    assert skip == "" and fields["task"] == "qlora" and fields["lora_targets"] == 1
    assert validation._task_fields(pd.Series({"lora_rank": "8"}))[0]["task"] == "lora"
    assert validation._task_fields(pd.Series({"task": "SFT"}))[0]["task"] == "sft"
    assert validation._task_fields(pd.Series({"task": "rlhf"}))[1].startswith("task 'rlhf'")


def test_row_parallel_adapters_gather_their_output_over_tp():
    # Megatron-Bridge: B of a linear_proj / linear_fc2 adapter all-gathers T x hidden per forward
    qkv, attn = sim([dict(BASE, task="lora", lora_targets="qkv", tp_comm_overlap=False),
                     dict(BASE, task="lora", lora_targets="attention",
                          tp_comm_overlap=False)]).itertuples()
    assert attn.time_tp > qkv.time_tp
    one = sim([dict(BASE, task="lora", lora_targets="attention", tp=1, num_gpus=1,
                    sequence_parallel=False, zero=0)]).iloc[0]
    assert one["time_tp"] == 0.0


def test_a_file_s_task_is_checked_against_every_task_rl_included(tmp_path):
    """`task:` in a file names a training task or rl (its own schema); anything else is one
    line listing all five, from the run and the space loader alike."""
    from sweep.config.files import load_run, load_space

    f = tmp_path / "run.yaml"
    f.write_text("task: reinforce\nmodel: llama3.1-8b\nseq_len: 4096\nglobal_batch: 64\n"
                 "cluster: {gpu: h100-sxm, num_gpus: 8}\n")
    for load in (load_run, load_space):
        with pytest.raises(ConfigError, match=r"^task: expected one of pretrain, sft, lora, "
                                              r"qlora, rl, got 'reinforce'$"):
            load(f)


def test_fp8_weight_cache_off_requantises_every_weight_in_every_micro_batch():
    """Megatron-Bridge's fine-tuning perf configs set disable_parameter_transpose_cache (TE gets
    is_first_microbatch=None): each FP8 layer weight is quantised again in every forward. The
    added time per micro-batch is the stage's layer weights x (cast + the recipe's amax pass)
    bytes at the elementwise HBM rate; bf16 rows and FP8 primary weights pay nothing."""
    row = dict(BASE, precision="fp8", fp8_recipe="tensorwise", tp=1, pp=2, vpp=1,
               num_gpus=8, global_batch=32, recompute="none", sequence_parallel=False,
               task="lora", lora_rank=16, lora_targets="qkv", gpu="gb200")
    t = sim([row, dict(row, fp8_weight_cache=False),
             dict(row, fp8_weight_cache=False, fp8_param_gather=True),
             dict(row, precision="bf16"), dict(row, precision="bf16", fp8_weight_cache=False)])
    step = t["step_time_s"].to_numpy()
    # Llama 3.1 70B layer linears: qkv 8192 x (8192 + 2 x 8 x 128), out 8192 x 8192, fc1
    # 8192 x 2 x 28672, fc2 28672 x 8192; 40 layers per stage
    h, ffn = 8192, 28672
    per_layer = h * (h + 2 * 8 * 128) + h * h + h * 2 * ffn + ffn * h
    weights = per_layer * 40
    # gb200: 8 TB/s x 0.80 elementwise; cast 3 B (read bf16, write fp8) + 2 B current-scaling amax
    per_micro_batch = weights * (3.0 + 2.0) / (8000e9 * 0.80)
    # 1F1B over pp 2 with 8 micro-batches per DP rank (dp 4, batch 32): the step runs
    # m + pp - 1 = 9 micro-batch slots of a stage
    added = per_micro_batch * (8 + 2 - 1)
    assert step[1] - step[0] == pytest.approx(added, rel=0.01)
    assert step[2] == pytest.approx(step[0], rel=1e-12)
    assert step[4] == pytest.approx(step[3], rel=1e-12)
