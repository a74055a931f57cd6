"""Run tuning candidates on Ray (``pip install 'privguard[ray]'``).

    from privguard.integrations.ray import RayExecutor
    result = tuner.run(objective, ledger, backend=RayExecutor(num_cpus=1))

The ledger stays at the driver. Before the tuner charges its bound, the
executor starts (or connects to) Ray and puts the objective in the object
store, so a Ray that cannot start or an objective that cannot be pickled
raises :class:`privguard.InvalidArgumentError` with nothing charged
(``run`` refuses an objective that was not prepared so, before Ray starts). The
tuner then draws K and every candidate's hyperparameters at the driver, and
each candidate runs as one Ray task (with the CPUs/GPUs you request) that
builds the candidate's strict child ledger inside the worker and runs the
objective under it. Tasks are never retried (``max_retries=0``): a retry
would change the distribution of the number of runs.

Failures are ⊥, exactly as in this process: the task itself catches every
exception of the objective and returns ⊥, so no exception, message or
traceback of a candidate is stored by Ray; a task whose worker dies, whose
result cannot be pickled or that Ray loses is ⊥ too. The artifact travels
pickled, and the driver unpickles it itself: one that cannot be rebuilt there
is ⊥, with nothing printed (Ray's logger printed the error of an artifact it
failed to unpickle, any candidate's). Outcomes are streamed to
the tuner's reducer as they finish (ties go to the earlier draw, so a seeded
run selects what the serial backend selects), and each result is released
from the object store as soon as it is read; only the current best is kept.

Sealed results: privguard logs nothing about candidates. It starts a local
Ray instance without the dashboard and without forwarding worker output. A
task's return value crosses Ray's in-memory object store on its way back and
is not persisted by privguard. What your own objective prints or logs is
yours to control. If the tuning run is interrupted, the tasks still pending
are cancelled. An objective whose pickle carries a file- or server-backed
ledger is refused before the charge: every worker would reopen it, and a
candidate that charged it would write to your journal once per candidate.

What Ray itself records: its task table and logs (``ray.util.state``, the
session's log files, the dashboard if you enable it) hold one task per
candidate, so they show K and which workers died — not the hyperparameters'
outcomes, scores or exceptions. Ray's driver also prints a "(raylet) A worker
died ..." line on the console for every candidate whose worker dies (a
candidate that crashes its process), whatever ``log_to_driver`` says: it comes
from Ray's error channel, which privguard cannot turn off. K is not part of what a tuning run releases
(see :mod:`privguard.tuning`), so keep the Ray cluster's logs as private as
the data.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable
from typing import Any

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard.integrations._frameworks import require
from privguard.tuning._executors import Outcome, Reduce, Task, register_executor, run_candidate
from privguard.tuning._quiet import candidate_scope

ray = require("ray", "ray")

__all__ = ["RayExecutor"]

_SHIPPED: set[str] = set()


def _remote_candidate(objective, params, orders, budget) -> Any:
    """One candidate in a worker: ⊥ (None), or its score and its artifact pickled here.

    The artifact travels as bytes that the driver unpickles itself (:func:`_opened`).
    Left to Ray, an artifact that failed to unpickle at the driver (a class the driver
    cannot import, a ``__reduce__`` that raises there) was ⊥ too, but Ray's own logger
    first printed the error, its message and traceback, on the driver's console, for
    any candidate, winner or not (review tl). An artifact that cannot be pickled is ⊥
    here, not an error Ray records.
    """
    # the artifact's own code (__reduce__, __getstate__, __del__) runs here after the
    # candidate: its warnings and reports are discarded as the candidate's are (they
    # reached the worker's stderr; review rtl)
    with candidate_scope():
        outcome = run_candidate(objective, params, orders, budget)
        if outcome is None:
            return None
        try:
            return outcome[0], ray.cloudpickle.dumps(outcome[1])
        except KeyboardInterrupt:
            raise  # as run_candidate: the user's
        except BaseException:  # by design: an artifact that cannot travel is ⊥
            return None
        finally:
            outcome = None


def _opened(returned: Any) -> Outcome:
    """A task's return value as an outcome: (score, artifact unpickled), or ⊥ (None).

    Unpickling runs the artifact's own code (``__reduce__``, ``__setstate__``): as in a
    candidate, whatever it raises is ⊥, with nothing logged; the caller runs this in the
    candidate's scope (:func:`~privguard.tuning._quiet.candidate_scope`), which discards its
    warnings and reports.
    """
    if returned is None:
        return None
    try:
        score, blob = returned
        return score, ray.cloudpickle.loads(blob)
    except KeyboardInterrupt:
        raise
    except BaseException:  # by design: an artifact that cannot be rebuilt here is ⊥
        return None


class _StoredLedger(Exception):
    """Raised by :class:`_LedgerProbe` at the first file- or server-backed ledger it meets."""


_CloudPickler: Any = ray.cloudpickle.CloudPickler


class _LedgerProbe(_CloudPickler):
    """Pickles like Ray and stops at a file- or server-backed :class:`Ledger` it would ship.

    Such a ledger pickles as a reference to its store and every worker reopens it
    (``Ledger.__getstate__``): a candidate that charges the ledger it captured would write
    one journal entry per candidate to the caller's file, which counts K (review at). An
    in-memory ledger pickles as a copy, which the caller never sees.
    """

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Ledger) and obj._store is not None:
            raise _StoredLedger
        return None


def _refuse_stored_ledgers(objective: Callable) -> None:
    """Refuse an objective whose pickle would carry a file- or server-backed ledger."""
    try:
        _LedgerProbe(io.BytesIO()).dump(objective)
    except _StoredLedger:
        raise InvalidArgumentError(
            "objective", objective, "carries a file- or server-backed Ledger (a closure, a "
            "global or an attribute): every Ray worker would reopen it, and a candidate "
            "that charges it writes one journal entry per candidate, which counts the "
            "hidden number of runs; give candidates only their child ledger") from None
    except Exception:  # not picklable: ray.put says so, as before
        pass


def _resource(name: str, value: Any) -> float:
    x = check._real(value)  # None for a bool or a non-number; inf for an int past floats
    if x is None or not (math.isfinite(x) and x >= 0):  # float(10**400) raised (review bd)
        raise InvalidArgumentError(name, check.short(value), "must be a finite number >= 0")
    return x


class RayExecutor:
    """Candidates as Ray tasks on the cluster ``ray.init`` connects to.

    Args:
        address: a cluster address for ``ray.init``; default: an already
            initialised Ray, else a new local instance.
        num_cpus, num_gpus: resources requested per candidate (finite, >= 0).
        init_kwargs: extra arguments for ``ray.init`` when this executor
            starts Ray (e.g. ``num_cpus`` of a local instance).

    Raises:
        InvalidArgumentError: any argument out of its domain.
    """

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float = 0,
                 init_kwargs: dict | None = None) -> None:
        if address is not None and (not isinstance(address, str) or not address):
            raise InvalidArgumentError("address", address, "must be None or a non-empty string")
        self.num_cpus = _resource("num_cpus", num_cpus)
        self.num_gpus = _resource("num_gpus", num_gpus)
        if init_kwargs is not None and (not isinstance(init_kwargs, dict) or not all(
                isinstance(k, str) for k in init_kwargs)):
            raise InvalidArgumentError("init_kwargs", init_kwargs,
                                       "must be None or a dict of ray.init keyword arguments")
        self.address = address
        self.init_kwargs = dict(init_kwargs or {})
        self._task: Any = None
        self._prepared: tuple[Callable, Any] | None = None

    def _ensure(self) -> None:
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False,
                      "configure_logging": False, **self.init_kwargs}
            if self.address is not None:
                kwargs["address"] = self.address
            else:
                kwargs.setdefault("_node_ip_address", "127.0.0.1")  # a local instance stays local
            try:
                ray.init(**kwargs)
            except Exception as exc:
                name = "address" if self.address is not None else "init_kwargs"
                raise InvalidArgumentError(
                    name, getattr(self, name),
                    f"ray.init failed ({type(exc).__name__}: {exc})") from None
        if self._task is None:
            self._task = ray.remote(max_retries=0)(_remote_candidate).options(
                num_cpus=self.num_cpus, num_gpus=self.num_gpus)

    @staticmethod
    def _ship_by_value(objective: Callable) -> None:
        """Workers cannot import a user's script modules: send their code by value.

        The objective's own module and the modules its globals come from (one
        level) are shipped, unless they are ``__main__`` (already sent by
        value), privguard, or installed (stdlib, site-packages), which the
        workers import as usual.
        """
        paths = sysconfig.get_paths()
        installed = tuple(os.path.abspath(paths[k]) for k in ("purelib", "platlib", "stdlib"))
        names = {getattr(objective, "__module__", None)}
        for value in getattr(objective, "__globals__", {}).values():
            names.add(value.__name__ if isinstance(value, type(sys)) else
                      getattr(value, "__module__", None))
        for name in names:
            module = sys.modules.get(name) if isinstance(name, str) else None
            path = getattr(module, "__file__", None)
            if (module is None or path is None or not isinstance(name, str)
                    or name == "__main__" or name in _SHIPPED
                    or name.split(".")[0] == "privguard"
                    or os.path.abspath(path).startswith(installed)):
                continue
            ray.cloudpickle.register_pickle_by_value(module)
            _SHIPPED.add(name)

    def prepare(self, objective: Callable) -> None:
        """Start or join Ray and put ``objective`` in the object store (before the charge).

        Raises:
            InvalidArgumentError: Ray cannot start, ``objective`` cannot be
                pickled by Ray, or it carries a file- or server-backed ledger
                (every worker would reopen it: a candidate charging it would
                write to the caller's journal once per candidate).
        """
        self._ensure()
        self._ship_by_value(objective)
        _refuse_stored_ledgers(objective)
        try:
            ref = ray.put(objective)
        except Exception as exc:
            raise InvalidArgumentError(
                "objective", objective,
                f"must be picklable by Ray to run on workers ({type(exc).__name__})") from None
        self._prepared = (objective, ref)

    def run(self, tasks: Iterable[Task], reduce: Reduce) -> None:
        """Submit every task; hand each outcome to ``reduce`` as it finishes, keep none.

        A task that Ray reports as failed (its worker died, its result was
        lost) is ⊥. Tasks still pending when this call is left by an
        exception (e.g. ``KeyboardInterrupt``) are cancelled.

        Raises:
            InvalidArgumentError: a task's objective is not the one given to
                :meth:`prepare` (or ``prepare`` was not called), before that task
                runs. Task cb: such an objective was shipped unchecked, a file- or
                server-backed ledger it carries included, which every worker reopened
                (a candidate charging it wrote to the caller's journal once per
                candidate). The tuners call ``prepare`` before the charge.
        """
        if self._prepared is None:
            raise InvalidArgumentError(
                "tasks", "RayExecutor.run", "needs prepare(objective) first: it checks the "
                "objective (a file- or server-backed ledger it carries is refused) and ships it")
        prepared, shipped = self._prepared  # shipped once, by reference
        tasks = iter(tasks)
        first = next(tasks, None)  # checked before Ray starts
        pending: dict[Any, tuple[int, dict]] = {}
        if first is None:
            return
        try:
            for index, (objective, params, orders, budget) in enumerate(
                    itertools.chain([first], tasks)):
                if objective is not prepared:
                    raise InvalidArgumentError(
                        "tasks", check.short(objective), f"task {index}'s objective is not the "
                        "one given to prepare(objective): prepare it first")
                self._ensure()
                pending[self._task.remote(shipped, params, orders, budget)] = (index, params)
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                index, params = pending.pop(ref)
                # a loser's artifact is finalised in a candidate's scope, as on the serial
                # backend: its __del__'s warning or "Exception ignored" report (review rtl)
                with candidate_scope():
                    try:
                        outcome = _opened(ray.get(ref))
                    except ray.exceptions.RayError:
                        outcome = None  # ⊥: worker died, result lost or unpicklable
                    del ref  # the object store may free the result now
                    reduce(index, params, outcome)
                    outcome = None
        finally:
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:
                    pass
            pending.clear()


register_executor("ray", RayExecutor)  # backend="ray" (tuning/_executors.py's registry)
