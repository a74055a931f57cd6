"""The tuner protocol shared by every tuner.

A tuner has a search space, a per-candidate privacy cost, and
``run(objective, ledger)``, which

1. charges the whole tuning bound to ``ledger`` BEFORE any candidate runs
   (a refused charge raises :class:`privguard.BudgetExhausted` and nothing
   runs);
2. runs the candidates, each with a child ledger that strictly enforces the
   per-candidate curve the bound assumed (refuse if any order would exceed);
3. returns only the selected result.

Nothing about a non-selected candidate — its score, hyperparameters or
artifact — is logged, shown in the progress bar, put in an exception message
or returned. The number of runs and all tuner randomness come from OS entropy
unless a seed is given; a seed makes K predictable, which breaks the
guarantee, and is for tests only.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._base import Mechanism
from privguard._curve import RDPCurve
from privguard._errors import InvalidArgumentError
from privguard._ledger import Ledger
from privguard._orders import DEFAULT_ORDERS

log = logging.getLogger("privguard.tuning")

#: Child ledgers enforce the declared curve × (1 + SLACK) so that a candidate
#: spending exactly what it declared is never refused by floating-point
#: rounding; tuning bounds are computed from the same inflated curve, so the
#: guarantee covers everything a child can admit.
SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """The tuning bound before running: as a mechanism, a curve and an (ε, δ)."""

    mechanism: Mechanism
    orders: np.ndarray
    curve: np.ndarray
    epsilon: float
    delta: float
    expected_runs: float
    naive_epsilon: float
    """ε of composing ⌈E[K]⌉ runs non-adaptively, for comparison only."""

    def __str__(self) -> str:
        return (f"tuning bound: ε = {self.epsilon:.4f} at δ = {self.delta:g} "
                f"(E[runs] = {self.expected_runs:.2f}; naive composition of "
                f"{math.ceil(self.expected_runs)} runs: ε = {self.naive_epsilon:.4f})")


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """The only thing a tuner releases: the selected candidate.

    Attributes:
        selected: False when no candidate produced a result (e.g. K = 0 under
            Poisson, or every candidate failed).
        params: the selected hyperparameters (None if not selected).
        score: the selected candidate's score (None if not selected).
        artifact: what the selected objective returned besides its score.
        runs: how many candidates were run (K, independent of the data).
        failed: how many candidates were stopped by their child ledger.
        cost: the mechanism charged to the ledger for the whole tuning.
        seeded: True if K and the draws came from a fixed seed (tests only).
    """

    selected: bool
    params: dict[str, Any] | None
    score: float | None
    artifact: Any
    runs: int
    failed: int
    cost: Mechanism
    seeded: bool

    def __repr__(self) -> str:
        if not self.selected:
            return f"TuningResult(no candidate selected; runs={self.runs})"
        return f"TuningResult(params={self.params}, score={self.score!r}, runs={self.runs})"


def unpack(outcome: Any) -> tuple[float, Any]:
    """An objective returns a score, (score, artifact) or {'score': ..., 'artifact': ...}."""
    if isinstance(outcome, dict) and "score" in outcome:
        return float(outcome["score"]), outcome.get("artifact")
    if isinstance(outcome, tuple) and len(outcome) == 2:
        return float(outcome[0]), outcome[1]
    return float(outcome), None


def make_rng(seed: int | None) -> np.random.Generator:
    """A generator from OS entropy, or (tests only) from ``seed``."""
    return np.random.default_rng() if seed is None else np.random.default_rng(seed)


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

    def _charge(self, ledger: Ledger, label: str) -> Mechanism:
        if not isinstance(ledger, Ledger):
            raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
        mech = self.cost(ledger.orders)
        ledger.charge(mech, label=label)  # raises BudgetExhausted: nothing runs
        log.info("charged the tuning bound (%s) as %r", label, type(mech).__name__)
        return mech

    def _better(self, score: float, best: float | None) -> bool:
        if math.isnan(score):
            return False
        return best is None or (score > best if self.mode == "max" else score < best)


def check_cost(cost: Any, space: Any, name: str = "cost") -> Any:
    """A per-candidate cost: a mechanism, or ``params -> mechanism`` over a finite space."""
    if not isinstance(cost, Mechanism) and not callable(cost):
        raise InvalidArgumentError(name, cost, "must be a mechanism or params -> mechanism")
    if not isinstance(cost, Mechanism) and not space.is_finite:
        raise InvalidArgumentError(
            name, cost, "a per-candidate cost function needs a finite space (its maximum "
            "over every candidate is the bound); give one mechanism that bounds them all")
    return cost


def check_mode(mode: str) -> str:
    if mode not in ("max", "min"):
        raise InvalidArgumentError("mode", mode, "must be 'max' or 'min'")
    return mode


def declared_curve(cost: Any, params: dict, grid: np.ndarray, name: str = "cost") -> np.ndarray:
    """The curve one candidate declared (``cost`` or ``cost(params)``) on ``grid``."""
    mech = cost if isinstance(cost, Mechanism) else cost(params)
    if not isinstance(mech, Mechanism):
        raise InvalidArgumentError(f"{name}(params)", mech, "must return a privguard mechanism")
    return mech._rdp_checked(grid)


def uniform_bound(cost: Any, space: Any, grid: np.ndarray, name: str = "cost") -> np.ndarray:
    """Order-wise maximum of the declared curves over every candidate that can be
    drawn (seed 000 Lemma 9), inflated by SLACK as the child ledgers enforce it."""
    if isinstance(cost, Mechanism):
        worst = cost._rdp_checked(grid)
    else:
        worst = np.max([declared_curve(cost, p, grid, name) for p in space.candidates()], axis=0)
    return worst * (1 + SLACK)


def check_objective(objective: Callable) -> Callable:
    if not callable(objective):
        raise InvalidArgumentError("objective", objective, "must be callable(params, ledger)")
    return objective
