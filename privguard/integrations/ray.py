"""Run tuning candidates on Ray (``pip install 'privguard[ray]'``).

    from privguard.integrations.ray import RayExecutor
    result = tuner.run(objective, ledger, backend=RayExecutor(num_cpus=1))

The ledger stays at the driver: the tuner charges its bound there before any
task is submitted, and draws K and every candidate's hyperparameters there.
Each candidate runs as one Ray task (with the CPUs/GPUs you request) that
builds the candidate's strict child ledger inside the worker, runs the
objective under it, and reports its spend back. A worker that dies is a
failed candidate, which the tuning bound already covers. Tasks are never
retried (``max_retries=0``), because a retry would change the distribution
of the number of runs.

Sealed results: privguard logs nothing about candidates. It starts a local
Ray instance without the dashboard and without forwarding worker output, and
it drops every outcome but the best at the driver. A task's return value
crosses Ray's in-memory object store on its way back and is not persisted
by privguard. What your own objective prints or logs is yours to control.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

from privguard._errors import InvalidArgumentError
from privguard.integrations._frameworks import require
from privguard.tuning._executors import Outcome, Task, run_candidate

ray = require("ray", "ray")

__all__ = ["RayExecutor"]

_SHIPPED: set[str] = set()


def _remote_candidate(objective, params, orders, budget) -> Outcome:
    return run_candidate(objective, params, orders, budget)


class RayExecutor:
    """Candidates as Ray tasks on the cluster ``ray.init`` connects to.

    Args:
        address: a cluster address for ``ray.init``; default: an already
            initialised Ray, else a new local instance.
        num_cpus, num_gpus: resources requested per candidate.
        init_kwargs: extra arguments for ``ray.init`` when this executor
            starts Ray (e.g. ``num_cpus`` of a local instance).
    """

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float = 0,
                 init_kwargs: dict | None = None) -> None:
        if num_cpus < 0 or num_gpus < 0:
            raise InvalidArgumentError("num_cpus/num_gpus", (num_cpus, num_gpus), "must be >= 0")
        self.address = address
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.init_kwargs = dict(init_kwargs or {})
        self._task = None

    def _ensure(self) -> None:
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False,
                      "configure_logging": False, **self.init_kwargs}
            if self.address is not None:
                kwargs["address"] = self.address
            else:
                kwargs.setdefault("_node_ip_address", "127.0.0.1")  # a local instance stays local
            ray.init(**kwargs)
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
            if (module is None or path is None or name == "__main__" or name in _SHIPPED
                    or name.split(".")[0] == "privguard"
                    or os.path.abspath(path).startswith(installed)):
                continue
            ray.cloudpickle.register_pickle_by_value(module)
            _SHIPPED.add(name)

    def map(self, tasks: Sequence[Task], on_done: Callable[[], None] = lambda: None
            ) -> list[Outcome]:
        """Submit every task, wait for all; a dead worker gives a failed outcome."""
        self._ensure()
        for task in tasks[:1]:
            self._ship_by_value(task[0])
        refs = [self._task.remote(*task) for task in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            try:
                out[index[ref]] = ray.get(ref)
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.TaskCancelledError):
                out[index[ref]] = ("failed", None, None, None)
            on_done()
        return out
