"""A fork between two transactions: every ledger's locks are taken around ``os.fork``.

A child process has only the thread that forked. A ledger lock held at the fork by
another thread (a user's thread inside a charge, a prefetch's commit) stays held in the
child by a thread it does not have, and the child's first charge waits for it forever.
As CPython does for its own locks, the forking thread takes every ledger's transaction
lock ``_txn`` and then its state lock ``_lock`` (the ledgers' lock order, docs/theory.md
§13 "Locks") before the fork, so the fork falls between two transactions of every other
thread, and lets them go after it, in the parent and in the child (where it is the
owner). Both are re-entrant: a fork by a thread that holds them (in a transaction) takes
them at once. A thread that holds a ledger lock at the fork only *tries* the others' (a
thread that holds ``_lock`` alone never waits for ``_txn``, the lock order; waiting while
holding one could close a cycle with another thread, its hook included): a ledger it
could not take, and any ledger whose two locks the forking thread did not take (the hook
failed or was interrupted, the ledger was made meanwhile), is broken in the child (it
refuses everything: fail closed) with fresh locks, as its copy may be half-way through
another thread's transaction. Each forking thread keeps its own record, and every hook
takes the ledgers in one order (review rhl: two threads forking at once deadlocked).

The child also drops the parent's leases (Lemma 1: a lease lives in one process;
comparing pids alone fails when a pid is reused) and its prefetch, whose thread it does
not have, and lets go of every SQLite connection and flock descriptor its ledgers
inherited (``SQLiteStore.forked``, review sq) and every PostgreSQL connection
(``PostgresStore.forked``, review pgf): the next transaction opens its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any

from privguard._stores import _devnull, _lockfds, _sqlite

#: Every ledger of this process (in memory or not: each has both locks).
_LEDGERS: weakref.WeakSet[Any] = weakref.WeakSet()
#: During a fork, the forking thread's own record (review rhl: two threads forking at once
#: shared one list, the second cleared the first's, and the first's locks were never let
#: go: the second thread, and every later charge, waited forever): ``taken``, the locks it
#: took, in order; ``whole``, the ledgers whose two locks it took (the child breaks every
#: other ledger it has).
_FORKING = threading.local()

BROKEN_BY_FORK = ("this process was forked without the ledger's locks (another thread of "
                  "its parent held its transaction lock, or the at-fork hook was "
                  "interrupted): the copy may be half-way through a transaction; reopen "
                  "the ledger in the child")


def track(ledger: Any) -> None:
    """Take ``ledger``'s locks around every fork of this process, and drop its lease in
    the child."""
    _LEDGERS.add(ledger)


def _ledgers() -> list[Any]:
    """The ledgers, in one order for every forking thread (two hooks taking them in two
    orders would deadlock); ledgers that share their locks (a pickled copy and the ledger
    it was loaded into) side by side."""
    for _ in range(100):
        try:
            ledgers = list(_LEDGERS)
        except RuntimeError:  # another thread tracked a ledger meanwhile: again
            continue
        return sorted(ledgers, key=lambda ledger: id(ledger._txn))
    return []  # (none taken: the child breaks every ledger it has)


def _before() -> None:
    taken: list[Any] = []
    whole: dict[int, Any] = {}
    _FORKING.taken, _FORKING.whole = taken, whole
    ledgers = _ledgers()
    # A thread that holds a ledger lock (a fork inside a transaction, or with _lock alone)
    # only tries the others: waiting for one while holding another could close a cycle
    # (with a thread inside a transaction waiting for that _lock, or with another
    # thread's hook). Missed, a ledger is broken in the child.
    holds = any(ledger._txn._is_owned() or ledger._lock._is_owned() for ledger in ledgers)
    for ledger in ledgers:
        txn, lock = ledger._txn, ledger._lock
        if holds and not txn._is_owned():
            if not txn.acquire(blocking=False):
                continue
        else:
            txn.acquire()
        taken.append(txn)
        if not lock.acquire(blocking=not holds):
            continue
        taken.append(lock)
        whole[id(ledger)] = ledger


def _release() -> None:
    taken = getattr(_FORKING, "taken", [])
    while taken:
        taken.pop().release()


def _after_in_parent() -> None:
    _release()
    _FORKING.whole = {}


def _after_in_child() -> None:
    _release()  # this thread owns them here as in the parent
    whole = getattr(_FORKING, "whole", {})
    _FORKING.whole = {}
    kept = len(_sqlite.INHERITED)
    for ledger in list(_LEDGERS):
        if whole.get(id(ledger)) is not ledger:
            # Its locks were not this thread's at the fork (another thread may hold them
            # here, for ever): fresh locks, and it refuses everything (fail closed)
            ledger._txn, ledger._lock = threading.RLock(), threading.RLock()
            ledger._break(BROKEN_BY_FORK)
        ledger._lease = None
        ledger._next = None  # a prefetched lease is the parent's, as its lease is
        ledger._pending = None  # its thread is the parent's
        forked = getattr(getattr(ledger, "_store", None), "forked", None)
        if forked is not None:  # the parent's SQLite or psycopg connection: never used
            # here (reviews sq, pgf)
            forked(idle=whole.get(id(ledger)) is ledger)
    _sqlite.INHERITED.extend(_lockfds.forked())
    # The flock descriptors just inherited share their lock with the parent's (one open
    # file description): a child holding one kept a killed parent's flock held for as
    # long as it lived, and every other process's charge waited for it (review pgf).
    # Pointed at /dev/null, the child lets go of the description and of nothing else:
    # it holds no POSIX lock yet (none crosses a fork) that closing a descriptor of the
    # file could drop, and the number stays taken, never reused for another file.
    for fd in _sqlite.INHERITED[kept:]:
        if isinstance(fd, int):
            with contextlib.suppress(OSError):
                _devnull.over(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent,
                        after_in_child=_after_in_child)


__all__ = ["BROKEN_BY_FORK", "track"]
