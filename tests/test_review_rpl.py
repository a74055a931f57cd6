"""Review rpl of task pl (two locks: ``_txn`` before ``_lock``; docs/theory.md §13
"Locks"). Each test holds a thread at a chosen point with events (no sleeps)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from test_fork_locks import AskedLock
from test_prefetch_locks import _in_thread

from privguard import Ledger
from privguard import mechanisms as M
from privguard._ledger import _prefetch

STEP = M.SubsampledGaussian(1.0, 0.01)


class _GatedMutex:
    """A Prefetch's ``_mutex`` whose acquisition by ``thread_name`` signals ``entered``
    and waits for ``go`` (that thread then holds the ledger's ``_txn``)."""

    def __init__(self, thread_name, entered, go):
        self._real = threading.Lock()
        self._name, self._entered, self._go = thread_name, entered, go

    def __enter__(self):
        if threading.current_thread().name == self._name:
            self._entered.set()
            assert self._go.wait(30)
        return self._real.__enter__()

    def __exit__(self, *exc):
        return self._real.__exit__(*exc)


def test_fork_while_a_cancelled_prefetch_holds_the_transaction_lock(tmp_path, monkeypatch):
    # A prefetch cancelled before it began (a read took _txn first and settled it) still
    # has a thread: it takes _txn to find it was cancelled. A fork in that instant copied
    # _txn held by a thread the child does not have: the at-fork hook waited only for
    # ledger._pending, which the settle had already dropped, and the child's first
    # transaction then waited forever (here: killed by its alarm).
    kept = []
    monkeypatch.setattr(_prefetch.Prefetch, "start",
                        lambda self, lock, body: kept.append((self, lock, body)))
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "k.db", prefetch=True)
    while not kept:
        ledger.charge(STEP)
    pending, lock, body = kept[0]
    ledger.epsilon()  # a read: _txn, settles the prefetch not begun (cancelled)
    assert ledger._pending is None and pending.cancelled
    entered, go = threading.Event(), threading.Event()
    pending._mutex = _GatedMutex("cancelled-prefetch", entered, go)
    thread = threading.Thread(target=pending.run, args=(lock, body),
                              name="cancelled-prefetch")
    thread.start()  # as Prefetch.start would have started it
    assert entered.wait(30)  # it holds _txn, about to see it was cancelled
    # The at-fork hook asking for _txn lets the thread go on (task hl: the hook takes every
    # ledger's locks, so it waits for the thread, as it waited for its `done` before)
    ledger._txn = AskedLock(ledger._txn, go)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.alarm(20)
            with ledger._txn:  # what every transaction of the child takes first
                code = 0
        finally:
            os._exit(code)
    go.set()
    thread.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pending.done.is_set() and pending.lease is None  # it committed nothing
    ledger.charge(STEP)
    ledger.close()


def test_a_leased_step_during_a_rollback_journal_commit_waits_for_it(tmp_path, monkeypatch):
    # The docs said a leased step "never waits" for a prefetch's commit. In rollback-journal
    # mode the commit writes the main file, and until the prefetch's thread recorded the
    # file as it left it, a step sees the file changed: it cannot tell that write from
    # another writer's, so it syncs, i.e. waits for the commit (theory §13, "The leased
    # step's check while a prefetch is in flight"). Held here between the COMMIT and that
    # record: the step is handed out only once the prefetch let _txn go.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", "rollback")
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "j.db", prefetch=True)
    store = ledger._store
    real = store._stat_key
    committed, go = threading.Event(), threading.Event()

    def held():
        if threading.current_thread().name == "privguard-lease-prefetch":
            committed.set()
            assert go.wait(30)
        return real()

    monkeypatch.setattr(store, "_stat_key", held)
    while ledger._pending is None:
        ledger.charge(STEP)
    assert committed.wait(30) and ledger._lease.left > 0
    pending = ledger._pending
    asked = threading.Event()

    class Spy:  # the ledger's _txn, telling when the stepping thread asks for it
        def __init__(self, lock):
            self._real = lock

        def __enter__(self):
            if threading.current_thread().name == "stepper":
                asked.set()
            return self._real.__enter__()

        def __exit__(self, *exc):
            return self._real.__exit__(*exc)

        def _is_owned(self):
            return self._real._is_owned()

    monkeypatch.setattr(ledger, "_txn", Spy(ledger._txn))
    stepper, out, finished = _in_thread(lambda: ledger.charge(STEP), "stepper")
    assert asked.wait(30)  # it saw the file changed and waits for the prefetch's _txn
    assert not finished.is_set() and not pending.done.is_set()
    go.set()
    stepper.join(30)
    assert out and out[0][0] == "ok", out
    assert pending.done.is_set() and pending.lease is not None
    ledger.close()


OTHER = M.SubsampledGaussian(1.1, 0.01)


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_threads_charging_one_ledger_with_prefetch_on(tmp_path, monkeypatch, mode):
    # Several threads charge one file ledger (prefetch on): single steps, charge(times=3),
    # a mechanism change now and then, can_afford, reads, a listener that charges, and
    # another ledger of the same file writing meanwhile. Every step is handed out once
    # (the indices each record covers are disjoint), the journal balances (every step this
    # ledger spent is released or recorded unused) and the running ε never goes back.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    _threads_charging(tmp_path / "t.db")


def test_threads_charging_one_server_ledger_with_prefetch_on(pg):
    # The same on the PostgreSQL store (no file check; the connection is the
    # prefetch's and the caller's in turn, under _txn).
    import _pgserver

    srv, db, name = pg
    _threads_charging(srv.url(_pgserver.OWNER, db, name))


def _threads_charging(path):
    ledger = Ledger(80.0, 1e-5, path=path, prefetch=True)
    covered, errors, eps = [], [], []
    mutex, inner, stop = threading.Lock(), threading.local(), threading.Event()

    def keep(record, times):
        with mutex:
            covered.extend(range(record.index - times + 1, record.index + 1))

    def listener(event):
        if event.kind == "charge" and event.record.index % 41 == 0 \
                and not getattr(inner, "on", False):
            inner.on = True
            try:
                keep(ledger.charge(STEP), 1)
            finally:
                inner.on = False

    ledger.add_listener(listener)
    barrier = threading.Barrier(5)

    def worker(k):
        try:
            barrier.wait(30)
            for i in range(120):
                mech = OTHER if k == 3 and i % 40 == 39 else STEP
                times = 3 if k == 2 and i % 5 == 0 else 1
                keep(ledger.charge(mech, times=times), times)
                if k == 1 and i % 4 == 0:
                    ledger.can_afford(mech)
                if k == 0 and i % 10 == 0:
                    eps.append(ledger.epsilon())
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    def foreign():
        other = Ledger.open(path, lease=1)
        try:
            barrier.wait(30)
            while not stop.is_set():
                other.charge(M.SubsampledGaussian(2.0, 0.01), "foreign")
        except BaseException as exc:  # handed to the test
            errors.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    side = threading.Thread(target=foreign)
    for t in [*threads, side]:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    side.join(60)
    assert not errors, errors
    assert len(covered) == len(set(covered))
    assert eps == sorted(eps)
    ledger.close()
    reopened = Ledger.open(path, lease=1)
    mine = sum(r.count for r in reopened.runs if r.label != "foreign")
    assert mine == len(covered) + reopened.leased_unused
    reopened.close()
