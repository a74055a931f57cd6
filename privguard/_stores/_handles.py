"""Every open handle of a stored ledger in this process, by store: a hold reaches them all.

A tuner holds the ledger it charged its bound to: the ledger refuses every read and
charge while the candidates run (:func:`privguard.tuning._base.held`), since one charge
of it per candidate would count the hidden number of runs K. The hold was a flag of
that one ``Ledger`` object, so a candidate that opened the same file again
(``Ledger.open(path)`` in the objective, or in a training helper it calls) got a
second handle that was not held, and charged the journal once per candidate: the
journal then showed K, and every charge's time (task adv2). Here the handles of one
store (a SQLite file by its ``(st_dev, st_ino)``, a server ledger by its
``ledger_id``) are known process-wide, and a hold of one of them holds every other,
including a handle opened while the hold lasts. Handles in other processes (a Ray
worker, a subprocess) are not reached: the Ray executor refuses an objective that
carries a stored ledger, and a ledger another process opens is that process's.

A handle held through another gets that hold's own reason, a :class:`Through`
string (:func:`hold_others`), so that its release (:func:`release`) clears exactly what
it set: a handle's own hold stays, and so does a hold through another holder still in
force.
A handle held only through another can still be held by a tuner of its own
(``Ledger._hold``), which then outlasts the other's release.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable
from typing import Any

from privguard._errors import LedgerStateError

#: Re-entrant: a garbage collection may run a finaliser (an object's ``__del__`` that opens
#: a ledger: :func:`register`) while this thread holds it, which waited for ever on a plain
#: lock (task lo6). A nested call finds the tables consistent: each write here is whole
#: (a hold is recorded before the handles it reaches are set, a handle added before the
#: hold in force is read for it), and a ledger's state lock (``_set``) is re-entrant too;
#: the loops here run over copies that a nested call cannot break (:func:`_forget_gone`,
#: :func:`_live`: review rlo6).
_lock = threading.RLock()
#: store key -> the live handles (Ledger objects) of that store in this process
_handles: dict[Hashable, weakref.WeakSet[Any]] = {}
#: store key -> {id(holder): the reason the other handles refuse with}, in hold order
_holds: dict[Hashable, dict[int, str]] = {}


class Through(str):
    """The reason a handle refuses while another handle of its store is held."""


def store_key(store: Any) -> Hashable | None:
    """The identity of ``store``'s journal in this process, or None (in memory, unknown).

    A SQLite file by ``(st_dev, st_ino)`` (a second path or a link to it is the same
    file), a server ledger by its ``ledger_id``.
    """
    identity = getattr(store, "_identity", None)
    if identity is not None:
        return ("file", *identity)
    ledger_id = getattr(store, "ledger_id", None)
    if isinstance(ledger_id, str) and ledger_id:
        return ("server", ledger_id)
    return None


def refuse_if_held(store: Any) -> None:
    """Raise :class:`LedgerStateError` if ``store``'s journal is held in this process.

    For a write a store makes as it opens, before its ledger is a known handle: a
    retarget (``Ledger(path=..., retarget=...)``) in a candidate wrote one event per
    candidate, and a new target for the held ledger (review radv2).
    """
    key = store_key(store)
    if key is None:
        return
    with _lock:
        reason = _in_force(key)
    if reason is not None:
        raise LedgerStateError(f"ledger refuses a retarget for now: {reason}")


def register(ledger: Any) -> None:
    """Know ``ledger`` (just opened, or just unpickled) as a handle of its store; held now
    if the store is.

    The key is kept on the ledger (``_store_key``), so that a release finds it after the
    store was closed (a candidate may close the ledger it captured while it is held). A
    ledger that arrives with a hold through another handle (an unpickled copy takes its
    temporary ledger's state) gets the hold in force now: none if it ended meanwhile.
    Stores none of whose handles is alive any more are forgotten here (review radv2: a
    key per store ever opened stayed for the life of the process).
    """
    key = ledger._store_key = store_key(ledger._store)
    if key is None:
        return
    with _lock:
        _forget_gone()
        _handles.setdefault(key, weakref.WeakSet()).add(ledger)
        now = _in_force(key)
        ledger._born_under = now  # it may close under this hold (Ledger.close, task lo6)
        was = ledger._held
        if was is None or isinstance(was, Through):
            _set(ledger, was, now)


def hold_others(holder: Any, reason: str) -> None:
    """Hold every other handle of ``holder``'s store (now and opened later) with ``reason``."""
    key = getattr(holder, "_store_key", None)
    if key is None:
        return
    text = Through(f"{reason} (through another handle of the same ledger in this process)")
    with _lock:
        _holds.setdefault(key, {})[id(holder)] = text
        for other in _live(key):
            if other is not holder:
                _set(other, None, text)


def release(holder: Any) -> None:
    """End ``holder``'s own hold and what :func:`hold_others` set for it; another holder's
    hold stays, and ``holder`` refuses with it from now on.

    ``holder``'s own state is set under ``_lock`` too (review radv2: set after it, from what
    was read as left in force, a hold another handle's tuner began in between, which found
    ``holder`` held by its own tuner and so left it alone, was undone for ``holder``, and
    that tuner's candidates could charge the file through it).
    """
    key = getattr(holder, "_store_key", None)
    if key is None:
        _set(holder, holder._held, None)
        return
    with _lock:
        reasons = _holds.get(key)
        text = None if reasons is None else reasons.pop(id(holder), None)
        left = _in_force(key)
        if reasons is not None and not reasons:
            del _holds[key]
        if text is not None:
            for other in _live(key):
                if other is not holder:
                    _set(other, text, left)
        _set(holder, holder._held, left)


def _forget_gone() -> None:
    """Forget the stores none of whose handles is alive and none held; under ``_lock``.

    Each store is checked as it is deleted, over a copy of the keys: a finaliser that a
    garbage collection runs in this thread between two deletions (``_lock`` is re-entrant)
    may register a handle of a store listed as gone, and deleting that store's set from a
    list made before dropped the handle from the registry, where no later hold reached it
    (review rlo6: fail open); iterating the dict itself raised RuntimeError (changed
    during iteration) out of ``Ledger.open``."""
    for key in list(_handles):  # copied in C: no finaliser runs inside
        handles = _handles.get(key)
        if handles is not None and not handles and key not in _holds:
            del _handles[key]


def _live(key: Hashable) -> list[Any]:
    """The live handles of ``key``'s store, as a list; under ``_lock``.

    Copying a WeakSet iterates it in Python: a finaliser that a garbage collection runs in
    this thread meanwhile (``_lock`` is re-entrant) and that opens a ledger of the same
    store adds to it, and the copy raises RuntimeError (the set changed size during
    iteration; review rlo6: it escaped a tuner's ``run`` and left the ledger held). Such a
    registration is whole when the copy is retried, and one made while the caller's loop
    runs found the tables as the caller left them (the hold recorded first, or released).
    """
    while True:
        try:
            return list(_handles.get(key, ()))
        except RuntimeError:  # changed by a finaliser's register() mid-copy: copy again
            continue


def _in_force(key: Hashable) -> str | None:
    """The hold in force for ``key``'s store (the first still held), or None; under ``_lock``."""
    reasons = _holds.get(key)
    return next(iter(reasons.values()), None) if reasons else None


def _set(ledger: Any, was: str | None, now: str | None) -> None:
    """``ledger._held = now`` if it is ``was`` (None: not held), under its state lock."""
    with ledger._lock:
        if ledger._held is was:
            ledger._held = now


def _after_fork_in_child() -> None:
    """A fresh lock in a forked child: a thread of the parent inside :func:`hold_others` or
    :func:`release` at the fork (waiting there for a ledger's state lock, which the
    at-fork hook holds) left ``_lock`` held by a thread the child does not have, and the
    child's first ``Ledger(path=...)`` waited for ever (review radv2). Every hold in force
    is applied again to every handle, so that one such call cut short by the fork leaves
    no handle of a held store unheld (fail closed; the child never releases a parent's
    hold: its tuner's thread is the parent's).
    """
    global _lock
    _lock = threading.RLock()
    for key in _holds:
        now = _in_force(key)
        for ledger in _live(key):
            if now is not None and ledger._held is None:
                ledger._held = now  # the child's ledger locks are its own (the at-fork hook)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
