"""The one path of a random-K tuning run: check, charge the bound, then search sealed.

:class:`~privguard.tuning.RandomSearch` and :class:`~privguard.tuning.DPHyPOSearch`
differ only in how they draw candidates (``_search``). Everything before the
search — the argument checks, the exact sampleability of the number of runs
(docs/theory.md §7, "Drawing K"), the bound's curve computed before the charge, the
charge itself — and the sealing of what follows it (nothing of a non-selected
candidate escapes: :func:`~privguard.tuning._base.sealed`) is this one function, so
that the two tuners cannot drift apart on what is checked before the budget is spent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from privguard._accounting._accounting import check_label
from privguard.tuning._base import (
    Elapsed,
    TuningResult,
    check_copyable,
    check_ledger,
    check_objective,
    held,
    sealed,
)
from privguard.tuning._executors import prepare, resolve


def charged_run(tuner: Any, objective: Any, ledger: Any, label: Any, backend: Any,
                title: str, before: Callable[[], None] | None = None) -> TuningResult:
    """Check everything, charge ``tuner.cost`` to ``ledger``, then run ``tuner._search`` sealed.

    ``before`` runs after the arguments are checked and before anything is charged
    (DP-HyPO checks its update rule there). ``title`` names the progress bar when
    ``label`` is ``None``.
    """
    check_objective(objective, call=("params", "child_ledger"))
    check_ledger(ledger)
    tuner.runs.check_sampleable("runs")  # the number of runs drawn exactly, before the charge
    label = check_label(label)
    check_copyable("space", tuner.space.choices())  # each candidate gets its own copy
    executor = resolve(backend)
    if before is not None:
        before()
    grid = ledger.orders
    budgets = tuner.costs.budgets(grid)
    mech = tuner.cost(grid)
    mech._rdp_checked(grid)  # the bound's curve, computed before the charge
    prepare(executor, objective)
    with Elapsed(label or title, tuner.progress) as bar:
        tuner._charge(ledger, mech, label)  # raises BudgetExhausted: nothing runs
        bar.show_budget(ledger)
        with held(ledger):  # a candidate charging this ledger would count K (review at)
            return sealed(lambda: tuner._search(objective, grid, budgets, executor, mech))
