"""A dress rehearsal of a tuning run: one candidate, end to end, nothing charged (issue 25).

A tuning run hides every failed candidate on purpose (a failure is ⊥, and
nothing about it is released), so a typo in an objective or a per-candidate
cost too small for one candidate's training silently turns every candidate
into ⊥ while the whole tuning bound is spent. ``tuner.rehearse(objective)``
runs ONE candidate with an objective the caller has bound to public or
synthetic data, under a throwaway child ledger of the per-candidate cost
(never connected to a real ledger, so it charges nothing to any), and shows
everything: whatever the objective raises is re-raised as it is, a refusal
of the child ledger is re-raised with the per-candidate cost and the remedy,
and a return value that is not a score raises. Nothing here touches private
data unless the caller passes it in; rehearse on public or synthetic data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from privguard._errors import BudgetExhausted, InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard.tuning._base import accept, check_copyable, check_objective, make_rng, own_copy


@dataclasses.dataclass(frozen=True)
class Rehearsal:
    """What a rehearsal returns: the one candidate it ran and what its objective gave.

    Attributes:
        params: the candidate's hyperparameters.
        score: its score (a finite float).
        artifact: what its objective returned besides the score.
    """

    params: dict[str, Any]
    score: float
    artifact: Any


class RehearseOne:
    """``rehearse`` for a tuner with a ``space``, per-candidate ``costs`` and a ``seed``."""

    def rehearse(self, objective: Callable[[dict, Ledger], Any], *, orders: Any = None
                 ) -> Rehearsal:
        """Rehearse before ``run``: one candidate end to end, nothing charged.

        Draws one candidate as ``run`` would and calls ``objective(params,
        child)`` under a throwaway child ledger of the per-candidate cost (on
        ``orders``, default :data:`privguard.DEFAULT_ORDERS`), connected to no
        real ledger. Bind the objective to public or synthetic data: unlike
        ``run``, a rehearsal shows everything.

        Returns:
            A :class:`privguard.tuning.Rehearsal` (params, score, artifact).

        Raises:
            Whatever the objective raises (a typo's ``KeyError``, say), as it is.
            BudgetExhausted: the child ledger refused: the per-candidate cost does
                not cover one candidate's training (the message names the remedy).
            InvalidArgumentError: the objective returned no finite score.

        Example:
            >>> from privguard import mechanisms as M
            >>> from privguard.tuning import Poisson, RandomSearch
            >>> tuner = RandomSearch({"lr": [0.1]}, Poisson(4.0),
            ...                      cost=M.Gaussian(5.0), progress=False)
            >>> tuner.rehearse(lambda p, child: child.charge(M.Gaussian(5.0)) and p["lr"])
            Rehearsal(params={'lr': 0.1}, score=0.1, artifact=None)
        """
        return rehearse_candidate(self, objective, orders, getattr(self, "seed", None))


def rehearse_candidate(tuner: Any, objective: Callable, orders: Any, seed: int | None
                       ) -> Rehearsal:
    """One candidate of ``tuner`` (a space and per-candidate costs), drawn as a run would."""
    from privguard import _validation as check
    from privguard._curves._orders import DEFAULT_ORDERS

    check_objective(objective, call=("params", "child_ledger"))
    grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
    check_copyable("space", tuner.space.choices())  # the candidate gets its own copy, as in run
    index, params = tuner.space.draw(make_rng(seed))
    costs = tuner.costs
    budgets = costs.budgets(grid)
    one = index is None or len(budgets) == 1
    cost = costs.single if costs.single is not None else costs.per_candidate[0 if one else index]
    return run_one(objective, params, grid, budgets[0] if one else budgets[index], cost)


def run_one(objective: Callable, params: dict, orders: np.ndarray, budget: np.ndarray,
            cost: Any, what: str = "objective") -> Rehearsal:
    """``objective(params, child)`` under a throwaway strict child ledger.

    Raises:
        Whatever the objective raises, unchanged, except a refusal of the child
        ledger, which is re-raised as :class:`privguard.BudgetExhausted` naming the
        per-candidate cost and the remedy (the child's refusal is its cause).
        InvalidArgumentError: the objective returned something that is not a
            score (a run would count it as ⊥).
    """
    # its own copy, as in a run: an in-place edit left the space edited for the real run
    result = call_with_child(lambda child: objective(own_copy(params), child), orders, budget,
                             cost)
    outcome = accept(result)
    if outcome is None:
        raise InvalidArgumentError(
            what, objective, f"returned {result!r} for {params!r}: not a finite score, "
            "(score, artifact) or {'score': ..., 'artifact': ...}; run() would count every "
            "such candidate as failed")
    return Rehearsal(own_copy(params), outcome[0], outcome[1])


def call_with_child(call: Callable[[Ledger], Any], orders: np.ndarray, budget: np.ndarray,
                    cost: Any) -> Any:
    """``call(child)`` with a throwaway strict child; its refusal names the cost and remedy."""
    refused: list[Any] = []
    child = Ledger(orders=orders, rdp_budget=budget,
                   listeners=[lambda e: refused.append(e) if e.kind == "refused" else None])
    try:
        return call(child)
    except BudgetExhausted as exc:
        if not refused:  # another ledger's refusal: the objective's own error
            raise
        raise BudgetExhausted(
            f"rehearsal: the candidate's child ledger refused a charge after "
            f"{len(child.history)} admitted charge(s): the per-candidate cost {cost!r} does "
            "not cover one candidate's training, so in run() every candidate would fail (⊥) "
            "while the tuning bound is spent. Declare the cost as everything one candidate "
            "does, e.g. SubsampledGaussian(σ, q, steps=epochs * steps_per_epoch) composed "
            f"with its scoring (the child's refusal: {exc})",
            requested=exc.requested, label=exc.label, remaining=exc.remaining) from exc
