"""RL rows and the training frame several RL test modules price (not a test module).

NEMO_DTENSOR_8B is the NeMo RL v0.3 blog's Llama 3.1-8B DTensor row (sim_core/data/rl/
rl_runs.csv); NEMO_DTENSOR_70B the fields its Llama 3.1-70B DTensor TP8 sibling changes."""

import pandas as pd

from sim_core.rl import inputs, nemo_rl, training
from sim_core.simulate import simulate_frame

NEMO_DTENSOR_8B = dict(model="llama3.1-8b", gpu="h100-sxm", num_gpus=8, rollout_tp=1,
                       prompts_per_step=64, responses_per_prompt=32, prompt_len=92,
                       response_mean=777, response_max=4004, gpu_memory_utilization=0.6,
                       train_tp=1, train_pp=1, train_recompute="none", mini_batches=4,
                       train_seq_len=4096, train_zero=3, rl_framework="nemo_rl",
                       logprob_batch_size=2)
# the blog's Qwen3-30B-A3B row (Megatron TP2 EP8 SP, 64 H100, one 4,096-token sequence per
# training micro-batch, four per log-prob micro-batch)
NEMO_QWEN3_30B_A3B = dict(model="qwen3-30b-a3b", gpu="h100-sxm", num_gpus=64, rollout_tp=4,
                          prompts_per_step=64, responses_per_prompt=32, prompt_len=92,
                          response_mean=3251, response_max=4004, gpu_memory_utilization=0.7,
                          train_tp=2, train_ep=8, train_etp=1, train_recompute="none",
                          mini_batches=4, rl_framework="nemo_rl", logprob_batch_size=4,
                          sequence_packing=False, train_sequence_parallel=True,
                          train_seq_len=4096)
NEMO_DTENSOR_70B = dict(model="llama3.1-70b", num_gpus=64, rollout_tp=4, train_tp=8,
                        response_mean=395, dynamic_batching=True)


def priced_training_frame(row: dict):
    """(df, batch, training frame, its pre-training simulation, the log-prob pass's token
    ratio and gathers per optimizer step) of one RL row: what the per-pass rules take."""
    df = pd.DataFrame([row])
    b = inputs.to_batch(df)
    tf = training.training_frame(df, b)
    sim = simulate_frame(tf.reset_index(drop=True))
    tok, gathers = nemo_rl.dynamic_logprob_ratios(b, tf, training.pack_budget(df, b))
    return df, b, tf, sim, tok, gathers


def published_rows(source: str):
    """The rows of the shipped RL run table (sim_core/data/rl/rl_runs.csv) from one source,
    renumbered from 0: the per-batch row tests read their rows through it."""
    from sim_core.accuracy import rl
    t = rl.load()
    return t[t.source.eq(source)].reset_index(drop=True)
