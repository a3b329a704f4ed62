"""Advice from finished results: what a user decides with.

* `recommend`  the best configuration under constraints, runner-ups, recipes;
* `baseline`   the rule-of-thumb layout the pick is compared with;
* `export`     launchable recipes (Megatron-LM, torchtitan, DeepSpeed, nanotron, run YAML);
* `report`     the HTML + Markdown report; `frontier` the cost-vs-throughput frontier;
* `trace`      one simulated step as a Chrome/Perfetto timeline.

May import sweep.results, sweep.engine (to re-simulate a row), sweep.config, sweep.errors and
sim_core; never sweep.cli or sweep.api.
"""
