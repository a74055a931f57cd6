"""Optuna samplers the tuning theorems cover, and Optuna's logger kept quiet (private).

:class:`DPHyPOSampler` is DP-HyPO's Framework 1 (seed 003) as an Optuna
``BaseSampler``; :class:`TPERule` drives it with Optuna's own TPE. Both are
re-exported by :mod:`privguard.integrations.optuna`, which documents how they
are charged.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from privguard._errors import InvalidArgumentError
from privguard._optional import require
from privguard.tuning._dp_hypo import (
    DPHyPOSearch,
    GPUpdate,
    bounded_density,
    check_history,
    ordinal_coordinates,
)
from privguard.tuning._draw import draw_index
from privguard.tuning._quiet import quiet_warnings
from privguard.tuning._space import SearchSpace

try:
    import optuna
except ImportError:  # the install hint
    require("optuna", "optuna")
    raise

__all__ = ["DPHyPOSampler", "TPERule", "silenced"]


_quiet_lock = threading.Lock()
_quiet: dict[str, Any] = {"depth": 0, "level": None, "propagate": None}


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Optuna's logger says nothing and every warning is discarded for the duration.

    Optuna's per-trial lines carry values; a warning raised by a trial or by an
    update rule is output about trials that may not win (one per trial, under an
    "always" filter, counts K).

    Scopes nest and overlap across threads (trials run in threads): the first
    to enter saves Optuna's logger level and the warning filters and silences
    both, the last to leave restores them, under a lock. Each scope restoring
    what it saw (``warnings.catch_warnings`` per scope, as before) left them
    silenced for good when two threads' scopes overlapped: the second saved the
    first's silence and restored it last. Both are process-wide state, so while
    any scope is open every thread's Optuna log lines and warnings are dropped
    (erring towards releasing nothing about a trial); with context-aware
    warnings (Python 3.14+) the warning filters are per scope instead. A
    ``catch_warnings`` of other code in another thread that overlaps a scope
    can still save and restore its silence: the filters are not thread-safe.
    """
    _enter_quiet()
    try:
        # the tuners' own scope (privguard/tuning/_quiet.py), one count with run_candidate's
        with quiet_warnings():
            yield
    finally:
        _leave_quiet()


def _enter_quiet() -> None:
    with _quiet_lock:
        if _quiet["depth"] == 0:
            logger = logging.getLogger("optuna")
            _quiet.update(level=logger.level, propagate=logger.propagate)
            logger.setLevel(logging.CRITICAL + 1)
        _quiet["depth"] += 1


def _leave_quiet() -> None:
    with _quiet_lock:
        _quiet["depth"] -= 1
        if _quiet["depth"] == 0:
            logger = logging.getLogger("optuna")
            logger.setLevel(_quiet["level"])
            logger.propagate = _quiet["propagate"]


def _grid(search_space: Any) -> SearchSpace:
    """``search_space`` checked as a grid of categorical choices (:func:`_check_grid`)."""
    if not isinstance(search_space, Mapping) or not search_space or not all(
            isinstance(v, (list, tuple)) and v for v in search_space.values()):
        raise InvalidArgumentError("search_space", search_space,
                                   "must be a {name: [values, ...]} grid, every list non-empty")
    _check_grid(search_space)
    return SearchSpace(search_space)


def _check_grid(search_space: Mapping[Any, Sequence[Any]]) -> None:
    """Every name a string and every value a choice some ``suggest_*`` can return.

    Else every trial drawing it would be ⊥ after the whole bound is charged.
    """
    for name, values in search_space.items():
        if not isinstance(name, str):
            raise InvalidArgumentError("search_space", search_space,
                                       f"has the name {name!r}: suggest_* names are strings")
        for value in values:
            try:
                hash(value)
            except TypeError:
                raise InvalidArgumentError("search_space", search_space,
                                           f"has the unhashable value {value!r} for {name!r}: "
                                           "not a categorical choice") from None
            if isinstance(value, (float, np.floating)) and not np.isfinite(value):
                raise InvalidArgumentError("search_space", search_space,
                                           f"has the value {value!r} for {name!r}: it fits "
                                           "no suggestion")


class DPHyPOSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler that proposes from a density kept within [c, C] × the prior (DP-HyPO).

    Seed 003's Framework 1 on a finite (or discretised) search space: after
    each trial, an update ``rule`` maps the history of (candidate, value) to
    a density over the candidates, which privguard's exact Euclidean
    projection (:func:`privguard.tuning.project_density`) keeps within
    [c·π₀, C·π₀]; the next candidate is drawn from it. Under
    :func:`privguard.integrations.optuna.private_optimize` the cost is
    DP-HyPO's Theorem 1 bound (``privguard.mechanisms.DPHyPO``), charged
    before the first trial, and
    the rule sees only the trials that were not ⊥. Used in a plain Optuna
    study it proposes the same way, from the study's complete trials (and
    then nothing is private).

    Args:
        search_space: ``{name: [values, ...]}``, a finite grid as for
            Optuna's ``GridSampler``; every ``suggest_*`` of the objective
            returns the drawn candidate's value, which must lie in the range
            the objective suggests (else the trial is ⊥).
        C, c: the density bounds, c ≤ 1 ≤ C (paper defaults 2 and 0.75).
        rule: ``"gp"`` (Algorithm 3: a Gaussian process and UCB, needs
            ``privguard[gp]``), ``"tpe"`` (:class:`TPERule`: the law of
            Optuna's TPE proposals, estimated by sampling, since Optuna's
            public API does not expose TPE's density) or any
            ``(history, coords) -> weights`` as for
            :class:`privguard.tuning.DPHyPOSearch` (history: (candidate
            index, value) pairs, values oriented so larger is better).
        prior: π₀ over the candidates in grid order (default uniform).

    Raises:
        InvalidArgumentError: any argument out of its domain.

    Example:
        >>> from privguard.integrations.optuna import DPHyPOSampler
        >>> sampler = DPHyPOSampler({"lr": [0.01, 0.1, 1.0]}, rule=lambda h, x: [1, 1, 1])
        >>> len(sampler.candidates), round(float(sampler.density([]).sum()), 12)
        (3, 1.0)
    """

    def __init__(self, search_space: Mapping[str, Sequence[Any]], *, C: float = 2.0,
                 c: float = 0.75, rule: str | Callable[[list, np.ndarray], Any] = "gp",
                 prior: Any = None) -> None:
        space = _grid(search_space)
        if isinstance(rule, str) and rule == "gp":
            require("sklearn.gaussian_process", "gp")
            rule = GPUpdate()
        elif isinstance(rule, str) and rule == "tpe":
            rule = TPERule(search_space)
        if isinstance(rule, str) or not callable(rule):
            raise InvalidArgumentError("rule", rule,
                                       "must be 'gp', 'tpe' or callable(history, coords)")
        # DPHyPOSearch checks C, c and the prior; its runs and cost here are placeholders.
        from privguard.mechanisms import PureDP
        from privguard.tuning import Geometric

        checked = DPHyPOSearch(space, Geometric(mean=2.0), cost=PureDP(1.0), C=C, c=c,
                               update=rule, prior=prior, progress=False)
        self.space, self.C, self.c, self.rule = space, checked.C, checked.c, rule
        self.prior = checked.prior
        self.candidates = space.candidates()
        self.coords = ordinal_coordinates(space)
        self._rng = np.random.default_rng()

    def density(self, history: list) -> np.ndarray:
        """The projected density after ``history`` ((candidate index, value) pairs)."""
        return bounded_density(self.rule, self.coords, self.prior, self.C, self.c, history)

    # -- Optuna's sampler protocol (a plain, non-private study) ------------------------
    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return {name: optuna.distributions.CategoricalDistribution(self.space._choice(name).values)
                for name in self.space.dimensions}

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]
                        ) -> dict[str, Any]:
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        history = []
        for done in study.get_trials(deepcopy=False,
                                     states=(optuna.trial.TrialState.COMPLETE,)):
            try:
                history.append((self.candidates.index(
                    {k: done.params[k] for k in self.space.dimensions}), sign * done.value))
            except (KeyError, ValueError):
                continue
        try:
            pi = self.density(history)
        except Exception:  # the rule with the prior as fallback, as in DPHyPOSearch
            pi = self.prior
        return dict(self.candidates[draw_index(self._rng, pi)])  # exactly π/Σπ (task ul)

    def sample_independent(self, study: Any, trial: Any, param_name: str,
                           param_distribution: Any) -> Any:
        raise ValueError(f"parameter {param_name!r} is not in DPHyPOSampler's search_space")

    def _tuner(self, runs: Any, cost: Any, mode: str, seed: int | None,
               progress: bool) -> DPHyPOSearch:
        return DPHyPOSearch(self.space, runs, cost=cost, C=self.C, c=self.c, update=self.rule,
                            prior=self.prior, mode=mode, seed=seed, progress=progress)

    def __repr__(self) -> str:
        return f"DPHyPOSampler({len(self.candidates)} candidates, C={self.C}, c={self.c})"


class TPERule:
    """A DP-HyPO update rule driven by Optuna's own TPE: the law of TPE's proposals.

    Optuna's public API does not give TPE's density: the Parzen estimators
    l(x) and g(x) and the ratio TPE maximises live in the private module
    ``optuna.samplers._tpe``; the public ``TPESampler`` only returns samples.
    So the rule rebuilds an in-memory study from the history (public
    ``create_study``, ``create_trial``, ``add_trials``), asks TPE for
    ``n_samples`` proposals (``study.ask``) and returns how often each
    candidate was proposed: a Monte Carlo estimate of TPE's proposal law on
    the grid. Like any rule, its output is then projected into [c, C] × the
    prior, so Theorem 1 holds whatever TPE does (seed 003). Until TPE has
    ``n_startup_trials`` results (Optuna's default 10) its proposals are
    uniform.

    Args:
        search_space: the grid, as for :class:`DPHyPOSampler`.
        n_samples: proposals drawn per update (default 64).
        **tpe_options: passed to ``optuna.samplers.TPESampler``.

    Example:
        >>> rule = TPERule({"x": [0, 1, 2]}, n_samples=8)
        >>> weights = rule([(0, 1.0)], None)
        >>> weights.shape, float(weights.sum())
        ((3,), 8.0)
    """

    def __init__(self, search_space: Mapping[str, Sequence[Any]], *, n_samples: int = 64,
                 **tpe_options: Any) -> None:
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise InvalidArgumentError("n_samples", n_samples, "must be an integer >= 1")
        space = _grid(search_space)  # an unhashable value raised TypeError (review tl)
        try:  # a bad option would make every update raise: DP-HyPO would silently use the prior
            optuna.samplers.TPESampler(**tpe_options)
        except Exception as exc:
            raise InvalidArgumentError("tpe_options", tpe_options,
                                       f"are not accepted by optuna.samplers.TPESampler ({exc})"
                                       ) from None
        self.names = list(space.dimensions)
        self.candidates = space.candidates()
        self.index = {tuple(c.values()): i for i, c in enumerate(self.candidates)}
        self.distributions: dict[str, optuna.distributions.BaseDistribution] = {
            name: optuna.distributions.CategoricalDistribution(
            space._choice(name).values) for name in self.names}
        self.n_samples, self.tpe_options = n_samples, dict(tpe_options)

    def __call__(self, history: list, coords: Any) -> np.ndarray:
        # review fs; ±inf as before (Optuna completes such trials, and TPE takes them)
        history = check_history(history, len(self.candidates), finite=False)
        counts = np.zeros(len(self.candidates))
        with silenced():
            study = optuna.create_study(
                direction="maximize", sampler=optuna.samplers.TPESampler(**self.tpe_options))
            study.add_trials([optuna.trial.create_trial(
                params=self.candidates[i], distributions=self.distributions, value=float(v))
                for i, v in history])
            for _ in range(self.n_samples):
                trial = study.ask(self.distributions)
                counts[self.index[tuple(trial.params[n] for n in self.names)]] += 1
        return counts
