"""Accuracy tooling: how right the simulator is, never part of it.

* `validation`    published measured runs -> the configurations they describe, simulated;
* `published`     the comparison tables `sweep validate` prints (by family, subset, GPU);
* `fit`           the few fitted constants, fitted on declared rows, with leave-one-source-out
                  error (`python -m sim_core.accuracy.fit`);
* `memory_error`  the memory model's measured error per framework, written as the data that
                  sim_core/risk.py reads (`python -m sim_core.accuracy.memory_error --write`).

May import the simulator (sim_core's physics modules) and sim_core.calibration; the simulator
imports nothing from here (tests/test_layout.py checks it).
"""
