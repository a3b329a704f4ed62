"""The decode step's sampler (issue 40): vLLM's V1 sampler makes float32 passes over the
vocabulary of every running sequence, with a log-softmax where the rollout asks for
log-probabilities (catalogs/rl.yaml sampler_bytes_per_logit, counted from vLLM 0.8.5's
sampler.py). These tests fail if the term is dropped, divided by TP, charged without
logprobs as with, or charged to engines whose sampler was not counted."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim_core import catalog
from sim_core.rl import calibrate, generation, inputs
from tests.rl_decode import BASE, decode_steps

def test_logprobs_cost_is_the_log_softmax_and_rank_bytes_per_logit():
    batch = 1024.0
    # the GPU step: the logprobs' host loop (engine_host.py) is tested apart
    b, t = decode_steps([{}, {"rollout_logprobs": False}], batch, host=False)
    table = inputs.constants()["sampler_bytes_per_logit"]["vllm"]
    extra = table["logprobs"] - table["plain"]
    assert extra == 28  # log_softmax with its bf16 -> fp32 cast (22) + the sampled rank (6)
    bw = b.hbm_bw_gbs[0] * 1e9 * generation.decode_constants()["hbm_efficiency"]
    vocab = catalog.get_model("qwen2.5-0.5b").vocab
    np.testing.assert_allclose(t[0] - t[1], batch * vocab * extra / bw, rtol=1e-9)


def test_sampler_scales_with_batch_and_is_not_split_over_tp():
    # every GPU of the engine samples the all-gathered logits: the sampler's share of the
    # step is the same at TP 1 and TP 2, and grows linearly in the batch
    _, t1 = decode_steps([{"rollout_tp": 1}, {"rollout_tp": 1, "rollout_logprobs": False}], 512,
                         host=False)
    _, t2 = decode_steps([{"rollout_tp": 2}, {"rollout_tp": 2, "rollout_logprobs": False}], 512,
                         host=False)
    np.testing.assert_allclose(t1[0] - t1[1], t2[0] - t2[1], rtol=1e-9)
    _, t4 = decode_steps([{}, {"rollout_logprobs": False}], 1024, host=False)
    np.testing.assert_allclose(t4[0] - t4[1], 2 * (t1[0] - t1[1]), rtol=1e-9)


def test_sampler_weighs_on_small_models_not_on_large_ones():
    # the same 1024 running sequences: a 0.5B model's step is mostly the vocabulary-wide
    # sampler's traffic beyond the weights; a 70B (TP 4) step barely notices it
    rows = [{}, {"model": "llama3.1-70b", "rollout_tp": 4}]
    b, with_lp = decode_steps(rows, 1024)
    sampler = 1024 * b.vocab * generation.sampler_bytes(b) / (
        b.hbm_bw_gbs * 1e9 * generation.decode_constants()["hbm_efficiency"])
    share = sampler / with_lp
    assert share[0] > 0.12 and share[1] < 0.05


def test_sglang_logprobs_sort_the_vocabulary_and_tensorrt_llm_is_not_counted():
    # SGLang v0.4.6 with return_logprob normalises top-p by a full sort of the probabilities:
    # far more traffic per logit than vLLM's log-softmax; TensorRT-LLM's sampler was not read
    b = inputs.to_batch(pd.DataFrame([{**BASE, "rollout_engine": e, "rollout_logprobs": lp}
                                      for e in ("vllm", "sglang", "tensorrt-llm")
                                      for lp in (True, False)]))
    got = generation.sampler_bytes(b)
    np.testing.assert_array_equal(got, [80.0, 52.0, 282.0, 44.0, 4.0, 4.0])
    assert got[2] - got[3] > 3 * (got[0] - got[1])


def test_rl_rows_ask_for_logprobs_and_benchmark_frames_do_not():
    b = inputs.to_batch(pd.DataFrame([BASE]))
    assert b.rollout_logprobs[0] == 1.0
    bench = calibrate.load().head(2)
    assert not calibrate.frame(bench).rollout_logprobs.any()


def test_bad_logprobs_value_names_the_field():
    with pytest.raises(catalog.CatalogError, match="rollout_logprobs"):
        inputs.to_batch(pd.DataFrame([{**BASE, "rollout_logprobs": "sometimes"}]))


def test_run_file_logprobs_reach_the_decode_step(tmp_path):
    import yaml

    import sweep

    src = yaml.safe_load(open("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml"))
    with_lp = sweep.simulate("search_spaces/examples/rl-grpo-qwen3-32b-64xh100.yaml")
    src["rollout"]["logprobs"] = False
    f = tmp_path / "plain.yaml"
    f.write_text(yaml.safe_dump(src))
    plain = sweep.simulate(str(f))
    assert plain.gen_time_s.iloc[0] < with_lp.gen_time_s.iloc[0]
