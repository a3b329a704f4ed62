"""What a row's measured log-prob time holds, so that the predicted side sums the same passes.

Sources time the log-prob passes differently: verl's `timing_s/old_log_prob` is the policy's
pass alone, its reference pass under its own `timing_s/ref`
(verl/trainer/ppo/ray_trainer.py `marked_timer("old_log_prob", ...)`, `marked_timer("ref",
...)`, verl-project/verl at 1dda039b); NeMo RL's `policy_and_reference_logprobs` holds both
(nemo_rl/algorithms/grpo.py `timer.time("policy_and_reference_logprobs")`, NVIDIA-NeMo/RL at
7ea279ab); SkyRL's `fwd_logprobs_values_reward` holds the policy's, the reference's and the
critic's forwards (skyrl/train/trainer.py `Timer("fwd_logprobs_values_reward", ...)`,
NovaSky-AI/SkyRL at a9564572); slime's (miles', vime's) `perf/log_probs` is the actor's pass,
the reference's under `perf/ref_log_probs` (slime/backends/megatron_utils/actor.py
`timer(f"{store_prefix}log_probs")`, THUDM/slime at 624b824a; miles/backends/megatron_utils/
actor.py, radixark/miles at 31f1ca96).

A row's measured figure is old_log_prob_time_s plus ref_time_s where it states one (two
timers summed: both passes); its `log_prob_timer` cell says what a lone old_log_prob_time_s
holds (`policy` or `policy+ref`), blank = its framework's timer (FRAMEWORK_TIMER).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TIMERS = ("policy", "policy+ref")
# the framework's own log-prob timer (module docstring: the code that names it)
FRAMEWORK_TIMER = {"verl": "policy", "nemo_rl": "policy+ref", "skyrl": "policy+ref",
                   "slime": "policy", "miles": "policy", "vime": "policy"}
_SPELLINGS = {"policy": "policy", "actor": "policy", "old": "policy", "old_log_prob": "policy",
              "policy+ref": "policy+ref", "policy+reference": "policy+ref",
              "actor+ref": "policy+ref", "both": "policy+ref", "all": "policy+ref"}


class LogProbTimerError(ValueError):
    pass


def parse(cell) -> str:
    """A `log_prob_timer` cell as one of TIMERS ('' where blank)."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return ""
    s = str(cell).strip().lower().replace(" ", "")
    if not s or s == "nan":
        return ""
    if s not in _SPELLINGS:
        raise LogProbTimerError(f"log_prob_timer {cell!r}: expected one of {', '.join(TIMERS)}")
    return _SPELLINGS[s]


def held(cells, framework, ref_stated) -> np.ndarray:
    """Per row, the passes its measured log-prob figure holds: both where the row states a
    separate reference time (the two timers summed), else its cell, else its framework's
    timer (an unknown framework: verl's, the model's default framework)."""
    cells = pd.Series(cells, dtype=object).map(parse).to_numpy(dtype=object)
    fw = pd.Series(framework, dtype=object).astype(str).to_numpy()
    dflt = np.array([FRAMEWORK_TIMER.get(f, "policy") for f in fw], dtype=object)
    out = np.where(cells != "", cells, dflt)
    return np.where(np.asarray(ref_stated, dtype=bool), "policy+ref", out)


def predicted(timer: np.ndarray, old: np.ndarray, ref: np.ndarray,
              values: np.ndarray) -> np.ndarray:
    """The predicted seconds of the passes the timer holds: the policy's (old log-probs) alone,
    or every log-prob pass (policy, reference, the critic's values)."""
    old, ref, values = (np.asarray(a, dtype=float) for a in (old, ref, values))
    return np.where(np.asarray(timer) == "policy", old, old + ref + values)
