"""The Optuna samplers of `search.sampler`, with settings chosen by benchmarks/search_strategies.py.

`tpe` is Optuna's TPESampler (multivariate), fitted once per ask/tell round instead of once
per ask. Optuna's TPE refits from every earlier trial on each ask (a Python loop over the
trials), so a study of n trials costs O(n^2) in the driver: 2,000 trials took longer than the
grid of 3.3M configurations. Within a round nothing new is known, so one fit serves the
round: each ask of the round is, as in TPE, the best of its own `n_ei_candidates` draws by
the acquisition function; the draws of the whole round are scored in one call. That is TPE
without constant liar (a refit per ask that sees the running trials), at a fraction of the
cost. A draw of a layout tried before loses to any untried draw of the same ask (a repeat
teaches nothing; when all of an ask's draws were tried, it repeats, and a layout asked again
costs no simulation: its result is known). Past MAX_ABOVE
trials the "above" estimator keeps the most recent ones, so 5,000 trials stay affordable.
If a future Optuna changes the internals this relies on, plain TPESampler is used.

`random` is the floor every sampler must beat; `nsga2` (a genetic algorithm for two or more
objectives) and `qmc` (a low-discrepancy sequence) are Optuna's own, unchanged. TPE is the
default for any number of objectives (measured: `default_sampler`).
"""

from __future__ import annotations

import warnings

import numpy as np

SAMPLERS = ("tpe", "random", "nsga2", "qmc")
# TPE's "above" estimator keeps the most recent MAX_ABOVE of its trials (TPE already weighs
# older ones less): a fit then costs O(round x (25 + MAX_ABOVE)), not O(round x trials)
MAX_ABOVE = 500


def _round_tpe_class():
    """TPESampler with per-round Parzen fits, or None when Optuna's internals differ."""
    try:
        from optuna.samplers import TPESampler
        from optuna.samplers._tpe import sampler as tpe_mod
        from optuna.trial import TrialState
    except ImportError:  # pragma: no cover
        return None
    needed = ("_build_parzen_estimator", "_compute_acquisition_func", "_compare", "_sample")
    if not all(hasattr(TPESampler, n) for n in needed) or not hasattr(tpe_mod, "_split_trials"):
        return None  # pragma: no cover - another Optuna

    class RoundTPESampler(TPESampler):
        """TPE fitted once per round of asks (see module doc)."""

        def __init__(self, round_size: int = 1, max_above: int = MAX_ABOVE,
                     skip_tried: bool = True, **kwargs):
            super().__init__(constant_liar=False, **kwargs)
            self.skip_tried = skip_tried
            self.round_size = max(1, round_size)
            self.max_above = max_above
            self._told = 0
            self._seen, self._seen_n, self._seen_names = set(), 0, None
            self._queues: dict = {}
            self.fit_count = 0  # how many times the estimators were built (tests read it)

        def after_trial(self, study, trial, state, values):
            self._told += 1  # a new result: the next ask refits
            super().after_trial(study, trial, state, values)

        def _sample(self, study, trial, search_space):
            names = tuple(search_space)
            seen, queue = self._queues.get(names, (None, []))
            if seen != self._told or not queue:
                trials = study._get_trials(deepcopy=False,
                                           states=(TrialState.COMPLETE, TrialState.PRUNED),
                                           use_cache=True)
                queue = self._fit_and_rank(study, trials, search_space)
                self._queues[names] = (self._told, queue)
            ret = dict(zip(names, queue.pop(0)))
            for name, dist in search_space.items():
                ret[name] = dist.to_external_repr(ret[name])
            return ret

        def _seen_params(self, study, names) -> set:
            """Internal values of every trial's params (any state), updated incrementally."""
            trials = study._get_trials(deepcopy=False, states=None, use_cache=False)
            if self._seen_names != names:
                self._seen, self._seen_n, self._seen_names = set(), 0, names
            for t in trials[self._seen_n:]:
                if all(n in t.params for n in names):
                    self._seen.add(tuple(float(t.distributions[n].to_internal_repr(t.params[n]))
                                         for n in names))
            self._seen_n = len(trials)
            return self._seen

        def propose(self, study, search_space, k: int) -> list[dict]:
            """The params of a round of k trials at once (what k asks would return)."""
            trials = study._get_trials(deepcopy=False,
                                       states=(TrialState.COMPLETE, TrialState.PRUNED),
                                       use_cache=False)
            if len(trials) < self._n_startup_trials:
                return [{n: self._random_sampler.sample_independent(study, None, n, d)
                         for n, d in search_space.items()} for _ in range(k)]
            rows = self._fit_and_rank(study, trials, search_space, k)
            return [{n: d.to_external_repr(v) for (n, d), v in zip(search_space.items(), row)}
                    for row in rows]

        def _fit_and_rank(self, study, trials, search_space, k: int | None = None) -> list:
            """One fit, then per ask of the round what TPE's ask does: the best of its own
            `n_ei_candidates` draws by the acquisition function (all scored in one call)."""
            if self._gamma is None:
                self._gamma = (tpe_mod.default_gamma if len(study.directions) <= 1
                               else tpe_mod.default_gamma_multiobjective)
            n_all = len(trials)
            names = list(search_space)
            seen = self._seen_params(study, names) if self.skip_tried else set()
            # pruned trials (no value) all go above: only the most recent can be kept there
            pruned = [t for t in trials if t.state == TrialState.PRUNED]
            if len(pruned) > self.max_above:
                keep = {t.number for t in pruned[-self.max_above:]}
                trials = [t for t in trials if t.state != TrialState.PRUNED or t.number in keep]
            below, above = tpe_mod._split_trials(study, trials, self._gamma(n_all))
            if len(above) > self.max_above:  # the most recent: TPE weighs older ones less
                above = sorted(above, key=lambda t: t.number)[-self.max_above:]
            mpe_below = self._build_parzen_estimator(study, search_space, below,
                                                     handle_below=True)
            mpe_above = self._build_parzen_estimator(study, search_space, above,
                                                     handle_below=False)
            self.fit_count += 1
            k, m = k or self.round_size, self._n_ei_candidates
            samples = mpe_below.sample(self._rng.rng, k * m)
            # score each distinct candidate once (draws from a discrete space repeat)
            pool = np.column_stack([np.asarray(samples[n], dtype=float) for n in names])
            uniq, inverse = np.unique(pool, axis=0, return_inverse=True)
            acq = self._compute_acquisition_func(
                {n: uniq[:, j] for j, n in enumerate(names)}, mpe_below, mpe_above)
            acq = acq[np.ravel(inverse)]
            if seen:  # a layout tried (or in flight) teaches nothing: its draws lose
                old = np.array([tuple(r) in seen for r in pool.tolist()])
                acq = np.where(old, -np.inf, acq)
            acq = np.where(np.isnan(acq), -np.inf, acq)
            pick = np.argmax(acq.reshape(k, m), axis=1) + np.arange(k) * m
            return [list(pool[i]) for i in pick]

    return RoundTPESampler


def round_proposer(sampler):
    """`propose(study, distributions, k) -> [params]` for a sampler that can draw a whole round
    from the study as it is (per-round TPE, random), else None (then each trial is asked).

    Drawing a round at once skips `study.ask`, whose bookkeeping scans every trial of the
    study on each call (O(n) per ask, O(n^2) per study: 25 of the 31 s of 5,000 asks)."""
    import optuna

    if hasattr(sampler, "propose"):
        return sampler.propose
    if type(sampler) is optuna.samplers.RandomSampler:
        return lambda study, dists, k: [
            {n: sampler.sample_independent(study, None, n, d) for n, d in dists.items()}
            for _ in range(k)]
    return None


def default_sampler(objectives: list[str]) -> str:
    """TPE for one objective and for several: on the 12-axis space with [step_time, cost],
    2,000 trials, seeds 0-1, per-round TPE reached 100% of the grid front's hypervolume in
    11-13 s; NSGA-II (asked trial by trial) also 100% but in 32-36 s."""
    return "tpe"


def make_sampler(name: str | None, objectives: list[str], seed: int, round_size: int):
    """The Optuna sampler object for `search.sampler` (None: the default for the objectives)."""
    import optuna

    name = name or default_sampler(objectives)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature warnings
        if name == "tpe":
            startup = max(10, round_size)
            cls = _round_tpe_class()
            if cls is None:  # pragma: no cover
                return optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                                  constant_liar=True, n_startup_trials=startup)
            return cls(round_size=round_size, seed=seed, multivariate=True,
                       n_startup_trials=startup)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(round_size, 8))
        if name == "qmc":
            return optuna.samplers.QMCSampler(seed=seed, qmc_type="halton", scramble=True)
        return optuna.samplers.RandomSampler(seed=seed)
