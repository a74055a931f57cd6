"""The registry of handles (``_stores/_handles``) when a garbage collection runs a finaliser
that opens a ledger in the middle of one of its loops (review rlo6).

Task lo6 made the registry's lock re-entrant, so such a finaliser no longer waits for ever;
it then registers its handle while the outer call is still looping over the registry.
Copying a store's WeakSet while the finaliser added to it raised RuntimeError out of a
tuner's ``run`` (the ledger left held, and unclosable); and the sweep of stores with no
live handle, from a list made before the finaliser re-registered one of them, deleted that
store's set with the new handle in it, which no later hold reached (fail open). In CPython
3.12 and later a collection runs wherever the interpreter checks for pending work (a
loop's back edge, a call), whichever thread's allocations asked for it; the tests force
one at those points.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from _tuning_holds import tuner

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores import _handles


@pytest.fixture
def no_automatic_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _arm_finaliser(opened: list, path: str) -> None:
    class Opens:  # in a reference cycle: freed by a collection, which runs __del__
        def __del__(self):
            opened.append(Ledger.open(path))

    obj = Opens()
    obj.me = obj


def test_a_collection_while_a_hold_copies_the_handles(tmp_path, monkeypatch, no_automatic_gc):
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    handles = _handles._handles[ledger._store_key]
    opened: list[Ledger] = []
    _arm_finaliser(opened, path)
    iterate = weakref.WeakSet.__iter__
    armed = [True]

    def collecting(self):  # the store's set: a collection after its first handle
        for item in iterate(self):
            if self is handles and armed[0]:
                armed[0] = False
                gc.collect()
            yield item

    monkeypatch.setattr(weakref.WeakSet, "__iter__", collecting)
    seen: list[str] = []

    def objective(params, child):
        try:
            opened[0].charge(M.Gaussian(100.0), label="leak")
            seen.append("charged")
        except LedgerStateError:
            seen.append("refused")
        return 1.0

    result = tuner().run(objective, ledger)  # RuntimeError: Set changed size during iteration
    monkeypatch.undo()
    assert not armed[0] and len(opened) == 1  # the finaliser ran inside the hold's copy
    assert result.selected and set(seen) == {"refused"}
    assert [r.label for r in ledger.history] == ["tuning"]
    opened[0].close()
    ledger.close()  # released: it closes


def test_a_collection_between_two_forgotten_stores(tmp_path, monkeypatch, no_automatic_gc):
    # Stores x and a each had a handle, now gone: the next open (of b) forgets both. A collection
    # between the two deletions runs a finaliser that opens a again: its handle must stay
    # known, so that a hold of a reaches it.
    class Collecting(dict):
        armed = True

        def __delitem__(self, key):
            super().__delitem__(key)
            if Collecting.armed:  # (the loop's back edge after the first deletion)
                Collecting.armed = False
                gc.collect()

    monkeypatch.setattr(_handles, "_handles", Collecting())
    x, a, b = (str(tmp_path / f"{n}.db") for n in "xab")
    kept = Ledger(epsilon=50.0, delta=1e-5, path=b)  # b's set stays
    first = [Ledger(epsilon=50.0, delta=1e-5, path=path) for path in (x, a)]
    for ledger in first:
        ledger.close()
    del first, ledger
    gc.collect()  # their handles are gone; the sets stay until the next open
    assert [len(h) for h in _handles._handles.values()] == [1, 0, 0]
    assert Collecting.armed
    opened: list[Ledger] = []
    _arm_finaliser(opened, a)
    other = Ledger.open(b)  # forgets x, then a: the finaliser runs in between
    assert not Collecting.armed and len(opened) == 1
    holder = Ledger.open(a)
    assert holder._hold("a tuner")
    try:
        with pytest.raises(LedgerStateError, match="a tuner"):
            opened[0].charge(M.Gaussian(100.0), label="leak")  # charged: not held
    finally:
        holder._unhold()
    assert len(holder.history) == 0
    for ledger in (opened[0], holder, other, kept):
        ledger.close()


def test_an_interrupt_while_the_hold_begins_leaves_the_ledger_closable(tmp_path, monkeypatch):
    # A KeyboardInterrupt (or the RuntimeError above) inside hold_others left the tuner's
    # own hold set and never released (held() releases only a hold _hold returned), and
    # since task lo6 a held ledger refuses close(): it stayed held and unclosable.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    before = Ledger.open(path)
    hold_others = _handles.hold_others

    def interrupted(holder, reason):
        hold_others(holder, reason)
        raise KeyboardInterrupt

    monkeypatch.setattr(_handles, "hold_others", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tuner().run(lambda params, child: 1.0, ledger)
    monkeypatch.undo()
    assert ledger._held is None and before._held is None  # released: nothing held
    before.charge(M.Gaussian(100.0), label="after")
    assert [r.label for r in ledger.history] == ["tuning", "after"]
    before.close()
    ledger.close()
