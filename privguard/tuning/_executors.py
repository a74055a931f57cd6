"""Where tuning candidates run: in this process, or on Ray (privguard.integrations.ray).

This module is below the executors it names: ``backend="ray"`` is looked up in a registry
that the Ray integration fills when it is imported (:func:`register_executor`), or else
through the ``privguard.executors`` entry point the package declares, so tuning never
imports an integration (tests/test_import_graph.py).

A tuner draws K and every candidate's hyperparameters at the driver and
hands the executor a stream of tasks, one per candidate. Each task builds
its own strict child ledger from the grid and the declared budget, runs the
objective under it, and yields an outcome: ``(score, artifact)``, or
``None`` for ⊥ (the objective raised, its child refused a charge, its score
is not a finite real number, or the worker died). The executor streams each
outcome to the tuner's reducer as soon as it exists and keeps none of them:
only the reducer's current best survives.

The executor protocol (duck-typed; see :class:`SerialExecutor`):

* ``prepare(objective)``: everything that can fail for a reason other than
  a candidate (starting Ray, shipping the objective), called BEFORE the
  tuning bound is charged; raises :class:`privguard.InvalidArgumentError`.
* ``run(tasks, reduce)``: runs every task of the iterable ``tasks`` and
  calls ``reduce(index, params, outcome)`` once per task, ``index`` being
  the task's position in ``tasks``. It must not raise for a candidate's
  failure, and must not keep outcomes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from privguard._errors import InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard.tuning._base import accept, own_copy
from privguard.tuning._quiet import candidate_scope

Task = tuple  # (objective, params, orders, budget)
Outcome = Any  # (score: float, artifact) or None (⊥)
Reduce = Callable[[int, dict, Outcome], Any]


def run_candidate(objective: Callable, params: dict, orders: np.ndarray, budget: np.ndarray
                  ) -> Outcome:
    """Run one candidate under a strict child ledger (the same code on every executor).

    Returns ``(score, artifact)`` or None (⊥). Everything the objective
    raises — a refusal of its child ledger, ``SystemExit``, ``GeneratorExit``,
    any ``BaseException`` — is ⊥ and is dropped here, with its message and
    traceback: the run goes on. Ending the run instead would release
    whether SOME candidate raised, a function of non-selected candidates
    that the tuning bound (best of K) does not cover. The one exception is
    ``KeyboardInterrupt``, taken to be the user's: it propagates and the
    tuner replaces it with a fresh one (:func:`privguard.tuning._base.sealed`).
    """
    child = Ledger(orders=orders, rdp_budget=budget)
    try:
        # a candidate's warnings are about it, and count K (review bx); so would a nested
        # tuner's progress bar and log line (review at)
        with candidate_scope():
            return accept(objective(own_copy(params), child))  # its own copy (review tl)
    except KeyboardInterrupt:
        raise  # the user's interrupt, not a candidate's output
    except BaseException:  # by design: a failed candidate is ⊥ (SystemExit included)
        return None


class SerialExecutor:
    """Runs candidates one after the other in this process (the default)."""

    def prepare(self, objective: Callable) -> None:
        """Nothing to prepare in this process."""

    def run(self, tasks: Iterable[Task], reduce: Reduce) -> None:
        """Run each task and hand its outcome to ``reduce``; keep nothing."""
        for index, task in enumerate(tasks):
            # the candidate's objects are finalised in its scope: its locals when it raised
            # (run_candidate's except), its artifact when it loses (here or in reduce, when
            # a better one replaces it); a __del__'s warning or report is about it (review rtl)
            with candidate_scope():
                outcome = run_candidate(*task)
                reduce(index, task[1], outcome)
                del outcome


#: Executors by name: a factory called with no argument. "serial" is this module's; the Ray
#: integration registers "ray" when it is imported.
_NAMED: dict[str, Callable[[], Any]] = {"serial": SerialExecutor}

#: The entry-point group through which ``backend="<name>"`` finds an executor whose module
#: has not been imported yet (pyproject.toml declares ``ray`` in it).
ENTRY_POINT_GROUP = "privguard.executors"


def register_executor(name: str, factory: Callable[[], Any]) -> None:
    """Make ``backend=name`` call ``factory()`` (the Ray integration registers "ray")."""
    _NAMED[name] = factory


def _named(name: str) -> Callable[[], Any] | None:
    factory = _NAMED.get(name)
    if factory is not None:
        return factory
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP, name=name):
        entry.load()  # imports the integration (its missing extra raises the install hint)
        return _NAMED.get(name)
    return None


def resolve(backend: Any):
    """``None``/"serial" → SerialExecutor; "ray" → a local RayExecutor; or an executor object."""
    if backend is None:
        return SerialExecutor()
    if isinstance(backend, str) and backend in ("serial", "ray"):
        factory = _named(backend)
        if factory is None:  # an install whose metadata predates the entry point
            raise InvalidArgumentError("backend", backend, "needs `import privguard.integrations"
                                       f".{backend}` first (pip install 'privguard[{backend}]')")
        return factory()
    if isinstance(backend, type):  # its methods unbound: prepare(objective) raised TypeError
        raise InvalidArgumentError("backend", backend.__name__,
                                   "is a class: pass an instance, e.g. RayExecutor(num_cpus=1)")
    if not isinstance(backend, str) and callable(getattr(backend, "run", None)):
        return backend
    raise InvalidArgumentError("backend", backend,
                               "must be 'serial', 'ray' or an executor with run(tasks, reduce)")


def prepare(executor: Any, objective: Callable) -> None:
    """Call the executor's ``prepare`` (if it has one) before the charge."""
    hook = getattr(executor, "prepare", None)
    if callable(hook):
        hook(objective)
