"""Reading a journal row's numbers back, shared by the stores that keep rows."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

from privguard._errors import LedgerStateError


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector over a bulk replay, then restore it.

    A replay makes no reference cycles (reference counting frees everything
    it drops), but it keeps a growing list of runs, and the collector's
    passes over it cost about 7% of ``privguard verify`` on 10⁵ rows
    (benchmarks/journal_scale.py). Process-wide, like any ``gc.disable()``.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_numbers(count: Any, first: Any, last: Any, pid: Any, where: str
                ) -> tuple[int, float, float, int]:
    """A run row's (count, first time, last time, pid) as read back.

    An edit that leaves them unreadable (SQLite keeps text in a numeric column;
    a PostgreSQL superuser can write NULL) fails closed with LedgerStateError.
    """
    try:
        return int(count), float(first), float(last), int(pid)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LedgerStateError(f"{where} is unreadable ({exc})") from None
