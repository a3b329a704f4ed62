"""Megatron-Core's uneven pipeline split: the embedding and the loss counted as layers.

With `account_for_embedding_in_pipeline_split` (`account_for_loss_in_pipeline_split`)
Megatron-Core adds one to the layer count for the split, gives every (virtual) chunk
(layers + flags) / (pp x vpp) decoder layers, and builds one fewer on the first chunk of the
first pipeline rank (the last chunk of the last rank): transformer_block.py
get_num_layers_to_build and transformer_config.py __post_init__ (core_v0.15.0; it asserts the
sum divides by pp, and by pp x vpp per rank). With pp == 1 the one rank builds every layer.
The point is to even out the stages: the first rank also runs the embedding, the last the
output head and loss. Example: Qwen3-235B (94 layers) at PP8 with both flags builds
11, 12 x 6, 11 (verl v0.7.0 examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh).

The simulator's stages hold workload.layers_per_stage = ceil(layers / (pp x vpp)) x vpp
layers (the busiest rank's). Where (layers + flags) divides as Megatron demands and a middle
rank exists, that is also the middle ranks' count under the flags; this module gives how many
fewer the first and the last rank hold, which step.py prices as negative stage extras (time:
the busiest rank, embedding and loss included) and memory.py as fewer layers' activations in
flight. Flags off (the default), every function returns zeros: no prediction changes.
A split Megatron would reject (not divisible) is priced with the ceiling, not refused."""

from __future__ import annotations

import numpy as np


def _flags(b) -> tuple[np.ndarray, np.ndarray]:
    """(embedding, loss) as 0/1 floats, zero where pp == 1 (the split does not act)."""
    on = np.asarray(b.pp) > 1
    e = np.asarray(b.account_for_embedding_in_pipeline_split, dtype=bool) & on
    lo = np.asarray(b.account_for_loss_in_pipeline_split, dtype=bool) & on
    return e.astype(np.float64), lo.astype(np.float64)


def any_on(b) -> bool:
    """Whether any configuration of the batch uses the split (skips the work otherwise)."""
    e, lo = _flags(b)
    return bool(np.any(e > 0) or np.any(lo > 0))


def stage_layers(b, layers_per_stage) -> dict:
    """Decoder layers on the first, a middle and the last pipeline rank (arrays).

    Each chunk holds ceil((layers + e + l) / (pp x vpp)) layers (Megatron's exact quotient
    where it divides), a rank vpp chunks; the first rank one fewer with the embedding flag,
    the last one fewer with the loss flag. Flags off: all three equal layers_per_stage."""
    e, lo = _flags(b)
    p = np.asarray(b.pp, dtype=np.float64)
    v = np.maximum(np.asarray(b.vpp, dtype=np.float64), 1.0)
    per_rank = np.ceil((np.asarray(b.layers, dtype=np.float64) + e + lo) / (p * v)) * v
    split = (e + lo) > 0
    full = np.where(split, per_rank, layers_per_stage)
    return {"first": full - e, "middle": full, "last": full - lo}


def fewer_layers(b, layers_per_stage) -> tuple[np.ndarray, np.ndarray]:
    """(first, last): how many decoder layers the first and the last rank hold fewer than
    layers_per_stage (the simulator's stage), >= 0 where the split leaves them lighter."""
    s = stage_layers(b, layers_per_stage)
    return layers_per_stage - s["first"], layers_per_stage - s["last"]


def has_middle(b) -> np.ndarray:
    """Whether a rank other than the first and the last exists (pp > 2) with the split on:
    then the busiest rank is at least a middle one, extras of the ends below zero or not."""
    e, lo = _flags(b)
    return (np.asarray(b.pp) > 2) & ((e + lo) > 0)


def stage_extras(b, layers_per_stage, stage_mb) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds per micro-batch the split adds to the first and the last rank's stage extras
    (negative: the layers they no longer hold, at the stage's average per layer, as
    step.last_stage_layers_s prices a pipeline layout's), and a middle rank's own extra
    (0 where it holds layers_per_stage; -inf where there is no middle rank or no split), so
    that the busiest rank is the max of the three."""
    L = np.maximum(layers_per_stage, 1.0)
    s = stage_layers(b, layers_per_stage)
    per_layer = stage_mb / L
    first = (s["first"] - layers_per_stage) * per_layer
    last = (s["last"] - layers_per_stage) * per_layer
    middle = np.where(has_middle(b), (s["middle"] - layers_per_stage) * per_layer, -np.inf)
    return first, last, middle
