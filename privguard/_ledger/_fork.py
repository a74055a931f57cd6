"""A fork between two transactions: every ledger's locks are taken around ``os.fork``.

A child process has only the thread that forked. A ledger lock held at the fork by
another thread (a user's thread inside a charge, a prefetch's commit) stays held in the
child by a thread it does not have, and the child's first charge waits for it forever.
As CPython does for its own locks, the forking thread takes every ledger's transaction
lock ``_txn`` and then its state lock ``_lock`` (the ledgers' lock order, docs/theory.md
§13 "Locks") before the fork, so the fork falls between two transactions of every other
thread, and lets them go after it, in the parent and in the child (where it is the
owner). Both are re-entrant: a fork by a thread that holds them (in a transaction) takes
them at once. A thread that holds ``_lock`` alone never waits for ``_txn`` (lock order):
if another thread holds that ledger's ``_txn``, the fork goes on without it and the
child's copy of that ledger, perhaps half-way through that thread's transaction, is
broken (it refuses everything: fail closed) with fresh locks.

The child also drops the parent's leases (Lemma 1: a lease lives in one process;
comparing pids alone fails when a pid is reused) and its prefetch, whose thread it does
not have.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

#: Every ledger of this process (in memory or not: each has both locks).
_LEDGERS: weakref.WeakSet[Any] = weakref.WeakSet()
#: During a fork: the locks the forking thread took, in order, and the ledgers whose
#: locks it could not all take (another thread may hold them in the child's copy).
_TAKEN: list[Any] = []
_MISSED: list[Any] = []

BROKEN_BY_FORK = ("this process was forked without the ledger's locks (another thread of "
                  "its parent held its transaction lock, or the at-fork hook was "
                  "interrupted): the copy may be half-way through a transaction; reopen "
                  "the ledger in the child")


def track(ledger: Any) -> None:
    """Take ``ledger``'s locks around every fork of this process, and drop its lease in
    the child."""
    _LEDGERS.add(ledger)


def _before() -> None:
    _TAKEN.clear()
    # Each ledger is missed until both of its locks are this thread's (an exception here,
    # an interrupt, leaves the rest missed: CPython reports it and forks all the same)
    _MISSED[:] = list(_LEDGERS)
    for i, ledger in enumerate(_MISSED):
        txn, lock = ledger._txn, ledger._lock
        if lock._is_owned() and not txn._is_owned():
            # Waiting for _txn while holding _lock would take them out of order (a
            # thread inside a transaction may be waiting for this _lock): try only.
            if not txn.acquire(blocking=False):
                continue
        else:
            txn.acquire()
        _TAKEN.append(txn)
        lock.acquire()
        _TAKEN.append(lock)
        _MISSED[i] = None


def _release() -> None:
    while _TAKEN:
        _TAKEN.pop().release()


def _after_in_parent() -> None:
    _release()
    _MISSED.clear()


def _after_in_child() -> None:
    _release()  # this thread owns them here as in the parent
    for ledger in _MISSED:
        if ledger is not None:
            ledger._txn, ledger._lock = threading.RLock(), threading.RLock()
            ledger._break(BROKEN_BY_FORK)
    _MISSED.clear()
    for ledger in list(_LEDGERS):
        ledger._lease = None
        ledger._next = None  # a prefetched lease is the parent's, as its lease is
        ledger._pending = None  # its thread is the parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent,
                        after_in_child=_after_in_child)


__all__ = ["BROKEN_BY_FORK", "track"]
