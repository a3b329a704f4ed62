"""The RL search by chunks (sweep/engine/rl.py, RLConfig.frame(start, stop)): the same
configurations and ranking as pricing the whole space at once, in bounded pieces that survive
an interruption."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from sweep.config import load_space
from sweep.engine import rl as engine
from sweep.errors import Interrupted, SweepError

SPACE = "search_spaces/rl-grpo-qwen3-32b-64xh100.yaml"


def _reference_frame(cfg) -> pd.DataFrame:
    """The table as the search built it before chunks: one dict per combination, then the
    normalisations and pandas' drop_duplicates over the whole space."""
    from sim_core.rl import inputs

    base, axes = cfg.base_row(), cfg.space or {}
    rows = [dict(base, **dict(zip(axes, combo)))
            for combo in itertools.product(*axes.values())]
    df = pd.DataFrame(rows)
    df["train_sequence_parallel"] = df["train_sequence_parallel"] & (df["train_tp"] > 1)
    df = df[~((df["train_ulysses"] > 1) & (df["train_cp"] > 1))].copy()
    df.loc[df["placement"] == "colocated", "rollout_gpus"] = 0
    off = pd.Series(inputs.framework_offloads(df["rl_framework"], df["placement"]),
                    index=df.index)
    for col in ("offload_params", "offload_optimizer"):
        df[col] = df[col].where(df[col].notna(), off).astype(bool)
    df.loc[df["placement"] == "split", ["offload_params", "offload_optimizer"]] = False
    return df.drop_duplicates(ignore_index=True)


def _space(**axes):
    cfg = load_space(SPACE)
    cfg.space = axes
    return cfg


MIXED = dict(placement=["colocated", "split"], rollout_gpus=[16, 32, 32],
             asynchrony=["sync", "one_step_off"], rollout_tp=[2, 4],
             offload_optimizer=[False, True], train_tp=[4, 8], train_cp=[1, 2])


def test_chunks_build_the_same_table_as_the_whole_space():
    cfg = _space(**MIXED)
    whole = cfg.frame()
    ref = _reference_frame(_space(**{**MIXED, "rollout_gpus": [16, 32]}))
    # the same rows, in the same order, as one dict per combination and drop_duplicates gave
    # (a value listed twice is one configuration)
    pd.testing.assert_frame_equal(whole.drop(columns="config_id"), ref)
    # colocated rows once per distinct configuration; split rows never offload
    assert (whole.loc[whole.placement == "colocated", "rollout_gpus"] == 0).all()
    assert not whole.loc[whole.placement == "split", "offload_optimizer"].any()
    n = cfg.space_size()
    assert n == 2 * 2 * 2 * 2 * 2 * 2 * 2 and len(whole) < n
    for size in (1, 7, 50, n):
        parts = pd.concat([cfg.frame(s, s + size) for s in range(0, n, size)],
                          ignore_index=True)
        pd.testing.assert_frame_equal(parts, whole)
    assert whole.config_id.is_monotonic_increasing and whole.config_id.max() < n


def test_ulysses_and_cp_are_never_both():
    cfg = _space(train_cp=[1, 2], train_ulysses=[1, 2])
    cfg.train.rl_framework, cfg.parallel.zero = "verl", 3
    df = cfg.frame()
    assert len(df) == 3 and not ((df.train_cp > 1) & (df.train_ulysses > 1)).any()


def test_chunked_search_ranks_as_the_whole_space(tmp_path):
    cfg = _space(**MIXED)
    whole = engine.rank(engine.evaluate(cfg), cfg.search.objective)
    r = engine.search(cfg, tmp_path, chunk=13)
    got = r["ranking"]
    assert list(got.config_id) == list(whole.config_id.head(len(got)))
    assert got.step_time_s.tolist() == pytest.approx(whole.step_time_s.head(len(got)).tolist())
    assert r["counts"]["rows"] == len(engine.evaluate(cfg))
    assert r["counts"]["fit"] == len(whole)
    stored = pd.read_parquet(tmp_path / "results.parquet")
    assert len(stored) == r["counts"]["rows"] and stored.config_id.is_unique
    assert pd.read_csv(tmp_path / "ranking.csv").config_id.tolist() == got.config_id.tolist()


def test_an_interrupted_search_resumes_without_redoing_chunks(tmp_path, monkeypatch):
    cfg = _space(**MIXED)

    def stop_after_two(bid, done):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="kept 2 of"):
        engine.search(cfg, tmp_path / "a", chunk=16, on_chunk=stop_after_two)
    priced = []
    real = engine._eval_chunk

    def counting(cfg_, bid, *args):
        priced.append(bid)
        return real(cfg_, bid, *args)

    monkeypatch.setattr(engine, "_eval_chunk", counting)
    resumed = engine.search(cfg, tmp_path / "a", chunk=16)
    chunks = -(-cfg.space_size() // 16)
    assert sorted(priced) == list(range(2, chunks))  # the two finished chunks were kept
    once = engine.search(cfg, tmp_path / "b", chunk=16)
    pd.testing.assert_frame_equal(resumed["ranking"], once["ranking"])
    assert resumed["counts"] == once["counts"]


def test_another_space_in_the_same_folder_is_a_one_line_error(tmp_path):
    engine.search(_space(**MIXED), tmp_path, chunk=64)
    with pytest.raises(SweepError, match="different space"):
        engine.search(_space(**{**MIXED, "rollout_tp": [8]}), tmp_path, chunk=64)


def test_check_counts_by_chunks_as_the_whole_space():
    cfg = _space(**MIXED)
    res = engine.evaluate(cfg)
    c = engine.census(cfg, chunk=11)
    assert c["rows"] == len(res) and c["fit"] == int(res.fits.sum())
    assert c["invalid"] == int((~res.valid).sum()) and c["combinations"] == cfg.space_size()


def test_the_frontier_over_cluster_sizes(tmp_path):
    """num_gpus as an axis: the cost-versus-throughput frontier (pareto.csv) holds exactly the
    fitting rows no other fitting row beats on both step time and cost, chunks or not."""
    cfg = _space(num_gpus=[32, 64, 128], placement=["colocated", "split"],
                 rollout_gpus=[16, 32, 64], rollout_tp=[4, 8], train_pp=[1, 2])
    res = engine.evaluate(cfg)
    fit = res[res.fits]
    assert fit.num_gpus.nunique() == 3
    r = engine.search(cfg, tmp_path, chunk=10)
    front = pd.read_csv(tmp_path / "pareto.csv")
    assert len(front) > 1 and front.num_gpus.nunique() > 1
    assert front.step_time_s.is_monotonic_increasing
    assert front.cost_per_1000_steps.is_monotonic_decreasing
    t, c = fit.step_time_s.to_numpy(), fit.cost_per_1000_steps.to_numpy()
    for _, row in front.iterrows():  # nothing beats a frontier row on both
        assert not ((t <= row.step_time_s) & (c <= row.cost_per_1000_steps)
                    & ((t < row.step_time_s) | (c < row.cost_per_1000_steps))).any()
    for ti, ci in zip(t, c):  # every fitting row is matched or beaten by a frontier row
        assert ((front.step_time_s <= ti + 1e-9) & (front.cost_per_1000_steps <= ci + 1e-9)).any()
    # the fastest point of the frontier is the ranking's best
    assert front.config_id.iloc[0] == r["ranking"].config_id.iloc[0]
    pd.testing.assert_frame_equal(r["pareto"], engine.frontier(res))


def test_chunks_on_ray_rank_as_in_the_driver(tmp_path, local_ray):
    """With a Ray running the chunks are Ray tasks (the path of large spaces and of
    --address): the same parts, counters, ranking and frontier as in the driver."""
    cfg = _space(**MIXED)
    on_ray = engine.search(cfg, tmp_path / "ray", chunk=40)
    import ray

    ray.shutdown()  # the driver path: no Ray running, a small space
    here = engine.search(cfg, tmp_path / "here", chunk=40)
    assert on_ray["counts"] == here["counts"]
    pd.testing.assert_frame_equal(on_ray["ranking"], here["ranking"])
    pd.testing.assert_frame_equal(on_ray["pareto"], here["pareto"])
    assert sorted(p.name for p in (tmp_path / "ray" / "parts").iterdir()) == \
        sorted(p.name for p in (tmp_path / "here" / "parts").iterdir())


def test_the_moe_space_searches_expert_parallel_layouts(tmp_path):
    """search_spaces/rl-grpo-qwen3-30b-a3b-h100.yaml: EP of the engine and of the trainer are
    axes that reach the predictions and the recipes."""
    from sweep.advice import rl as adv

    cfg = load_space("search_spaces/rl-grpo-qwen3-30b-a3b-h100.yaml")
    res = engine.evaluate(cfg)
    ok = res[res.valid]
    assert set(ok.train_ep) == {4, 8} and set(ok.rollout_ep) == {1, 4}
    # the same configuration with another training EP prices its update differently
    key = [c for c in cfg.axes() if c != "train_ep"]
    pairs = ok.groupby(key).update_time_s.nunique()
    assert (pairs > 1).any()
    row = ok[(ok.rollout_ep == 4)].iloc[0]
    assert adv.verl_overrides(row)["actor_rollout_ref.rollout.expert_parallel_size"] == 4
    n = adv.nemo_rl_config(row)
    assert n["policy"]["generation"]["vllm_cfg"]["expert_parallel_size"] == 4
    assert n["policy"]["megatron_cfg"]["expert_model_parallel_size"] == int(row.train_ep)
    assert "expert_parallel_size" not in str(adv.verl_overrides(ok[ok.rollout_ep == 1].iloc[0]))
    r = engine.search(cfg, tmp_path)
    assert r["pareto"].num_gpus.nunique() >= 2  # cluster sizes trade time for cost
