"""RL post-training physics (issue 40): one step of GRPO/DAPO/PPO as generation (prefill and
decode on an inference engine), log-probability passes and training in the training layout,
weight sync between the two layouts, and the placement that composes them (colocated or split,
synchronous or off-policy), with memory per phase. Vectorised over configurations like the rest
of `sim_core`; the training pass is the pre-training simulator's, called on a derived workload.

Modules: `inputs` (a table of RL configurations -> arrays), `generation` (prefill, decode, KV
cache, continuous batching, the length tail), `weight_sync` (refit), `training` (log-prob and
update passes through `sim_core.simulate`), `phases` (placement, asynchrony, memory verdicts,
the step), `calibrate` (the decode fit on published inference benchmarks), `refit_host` (NeMo
RL's colocated refit per tensor: collective latency, IPC handles, Ray controller entries) and
`refit_fit` (its two constants fitted on NeMo RL's published refit totals).
"""
