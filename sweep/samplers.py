"""The Optuna samplers of `search.sampler`, with settings chosen by benchmarks/search_strategies.py.

`tpe` is Optuna's TPESampler (multivariate), fitted once per ask/tell round instead of once
per ask. Optuna's TPE refits from every earlier trial on each ask (a Python loop over the
trials), so a study of n trials costs O(n^2) in the driver: 2,000 trials took longer than the
grid of 3.3M configurations. Within a round nothing new is known, so one fit serves the
round: each ask of the round is, as in TPE, the best of its own `n_ei_candidates` draws by
the acquisition function; the draws of the whole round are scored in one call. That is TPE
without constant liar (a refit per ask that sees the running trials), at a fraction of the
cost; a layout asked again costs no simulation (its result is known).
If a future Optuna changes the internals this relies on, plain TPESampler is used.

`random` is the floor every sampler must beat; `nsga2` (two or more objectives) and `qmc`
(a low-discrepancy sequence) are Optuna's own, unchanged.
"""

from __future__ import annotations

import warnings

import numpy as np

SAMPLERS = ("tpe", "random", "nsga2", "qmc")


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

        def __init__(self, round_size: int = 1, **kwargs):
            super().__init__(constant_liar=False, **kwargs)
            self.round_size = max(1, round_size)
            self._queues: dict = {}
            self.fit_count = 0  # how many times the estimators were built (tests read it)

        def _sample(self, study, trial, search_space):
            trials = study._get_trials(deepcopy=False,
                                       states=(TrialState.COMPLETE, TrialState.PRUNED),
                                       use_cache=True)
            names = tuple(search_space)
            seen, queue = self._queues.get(names, (None, []))
            if seen != len(trials) or not queue:
                queue = self._fit_and_rank(study, trials, search_space)
                self._queues[names] = (len(trials), queue)
            ret = dict(zip(names, queue.pop(0)))
            for name, dist in search_space.items():
                ret[name] = dist.to_external_repr(ret[name])
            return ret

        def _fit_and_rank(self, study, trials, search_space) -> list:
            """One fit, then per ask of the round what TPE's ask does: the best of its own
            `n_ei_candidates` draws by the acquisition function (all scored in one call)."""
            if self._gamma is None:
                self._gamma = (tpe_mod.default_gamma if len(study.directions) <= 1
                               else tpe_mod.default_gamma_multiobjective)
            below, above = tpe_mod._split_trials(study, trials, self._gamma(len(trials)))
            mpe_below = self._build_parzen_estimator(study, search_space, below,
                                                     handle_below=True)
            mpe_above = self._build_parzen_estimator(study, search_space, above,
                                                     handle_below=False)
            self.fit_count += 1
            k, m = self.round_size, self._n_ei_candidates
            samples = mpe_below.sample(self._rng.rng, k * m)
            acq = self._compute_acquisition_func(samples, mpe_below, mpe_above)
            pick = np.argmax(acq.reshape(k, m), axis=1) + np.arange(k) * m
            names = list(search_space)
            return [[samples[n][i] for n in names] for i in pick]

    return RoundTPESampler


def default_sampler(objectives: list[str]) -> str:
    return "tpe" if len(objectives) == 1 else "nsga2"


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
