"""DP-HyPO: adaptive hyperparameter search with bounded sampling densities (seed 003).

Framework 1: draw T ~ D_{θ,γ}; for each run, sample a candidate from the
current density, run it, and update the density from the history by ANY rule,
privatised by projecting onto S_{C,c} = {c·π⁽⁰⁾ ≤ f ≤ C·π⁽⁰⁾, Σ f = 1}
(:func:`project_density`); release the best run. The cost is
``privguard.mechanisms.DPHyPO`` (Theorem 1), charged before anything runs.
The densities, the history and the surrogate model live only inside
``run``; a run releases the best run's (hyperparameters, score, artifact) or
that there is none — not T, not failures (see :class:`TuningResult`).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._curve import RDPCurve
from privguard._mechanisms._repeat_select import DPHyPO
from privguard._mechanisms._runs import TruncatedNegativeBinomial
from privguard._optional import require
from privguard.tuning._base import (
    Best,
    CandidateCosts,
    Tuner,
    TuningResult,
    check_mode,
    check_seed,
    is_outcome,
    make_rng,
)
from privguard.tuning._charged_run import charged_run
from privguard.tuning._draw import draw_index
from privguard.tuning._projection import project_density
from privguard.tuning._rehearse import RehearseOne
from privguard.tuning._space import Choice, SearchSpace

History = list  # of (candidate index, score), in the order run


def _ranks(values: tuple) -> list[float]:
    """Each value's rank among ``values``, scaled to [0, 1]; values that cannot be
    ordered keep the order they were given in."""
    n = len(values)
    try:
        order = sorted(range(n), key=lambda i: (str(type(values[i])), values[i]))
    except TypeError:
        order = list(range(n))
    rank = [0.0] * n
    for r, i in enumerate(order):
        rank[i] = r / max(n - 1, 1)
    return rank


def ordinal_coordinates(space: SearchSpace) -> np.ndarray:
    """Each candidate's hyperparameters as ranks in [0, 1] (n × d), in ``candidates()`` order."""
    grids = [_ranks(dim.values) for dim in space.dimensions.values()
             if isinstance(dim, Choice)]  # a finite space: every dimension is a Choice
    return np.array(list(itertools.product(*grids)), dtype=float).reshape(-1, len(grids))


def check_history(history: Any, candidates: int, *, finite: bool = True) -> History:
    """``history`` as a list of (candidate index, score) pairs, each index in
    [0, ``candidates``) and each score a real number, finite or (``finite=False``) ±inf,
    never NaN; or InvalidArgumentError naming it (review fs: a malformed one raised
    whichever built-in the rule met first, and index −1 read the last candidate).

    ``finite=False`` is what :func:`bounded_density` and the Optuna ``TPERule`` take:
    an Optuna study completes a trial whose value is ±inf, and ``DPHyPOSampler`` hands its
    rule such a history, as before review fs (refusing it sent every later trial to the
    prior, silently: review radv). :class:`GPUpdate` needs finite scores."""
    if isinstance(history, (str, bytes)) or not isinstance(history, (list, tuple)):
        raise InvalidArgumentError("history", check.short(history),
                                   "must be a list of (candidate index, score) pairs")
    out: History = []
    for i, pair in enumerate(history):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InvalidArgumentError("history", check.short(history),
                                       f"item {i} is not an (index, score) pair")
        index, score = pair
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not (
                0 <= index < candidates):
            raise InvalidArgumentError("history", check.short(history),
                                       f"item {i}'s index {check.short(index)!r} is not an "
                                       f"integer in [0, {candidates})")
        value = check._real(score)
        if value is None or np.isnan(value) or (finite and not np.isfinite(value)):
            raise InvalidArgumentError("history", check.short(history),
                                       f"item {i}'s score {check.short(score)!r} is not a "
                                       f"{'finite ' if finite else ''}real number"
                                       f"{'' if finite else ' (±inf allowed, not NaN)'}")
        out.append((int(index), value))
    return out


def bounded_density(update: Callable[[History, np.ndarray], np.ndarray], coords: np.ndarray,
                    prior: np.ndarray, C: float, c: float, history: History) -> np.ndarray:
    """The rule's density after ``history``, projected onto S_{C,c}(prior) (seed 003 eq. 3.1).

    The prior (projected) for an empty history. Shared by :class:`DPHyPOSearch`
    and :class:`privguard.integrations.optuna.DPHyPOSampler`.

    Raises:
        InvalidArgumentError: the rule's output is not one finite weight per candidate.
    """
    history = check_history(history, len(prior), finite=False)  # the rule decides on ±inf
    if not history:
        return project_density(prior, prior, C, c)
    raw = np.asarray(update(history, coords), float)
    if raw.shape != prior.shape or not np.all(np.isfinite(raw)):
        raise InvalidArgumentError("update(...)", raw,
                                   "must return one finite weight per candidate")
    with np.errstate(over="ignore"):  # weights near the float range: their sum is inf, p = 0
        total = raw.sum()
        p = raw / total if total > 0 else prior
    return project_density(p, prior, C, c)


class GPUpdate:
    """Algorithm 3's update: a Gaussian process on past (λ, q), UCB s = μ + τσ,
    π ∝ exp(β·s). scikit-learn's GaussianProcessRegressor, fixed kernel (RBF +
    white noise on the candidates' ordinal coordinates); paper defaults τ = 0.1, β = 1."""

    def __init__(self, tau: float = 0.1, beta: float = 1.0, length_scale: float = 0.25,
                 noise: float = 0.01) -> None:
        self.tau = check.non_negative_finite("tau", tau)
        self.beta = check.non_negative_finite("beta", beta)
        self.length_scale = check.positive_finite("length_scale", length_scale)
        self.noise = check.positive_finite("noise", noise)

    def __call__(self, history: History, coords: np.ndarray) -> np.ndarray:
        gaussian_process = require("sklearn.gaussian_process", "gp")
        GaussianProcessRegressor = gaussian_process.GaussianProcessRegressor
        RBF, WhiteKernel = gaussian_process.kernels.RBF, gaussian_process.kernels.WhiteKernel
        if not (isinstance(coords, np.ndarray) and coords.ndim == 2 and coords.shape[0] > 0):
            raise InvalidArgumentError("coords", check.short(coords),
                                       "must be a 2-D array, one row per candidate")
        history = check_history(history, coords.shape[0])
        if not history:  # a GP needs a point (density() gives the prior for none)
            raise InvalidArgumentError("history", history, "must hold at least one pair")
        idx = np.array([i for i, _ in history])
        y = np.array([s for _, s in history], dtype=float)
        kernel = RBF(self.length_scale, "fixed") + WhiteKernel(self.noise, "fixed")
        gp = GaussianProcessRegressor(kernel, optimizer=None, normalize_y=len(y) > 1)
        gp.fit(coords[idx], y)
        mu, sd = gp.predict(coords, return_std=True)
        score = self.beta * (mu + self.tau * sd)
        w = np.exp(score - score.max())
        return w / w.sum()


class DPHyPOSearch(RehearseOne, Tuner):
    """Adaptive random search with densities kept within [c, C] × the prior.

    A run releases the best run's hyperparameters, score and artifact, or
    that there is none, and nothing else (not T, not failures; see
    :class:`TuningResult`).

    Args:
        space: a finite :class:`SearchSpace` or ``{name: values}`` mapping.
        runs: T ~ ``TruncatedNegativeBinomial`` (only this family is covered
            by seed 003's theorem; Poisson is refused).
        cost: the privacy cost of one run (mechanism, or ``params -> mechanism``).
        C, c: density bounds, c ≤ 1 ≤ C (paper defaults 2 and 0.75).
        update: ``"gp"`` (Algorithm 3, :class:`GPUpdate`) or any
            ``(history, coords) -> density`` over the candidates, where history
            is a list of (candidate index, score) of the runs that were not ⊥
            (the score negated under ``mode="min"``, so larger is always better);
            its output is projected. If the rule raises, or returns anything
            but one finite weight per candidate, that step samples from the
            prior π⁽⁰⁾ (which lies in S_{C,c}): the rule with this fallback
            is itself an update rule, and Theorem 1 holds for any rule. The
            rule is tried once, on the history [(0, 0.0)], before anything
            is charged.
        prior: π⁽⁰⁾ over the candidates (default uniform; App. D), normalised
            to sum to 1.
        mode: ``"max"`` (default) or ``"min"``.
        seed: ONLY for tests (breaks the guarantee).
        progress: show the elapsed time while running (never a count or a score).

    Raises:
        InvalidArgumentError: any argument out of its domain.

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> from privguard.tuning import DPHyPOSearch, Geometric
        >>> tuner = DPHyPOSearch({"lr": [0.1, 0.3, 1.0]}, Geometric(mean=4.0),
        ...                      cost=M.Gaussian(10.0), progress=False)
        >>> result = tuner.run(lambda p, child: -abs(p["lr"] - 0.3), Ledger(8.0, 1e-5))
        >>> result.params["lr"] in (0.1, 0.3, 1.0)
        True
    """

    def __init__(self, space: SearchSpace | Mapping[str, Any], runs: TruncatedNegativeBinomial, *,
                 cost, C: float = 2.0, c: float = 0.75,
                 update: str | Callable[[History, np.ndarray], np.ndarray] = "gp",
                 prior=None, mode: str = "max", seed: int | None = None,
                 progress: bool = True) -> None:
        if not isinstance(runs, TruncatedNegativeBinomial):
            raise InvalidArgumentError(
                "runs", runs, "DP-HyPO's theorem covers truncated negative binomial T only; "
                "Poisson is not offered for the adaptive case (docs/theory.md §9)")
        space = space if isinstance(space, SearchSpace) else SearchSpace(space)
        if not space.is_finite:
            raise InvalidArgumentError("space", space, "DP-HyPO works on a finite grid of candidates")
        self.space, self.runs = space, runs
        self.mode = check_mode(mode)
        self.seed = check_seed(seed)
        self.progress = check.flag("progress", progress)
        big, small = check._as_float("C", C), check._as_float("c", c)
        DPHyPO(RDPCurve([2.0], [0.0]), runs, big, small)  # validates c <= 1 <= C
        self.C, self.c = big, small
        self.costs = CandidateCosts(cost, space)
        self.cost_of = cost
        self.candidates = space.candidates()
        self.coords = ordinal_coordinates(space)
        n = len(self.candidates)
        if prior is None:
            self.prior = np.full(n, 1.0 / n)
        else:
            try:
                p = np.array(prior, dtype=float)
            except (TypeError, ValueError, OverflowError):  # OverflowError: an int past floats
                p = np.full(1, np.nan)
            if (p.shape != (n,) or not np.all(np.isfinite(p)) or np.any(p < 0)
                    or not np.isclose(p.sum(), 1.0)):
                raise InvalidArgumentError("prior", prior,
                                           f"must be {n} non-negative weights summing to 1")
            # normalised: np.isclose let the sum be 1 ± 1e-5, and the bounds c·prior and
            # C·prior of the raw vector then held only to 1e-5 against the law the run
            # samples (every density normalised, the fallback too): 0.749993·π⁽⁰⁾ (review rtl)
            self.prior = p / p.sum()
        if isinstance(update, str) and update == "gp":
            require("sklearn.gaussian_process", "gp")  # before anything is charged
            update = GPUpdate()
        if isinstance(update, str) or not callable(update):
            raise InvalidArgumentError("update", update, "must be 'gp' or callable(history, coords)")
        self.update = update

    def _per_candidate_curve(self, orders: np.ndarray) -> np.ndarray:
        return self.costs.bound(orders)

    def _expected_runs(self) -> float:
        return self.runs.mean

    def cost(self, orders=None) -> DPHyPO:
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        return DPHyPO(RDPCurve._trusted(grid, self._per_candidate_curve(grid)), self.runs,
                      self.C, self.c)

    def density(self, history: History) -> np.ndarray:
        """The projected sampling density after ``history`` (public for inspection).

        Raises:
            InvalidArgumentError: the update rule's output is not one finite
                weight per candidate.
        """
        return bounded_density(self.update, self.coords, self.prior, self.C, self.c, history)

    def _density_or_prior(self, history: History) -> np.ndarray:
        """:meth:`density`, or the prior when the rule fails (inside a run: nothing is raised)."""
        try:
            with warnings.catch_warnings():  # a warning would be a data-dependent output
                warnings.simplefilter("ignore")
                return self.density(history)
        except KeyboardInterrupt:
            raise  # the user's interrupt
        except BaseException:  # by design: the fallback is part of the update rule
            return self.prior

    def run(self, objective: Callable[[dict, Ledger], Any], ledger: Ledger, *,
            label: str | None = "DP-HyPO tuning", backend: Any = None) -> TuningResult:
        """Charge Theorem 1's bound, run T adaptively sampled candidates, release the winner.

        Rehearse first (:meth:`rehearse`): a run hides every failed candidate.

        The adaptive part (densities, sampling) stays here at the driver;
        each training run goes to ``backend`` ("serial", "ray" or an
        executor). Candidates that raise or score NaN/±inf/non-numbers are ⊥,
        as in :meth:`RandomSearch.run`, and do not enter the history.

        Raises:
            InvalidArgumentError: a bad argument or an update rule that fails
                on a one-run history; raised before the charge.
            BudgetExhausted: the ledger refuses the bound; nothing ran.
            KeyboardInterrupt: interrupted mid-run (a fresh one, carrying
                nothing of the run); the bound stays charged.
            TuningAborted: anything else escaped mid-run (cause withheld).
        """
        return charged_run(self, objective, ledger, label, backend, "DP-HyPO tuning",
                           before=self._check_update_rule)

    def _check_update_rule(self) -> None:
        """The rule must work on a data-independent history, before anything is charged."""
        try:
            self.density([(0, 0.0)])
        except Exception as exc:
            raise InvalidArgumentError(
                "update", self.update,
                f"fails on the one-run history [(0, 0.0)] ({type(exc).__name__})") from None

    def _search(self, objective: Callable, grid: np.ndarray, budgets: list[np.ndarray],
                executor: Any, mech: DPHyPO) -> TuningResult:
        """Everything after the charge. T, the history and the best live only in this frame."""
        rng = make_rng(self.seed)
        t = self.runs.sample(rng)
        history: History = []
        best = Best(self.mode)
        for step in range(t):
            pi = self._density_or_prior(history)
            i = draw_index(rng, pi)  # exactly π/Σπ (task ul)
            budget = budgets[0] if len(budgets) == 1 else budgets[i]

            def reduce(_: int, params: dict, outcome: Any, step: int = step, i: int = i) -> None:
                if is_outcome(outcome):  # ⊥ neither enters the history nor wins
                    # the rule maximises: under mode "min" it sees the negated score
                    history.append((i, outcome[0] if self.mode == "max" else -outcome[0]))
                    best.offer(step, params, outcome)

            executor.run([(objective, self.candidates[i], grid, budget)], reduce)
        return best.result(mech, self.seed is not None)
