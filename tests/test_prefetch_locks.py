"""Leased steps while a prefetch's transaction is in flight (task pl, issue 26;
docs/theory.md §13 "Prefetch", "Locks"): the prefetch holds the ledger's transaction lock
across its commit and the state lock only for an instant, so a step of the current lease
goes on meanwhile; everything that needs the store (a lease used up, a mechanism change,
a read, a hold, close, a fork) waits for the commit and then sees its result. Each test
holds the prefetch in flight with the ``gate`` fixture (events, no sleeps)."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import test_lease_check
import test_lease_prefetch

from privguard import BudgetExhausted, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting import _lease

STEP = M.SubsampledGaussian(1.0, 0.01)
OTHER = M.SubsampledGaussian(1.1, 0.01)
gate = test_lease_prefetch.gate  # the fixture: a prefetch held in flight, deterministically


def _in_flight(ledger, entered):
    """Charge ``ledger`` until a prefetch is in flight (held at the gate); the steps
    released."""
    released = 0
    while ledger._pending is None:
        ledger.charge(STEP)
        released += 1
    assert entered.wait(30) and ledger._lease.left > 0
    return released


def _in_thread(fn, name=None):
    """Run ``fn`` in a thread (named ``name``): (thread, result list, finished event)."""
    out, finished = [], threading.Event()

    def body():
        try:
            out.append(("ok", fn()))
        except BaseException as exc:  # handed to the test
            out.append(("raised", exc))
        finally:
            finished.set()

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return thread, out, finished


def test_the_whole_lease_is_handed_out_while_the_prefetch_is_in_flight(tmp_path, gate):
    # Every remaining step of the current lease, while the commit waits on the gate (before
    # task pl each step waited for the whole transaction: this deadlocked until the gate's
    # own 30 s timeout broke the prefetch). Then the step that needs a lease waits for the
    # commit and goes on from the prefetched lease: no new lease, nothing abandoned, and a
    # read in another thread sees the committed lease.
    entered, go = gate
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "a.db", prefetch=True)
    released = _in_flight(ledger, entered)
    lease = ledger._lease
    last = None
    for _ in range(lease.left):
        last = ledger.charge(STEP).index
        released += 1
    assert lease.left == 0 and ledger._pending is not None and not ledger._pending.done.is_set()
    stepper, out, finished = _in_thread(lambda: ledger.charge(STEP))
    reader, seen, _ = _in_thread(lambda: len(ledger.history))
    go.set()
    stepper.join(30)
    reader.join(30)
    assert finished.is_set() and out[0][0] == "ok", out
    assert out[0][1].index == last + 1  # the prefetched lease's first step
    released += 1
    # the read waited for the commit and saw the prefetched lease spent (the step above
    # is one of its steps)
    assert seen[0][0] == "ok" and seen[0][1] >= out[0][1].index + 1
    assert ledger._lease is not lease  # the prefetched lease took over
    assert not [e for e in ledger.events if e["event"] == _lease.UNUSED]
    ledger.close()
    test_lease_prefetch._journal_balances(tmp_path / "a.db", released)


def test_a_refused_prefetch_while_steps_go_on(tmp_path, gate):
    # Another process spends the budget while the prefetch is in flight: the prefetch is
    # refused (nothing committed), the current lease's steps (spent before) are handed
    # out (the file changed: the first one syncs, so it waits for the commit), and the
    # step after the lease is refused as lease=1 would be.
    entered, go = gate
    path = tmp_path / "r.db"
    ledger = Ledger(1.5, 1e-5, path=path, prefetch=True)
    _in_flight(ledger, entered)
    left = ledger._lease.left
    other = Ledger.open(path, lease=1)
    test_lease_prefetch._until_refused(other, STEP)
    spent = len(other.history)
    other.close()
    pending = ledger._pending
    stepper, out, _ = _in_thread(lambda: [ledger.charge(STEP) for _ in range(left)])
    go.set()
    stepper.join(30)
    assert out and out[0][0] == "ok", out
    assert pending.done.is_set() and pending.lease is None and pending.error is None
    with pytest.raises(BudgetExhausted):
        ledger.charge(STEP)
    ledger.close()
    assert len(Ledger.open(path, lease=1).history) == spent  # the prefetch wrote nothing


def test_a_prefetch_that_fails_while_steps_go_on_breaks_the_ledger(tmp_path, gate,
                                                                   monkeypatch):
    # A step handed out while the prefetch is in flight, then the prefetch fails: the
    # ledger breaks, the next step is refused (it is not handed out from the current
    # lease), and nothing of the prefetch is in the file.
    entered, go = gate
    path = tmp_path / "b.db"
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=True)
    _in_flight(ledger, entered)
    ledger.charge(STEP)  # in flight: from the lease
    charges = ledger._acc.journal.charges

    def boom(*args, **kwargs):
        raise LedgerStateError("injected")

    monkeypatch.setattr(Ledger, "_grown", boom)
    left = ledger._lease.left
    go.set()
    assert ledger._pending.done.wait(30)
    monkeypatch.undo()
    with pytest.raises(LedgerStateError, match="injected"):
        ledger.charge(STEP)
    assert ledger._lease.left == left
    ledger.close()
    assert len(Ledger.open(path, lease=1).history) == charges


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_a_foreign_edit_while_the_prefetch_is_in_flight_is_refused(tmp_path, gate,
                                                                   monkeypatch, mode):
    # The leased step's check (theory §13) while the prefetch is in flight: the head is
    # edited in the file (checkpointed into the main file in WAL mode); the step sees the
    # file changed, waits for the prefetch (lock order) and syncs, which refuses: nothing
    # is handed out, the ledger stays closed. Neither the prefetch's commit nor its being
    # in flight lets the edit through.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    entered, go = gate
    path = tmp_path / "e.db"
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=True)
    _in_flight(ledger, entered)
    lease = ledger._lease
    left = lease.left
    test_lease_check._next_tick(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE head SET last_count = last_count - 1")
    conn.commit()
    if mode == "wal":
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    changed = threading.Event()
    store, real = ledger._store, ledger._store.check_lease

    def check():
        unchanged = real()
        if not unchanged:
            changed.set()
        return unchanged

    monkeypatch.setattr(store, "check_lease", check)
    ledger._check_lease = check
    stepper, out, _ = _in_thread(lambda: ledger.charge(STEP))
    assert changed.wait(30)  # the step saw the change while the prefetch was in flight
    go.set()
    stepper.join(30)
    assert out and out[0][0] == "raised" and isinstance(out[0][1], LedgerStateError), out
    assert "head" in str(out[0][1])
    assert lease.left == left
    with pytest.raises(LedgerStateError):
        ledger.charge(STEP)
    ledger.close()


def test_a_hold_waits_for_the_prefetch_and_then_refuses_every_step(tmp_path, gate):
    # _hold (a tuner) while the prefetch is in flight: it waits for the commit; held, no
    # step of either lease is handed out; unheld, they are, in order.
    entered, go = gate
    path = tmp_path / "h.db"
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=True)
    released = _in_flight(ledger, entered)
    ledger.charge(STEP)  # in flight: from the lease
    released += 1
    holder, out, _ = _in_thread(lambda: ledger._hold("a tuner"))
    go.set()
    holder.join(30)
    assert out == [("ok", True)] and ledger._pending.done.is_set()
    index = ledger._lease.next_index
    with pytest.raises(LedgerStateError, match="a tuner"):
        ledger.charge(STEP)
    with pytest.raises(LedgerStateError, match="a tuner"):
        ledger.can_afford(STEP)
    ledger._unhold()
    for i in range(40):  # the current lease, then the prefetched one
        assert ledger.charge(STEP).index == index + i
        released += 1
    ledger.close()
    test_lease_prefetch._journal_balances(path, released)


def test_can_afford_while_the_prefetch_is_in_flight(tmp_path, gate):
    # can_afford of the leased step answers from the lease while the commit is in flight
    # (it leaves the prefetch alone); of another mechanism it needs the journal: it waits.
    entered, go = gate
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "c.db", prefetch=True)
    _in_flight(ledger, entered)
    assert ledger.can_afford(STEP)
    assert not ledger._pending.done.is_set()
    asker, out, _ = _in_thread(lambda: ledger.can_afford(OTHER))
    go.set()
    asker.join(30)
    assert out == [("ok", True)]
    assert ledger._next is not None  # settled: the prefetched lease is installed
    ledger.close()



def test_can_afford_after_the_lease_ran_out_in_flight_answers_from_the_prefetched_lease(
        tmp_path, gate):
    # The current lease used up while the prefetch is in flight: can_afford waits for the
    # commit and answers from the prefetched lease, which then takes over (as the charge
    # that follows would), instead of a decision that ignores steps already spent.
    entered, go = gate
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "n.db", prefetch=True)
    _in_flight(ledger, entered)
    for _ in range(ledger._lease.left):
        ledger.charge(STEP)
    asker, out, _ = _in_thread(lambda: ledger.can_afford(STEP))
    go.set()
    asker.join(30)
    assert out == [("ok", True)]
    assert ledger._next is None and ledger._lease.left > 0  # the prefetched lease
    ledger.close()
