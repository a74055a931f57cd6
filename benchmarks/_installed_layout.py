"""A checkout's package laid out as the wheel installs it, for a benchmark's subprocess.

The wheel maps the top-level ``integrations/`` folder onto ``privguard.integrations``
(pyproject's ``package-dir``). A checkout put first on ``PYTHONPATH`` as it is lacks that
subpackage: only an editable install of some checkout supplied it (review rhk for
``attach_overhead.py --against``; CI62 for ``quickstart_cost.py --against``, which
imported the checkout's bare ``privguard/`` and failed on the installed wheel).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any


def as_installed(checkout: str, into: str) -> str:
    """A folder to put first on ``PYTHONPATH`` (and to run in) whose ``privguard`` is
    ``checkout``'s, with its ``integrations/`` as ``privguard.integrations``.

    Raises:
        RuntimeError: ``checkout`` has no ``privguard/`` or no ``integrations/`` folder.
    """
    parts = [os.path.join(checkout, name) for name in ("privguard", "integrations")]
    if not all(os.path.isdir(p) for p in parts):
        raise RuntimeError(f"{checkout}: failed: no privguard/ and integrations/ folders "
                           "to import a package from")
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(parts[0], os.path.join(into, "privguard"), ignore=skip)
    shutil.copytree(parts[1], os.path.join(into, "privguard", "integrations"), ignore=skip)
    return into


def library_env(library: str) -> dict[str, str]:
    """This process's environment with ``library`` (an :func:`as_installed` folder) first on
    ``PYTHONPATH``, for a worker that must import that library's ``privguard``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [library, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def require_library(library: str) -> None:
    """In a worker: exit at once, naming what it imported, unless its ``privguard`` and
    ``privguard.integrations.opacus`` are ``library``'s (review rhk: a worker that imported
    an installed release printed its times as the library's)."""
    import sys

    import privguard
    import privguard.integrations.opacus as opacus_integration

    inside = os.path.realpath(os.path.join(library, "privguard")) + os.sep
    for module in (privguard, opacus_integration):
        if not os.path.realpath(module.__file__ or "").startswith(inside):
            sys.exit(f"worker: {module.__name__} imported from {module.__file__}, not from "
                     f"{inside}: the timing would not be of that library")


def ask(worker: Any, name: str, request: str) -> str:
    """Send one request line to a worker process and return its one answer line.

    Raises:
        SystemExit: the worker stopped (its own error is on stderr above).
    """
    assert worker.stdin is not None and worker.stdout is not None
    answer = ""
    with contextlib.suppress(BrokenPipeError):  # a worker that exited
        worker.stdin.write(f"{request}\n")
        worker.stdin.flush()
        answer = worker.stdout.readline()
    if not answer:
        raise SystemExit(f"the worker of {name} stopped (its error above)")
    return str(answer)


def close(workers: Any) -> None:
    """Close each worker's requests and wait for it to exit."""
    for worker in workers:
        assert worker.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            worker.stdin.close()
        worker.wait()
