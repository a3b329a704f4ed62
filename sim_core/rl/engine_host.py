"""The rollout engine's host work per running sequence per decode step: vLLM V1 and SGLang.

Why: between two decode steps an engine loops over its running requests in Python (schedule
them, update the model runner's persistent batch, append the sampled token and check the stop
conditions, build each request's output and its log-probabilities). That work grows with the
running batch and does not shrink with the model, so it weighs most on small models at high
concurrency. vLLM V0 is priced apart (`v0_host.py`: a published profile). This module prices
V1 and SGLang from what their code runs per request and one published measurement of such a
loop, and says how each engine's loop combines it with the GPU step:

- **vLLM V1 at 0.8.x-0.10.x: serial.** `EngineCore.step` is schedule -> execute_model ->
  update_from_output, one after the other (vllm 0.8.5 and 0.10.0 `v1/engine/core.py`); the
  model runner's input update runs before the forward and the sampled tokens' `.tolist()`
  synchronises after it (0.8.5 `v1/worker/gpu_model_runner.py` "GPU -> CPU Sync happens
  here"). RL frameworks run the engine in the trainer's process (verl's `external_launcher`
  and NeMo RL v0.3.0 set `VLLM_ENABLE_V1_MULTIPROCESSING=0`), so `LLMEngine.step`'s output
  processing (`v1/engine/output_processor.py process_outputs`) is on the same thread too.
  Asynchronous scheduling came in vLLM 0.10.0 (PR 19970, `SchedulerConfig.async_scheduling`
  default False, multiprocess executor only); vLLM 0.16.0 / 0.17.0 turn it on by default on
  the `mp`, `uni` and `external_launcher` executors (`vllm/config/vllm.py`), so the NeMo RL
  nightly rows at vLLM 0.17.0 and TP 1 run it (`rollout_async_scheduling` in rl_runs.csv).
- **SGLang 0.4.x: overlapped.** Its overlap scheduler is on by default (sglang 0.4.6
  `server_args.py disable_overlap_schedule: False`; AReaL v0.3.0 keeps it,
  `realhf/api/cli_args.py`): the result of batch N is processed while batch N+1 runs, so a
  step lasts max(GPU step, host work).

The price: per-request loop bodies counted in the code at the rows' versions (catalogs/rl.yaml
`engine_host`), each at the cost vLLM's own micro-benchmark measured for one of them
(`Scheduler.update_from_output`, PR 46112: 0.142 ms at 128 and 0.287 ms at 256 decode
requests, 1.1 us per request). `python -m sim_core.rl.engine_host` prints the terms and a
cross-check; `benchmarks/rl_engine_host.py` what they add at the validation rows.
"""

from __future__ import annotations

import numpy as np

from ..columns import Batch
from . import inputs
from .inputs import constants


def _k() -> dict:
    return constants()["engine_host"]


def per_seq_s(b: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(serial, overlapped) host seconds per running sequence per decode step, per row.

    vLLM V1 rows pay the serial term; SGLang rows the overlapped one; vLLM V0 rows (priced
    by `generation.v0_host_per_seq`) and TensorRT-LLM rows (a C++ executor) neither."""
    k = _k()
    unit = float(k["loop_body_s"])
    eng = np.asarray(b.rollout_engine, dtype=np.int64)
    lp = np.asarray(b.rollout_logprobs, dtype=float) > 0
    v0 = np.asarray(b.rollout_vllm_v0, dtype=float) > 0
    v1 = (eng == inputs.ENGINE.index("vllm")) & ~v0
    # vLLM >= 0.10.0 with async_scheduling: the scheduler runs one step ahead of the GPU
    ahead = v1 & (b.floats("rollout_async_scheduling", 0.0) > 0)
    sg = eng == inputs.ENGINE.index("sglang")
    v1_loops = float(k["vllm_v1_loops"]) + np.where(lp, float(k["vllm_v1_logprob_loops"]), 0.0)
    sg_loops = float(k["sglang_loops"]) + np.where(lp, float(k["sglang_logprob_loops"]), 0.0)
    serial = np.where(v1 & ~ahead, v1_loops * unit, 0.0)
    overlapped = np.where(sg, sg_loops * unit, np.where(ahead, v1_loops * unit, 0.0))
    return serial, overlapped


def combine(gpu_step, seqs, serial_per_seq, overlapped_per_seq) -> np.ndarray:
    """A decode step as the engine's loop runs it: serial host work adds to the GPU step;
    overlapped host work hides under it unless it is longer (then the GPU waits for it)."""
    seqs = np.asarray(seqs, dtype=np.float64)
    return np.maximum(gpu_step + serial_per_seq * seqs, overlapped_per_seq * seqs)


def main() -> None:
    k = _k()
    unit = float(k["loop_body_s"])
    v1 = k["vllm_v1_loops"] + k["vllm_v1_logprob_loops"]
    sg = k["sglang_loops"] + k["sglang_logprob_loops"]
    print(f"loop body {unit * 1e6:.2f} us (vLLM PR 46112: update_from_output 0.142 ms at 128, "
          f"0.287 ms at 256 requests)")
    print(f"  vLLM V1, serial: {k['vllm_v1_loops']} loops + {k['vllm_v1_logprob_loops']} with "
          f"logprobs = {v1 * unit * 1e6:.1f} us per sequence-step; "
          f"{v1 * unit * 1024 * 1e3:.1f} ms at 1024 sequences")
    print(f"  SGLang, overlapped: {k['sglang_loops']} + {k['sglang_logprob_loops']} = "
          f"{sg * unit * 1e6:.1f} us; {sg * unit * 1024 * 1e3:.1f} ms at 1024 sequences, hidden "
          f"under any GPU step longer than that")
    # cross-check: vllm-project/vllm issue 10634 (2024-11-25): V1's AsyncLLM prototype,
    # Llama2-7b, batch 256, ShareGPT: "the gap between the two decodes ... is about 5-6ms",
    # attributed to GIL contention between scheduling and the IPC threads
    print(f"  issue 10634 (V1 prototype with IPC, 5-6 ms between decodes at 256): this rule "
          f"{v1 * unit * 256 * 1e3:.1f} ms (+ the fixed per-step overhead of the decode fit)")
    print("  per validation row: PYTHONPATH=$PWD python benchmarks/rl_engine_host.py")


if __name__ == "__main__":
    main()
