"""Private hyperparameter tuning in Optuna's own terms (``pip install 'privguard[optuna]'``).

    import optuna
    from privguard.integrations.optuna import private_optimize
    from privguard.tuning import Geometric

    def objective(trial, child_ledger):
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        ...                      # train with Opacus, attach(optimizer, child_ledger)
        return accuracy, model   # a (private) score, and optionally an artifact

    result = private_optimize(objective, ledger, runs=Geometric(mean=8), cost=per_trial,
                              direction="maximize")
    result.best_params, result.best_value, result.best_user_attrs, result.artifact

What a call does, in Optuna's vocabulary (docs/theory.md §17):

* **The number of trials is random and hidden.** K is drawn from ``runs``
  with OS entropy (``Poisson`` or ``TruncatedNegativeBinomial``, as for
  :class:`privguard.tuning.RandomSearch`), and the whole tuning bound is
  charged to ``ledger`` before the first trial: the random-K bound of seed
  002 (RandomSampler, computed by ``RandomSearch`` itself) or DP-HyPO's
  Theorem 1 (``DPHyPOSampler``, computed by ``DPHyPOSearch``). Each trial
  then runs under a strict child ledger of ``cost``.
* **Two samplers are covered.** ``RandomSampler`` (the default), with a
  fresh generator per trial seeded from a number drawn at the driver for
  that trial alone, so the trials are i.i.d.; and :class:`DPHyPOSampler`,
  adaptive through a density kept within [c, C] × the prior. Every other
  sampler (TPE, CMA-ES, GP, QMC, Grid, NSGA-II, ...) is refused before
  anything is charged.
* **The study never leaves.** The objective gets a restricted trial
  (``suggest_*``, ``set_user_attr``, ``report``, ``should_prune``; no
  ``study``, no ``number``); storages, ``n_trials``, ``timeout``,
  ``callbacks`` and pruners that read other trials are refused; Optuna's
  logger is silenced and every warning discarded for the duration, and
  ``ledger`` refuses every read and charge while the trials run, so a trial
  cannot charge it (on Ray, a file- or server-backed one in the objective is
  refused before the charge). The result is the winner's
  parameters, value, user attributes and artifact, or "no winner": not K,
  not how many trials failed or were pruned.
* **A trial that raises, returns NaN, overspends its child or is pruned is
  ⊥** (never selected, nothing about it released), exactly as in
  ``RandomSearch``. Use :func:`rehearse` first, on public or synthetic data:
  there, errors are re-raised and nothing is charged.

``backend="ray"`` runs the trials as :class:`privguard.integrations.ray.RayExecutor`
does; K and every trial's draw (its seed, or its DP-HyPO candidate) are
drawn at the driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import BudgetExhausted, InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._base import Mechanism
from privguard._optional import require
from privguard.integrations._optuna_sampler import DPHyPOSampler, TPERule, silenced
from privguard.integrations._optuna_trial import (
    SEED_KEY,
    PrivateTrial,
    TrialObjective,
    Winner,
    optuna_value,
)
from privguard.tuning._base import TuningPlan, accept, check_ledger, check_objective
from privguard.tuning._dp_hypo import DPHyPOSearch
from privguard.tuning._draw import draw_index
from privguard.tuning._executors import resolve
from privguard.tuning._random_search import RandomSearch
from privguard.tuning._space import IntUniform

try:
    import optuna
except ImportError:  # the install hint
    require("optuna", "optuna")
    raise

__all__ = ["DPHyPOSampler", "PrivateStudyResult", "PrivateTrial", "TPERule", "private_optimize",
           "rehearse", "tuning_plan"]

_COVERED = ("the covered samplers are optuna.samplers.RandomSampler (i.i.d. trials, random-K "
            "bound, seed 002) and privguard.integrations.optuna.DPHyPOSampler (bounded "
            "adaptive density, DP-HyPO Theorem 1, seed 003)")

#: study.optimize / create_study arguments that are refused, and why.
_REFUSED = {
    "n_trials": "the number of trials is drawn from runs= and kept hidden; a fixed count "
                "is composition, not private tuning",
    "timeout": "stopping on time makes the number of trials depend on the trials",
    "callbacks": "a callback receives the whole study (every trial's value)",
    "storage": "a storage persists every trial's value; the study lives in memory "
               "inside the call",
    "study": "the study lives in memory inside the call and is never returned",
    "study_name": "the study lives in memory inside the call and is never returned",
    "load_if_exists": "the study lives in memory inside the call and is never returned",
    "n_jobs": "use backend='ray' for parallel trials",
    "catch": "every exception of a trial is caught: the trial is ⊥",
    "gc_after_trial": "each trial's objects are dropped after it, except the current best's",
    "show_progress_bar": "use progress=True (it shows the elapsed time, never a count)",
    "directions": "one direction: multi-objective tuning is not covered",
}

_SEEDS = IntUniform(0, 2**32 - 1)  # one seed per trial for its own RandomSampler (MT19937)


@dataclasses.dataclass(frozen=True)
class PrivateStudyResult:
    """Everything :func:`private_optimize` releases: the best trial, or that there is none.

    Not released, on purpose: the number of trials K, how many failed or were
    pruned, their numbers, and anything about a trial that did not win
    (docs/theory.md §17).

    Attributes:
        selected: False when no trial produced a value (K = 0 under Poisson,
            or every trial was ⊥).
        best_params: the winner's suggested parameters (None if not selected).
        best_value: the winner's value (None if not selected).
        best_user_attrs: what the winner passed to ``set_user_attr``.
        artifact: what the winner's objective returned besides its value.
        cost: the mechanism charged to the ledger for the whole tuning.
        seeded: True if K and the draws came from a fixed seed (tests only).
    """

    selected: bool
    best_params: dict[str, Any] | None
    best_value: float | None
    best_user_attrs: dict[str, Any] | None
    artifact: Any
    cost: Mechanism
    seeded: bool

    def __repr__(self) -> str:
        if not self.selected:
            return "PrivateStudyResult(no trial selected)"
        return f"PrivateStudyResult(best_params={self.best_params}, best_value={self.best_value!r})"


# ------------------------------------------------------------------ checks
def _direction(direction: Any) -> str:
    """``"minimize"``/``"maximize"``, or Optuna's ``StudyDirection`` for them, as a mode."""
    given = optuna.study.StudyDirection
    if isinstance(direction, given) and direction != given.NOT_SET:  # as create_study takes
        direction = "maximize" if direction == given.MAXIMIZE else "minimize"
    if not isinstance(direction, str) or direction not in ("minimize", "maximize"):
        raise InvalidArgumentError("direction", direction, "must be 'minimize' or 'maximize'")
    return "max" if direction == "maximize" else "min"


def _sampler(sampler: Any) -> DPHyPOSampler | None:
    """None for the (per-trial re-seeded) RandomSampler, the DPHyPOSampler, or a refusal."""
    if sampler is None or type(sampler) is optuna.samplers.RandomSampler:
        return None
    if type(sampler) is DPHyPOSampler:
        return sampler
    name = type(sampler).__name__
    if isinstance(sampler, type):
        raise InvalidArgumentError("sampler", sampler.__name__,
                                   f"is a class: pass an instance; {_COVERED}")
    if isinstance(sampler, DPHyPOSampler):
        why = ("a subclass of DPHyPOSampler may change how the bound is computed or the "
               "candidates drawn, which Theorem 1 does not cover; pass a rule= instead")
    elif isinstance(sampler, optuna.samplers.QMCSampler):
        why = ("its points are a low-discrepancy sequence (deterministic unless scrambled), "
               "not independent draws")
    elif isinstance(sampler, optuna.samplers.GridSampler):
        why = ("it draws without replacement and stops the study when the grid is exhausted "
               "(truncating K); for i.i.d. draws with replacement from a grid use "
               "DPHyPOSampler(grid, C=1, c=1)")
    elif isinstance(sampler, optuna.samplers.RandomSampler):
        why = "a subclass of RandomSampler may adapt to earlier trials"
    elif isinstance(sampler, optuna.samplers.BaseSampler):
        why = "it adapts to earlier trials' values with no bound on its density"
    else:
        why = "it is not an Optuna sampler"
    raise InvalidArgumentError("sampler", name, f"is not covered: {why}; {_COVERED}")


def _pruner(pruner: Any) -> Any:
    """None, or a pruner that reads only the trial's own reported values."""
    if pruner is None or type(pruner) is optuna.pruners.NopPruner:
        return None
    if type(pruner) is optuna.pruners.ThresholdPruner:
        return pruner
    if isinstance(pruner, type):
        raise InvalidArgumentError("pruner", pruner.__name__,
                                   "is a class: pass an instance, e.g. ThresholdPruner(lower=0.0)")
    raise InvalidArgumentError(
        "pruner", type(pruner).__name__,
        "reads other trials' values (or is unknown), which makes the trials depend on each "
        "other; only ThresholdPruner (the trial's own values) or None is covered")


#: Optuna's own defaults for refused arguments that ask for nothing (no count, no time
#: limit, no callback, no storage, one process...): taken as given, as Optuna takes them
#: (review at: ``n_jobs=1`` or ``timeout=None`` ported from a study.optimize call was
#: refused). ``catch=()`` is not among them: Optuna then re-raises a trial's exception.
_NO_OP: dict[str, tuple[Any, ...]] = {
    "n_trials": (None,), "timeout": (None,), "callbacks": (None, [], ()), "storage": (None,),
    "study_name": (None,), "load_if_exists": (False,), "n_jobs": (1,),
    "gc_after_trial": (False,), "show_progress_bar": (False,), "directions": (None,),
}


def _is_no_op(name: str, value: Any) -> bool:
    return any(value is default or (type(value) is type(default) and value == default)
               for default in _NO_OP.get(name, ()))


def _refuse(kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if _is_no_op(name, value):
            continue
        why = _REFUSED.get(name, "is not an argument of private_optimize")
        raise InvalidArgumentError(name, value, f"refused: {why}")


def _tuner(sampler: DPHyPOSampler | None, runs: Any, cost: Any, mode: str, seed: int | None,
           progress: bool) -> RandomSearch | DPHyPOSearch:
    """The privguard tuner that charges and runs: RandomSearch over per-trial seeds, or
    DPHyPOSearch over the sampler's grid. Raises InvalidArgumentError before any charge."""
    if sampler is not None:
        return sampler._tuner(runs, cost, mode, seed, progress)
    if not isinstance(cost, Mechanism):
        raise InvalidArgumentError(
            "cost", cost, "must be one mechanism that bounds every trial (a per-trial cost "
            "function needs DPHyPOSampler's finite search_space)")
    return RandomSearch({SEED_KEY: _SEEDS}, runs, cost=cost, mode=mode, seed=seed,
                        progress=progress)


# ------------------------------------------------------------------ the two calls
def private_optimize(objective: Callable[[PrivateTrial, Ledger], Any], ledger: Ledger, *,
                     runs: Any = None, cost: Any = None, sampler: Any = None, direction: str = "minimize",
                     pruner: Any = None, backend: Any = None, label: str | None = "optuna tuning",
                     progress: bool = True, seed: int | None = None,
                     **refused: Any) -> PrivateStudyResult:
    """Optuna's ``study.optimize``, privately: charge the tuning bound, run K hidden trials,
    release the best one only.

    Args:
        objective: ``objective(trial, child_ledger)``: suggests with
            ``trial.suggest_*``, trains, charges its private work to
            ``child_ledger`` (e.g. ``privguard.integrations.opacus.attach``)
            and returns a value (also as Optuna's one-element ``[value]``),
            or ``(value, artifact)``. It must charge no
            other ledger, print nothing and keep nothing outside the call
            (each reveals losing trials and K; privguard cannot prevent it).
            Return a fresh artifact per trial: it is released by reference,
            and one shared between trials is released as the last trial
            left it. Its warnings are discarded.
        ledger: the privguard ledger the whole tuning bound is charged to.
            While the trials run it refuses every read and charge with
            ``LedgerStateError``: a trial that uses it is ⊥.
        runs: the law of the number of trials: ``Poisson(mean)`` or
            ``TruncatedNegativeBinomial`` (``Geometric``, ``Logarithmic``);
            DP-HyPO takes only the latter.
        cost: the privacy cost of ONE trial (training and scoring), a
            mechanism; with ``DPHyPOSampler`` also ``params -> mechanism``.
        sampler: ``None`` or ``optuna.samplers.RandomSampler()`` (each trial
            gets its own generator; the sampler's own is not used), or a
            :class:`DPHyPOSampler`. Anything else is refused.
        direction: ``"minimize"`` (Optuna's default) or ``"maximize"``, or
            Optuna's ``StudyDirection`` for either.
        pruner: ``None`` or ``optuna.pruners.ThresholdPruner`` (it reads the
            trial's own reports only). Report only values the trial
            privatised and charged to its child ledger.
        backend: ``"serial"`` (default), ``"ray"`` or a ``RayExecutor``.
        label: the ledger label of the charge.
        progress: show the elapsed time while running (never a count).
        seed: ONLY for tests: makes K and the draws predictable, which breaks
            the guarantee. Default: OS entropy.
        **refused: ``n_trials``, ``timeout``, ``callbacks``, ``storage``,
            ``n_jobs``, ``catch``... are refused, each with the reason; at
            Optuna's no-op defaults (``n_trials=None``, ``timeout=None``,
            ``n_jobs=1``, ``callbacks=None``, ``storage=None``, ...) they are taken.

    Returns:
        PrivateStudyResult: the winner's params, value, user attributes and
        artifact, or ``selected=False``.

    Raises:
        InvalidArgumentError: a bad or refused argument; raised before the charge.
        BudgetExhausted: the ledger refuses the tuning bound; nothing ran.
        KeyboardInterrupt: interrupted mid-run (a fresh one, carrying nothing
            of the run); the bound stays charged.
        TuningAborted: anything else escaped mid-run (cause withheld).

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> from privguard.tuning import Poisson
        >>> ledger = Ledger(epsilon=5.0, delta=1e-5)
        >>> def objective(trial, child):
        ...     x = trial.suggest_float("x", -1.0, 1.0)
        ...     child.charge(M.Gaussian(10.0))       # the trial's private work
        ...     return x ** 2
        >>> result = private_optimize(objective, ledger, runs=Poisson(4.0),
        ...                           cost=M.Gaussian(10.0), progress=False)
        >>> len(ledger.history), sorted(vars(result))
        (1, ['artifact', 'best_params', 'best_user_attrs', 'best_value', 'cost', 'seeded', 'selected'])
    """
    _refuse(refused)
    check_objective(objective, call=("trial", "child_ledger"))
    check_ledger(ledger)
    mode = _direction(direction)
    dp_hypo = _sampler(sampler)
    own_pruner = _pruner(pruner)
    progress = check.flag("progress", progress)
    tuner = _tuner(dp_hypo, runs, cost, mode, seed, progress)
    executor = resolve(backend)
    ship = getattr(executor, "_ship_by_value", None)
    if callable(ship):  # the user's module, for Ray workers that cannot import it
        ship(objective)
    trials = TrialObjective(objective, fixed=dp_hypo is not None, pruner=own_pruner)
    with silenced():  # tuner.run holds ledger while the trials run (tuning._base.held)
        out = tuner.run(trials, ledger, label=label, backend=executor)
    winner = out.artifact
    if not out.selected or not isinstance(winner, Winner):
        return PrivateStudyResult(False, None, None, None, None, out.cost, out.seeded)
    return PrivateStudyResult(True, winner.params, out.score, winner.user_attrs, winner.artifact,
                              out.cost, out.seeded)


def tuning_plan(*, runs: Any = None, cost: Any = None, delta: Any = None, sampler: Any = None,
                orders: Any = None) -> TuningPlan:
    """What :func:`private_optimize` will charge, before anything runs.

    The same bound the call charges (random-K for ``RandomSampler``,
    Theorem 1 for :class:`DPHyPOSampler`) as a curve and an (ε, δ), with
    the ε of composing ⌈E[K]⌉ trials naively for comparison.

    Raises:
        InvalidArgumentError: a bad or uncovered argument (as private_optimize).

    Example:
        >>> from privguard import mechanisms as M
        >>> from privguard.tuning import Geometric
        >>> plan = tuning_plan(runs=Geometric(mean=8.0), cost=M.Gaussian(20.0), delta=1e-5)
        >>> plan.epsilon < plan.naive_epsilon
        True
    """
    dp_hypo = _sampler(sampler)
    return _tuner(dp_hypo, runs, cost, "max", None, False).plan(delta, orders)


def rehearse(objective: Callable[[PrivateTrial, Ledger], Any], *, cost: Any = None,
             sampler: Any = None, pruner: Any = None,
             orders: Any = None) -> PrivateStudyResult:
    """Run ONE trial end to end, charging nothing, and re-raise whatever goes wrong.

    Call it with an objective bound to public or synthetic data before the
    real run: in :func:`private_optimize` a trial that raises (a typo, a
    child ledger refusing a charge because ``cost`` cannot cover the
    training) is ⊥ and its error is never shown. Here the trial runs under a
    throwaway strict ledger of ``cost`` (as a child would), its parameters
    drawn as the real run draws them (DP-HyPO: from the prior), and an
    exception, a pruned trial or a value that is not a finite number is
    raised. No ledger of yours is involved.

    Args:
        objective, cost, sampler, pruner: as for :func:`private_optimize`.
        orders: the order grid of the throwaway ledger (default: privguard's).

    Returns:
        PrivateStudyResult: the trial's params, value, user attributes and
        artifact (``cost`` is the per-trial cost, ``seeded`` False).

    Raises:
        InvalidArgumentError: a bad argument, or a value that is not a finite number.
        Exception: whatever the objective raised (``optuna.TrialPruned`` included),
            except a refusal of the trial's child ledger, which is an
            InvalidArgumentError naming ``cost`` and the remedy (the refusal
            is its ``__cause__``).

    Example:
        >>> from privguard import mechanisms as M
        >>> def objective(trial, child):
        ...     child.charge(M.Gaussian(10.0))
        ...     child.charge(M.Gaussian(10.0))       # one step more than declared
        ...     return trial.suggest_float("x", 0.0, 1.0)
        >>> rehearse(objective, cost=M.Gaussian(10.0))
        Traceback (most recent call last):
        ...
        privguard._errors.InvalidArgumentError: cost=... does not cover one trial: ...
    """
    check_objective(objective, call=("trial", "child_ledger"))
    dp_hypo = _sampler(sampler)
    own_pruner = _pruner(pruner)
    tuner = _tuner(dp_hypo, _rehearsal_runs(dp_hypo), cost, "max", None, False)
    grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
    rng = np.random.default_rng()
    index = 0
    if dp_hypo is None:
        params: dict[str, Any] = {SEED_KEY: _SEEDS.sample(rng)}
    else:
        pi = dp_hypo.density([])
        index = draw_index(rng, pi)  # exactly π/Σπ (task ul)
        params = dict(dp_hypo.candidates[index])
    mech = tuner.costs.single or tuner.costs.per_candidate[index]
    budgets = tuner.costs.budgets(grid)
    budget = budgets[0] if len(budgets) == 1 else budgets[index]
    child = Ledger(orders=grid, rdp_budget=budget)
    trial = PrivateTrial(params, fixed=dp_hypo is not None, pruner=own_pruner)
    try:
        value = objective(trial, child)
    except BudgetExhausted as exc:
        if child.can_afford(exc.requested):  # another ledger refused: not ours to explain
            raise
        what = f"the charge {exc.label!r}" if exc.label else "a charge"
        raise InvalidArgumentError(
            "cost", cost,
            f"does not cover one trial: the trial's child ledger (a strict ledger of cost) "
            f"refused {what} of {type(exc.requested).__name__}; declare "
            "everything one trial charges (its whole training, e.g. SubsampledGaussian(sigma, "
            "q, steps=epochs * len(loader)), composed with its scoring) and rehearse "
            "again") from exc
    outcome = accept(optuna_value(value))
    if outcome is None:
        raise InvalidArgumentError("objective", value,
                                   "returned no finite value: in a real run this trial is ⊥")
    return PrivateStudyResult(True, dict(trial._params), outcome[0], dict(trial._user_attrs),
                              outcome[1], mech, False)


def _rehearsal_runs(dp_hypo: DPHyPOSampler | None) -> Any:
    """A placeholder law for building the tuner that checks ``cost`` (nothing is drawn)."""
    from privguard.tuning import Geometric, Poisson

    return Poisson(1.0) if dp_hypo is None else Geometric(mean=2.0)
