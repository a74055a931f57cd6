"""The tuner protocol shared by every tuner, and what a tuning run releases.

A tuner has a search space, a per-candidate privacy cost, and
``run(objective, ledger)``, which

1. checks every argument, computes every candidate's declared curve and the
   tuning bound, and prepares the backend — anything wrong raises here,
   before the charge;
2. charges the whole tuning bound to ``ledger`` (a refused charge raises
   :class:`privguard.BudgetExhausted` and nothing runs);
3. runs the candidates, each under a child ledger that strictly enforces the
   per-candidate curve the bound assumed (refuse if any order would exceed),
   while ``ledger`` itself refuses every read and charge (:func:`held`);
4. releases the winner and nothing else.

What is released. The tuning theorems (seed 002 Theorems 2 and 6, seed 003
Theorem 1) bound the privacy loss of the BEST of K runs, K drawn at random
and kept hidden. A :class:`TuningResult` therefore holds the winner — its
hyperparameters, score and artifact — or "no winner", and nothing else: not
K, not how many candidates failed, not any other candidate's score. K is
independent of the data, but releasing it with the winner is NOT covered:
given K the winner is a best-of-K with K fixed, which is no better than
composing K runs (seed 002 §3.2, App. D.1). In
``tests/test_tuning_release.py::test_released_output_meets_the_charged_bound_exactly``
each candidate is a 0.1-DP randomized response under K ~ Geometric(mean 50);
at the charged ε = 0.313 the released winner has hockey-stick δ = 0, while
(winner, K) would have δ = 4.9e-4 and the former (runs, failed) 0.149, both
far above the ledger's δ = 1e-5.

Failures. A candidate that raises anything but ``KeyboardInterrupt`` (a
diverged loss, its child ledger refusing a charge, a dead Ray worker,
``SystemExit``), or returns NaN, ±inf or
something that is not a real number, is ⊥: the lowest element of the order
on outputs, never selected. ⊥ is an output of the candidate, which the bound
covers; the run goes on, and nothing about it — exception, message,
hyperparameters, count — is logged, shown or returned. (Ending the run on a
candidate's exception would release whether SOME candidate raised, which the
best-of-K theorems do not cover.) A ``KeyboardInterrupt`` is taken to be the
user's and ends the run (below); an objective that raises one on purpose,
like one that prints its data, is outside what a tuner can seal. Only the current best
outcome is kept in memory while the run goes on.

Interruptions. Once the bound is charged, the run's state (the current best,
K, the draws) lives only in frames that are dropped before anything leaves
``run``: a ``KeyboardInterrupt`` is re-raised as a fresh
``KeyboardInterrupt()``, and any other exception that escapes the search
(an error of the tuner's machinery or of a custom executor, never a
candidate's) as :class:`TuningAborted`; either is raised outside the
original handler, with no cause, no context and no frame holding a
candidate's data. The charged bound stays charged.

The number of runs and all tuner randomness come from OS entropy unless a
seed is given; a seed makes K predictable, which breaks the guarantee, and is
for tests only.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import dataclasses
import inspect
import logging
import math
import numbers
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from privguard import _validation as check
from privguard._accounting._results import exact, upper
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError, PrivguardError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._base import Mechanism
from privguard._mechanisms._curve import RDPCurve
from privguard.tuning._quiet import inside_candidate

log = logging.getLogger("privguard.tuning")

#: Child ledgers enforce the declared curve × (1 + SLACK) so that a candidate
#: spending exactly what it declared is never refused by floating-point
#: rounding; tuning bounds are computed from the same inflated curve, so the
#: guarantee covers everything a child can admit.
SLACK = 1e-9

T = TypeVar("T")


class TuningAborted(PrivguardError):
    """A tuning run stopped after its bound was charged; the charge stands.

    Raised when something other than a candidate failed mid-run (the
    executor's infrastructure or the tuner's own machinery; never a candidate).
    The original exception is withheld on purpose: it and its traceback may
    carry candidates' scores, artifacts or hyperparameters. Nothing about
    the candidates is released; to debug an objective, call it directly,
    outside the tuner.

    Example:
        >>> from privguard import PrivguardError
        >>> from privguard.tuning import TuningAborted
        >>> err = TuningAborted()
        >>> isinstance(err, PrivguardError), err.__cause__ is None
        (True, True)
    """

    def __init__(self) -> None:
        super().__init__(
            "the tuning run was aborted after its bound was charged (the charge stands); "
            "the cause is withheld because it may carry candidates' data")


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """The tuning bound before running: as a mechanism, a curve and an (ε, δ).

    With ``with_final`` (:class:`privguard.tuning.SubsetSearch`) the bound is the whole plan,
    the tuning on the subset and the final training, and ``naive_epsilon`` composes the
    final training too: the two numbers printed side by side cover the same work (task
    adv9: the whole plan was printed as a "tuning bound", beside a naive ε of the tuning
    runs alone).
    """

    mechanism: Mechanism
    orders: np.ndarray
    curve: np.ndarray
    epsilon: float
    delta: float
    expected_runs: float
    naive_epsilon: float
    """ε of composing ⌈E[K]⌉ runs (and, ``with_final``, the final training) non-adaptively,
    for comparison only."""
    with_final: bool = False
    """Whether the bound includes the final training (a subset-tuning plan)."""

    def __str__(self) -> str:
        # the bound rounded up, so the printed number is still a bound (review cli), at its δ
        # unrounded and the comparison rounded up too (review rlo2)
        what, also = ("tuning and final training", " and the final training") \
            if self.with_final else ("tuning", "")
        return (f"{what} bound: ε = {upper(self.epsilon, '.4f')} at δ = {exact(self.delta)} "
                f"(E[runs] = {self.expected_runs:.2f}; naive composition of "
                f"{math.ceil(self.expected_runs)} runs{also}: "
                f"ε = {upper(self.naive_epsilon, '.4f')}, rounded up)")


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """Everything a tuning run releases: the winner, or that there is none.

    Not released, on purpose: the number of runs K (with the winner it is
    not covered by the theorems, see :mod:`privguard.tuning._base`), how many
    candidates failed, and anything about a candidate that was not selected.

    Attributes:
        selected: False when no candidate produced a result (K = 0 under
            Poisson, or every candidate was ⊥).
        params: the winner's hyperparameters (None if not selected).
        score: the winner's score (None if not selected).
        artifact: what the winner's objective returned besides its score.
        cost: the mechanism charged to the ledger for the whole tuning
            (fixed before anything ran).
        seeded: True if K and the draws came from a fixed seed (tests only).
    """

    selected: bool
    params: dict[str, Any] | None
    score: float | None
    artifact: Any
    cost: Mechanism
    seeded: bool

    def __repr__(self) -> str:
        if not self.selected:
            return "TuningResult(no candidate selected)"
        return f"TuningResult(params={self.params}, score={self.score!r})"


# --------------------------------------------------------------- outcomes
def as_score(value: Any) -> float | None:
    """A finite real score as a float, or None (⊥) for anything else.

    NaN, ±inf, bools (numpy's too), strings, None and objects without
    ``__float__`` are ⊥; so is anything whose ``float()`` raises.
    """
    if isinstance(value, (bool, np.bool_, str, bytes)) or not (
            isinstance(value, numbers.Real) or hasattr(type(value), "__float__")):
        return None
    try:
        score = float(value)
    except Exception:
        return None
    return score if math.isfinite(score) else None


def accept(result: Any) -> tuple[float, Any] | None:
    """An objective's return value as (score, artifact), or None (⊥).

    Accepted forms: a score, ``(score, artifact)`` or
    ``{"score": ..., "artifact": ...}``.
    """
    if isinstance(result, dict):
        score, artifact = (result.get("score"), result.get("artifact")) if "score" in result \
            else (None, None)
    elif isinstance(result, tuple) and len(result) == 2:
        score, artifact = result
    else:
        score, artifact = result, None
    value = as_score(score)
    return None if value is None else (value, artifact)


def is_outcome(outcome: Any) -> bool:
    """True for a (finite float score, artifact) pair; False for ⊥ (None) or anything else."""
    return (isinstance(outcome, tuple) and len(outcome) == 2
            and isinstance(outcome[0], float) and math.isfinite(outcome[0]))


class Best:
    """The running winner: the only outcome a tuner keeps.

    Outputs are totally ordered by (score, draw index): a better score wins,
    and among equal scores the earlier draw wins, whatever order the backend
    finished them in. ⊥ (``None``) is below everything.
    """

    __slots__ = ("artifact", "index", "mode", "params", "score")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.score: float | None = None
        self.index = -1
        self.params: dict | None = None
        self.artifact: Any = None

    def offer(self, index: int, params: dict, outcome: Any) -> bool:
        """Keep ``outcome`` if it beats the current best; True if it was kept."""
        if not is_outcome(outcome):
            return False  # ⊥
        score = outcome[0]
        if self.score is not None:
            better = score > self.score if self.mode == "max" else score < self.score
            if not (better or (score == self.score and index < self.index)):
                return False
        self.score, self.index, self.params, self.artifact = score, index, params, outcome[1]
        return True

    def result(self, cost: Mechanism, seeded: bool) -> TuningResult:
        if self.score is None:
            return TuningResult(False, None, None, None, cost, seeded)
        # a copy of the drawn values, not the space's own objects (see :func:`own_copy`)
        return TuningResult(True, own_copy(self.params or {}), self.score, self.artifact, cost,
                            seeded)


def sealed(search: Callable[[], T]) -> T:
    """Run the part of a tuning run that follows the charge; nothing escapes but its result.

    A ``KeyboardInterrupt`` becomes a fresh ``KeyboardInterrupt()``; any
    other exception (``BaseException`` included) becomes :class:`TuningAborted`.
    Either is raised after the handler has ended, so the original exception,
    its traceback and every frame of ``search`` (which hold the current best
    and K) are gone: the new exception has no cause, no context, and its
    traceback starts here.
    """
    failure: type[BaseException] = TuningAborted
    try:
        return search()
    except KeyboardInterrupt:
        failure = KeyboardInterrupt
    except BaseException:  # by design: every escape is replaced
        pass
    raise failure() from None


#: Why a ledger refuses everything while a tuner's candidates run (:func:`held`).
HELD = ("held by a privguard tuner while its candidates run, in every thread: a candidate "
        "charges its child ledger only (a charge here per candidate would count the hidden "
        "number of runs, and a candidate may start threads, so no thread is exempt). Another "
        "thread reads or charges this ledger once tuner.run(...) has returned (wait for it), "
        "or charges a separate Ledger, with its own budget, meanwhile")


@contextlib.contextmanager
def held(ledger: Ledger) -> Iterator[None]:
    """The ledger refuses every read and charge for the duration (after the tuning charge).

    A candidate that charged the ledger it captured in a closure added one journal entry
    per candidate, and the journal counted K (review at: only the Optuna integration held
    it). Held, such a candidate raises ``LedgerStateError`` and is ⊥. A ledger already
    held or broken is left as it is. On Ray an in-memory ledger is a copy in the worker,
    and one backed by a file or server is refused before the charge
    (:mod:`privguard.integrations.ray`).
    """
    holding = ledger._hold(HELD)
    try:
        yield
    finally:
        if holding:
            ledger._unhold()


class Elapsed:
    """A progress indicator that shows the elapsed time and nothing else.

    It never shows a count: the number of runs is not released. On a terminal
    it redraws once a second on a timer, elsewhere it writes one line when the
    run ends, none when it raised (:mod:`privguard._progress`); never per candidate, so what it
    writes does not depend on K or on any outcome (only on the run's duration).
    """

    def __init__(self, label: str, enabled: bool) -> None:
        self.label, self.enabled = label, enabled
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Elapsed:
        if self.enabled and not inside_candidate():  # a nested tuner's bar would count K
            from privguard._progress import Lines, progress

            # not a terminal: one line when the run ends, no carriage returns (task rd)
            self._bar = progress(self.label, bar_format="{desc}: running for {elapsed}",
                                 leave=False, elapsed_only=True)
            if not isinstance(self._bar, Lines):
                self._thread = threading.Thread(target=self._tick, daemon=True)
                self._thread.start()
        return self

    def show_budget(self, ledger: Any) -> None:
        """Show the ledger's budget meter after the up-front charge (data-independent:
        the charge is the tuning bound, fixed before any candidate runs)."""
        meter = ledger.budget()
        if self._bar is not None and meter is not None:
            self._bar.set_description_str(f"{self.label} ({meter})")

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._bar.refresh()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is None:
            return
        if exc and exc[0] is not None and hasattr(self._bar, "discard"):
            # off a terminal: no "ran for" line for a run that raised (its up-front charge
            # refused, say: it never ran); a terminal's bar (leave=False) vanishes alike
            self._bar.discard()
        else:
            self._bar.close()


# ------------------------------------------------------------- arguments
def make_rng(seed: int | None) -> np.random.Generator:
    """A generator from OS entropy, or (tests only) from ``seed``."""
    return np.random.default_rng() if seed is None else np.random.default_rng(seed)


def check_seed(seed: Any) -> int | None:
    """None (OS entropy) or an integer >= 0 (tests only)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise InvalidArgumentError("seed", seed, "must be None (OS entropy) or an integer >= 0")
    return int(seed)


def check_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode not in ("max", "min"):
        raise InvalidArgumentError("mode", mode, "must be 'max' or 'min'")
    return mode


def check_objective(objective: Any, name: str = "objective",
                    call: tuple[str, ...] | None = None) -> Callable:
    """``objective``, callable and (when ``call`` names its arguments) able to take them.

    A tuner calls the objective with ``len(call)`` positional arguments, each call
    inside a candidate, where a ``TypeError`` is ⊥ like any failure: an objective of
    the wrong shape (Optuna's one-argument ``objective(trial)``) made every candidate
    ⊥ and spent the whole bound for "no winner" (review at). Its signature is
    checked here, before anything is charged; one Python cannot inspect passes.
    """
    if not callable(objective):
        raise InvalidArgumentError(name, objective, "must be callable")
    if call is not None:
        try:
            signature = inspect.signature(objective)
        except (TypeError, ValueError):  # a builtin or an extension type: not inspectable
            return objective
        try:
            signature.bind(*call)
        except TypeError:
            raise InvalidArgumentError(
                name, objective, f"must accept {len(call)} positional arguments "
                f"({', '.join(call)}); its signature is {signature}") from None
    return objective


def own_copy(params: dict) -> dict:
    """A deep copy of a candidate's hyperparameters: what a candidate gets, and what is released.

    A shallow ``dict(params)`` shared the values' objects with the search space: a
    candidate that edited a list value in place (``params["hidden"].append(...)``) or
    trained a model given as a value edited it for every later candidate that drew the
    same value, and the released winner's params showed every edit, so the number of
    candidates that drew it (review tl). The space's values are checked deep-copyable
    before anything is charged (:func:`check_copyable`).
    """
    return copy.deepcopy(params)


def check_copyable(name: str, values: Any) -> None:
    """``values`` (a space's choices, or the candidates) can be deep-copied (:func:`own_copy`);
    checked before anything is charged, since a candidate whose copy fails would be ⊥.

    One value (one candidate) at a time, each copy dropped before the next: a copy of all
    of them at once held a second copy of every model in ``{"model": [m1, m2, m3]}``, so a
    space that a run copies one candidate at a time could be refused for memory (review rtl).
    """
    pieces = values.values() if isinstance(values, Mapping) else values
    try:
        for piece in pieces:
            for value in piece if isinstance(piece, tuple) else (piece,):
                copy.deepcopy(value)
    except Exception as exc:
        raise InvalidArgumentError(
            name, check.short(values), f"cannot be deep-copied ({type(exc).__name__}): each "
            "candidate gets its own copy of its hyperparameters, so that no candidate's edit "
            "of a value reaches another candidate or the released winner") from None


def check_ledger(ledger: Any) -> Ledger:
    if not isinstance(ledger, Ledger):
        raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
    return ledger


class CandidateCosts:
    """The declared privacy cost of every candidate, checked before anything is charged.

    ``cost`` is one mechanism that bounds every candidate, or a function
    ``params -> mechanism`` over a finite space; the function is evaluated
    for every candidate here, so a candidate that has no valid cost is found
    before the run, not after the charge.
    """

    def __init__(self, cost: Any, space: Any, name: str = "cost") -> None:
        self.name = name
        self.single: Mechanism | None = None
        self.per_candidate: list[Mechanism] = []
        if isinstance(cost, Mechanism):
            self.single = cost
        elif callable(cost):
            if not space.is_finite:
                raise InvalidArgumentError(
                    name, cost, "a per-candidate cost function needs a finite space (its "
                    "maximum over every candidate is the bound); give one mechanism that "
                    "bounds them all")
            for params in space.candidates():
                try:  # a copy, as a candidate gets: an in-place edit stayed in the space (rtl)
                    given = own_copy(params)
                except Exception:  # refused at run, with its reason (check_copyable)
                    given = dict(params)
                try:
                    mech = cost(given)
                except Exception as exc:
                    raise InvalidArgumentError(
                        name, cost, f"raised {type(exc).__name__} for {params!r}") from None
                if not isinstance(mech, Mechanism):
                    raise InvalidArgumentError(
                        name, cost, f"returned {mech!r} for {params!r}, not a privguard mechanism")
                self.per_candidate.append(mech)
        else:
            raise InvalidArgumentError(name, cost, "must be a mechanism or params -> mechanism")

    def budgets(self, grid: np.ndarray) -> list[np.ndarray]:
        """Each candidate's child budget on ``grid``: its declared curve × (1 + SLACK).

        One entry (shared by every candidate) for a single mechanism, else one
        per candidate in ``space.candidates()`` order.
        """
        if self.single is not None:
            return [self.single._rdp_checked(grid) * (1 + SLACK)]
        cache: dict[Any, np.ndarray] = {}
        out = []
        for mech in self.per_candidate:
            key: Any = mech
            try:
                hash(mech)
            except TypeError:  # an unhashable mechanism: computed on its own
                key = None
            curve = None if key is None else cache.get(key)
            if curve is None:
                curve = mech._rdp_checked(grid) * (1 + SLACK)
                if key is not None:
                    cache[key] = curve
            out.append(curve)
        return out

    def bound(self, grid: np.ndarray) -> np.ndarray:
        """Order-wise maximum of the declared curves over every candidate that can be
        drawn (seed 000 Lemma 9: a random mixture of ε(α)-RDP mechanisms is
        ε(α)-RDP), inflated by SLACK as the child ledgers enforce it."""
        return np.max(self.budgets(grid), axis=0)


class Tuner(abc.ABC):
    """Base class: subclasses give the tuning mechanism and the candidate loop."""

    mode: str = "max"

    @abc.abstractmethod
    def cost(self, orders=None) -> Mechanism:
        """The privacy cost of the whole tuning procedure, as a mechanism."""

    @abc.abstractmethod
    def _expected_runs(self) -> float:
        ...

    @abc.abstractmethod
    def _per_candidate_curve(self, orders: np.ndarray) -> np.ndarray:
        ...

    def plan(self, delta: float, orders=None) -> TuningPlan:
        """The tuning bound as a curve and an (ε, δ), before anything runs."""
        d = check.delta("delta", delta)
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        mech = self.cost(grid)
        curve = mech._rdp_checked(grid)
        k = math.ceil(self._expected_runs())
        naive = RDPCurve._trusted(grid, k * self._per_candidate_curve(grid)).epsilon(d)
        return TuningPlan(mech, grid, curve, RDPCurve._trusted(grid, curve).epsilon(d), d,
                          self._expected_runs(), naive)

    def _charge(self, ledger: Ledger, mech: Mechanism, label: str | None) -> None:
        ledger.charge(mech, label=label)  # raises BudgetExhausted: nothing runs
        if not inside_candidate():  # a nested tuner's line, once per candidate, would count K
            log.info("charged the tuning bound (%s) as %r", label, type(mech).__name__)
