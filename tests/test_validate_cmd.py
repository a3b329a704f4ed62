"""`sweep validate`: per-row table, summaries, CSV + plot, and one-line errors."""

import pandas as pd

from sweep.cli import main


def test_validate_writes_table_plot_and_summaries(tmp_path, capsys):
    assert main(["validate", "--subset", "dense", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for heading in ("by source family:", "by GPU:", "by model family:",
                    "unstated fields were filled as follows:"):
        assert heading in out
    table = pd.read_csv(tmp_path / "validation.csv")
    assert len(table) >= 90 and {"measured_step_s", "predicted_step_s", "step_error",
                                 "source"} <= set(table.columns)
    assert (tmp_path / "validation.png").stat().st_size > 10_000


def test_validate_on_a_user_dataset(tmp_path, capsys):
    from sim_core.accuracy import validation

    raw = pd.read_csv(validation.dataset_path(), dtype=str, keep_default_na=False)
    mine = tmp_path / "mine.csv"
    raw[raw["id"].isin(["22", "112", "192"])].to_csv(mine, index=False)
    assert main(["validate", str(mine)]) == 0
    out = capsys.readouterr().out
    assert "GPT-3 175B" in out and "LLAMA3-70B" in out


def test_validate_bad_dataset_is_a_one_line_error(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dataset") and "\n" not in err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["validate", str(bad)]) == 2
    assert "published_runs format" in capsys.readouterr().err


def _user_rows(tmp_path, ids, **change):
    from sim_core.accuracy import validation

    raw = pd.read_csv(validation.dataset_path(), dtype=str, keep_default_na=False)
    mine = raw[raw["id"].isin(ids)].copy()
    for col, value in change.items():
        mine[col] = value
    path = tmp_path / "mine.csv"
    mine.drop(columns=["notes", "reliability"]).to_csv(path, index=False)
    return path


def test_user_file_moe_no_means_dense_and_memory_only_rows_count(tmp_path, capsys):
    """A user's CSV: moe written 'no'/'false'/'0' is a dense model; a row with only a peak
    memory is compared on memory; optional columns may be absent."""
    from sim_core.accuracy import validation

    for spelling in ("no", "false", "0", "No"):
        path = _user_rows(tmp_path, ["55", "56", "57"], moe=spelling)
        data = validation.load_published(path)
        assert not data["is_moe"].any() and (data["skip"] == "").all()
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    raw.loc[raw["id"] == "56", ["step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                                "derived_step_time_s"]] = ""
    raw.to_csv(path, index=False)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "skipped 0 rows" in out and "peak memory: 3 rows" in out
    table = validation.validate(validation.load_published(path))
    row = table.set_index("id").loc["56"]
    assert pd.isna(row["step_error"]) and abs(row["mem_error"]) < 0.10


def test_user_file_with_nothing_usable_says_why_per_row(tmp_path, capsys):
    path = _user_rows(tmp_path, ["55", "56"], gpu="TPU v5")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[:2] == ["row 55 (Llama 3.1 8B): skipped: unknown GPU 'TPU v5'",
                       "row 56 (Llama 3.1 8B): skipped: unknown GPU 'TPU v5'"]
    assert err[-1].startswith("error: dataset: none of its 2 rows can be compared")
    nogpu = tmp_path / "nogpu.csv"
    pd.read_csv(path, dtype=str).drop(columns=["gpu"]).to_csv(nogpu, index=False)
    assert main(["validate", str(nogpu)]) == 2
    assert "missing column(s) gpu" in capsys.readouterr().err


def test_unparseable_shape_fields_take_the_catalog_value_or_skip_with_the_reason(tmp_path):
    """A vocabulary written as text ('~50k ... (padded)', as MLPerf-style tables write it) on a
    catalog model takes the catalog's value and says so in `imputed`; on a model the catalog
    does not know the row is skipped naming the field; no compared row is NaN without a reason."""
    from sim_core.accuracy import validation

    raw = pd.read_csv(validation.dataset_path(), dtype=str, keep_default_na=False)
    mine = raw[raw["id"].isin(["22", "175", "55"])].copy()
    mine.loc[mine["id"] == "22", "vocab"] = "~50k (GPT-2 BPE) (padded)"
    mine.loc[mine["id"] == "175", "vocab"] = "~50k ... (padded)"
    mine.loc[mine["id"] == "55", ["model", "hidden"]] = ["my-model", "about 4k"]
    path = tmp_path / "mine.csv"
    mine.to_csv(path, index=False)
    data = validation.load_published(path).set_index("id")
    assert data.loc["55", "skip"] == ("hidden 'about 4k' is not a number and model 'my-model' "
                                      "is not in the catalog to take it from")
    assert data.loc["22", "vocab"] == 51200 and data.loc["175", "vocab"] == 50368
    table = validation.validate(validation.load_published(path)).set_index("id")
    assert "vocab=51200 from catalog gpt3-175b (stated '~50k (GPT-2 BPE) (padded)')" in \
        table.loc["22", "imputed"]
    assert "vocab=50368 from catalog mpt-70b" in table.loc["175", "imputed"]
    assert table["step_error"].notna().all() and (table["no_error_because"] == "").all()
    # the same rows as shipped give the same prediction: the catalog's vocab is what they state
    shipped = validation.validate().set_index("id")
    for i in ("22", "175"):
        assert abs(table.loc[i, "predicted_step_s"] / shipped.loc[i, "predicted_step_s"] - 1) < 1e-9


def test_a_row_without_a_step_error_says_why(tmp_path):
    path = _user_rows(tmp_path, ["55", "56"])
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    raw.loc[raw["id"] == "56", ["step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                                "derived_step_time_s"]] = ""
    raw.to_csv(path, index=False)
    from sim_core.accuracy import validation

    table = validation.validate(validation.load_published(path)).set_index("id")
    assert table.loc["56", "no_error_because"].startswith("no step time measured")
    assert table.loc["55", "no_error_because"] == ""


def test_validate_prints_signed_median_by_sequence_and_model_size(capsys):
    from sim_core.accuracy import published, validation

    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "by sequence length (signed median" in out and "by model size" in out
    table = validation.validate()
    b = published.bucket_medians(table)
    seq = b["sequence length"].set_index("bucket")
    sel = table[(table["seq_len"] >= 1536) & (table["seq_len"] < 3072)]["step_error"]
    assert seq.loc["2k", "n"] == len(sel) and seq.loc["2k", "signed_median"] == sel.median()
    assert b["model size (total parameters)"]["n"].sum() == table["step_error"].notna().sum()


def test_validate_buckets_are_also_split_by_gpu(capsys):
    """Each bucket is also printed per GPU: the rows of a (bucket, GPU) pair are exactly the
    rows of that GPU in that bucket, the counts add up to the bucket's, and a bucket holding
    two GPUs whose errors differ gets two different signed medians."""
    from sim_core.accuracy import published, validation

    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "by sequence length, by GPU (signed median" in out
    assert "by model size (total parameters), by GPU" in out
    table = validation.validate()
    b = published.bucket_medians(table)
    split = b["sequence length, by GPU"]
    whole = b["sequence length"].set_index("bucket")
    sums = split.groupby("bucket")["n"].sum()
    assert (sums == whole.loc[sums.index, "n"]).all() and sums.sum() == whole["n"].sum()
    two = split[split["bucket"] == "2k"].set_index("gpu")
    assert {"a100-80gb", "h100-sxm"} <= set(two.index)
    t = table[table["step_error"].notna()]
    sel = t[(t["seq_len"] >= 1536) & (t["seq_len"] < 3072) & (t["gpu"] == "h100-sxm")]
    assert two.loc["h100-sxm", "n"] == len(sel)
    assert two.loc["h100-sxm", "signed_median"] == sel["step_error"].median()
    assert two.loc["a100-80gb", "signed_median"] != two.loc["h100-sxm", "signed_median"]


def test_stated_run_fields_override_defaults_and_bad_values_are_skipped_with_the_reason(
        tmp_path):
    """Optional columns named after run fields (validation.STATED_FIELDS): a 700 W H100 SXM
    held to `power_limit_w` 400 is predicted slower, by less than the tensor clock's
    (700/400)^(1/3) (memory-bound work keeps HBM's clock), and '400 W' reads as 400; an
    `attention_kernel` the row states replaces its framework's default (llm-foundry: fa2 ->
    triton is slower); a kernel the framework does not offer says why the row has no error;
    a value that is not of the field's kind skips the row naming the field."""
    from sim_core.accuracy import validation

    path = _user_rows(tmp_path, ["190"])
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    cases = {"free": {}, "cap": {"power_limit_w": "400"}, "cap_w": {"power_limit_w": "400 W"},
             "triton": {"attention_kernel": "Triton"}, "bad_cap": {"power_limit_w": "lots"},
             "bad_kernel": {"attention_kernel": "flash9"},
             "bad_bool": {"fused_elementwise": "maybe"}}
    rows = pd.concat([raw] * len(cases), ignore_index=True)
    rows["id"] = list(cases)
    for col in ("power_limit_w", "attention_kernel", "fused_elementwise"):
        rows[col] = [c.get(col, "") for c in cases.values()]
    rows.to_csv(path, index=False)
    data = validation.load_published(path).set_index("id")
    assert data.loc["bad_cap", "skip"] == "power_limit_w 'lots' is not a number >= 0"
    assert data.loc["bad_kernel", "skip"].startswith("attention_kernel 'flash9' is not one of fa3")
    assert data.loc["bad_bool", "skip"] == "fused_elementwise 'maybe' is not yes or no"
    table = validation.validate(data.reset_index()).set_index("id")
    free, cap = table.loc["free", "predicted_step_s"], table.loc["cap", "predicted_step_s"]
    assert 1.05 < cap / free < (700 / 400) ** (1 / 3)
    assert table.loc["cap_w", "predicted_step_s"] == cap
    assert table.loc["triton", "predicted_step_s"] > 1.02 * free


def test_a_kernel_the_framework_does_not_offer_says_why_there_is_no_error(tmp_path):
    from sim_core.accuracy import validation

    path = _user_rows(tmp_path, ["55"])  # torchtitan: no Triton flash kernel of 2022
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    raw["attention_kernel"] = "triton"
    raw.to_csv(path, index=False)
    table = validation.validate(validation.load_published(path)).set_index("id")
    why = table.loc["55", "no_error_because"]
    assert why.startswith("the simulator rejects the layout: ") and "triton" in why


def test_held_out_median_interval_brackets_the_median_and_narrows_with_rows():
    import numpy as np

    from sim_core.accuracy.fit import median_interval

    rng = np.random.default_rng(1)
    few = pd.Series(rng.normal(0, 0.08, 10))
    many = pd.Series(rng.normal(0, 0.08, 1000))
    for err in (few, many):
        lo, hi = median_interval(err)
        assert lo <= err.abs().median() <= hi
    assert (median_interval(many)[1] - median_interval(many)[0]) < 0.3 * (
        median_interval(few)[1] - median_interval(few)[0])
    assert median_interval(pd.Series([0.05] * 7)) == (0.05, 0.05)
    assert np.isnan(median_interval(pd.Series([np.nan]))[0])


def test_megatron_family_rows_take_the_cross_entropy_their_launch_config_selects():
    """IMPUTATION["loss"]: NeMo 24.07's launcher yamls set cross_entropy_loss_fusion for Llama 3
    and Nemotron 4B-22B only (the rest run Megatron-Core's unfused default); Megatron-LM's
    examples/llama script passes --cross-entropy-loss-fusion; the README's weak-scaling runs
    keep the CLI default; Megatron-Bridge's perf configs run TE's kernel. A stated loss_impl
    column wins."""
    from sim_core.accuracy import validation

    data = validation.load_published().set_index("id")
    expect = {"99": "vocab_parallel",  # NeMo 24.07 GPT3-5B
              "103": "vocab_parallel",  # NeMo 24.07 LLAMA2-7B
              "108": "vocab_parallel",  # NeMo 24.07 Nemotron-4 340B
              "106": "fused",  # NeMo 24.07 Nemotron-8B
              "109": "fused",  # NeMo 24.07 LLAMA3-8B
              "111": "fused",  # Megatron-LM examples/llama
              "1": "vocab_parallel",  # Megatron-LM README weak scaling (profile default)
              "114": "te"}  # Megatron-Bridge 25.09
    from sim_core import frameworks

    def loss(i):
        v = data.loc[i, "loss_impl"]
        return v if isinstance(v, str) else frameworks.default_value(data.loc[i, "framework"],
                                                                     "loss_impl")
    assert {i: loss(i) for i in expect} == expect
    table = validation.validate(data.loc[list(expect)].reset_index())
    assert table["step_error"].notna().all()
