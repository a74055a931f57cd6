"""Every warning discarded while a tuning candidate runs: one process-wide scope; and the
candidate's scope, inside which privguard's own progress bars and log lines are off.

A warning a candidate raises (its own code's, or privguard's from ``attach`` on its
child ledger, naming its σ, q or steps) is output about a candidate that may not win,
and under an "always" filter their number counts K. The tuners' ``run_candidate`` and
the Optuna integration's ``silenced()`` discard them inside :func:`quiet_warnings`.

Scopes nest and overlap across threads: the first to enter saves the warning filters
and ignores everything, the last to leave restores them, under a lock (a
``warnings.catch_warnings`` per scope left them ignored for good when two threads'
scopes overlapped: the second saved the first's silence and restored it last). While
any scope is open every thread's warnings are dropped (erring towards releasing nothing
about a candidate); with context-aware warnings (Python 3.14+) the filters are per scope.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"depth": 0, "kept": None}
# Python >= 3.14 run with context-aware warnings: catch_warnings changes this context's
# filters only, so each scope (each thread) sets its own
CONTEXT_WARNINGS = bool(getattr(sys.flags, "context_aware_warnings", False))


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """Discard every warning for the duration (see the module docstring).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     with quiet_warnings():
        ...         warnings.warn("a candidate's warning")
        >>> caught
        []
    """
    if CONTEXT_WARNINGS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
        return
    with _shared(_state, _ignore_warnings, lambda catcher: catcher.__exit__(None, None, None)):
        yield


def _ignore_warnings() -> Any:
    """Save the warning filters and ignore every warning; the saver, to restore them."""
    catcher = warnings.catch_warnings()
    catcher.__enter__()
    warnings.simplefilter("ignore")
    return catcher


@contextlib.contextmanager
def _shared(state: dict[str, Any], install: Callable[[], Any],
            restore: Callable[[Any], None]) -> Iterator[None]:
    """A process-wide setting for the duration, nested and shared across threads: the first
    scope to enter calls ``install()`` (what it returns is kept), the last to leave calls
    ``restore`` with it, under :data:`_lock`."""
    with _lock:
        if state["depth"] == 0:
            state["kept"] = install()
        state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            state["depth"] -= 1
            if state["depth"] == 0:
                kept, state["kept"] = state["kept"], None
                restore(kept)


_unraisable: dict[str, Any] = {"depth": 0, "kept": None}


def _ignore(_: Any) -> None:
    """An unraisable exception inside a candidate's scope: dropped (see :func:`quiet_unraisable`)."""


@contextlib.contextmanager
def quiet_unraisable() -> Iterator[None]:
    """Drop every "Exception ignored in ..." report (``sys.unraisablehook``) for the duration.

    A candidate's objects are finalised when it is done with: its locals when it raises,
    its artifact when another candidate beats it. A ``__del__`` that raised there had
    Python print "Exception ignored in", the exception's message and traceback, on stderr,
    one report per losing candidate (review rtl). Nested and shared across threads as
    :func:`quiet_warnings` (the hook is process-wide: every thread's reports are dropped
    while a scope is open). An object in a reference cycle is finalised by a later garbage
    collection, wherever that runs: its report is not covered.
    """
    with _shared(_unraisable, _drop_unraisable, _restore_unraisable):
        yield


def _drop_unraisable() -> Any:
    hook, sys.unraisablehook = sys.unraisablehook, _ignore
    return hook


def _restore_unraisable(hook: Any) -> None:
    if sys.unraisablehook is _ignore:  # else someone replaced it meanwhile: theirs
        sys.unraisablehook = hook


#: How many candidates this context is inside (a candidate may run a nested tuner).
_candidates: contextvars.ContextVar[int] = contextvars.ContextVar("privguard_candidates",
                                                                  default=0)


@contextlib.contextmanager
def candidate_scope() -> Iterator[None]:
    """The scope of one candidate (one partition's call, for propose-test): every warning
    and every unraisable exception's report (:func:`quiet_unraisable`) discarded, and
    privguard's own output turned off (:func:`inside_candidate`).

    A candidate that runs a nested tuner drew that tuner's progress bar and logged its
    "charged the tuning bound" line once per candidate: output of privguard's own that
    counts K (review at). The scope is per context (a thread or a Ray worker that runs
    the candidate enters its own).

    Example:
        >>> with candidate_scope():
        ...     inside_candidate()
        True
        >>> inside_candidate()
        False
    """
    token = _candidates.set(_candidates.get() + 1)
    try:
        with quiet_warnings(), quiet_unraisable():
            yield
    finally:
        _candidates.reset(token)


def inside_candidate() -> bool:
    """True while a tuning candidate runs in this context: privguard shows and logs nothing."""
    return _candidates.get() > 0
