"""Calibration: fit the simulator's optional parts to what a user measured on their cluster.

One module per artefact, each readable and changeable alone:

* `kernels`   kernel tables (nsys CSV, PyTorch profiler traces, plain tables) -> per-(GPU, op
              class) efficiency regressors and the hooks compute.py calls;
* `overlap`   overlap tables -> the Echo slowdown regressor and the hook overlap.py calls;
* `nccl`      nccl-tests logs -> per-cluster scales of the white-box NCCL model;
* `runs`      a user's own training runs -> a few interpretable per-cluster/framework scales;
* `rl_phases` a user's own RL run table -> one scale per RL phase (generation, log-probs,
              update, weight sync) with leave-one-group-out CV (`sweep calibrate rl-runs`);
* `rl_defaults` the two shipped scales of NeMo RL's training passes (catalogs/rl.yaml), fitted
              on the published NeMo RL rows with leave-one-source-out printed (`python -m
              sim_core.calibration.rl_defaults [--write]`);
* `training`  what the learned models share (xgboost calls, fingerprints, validation);
* `synthetic` example inputs with known ground truth (`python -m sim_core.calibration.synthetic
              make-examples`).

All of it is OPTIONAL: the simulator's defaults are untouched until a profile is activated
(sim_core.profiles.activate), except the constants `rl_defaults --write` stores in the catalog
(as `sim_core.accuracy.fit` stores the pre-training ones). Nothing here is fitted per
configuration.

May import the simulator's modules and sim_core.accuracy (a runs fit validates through it);
the simulator imports nothing from here, only sim_core.profiles does, when a profile is used.
"""
