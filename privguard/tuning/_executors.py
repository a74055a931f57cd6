"""Where tuning candidates run: in this process, or on Ray (privguard.integrations.ray).

A tuner draws K and every candidate's hyperparameters at the driver, then
hands the executor one task per candidate. Each task builds its own strict
child ledger from the grid and the declared budget, runs the objective under
it, and returns (status, score, artifact, spent); ``status`` is "ok" or
"failed" (the child refused a charge, or the worker died). Only the tuner
sees the outcomes, and it keeps only the best.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from privguard._errors import BudgetExhausted
from privguard._ledger import Ledger
from privguard.tuning._base import unpack

Task = tuple  # (objective, params, orders, budget)
Outcome = tuple  # (status, score, artifact, spent)


def run_candidate(objective: Callable, params: dict, orders: np.ndarray, budget: np.ndarray
                  ) -> Outcome:
    """Run one candidate under a strict child ledger (the same code on every executor)."""
    child = Ledger(orders=orders, rdp_budget=budget)
    try:
        score, artifact = unpack(objective(dict(params), child))
    except BudgetExhausted:
        return ("failed", None, None, child.spent)
    return ("ok", score, artifact, child.spent)


class SerialExecutor:
    """Runs candidates one after the other in this process (the default)."""

    def map(self, tasks: Sequence[Task], on_done: Callable[[], None] = lambda: None
            ) -> list[Outcome]:
        out = []
        for task in tasks:
            out.append(run_candidate(*task))
            on_done()
        return out


def resolve(backend: Any):
    """``None``/"serial" → SerialExecutor; "ray" → a local RayExecutor; or an executor object."""
    if backend is None or backend == "serial":
        return SerialExecutor()
    if backend == "ray":
        from privguard.integrations.ray import RayExecutor

        return RayExecutor()
    if hasattr(backend, "map"):
        return backend
    from privguard._errors import InvalidArgumentError

    raise InvalidArgumentError("backend", backend, "must be 'serial', 'ray' or an executor")
