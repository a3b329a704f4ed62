"""The work of verl's driver inside the `step` timer but outside every phase timer.

verl's `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py at 503ea75f5, the commit of PR
#2231 whose recipes the one_step_off.md rows ran; the same at v0.4.1, v0.5.0 and 448c6c35, the
r1_ascend commit) times `step` around the whole iteration and, inside it, `gen`,
`old_log_prob`, `ref`, `values`, `update_critic`, `update_actor` (`verl_calls.py` and the
passes price those), `reward`, `adv` and, every `test_freq` steps, `testing`. What runs in the
step and in none of the phases the simulator prices is the driver's own Python, on one core:
the trainer is the `TaskRunner` Ray actor (`main_ppo.py`: `@ray.remote(num_cpus=1)`), for which
Ray sets `OMP_NUM_THREADS` to its one CPU, so its torch ops on CPU tensors run single-threaded.
Counted in that code, per step, as functions of the batch (N sequences, P / R the padded
prompt / response caps, the mean prompt and response lengths):

1. **The reward manager** (`timing_s/reward`; `workers/reward_manager/naive.py` and `dapo.py`
   `__call__`): `torch.zeros_like(responses, float32)`, then a Python loop over the N
   responses: `data[i]` (a `DataProtoItem`: the TensorDict indexed once per key, six int64
   keys at that point), the valid prompt and response lengths (`attention_mask[:P].sum()`,
   `[P:].sum()`) and the two slices they index, two `tokenizer.decode` (each
   `to_py_obj` -> `.tolist()` then the Rust decoder over the valid tokens), the score, and
   `reward_tensor[i, valid_response_length - 1] = reward`; DAPO's overlong penalty adds six
   tensor ops (`exceed_len`, the division and scaling, `min`, the add). Priced: the torch ops
   at PyTorch's published eager overhead of one op on a CPU tensor, the decoded tokens at a
   published decode rate (catalogs/rl.yaml `verl_driver`). `data[i]` is priced as one op per
   key (TensorDict's own Python around them is not: a floor). The scorer's own regexes
   (`gsm8k.compute_score`, `math_dapo.compute_score` on the last 300 characters) are counted,
   not priced: no published per-call figure was found. DAPO's dynamic-sampling rounds (`gen_rounds`) score
   every round's batch.
2. **The advantage** (`timing_s/adv`; `core_algos.py`): GRPO's
   `compute_grpo_outcome_advantage` loops over the N samples twice in Python (one index op,
   then index, subtract, add, divide and store: 6), builds two tensors from each group's list
   (`torch.tensor(list)`, one conversion per element: 2 per sample) and reduces them
   (`mean`, `std`: 2 per group), then `scores.unsqueeze(-1) * response_mask` over [N, R];
   PPO's `compute_gae_advantage_return` loops over the R response positions (22 ops on [N]
   columns each) then `stack`, `+ values` and `masked_whiten` over [N, R].
3. **Passes over the padded batch on the driver**: `_balance_batch` sums `attention_mask`
   [N, P + R] and `reorder`s the batch (a gather of every int64 tensor: prompts, responses,
   input_ids, attention_mask, position_ids, response_mask, the counts of `verl_calls.py`);
   `global_token_num` sums `attention_mask` again; the reward's fp32 [N, R] zeros; the
   advantage's fp32 passes. Priced at Ray's `single_client_put_gigabytes` (19.86 GB/s, a
   one-thread copy into shared memory: catalogs/rl.yaml `ray_calls.put_gb_per_s`) per byte
   moved.

Counted, not priced (no per-call figure; microseconds each): the `uuid4` per sample, the
Karmarkar-Karp partition of `_balance_batch` (Python over N items), the non-tensor batch's
`repeat` and `np.array` of the reward's extra info. Outside the `step` timer at these
versions, so not in the step: `compute_data_metrics`, `compute_timing_metrics`,
`compute_throughout_metrics` (after the timer closes). Inside it but not priced: `testing`
(validation every `test_freq` steps: not a column; it lands in the step of the steps that
validate) and `save_checkpoint`.

verl rows only (`rl_framework` verl, which is also the blank default); on the training
pipeline (`phases.compose_step`'s `prep`): serial in a synchronous step, beside the generation
in one_step_off. Nothing fitted on the validation rows.
"""

from __future__ import annotations

import numpy as np

from . import verl_calls
from .inputs import ALGORITHM, RL_FRAMEWORK, constants

VERL = RL_FRAMEWORK.index("verl")
DAPO = ALGORITHM.index("dapo")
PPO = ALGORITHM.index("ppo")

# torch ops per response in the reward loop (module docstring, item 1): data[i] (6 keys)
# + 2 x (slice, sum, index slice, __index__) + 2 tolist + (v - 1, store) = 18
REWARD_OPS = 18
# DAPO's overlong penalty: exceed_len, / len, * factor, neg, min, add
DAPO_OVERLONG_OPS = 6
# GRPO advantage: ops per sample (two Python loops, two list -> tensor conversions) and per group
GRPO_OPS_PER_SAMPLE = 8
GRPO_OPS_PER_GROUP = 2
# PPO's GAE: ops per response position (on [N] columns)
GAE_OPS_PER_POSITION = 22
# bytes per [N, R] element the advantage moves: GRPO `token_level_rewards.sum` (fp32, 4 read)
# + `scores.unsqueeze(-1) * response_mask` (int64 mask, 8 read; fp32 result, 4 written) = 16;
# GAE: stack (8), + values (12), masked_whiten (~5 fp32 passes: 20) = 40
GRPO_ADV_BYTES = 16.0
GAE_ADV_BYTES = 40.0
# the reward's fp32 zeros [N, R]
REWARD_ZEROS_BYTES = 4.0


def counts(b) -> dict:
    """Per row, what the driver does per step: `reward_ops`, `decoded_tokens`, `adv_ops`,
    `bytes` (moved by its single-threaded passes). Zero off verl."""
    n = len(b.placement)
    verl = b.rl_framework == VERL
    rounds = np.maximum(np.nan_to_num(np.asarray(b.gen_rounds, float) * np.ones(n), nan=1.0),
                        1.0)
    seqs = np.asarray(b.sequences, float)
    scored = seqs * rounds
    p_cap = np.asarray(b.prompt_max, float)
    r_cap = np.asarray(b.response_max, float)
    ppo = b.algorithm == PPO
    per_resp = REWARD_OPS + np.where(b.algorithm == DAPO, DAPO_OVERLONG_OPS, 0)
    reward_ops = scored * per_resp
    decoded = scored * (np.asarray(b.prompt_len, float) + np.asarray(b.response_mean, float))
    groups = seqs / np.maximum(np.asarray(b.responses_per_prompt, float), 1.0)
    adv_ops = np.where(ppo, r_cap * GAE_OPS_PER_POSITION,
                       seqs * GRPO_OPS_PER_SAMPLE + groups * GRPO_OPS_PER_GROUP)
    int64 = 8.0 * (verl_calls.INT64_PROMPT_TENSORS * p_cap
                   + verl_calls.INT64_RESPONSE_TENSORS * r_cap)
    mask = 8.0 * (p_cap + r_cap)
    # balance: mask sum + gather of every int64 tensor; global_token_num: mask sum again
    per_seq = (2.0 * mask + int64 + REWARD_ZEROS_BYTES * r_cap * rounds
               + np.where(ppo, GAE_ADV_BYTES, GRPO_ADV_BYTES) * r_cap)
    z = np.where(verl, 1.0, 0.0)
    return {"reward_ops": reward_ops * z, "decoded_tokens": decoded * z,
            "adv_ops": adv_ops * z, "bytes": seqs * per_seq * z}


def seconds(b) -> dict:
    """Per row: `reward_s`, `adv_s`, `passes_s` and their sum `driver_s` (zero off verl)."""
    k = constants()
    op = float(k["verl_driver"]["cpu_op_s"])
    decode = float(k["verl_driver"]["decode_tokens_per_s"])
    put = float(k["ray_calls"]["put_gb_per_s"]) * 1e9
    c = counts(b)
    reward = c["reward_ops"] * op + c["decoded_tokens"] / decode
    adv = c["adv_ops"] * op
    passes = c["bytes"] / put
    return {"reward_s": reward, "adv_s": adv, "passes_s": passes,
            "driver_s": reward + adv + passes}
