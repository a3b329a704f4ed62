"""The search engine: from a space to evaluated, ranked candidates.

* `space`       the space's axes, enumeration by id, the divisibility rules on arrays;
* `prune`       bounds that spare simulating candidates that cannot win or cannot fit;
* `evaluate`    one frame of candidates: framework defaults, rules, bounds, simulator;
* `runtime`     where work runs: Ray (cluster or local) or the driver, progress;
* `strategy`    the interface every strategy implements (SearchJob -> Outcome);
* `grid`, `optuna_strategy` (+ `nested`, `samplers`)  the strategies;
* `execution`   run_search: picks a strategy by name and runs it.

May import sweep.config, sweep.results, sweep.errors and sim_core; never sweep.advice,
sweep.cli or sweep.api.
"""
