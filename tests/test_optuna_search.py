"""Optuna at the simulator's speed (issue 19): nested trials, per-round TPE, no census of the
space, patience, strategy auto, and what the summary reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sweep.config import load_space, parse_space
from sweep.errors import ConfigError
from sweep.engine.execution import choose_strategy, run_search
from sweep.engine.nested import split_axes
from sweep.engine.space import Space
from tests.fakes import fake_check, fake_simulate

ROOT = Path(__file__).resolve().parents[1]
FAKE = dict(simulate=fake_simulate, check=fake_check)


def doc(**search):
    return {"name": "t", "model": "llama3.1-8b", "seq_len": 8192, "global_batch": 64,
            "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
            "space": {"num_gpus": [8, 16, 32], "tp": [1, 2, 4, 8], "pp": [1, 2, 4],
                      "micro_batch": [1, 2, 4], "recompute": ["none", "selective", "full"],
                      "zero": [1, 3]},
            "search": {"strategy": "optuna", **search}}


# ---------------------------------------------------------------------------------------------
# which axes are inner
# ---------------------------------------------------------------------------------------------
def test_layout_axes_are_sampled_and_cheap_axes_enumerated():
    wide = Space.from_config(load_space(ROOT / "search_spaces" / "llama3.1-405b-wide.yaml"))
    n = split_axes(wide)
    assert n.outer == ("gpu", "num_gpus", "tp", "pp", "cp", "vpp")
    assert n.inner == ("micro_batch", "recompute", "sequence_parallel", "zero", "precision",
                       "tp_comm_overlap")
    assert n.rows_per_trial == 4 * 3 * 2 * 3 * 2 * 2


def test_inner_max_moves_the_largest_cheap_axis_to_the_sampler():
    huge = Space.from_config(load_space(ROOT / "search_spaces" / "llama3.1-405b-huge.yaml"))
    n = split_axes(huge)  # 8 micro-batches x 288 others = 2304 > 1024 rows
    assert "micro_batch" in n.outer and n.rows_per_trial == 288
    assert split_axes(huge, inner_max=4096).rows_per_trial == 2304
    given = split_axes(huge, inner=["zero", "recompute"])
    assert given.inner == ("recompute", "zero") and given.rows_per_trial == 9


def test_a_trial_is_the_sub_grid_of_its_layout():
    space = Space.from_config(parse_space(doc()))
    n = split_axes(space)
    params = {"num_gpus": 16, "tp": 4, "pp": 2}
    frame = space.frame_of_ids(n.ids([n.base(space, params)]))
    assert len(frame) == 18 and frame["config_id"].is_unique
    for k, v in params.items():
        assert (frame[k] == v).all()
    combos = set(zip(frame["micro_batch"], frame["recompute"], frame["zero"]))
    assert len(combos) == 18  # every micro_batch x recompute x zero once
    # and the ids are the whole space's: the same row the grid builds
    cid = int(frame["config_id"].iloc[5])
    one = space.frame(cid, cid + 1).iloc[0]
    assert one[["num_gpus", "tp", "pp", "micro_batch", "recompute", "zero"]].tolist() == \
        frame.iloc[5][["num_gpus", "tp", "pp", "micro_batch", "recompute", "zero"]].tolist()


def test_inner_must_name_fields_of_the_space():
    with pytest.raises(ConfigError, match=r"search.inner: 'zeros' is not a field of `space:`; "
                                          r"did you mean 'zero'\?"):
        parse_space(doc(inner=["zeros"]))
    with pytest.raises(ConfigError, match="search.patience: expected a positive integer"):
        parse_space(doc(patience=0))
    with pytest.raises(ConfigError, match="search.improvement: expected a fraction"):
        parse_space(doc(improvement=1.5))
    with pytest.raises(ConfigError, match="search.strategy: expected one of 'grid', 'optuna' "
                                          "or 'auto'"):
        parse_space(doc() | {"search": {"strategy": "bayes"}})


# ---------------------------------------------------------------------------------------------
# the sampler
# ---------------------------------------------------------------------------------------------
def test_tpe_is_fitted_once_per_round_not_per_trial():
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from sweep.engine.samplers import make_sampler, round_proposer

    sampler = make_sampler("tpe", ["step_time"], seed=0, round_size=8)
    propose = round_proposer(sampler)
    assert propose is not None and sampler.fit_count == 0
    dists = {"a": CategoricalDistribution(list(range(10))),
             "b": CategoricalDistribution(list(range(10)))}
    study = optuna.create_study(sampler=sampler)
    for _ in range(6):  # 6 rounds of 8
        params = propose(study, dists, 8)
        assert len(params) == 8
        study.add_trials([create_trial(params=p, distributions=dists, state=TrialState.COMPLETE,
                                       value=float((p["a"] - 7) ** 2 + (p["b"] - 3) ** 2))
                          for p in params])
    assert sampler.fit_count == 6 - 2  # the first 10 trials (two rounds) are random
    best = study.best_trial.params
    assert (best["a"], best["b"]) == (7, 3)


def test_in_process_needs_no_cluster_and_a_small_budget(monkeypatch):
    import sys

    import sweep.engine.runtime as rt

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.skip("a Ray of another test is running")
    assert rt.in_process(None, rt.IN_PROCESS_ROWS)
    assert not rt.in_process(None, rt.IN_PROCESS_ROWS + 1)
    assert not rt.in_process("10.0.0.1:6379", 10)
    monkeypatch.setenv("SWEEP_RAY", "1")
    assert not rt.in_process(None, 10)


# ---------------------------------------------------------------------------------------------
# runs (local Ray)
# ---------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("local_ray")
def test_a_space_of_1e10_starts_without_a_census(tmp_path, monkeypatch):
    import sweep.engine.space

    def no_census(*a, **k):
        raise AssertionError("the whole space was walked")

    monkeypatch.setattr(sweep.engine.space, "census", no_census)
    cfg = load_space(ROOT / "search_spaces" / "llama3.1-405b-huge.yaml")
    cfg.search.trials, cfg.search.batch_size = 16, 8
    space = Space.from_config(cfg)
    assert space.size > 10**10  # computed, not enumerated
    o = run_search(cfg, tmp_path, **FAKE)
    text = o.summary()
    assert "optuna tpe: 16 trials" in text and "stopped: the trial budget of 16" in text
    c = o.counts
    assert c["total"] == 288 * int(text.split("trials, ")[1].split(" distinct")[0])
    line = next(ln for ln in text.splitlines() if ln.startswith("sampled:"))
    assert f"sampled: {c['total']:,} configurations" in line
    assert f"({c['ok']:,} fit, {c['oom']:,} out of memory), {c['invalid']:,} invalid" in line


@pytest.mark.usefixtures("local_ray")
def test_patience_stops_the_search_and_says_why(tmp_path):
    cfg = parse_space(doc(trials=500, batch_size=4, patience=6, inner=["zero"]))
    o = run_search(cfg, tmp_path, **FAKE)
    text = o.summary()
    assert "in the last 6 trials (search.patience)" in text
    n = int(text.split("optuna tpe: ")[1].split(" trials")[0])
    assert n < 500
    # the trials after the last improvement: at least the patience, at most patience + what
    # was in flight (two rounds)
    df = pq.read_table(tmp_path / "results.parquet").to_pandas()
    ok = df[df["status"] == "ok"].groupby("trial")["step_time_s"].min()
    assert ok.min() == o.best.iloc[0]["step_time_s"]


@pytest.mark.usefixtures("local_ray")
def test_auto_picks_the_grid_for_a_small_space_and_says_why(tmp_path):
    cfg = parse_space(doc() | {"search": {"strategy": "auto"}})
    o = run_search(cfg, tmp_path, **FAKE)
    assert o.strategy == "grid" and o.counts["total"] == 648
    assert "strategy auto: grid, since the 648 candidates take about" in o.summary()
    huge = Space.from_config(load_space(ROOT / "search_spaces" / "llama3.1-405b-huge.yaml"))
    strategy, why = choose_strategy(huge, 2)
    assert strategy == "optuna" and why.startswith("strategy auto: optuna, since a grid of")
    wide = Space.from_config(load_space(ROOT / "search_spaces" / "llama3.1-405b-wide.yaml"))
    assert choose_strategy(wide, 2)[0] == "optuna"
    assert choose_strategy(wide, 512)[0] == "grid"  # a cluster large enough finishes it


@pytest.mark.usefixtures("local_ray")
def test_a_torn_journal_line_is_dropped_and_the_study_resumes(tmp_path):
    import optuna

    cfg = parse_space(doc(trials=24, batch_size=4, inner=["zero"]))
    run_search(cfg, tmp_path, **FAKE)
    journal = tmp_path / "optuna.journal"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines) + b'{"op_code": 4, "worker_id": "x", "tri')
    more = parse_space(doc(trials=32, batch_size=4, inner=["zero"]))
    o = run_search(more, tmp_path, **FAKE)
    assert journal.read_bytes().endswith(b"\n")
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name="t", storage=JournalStorage(
        JournalFileBackend(str(journal))))
    assert len(study.trials) == 32 and all(t.state.is_finished() for t in study.trials)
    df = pq.read_table(tmp_path / "results.parquet").to_pandas()
    assert df["config_id"].is_unique and len(df) == o.counts["total"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"]
    trials = sorted(n for e in manifest["batches"].values() for n in e["trials"])
    assert trials == list(range(32))  # every trial recorded in exactly one part
    assert np.isin(df["trial"].unique(), trials).all()


@pytest.mark.usefixtures("local_ray")
def test_rounds_evaluated_in_the_driver_equal_those_on_ray(tmp_path, monkeypatch):
    import sweep.engine.runtime as rt
    from sweep.results import read_results

    # a running Ray (the fixture's), a cluster address or a large budget: rounds go to Ray
    assert not rt.in_process(None, 10) and not rt.in_process("auto", 10)
    cfg = parse_space(doc(trials=40, batch_size=4, sampler="random", inner=["zero"]))
    on_ray = run_search(cfg, tmp_path / "ray", **FAKE)
    monkeypatch.setattr(rt, "in_process", lambda address, rows, limit=None: True)
    local = run_search(cfg, tmp_path / "local", **FAKE)
    a = read_results(tmp_path / "ray")[0].sort_values("config_id").reset_index(drop=True)
    b = read_results(tmp_path / "local")[0].sort_values("config_id").reset_index(drop=True)
    assert len(a) == on_ray.counts["total"] > 0
    pd.testing.assert_frame_equal(a, b)
    assert local.counts == on_ray.counts
    assert (local.best["config_id"].to_numpy() == on_ray.best["config_id"].to_numpy()).all()
    manifest = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert manifest["complete"]
    trials = sorted(n for e in manifest["batches"].values() for n in e["trials"])
    assert trials == list(range(40))  # every trial recorded in exactly one part



def test_a_round_with_no_valid_row_joins_the_published_results(tmp_path):
    """A round whose layouts are all invalid has no simulator columns; the published dataset
    still has one schema (that part rewritten with nulls, the others linked)."""
    from sweep.results import read_results

    d = doc(trials=6, batch_size=1, sampler="random", inner=["zero"])
    d["space"] = {"tp": [2, 3], "pp": [2, 4], "zero": [1, 3]}  # tp 3 never divides 8 GPUs
    o = run_search(parse_space(d), tmp_path, **FAKE)
    df = read_results(tmp_path)[0]
    assert set(df["tp"]) == {2, 3} and len(df) == o.counts["total"]
    bad = df[df["tp"] == 3]
    assert (bad["status"] == "invalid").all() and bad["step_time_s"].isna().all()
    assert (df.loc[df["tp"] == 2, "status"] != "invalid").all()
    assert df["step_time_s"].notna().any() and o.best.iloc[0]["tp"] == 2
