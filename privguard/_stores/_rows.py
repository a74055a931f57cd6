"""Reading a journal row's numbers back, shared by the stores that keep rows."""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterable, Iterator
from typing import Any

from privguard._errors import LedgerStateError
from privguard._journal import Run


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


def checked_items(store: Any, conn: Any, rows: Iterable[tuple]) -> list[Any]:
    """The whole journal in order (runs, ``[kind, body]`` for fix and event rows), each
    row checked against the digest chain from the genesis.

    ``rows`` are a store's journal rows in order, as (idx, kind, mech, label, pid, count,
    first, last, body, digest); ``store`` supplies ``path``, ``genesis``,
    ``_mechanism``, ``_run_fields`` and ``_entry_digest`` (the SQLite and PostgreSQL
    stores do).
    """
    items: list[Any] = []
    runs, start, prev = 0, 0, str(store.genesis)
    for position, row in enumerate(rows):
        idx, kind, mech_id, label, pid, count, first, last, body, digest = row
        where = f"{store.path}: journal row {idx}"
        if idx != position:
            raise LedgerStateError(f"{where} is out of sequence (row {position} missing)")
        if kind == "run":
            mechanism, mech_digest = store._mechanism(conn, mech_id, where)
            count, first, last, pid = run_numbers(count, first, last, pid, where)
            run = Run(runs, start, count, label, mechanism, first, last, pid)
            fields = store._run_fields(run, mech_digest)
            items.append(run)
            runs, start = runs + 1, start + count
        else:
            fields = [body]
            try:
                items.append([kind, json.loads(body)])
            except (TypeError, ValueError) as exc:
                raise LedgerStateError(f"{where} is unreadable ({exc})") from exc
        if store._entry_digest(prev, idx, kind, fields) != digest:
            raise LedgerStateError(f"{where} fails its digest chain (edited, reordered or "
                                   "corrupted)")
        prev = digest
    return items
