"""Task hl: forks, interrupts and failures around a ledger's locks and its prefetch
(docs/theory.md §13, "Locks", "Forks", "Prefetch"). Real threads and ``os.fork``; each
thread is held at a chosen point with events (no sleeps); a child that would wait
forever is killed by its alarm and fails the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._ledger import _fork

STEP = M.SubsampledGaussian(1.0, 0.01)
OTHER = M.SubsampledGaussian(1.1, 0.01)

needs_fork = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.fork")


class AskedLock:
    """A ledger's lock that sets ``asked`` whenever a thread asks for it (the at-fork
    hook, here), then behaves as the lock it wraps."""

    def __init__(self, real, asked):
        self._real, self._asked = real, asked

    def acquire(self, blocking=True, timeout=-1):
        self._asked.set()
        return self._real.acquire(blocking, timeout)

    def release(self):
        self._real.release()

    def _is_owned(self):
        return self._real._is_owned()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def _child(body):
    """Fork; the child runs ``body()`` (its exit code) under a 20 s alarm; the parent
    gets the child's exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.alarm(20)
            code = body()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _charges(ledger):
    """A child's body: one charge of its own, seen in the journal."""
    def body():
        before = len(ledger.history)
        ledger.charge(OTHER)
        return 0 if len(ledger.history) == before + 1 else 3
    return body


@needs_fork
@pytest.mark.parametrize("where", ["memory", "file"])
def test_a_fork_while_a_user_thread_is_inside_a_charge_waits_for_it(tmp_path, where):
    # Before task hl the hook waited only for a prefetch's thread: a user's thread inside a
    # charge (both locks held) at the fork left them held in the child by a thread it does
    # not have, and the child's first charge waited forever (here: killed by its alarm).
    ledger = Ledger(3.0, 1e-5, path=None if where == "memory" else tmp_path / "u.db")
    inside, go = threading.Event(), threading.Event()
    real_apply = ledger._acc.apply

    def gated(*args, **kwargs):
        if threading.current_thread().name == "user":
            inside.set()
            assert go.wait(30)
        return real_apply(*args, **kwargs)

    ledger._acc.apply = gated
    user = threading.Thread(target=ledger.charge, args=(STEP,), name="user")
    user.start()
    assert inside.wait(30)  # the user's thread holds _txn and _lock, inside its transaction
    ledger._txn = AskedLock(ledger._txn, go)  # the hook asking for it lets the thread go on
    pid = _child(_charges(ledger))
    go.set()
    user.join(30)
    assert _exit_code(pid) == 0
    # the user's charge (and the child's, in the shared file)
    assert not user.is_alive() and len(ledger.history) == (1 if where == "memory" else 2)
    ledger.charge(STEP)
    assert ledger._broken is None
    ledger.close()


@needs_fork
def test_a_fork_by_the_thread_inside_a_transaction_takes_its_own_locks(tmp_path):
    # The locks are re-entrant: the forking thread holding them (inside a transaction)
    # takes them at once; the parent does not deadlock, and both sides go on.
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "t.db")
    ledger.charge(STEP)
    with ledger._txn, ledger._lock:
        pid = _child(_charges(ledger))
    assert _exit_code(pid) == 0
    ledger.charge(STEP)
    assert not ledger._txn._is_owned() and not ledger._lock._is_owned()
    ledger.close()


@needs_fork
def test_a_fork_inside_a_listener(tmp_path):
    # A listener is told outside the ledger's locks: a fork there waits for nobody.
    pids, parent = [], os.getpid()

    def forks(event):
        # (the parent only: review rhl, the child's own charge told its copy of this
        # listener, which forked again, each generation racing its child's charge into the
        # shared file: the child saw two charges, not one, now and then, and a chain of a
        # few hundred processes ran on until the budget was spent)
        if not pids and os.getpid() == parent:
            pids.append(_child(_charges(event.ledger)))

    ledger = Ledger(3.0, 1e-5, path=tmp_path / "l.db", listeners=[forks])
    ledger.charge(STEP)
    assert _exit_code(pids[0]) == 0
    ledger.charge(STEP)
    ledger.close()


@needs_fork
def test_a_fork_holding_the_state_lock_alone_breaks_the_childs_copy(tmp_path):
    # The forking thread holds _lock alone; another thread holds _txn and waits for _lock.
    # Waiting for _txn would deadlock the parent (lock order), so the fork goes on, and the
    # child's copy (perhaps half-way through that thread's transaction) refuses everything.
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "s.db")
    ledger.charge(STEP)
    holding = threading.Event()

    def user():
        with ledger._txn:
            holding.set()
            with ledger._lock:
                pass

    def refused():
        try:
            ledger.charge(OTHER)
        except LedgerStateError as exc:
            return 0 if "forked" in str(exc) else 4
        return 3

    with ledger._lock:
        thread = threading.Thread(target=user)
        thread.start()
        assert holding.wait(30)
        pid = _child(refused)
    thread.join(30)
    assert _exit_code(pid) == 0 and not thread.is_alive()
    ledger.charge(STEP)  # the parent's ledger is untouched
    assert ledger._broken is None
    ledger.close()


_INTERRUPTED = textwrap.dedent("""
    import os, signal, sys, threading
    signal.alarm(60)  # a fork that waits forever fails the test
    from privguard import Ledger, mechanisms as M
    real = threading.Thread.start

    def start(self):
        if self.name == "privguard-lease-prefetch":
            raise KeyboardInterrupt  # after _pending was set, before its thread starts
        real(self)

    threading.Thread.start = start
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger(3.0, 1e-5, path=sys.argv[1], prefetch=True)
    try:
        for _ in range(100):
            ledger.charge(step)
    except KeyboardInterrupt:
        pass
    pending = ledger._pending
    assert pending is not None and not pending.done.is_set(), pending
    threading.Thread.start = real
    pid = os.fork()
    if pid == 0:
        os._exit(0 if len(ledger.history) >= 1 and ledger.charge(step) else 2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    for _ in range(40):  # the parent goes on; a transaction drops the prefetch never begun
        ledger.charge(step)
    assert ledger._broken is None and ledger._pending is not pending
    ledger.close()
    print("ok")
""")


@needs_fork
def test_an_interrupt_before_the_prefetch_thread_starts_leaves_nothing_to_wait_for(tmp_path):
    # Before task hl the at-fork hook waited for the prefetch's `done`, which a prefetch
    # whose thread never started never sets: the fork waited forever (here: the alarm).
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED, str(tmp_path / "i.db")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_prefetch_failing_between_memory_and_write_breaks_the_ledger_at_once(tmp_path):
    # Review rsl closed this window on the caller's path only: the prefetch applied its
    # lease to the accounting and then failed before the store's write; the store rolled
    # back, memory stayed one lease ahead, and the ledger went on handing out steps of the
    # current lease until the prefetch was settled. Now it breaks at once (fail closed).
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "p.db", prefetch=True)
    real_apply = ledger._acc.apply

    def fails_after(*args, **kwargs):
        changes = real_apply(*args, **kwargs)
        if threading.current_thread().name == "privguard-lease-prefetch":
            raise RuntimeError("injected after the accounting applied the lease")
        return changes

    ledger._acc.apply = fails_after
    while ledger._pending is None:
        ledger.charge(STEP)
    assert ledger._pending.done.wait(30) and ledger._pending.error is not None
    assert ledger._lease is not None and ledger._lease.left > 0
    assert ledger._broken is not None and "RuntimeError" in ledger._broken
    with pytest.raises(LedgerStateError, match="RuntimeError"):
        ledger.charge(STEP)  # a step of the current lease, under _lock alone


def test_the_hook_is_registered_for_every_ledger(tmp_path):
    memory, stored = Ledger(3.0, 1e-5), Ledger(3.0, 1e-5, path=tmp_path / "r.db")
    assert memory in _fork._LEDGERS and stored in _fork._LEDGERS
    stored.close()


@needs_fork
def test_a_fork_while_another_thread_holds_the_snapshot_lock(tmp_path):
    # Task lo8: privguard._stores._snapshot's lock was not made anew in a forked child. A
    # thread of the parent holding it at the fork (counting a snapshot in or out) left the
    # child's copy held by a thread the child does not have: the child's first snapshot
    # (`privguard report` run in a forked worker) waited forever (here: its alarm).
    from privguard._stores import _snapshot

    path = tmp_path / "s.db"
    Ledger(3.0, 1e-5, path=path).close()
    holding, go = threading.Event(), threading.Event()

    def hold():
        with _snapshot._lock:
            holding.set()
            assert go.wait(30)

    other = threading.Thread(target=hold)
    other.start()
    assert holding.wait(30)

    def body():
        with _snapshot.snapshot(path):
            return 0 if _snapshot.held_path(str(path)) is not None else 3

    pid = _child(body)
    go.set()
    other.join(30)
    assert _exit_code(pid) == 0
    with _snapshot.snapshot(path):  # the parent's lock is its own, released
        assert _snapshot.held_path(str(path)) is not None


@needs_fork
def test_a_forked_child_holds_none_of_its_parents_snapshots(tmp_path):
    # Review rlo8: the child kept the parent's snapshot counts. The parent's thread that
    # held the snapshot is not in the child, and its end unlocks the shared flock (one open
    # file description for both): the child still took the file as held, and a read-only
    # store it opened read it as immutable, with no lock against a writer.
    from privguard._stores import _snapshot

    path = tmp_path / "h.db"
    Ledger(3.0, 1e-5, path=path).close()
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with _snapshot.snapshot(path):
            inside.set()
            assert leave.wait(30)

    other = threading.Thread(target=hold)
    other.start()
    assert inside.wait(30)
    ended_r, ended_w = os.pipe()

    def body():
        os.read(ended_r, 1)  # the parent's snapshot has ended: the flock is gone
        if _snapshot.held_path(str(path)) is not None:
            return 3
        with _snapshot.snapshot(path):  # its own: counted in and out
            if _snapshot.held_path(str(path)) is None:
                return 4
        return 0 if _snapshot.held_path(str(path)) is None else 5

    pid = _child(body)
    leave.set()
    other.join(30)
    os.write(ended_w, b"x")
    os.close(ended_w)
    os.close(ended_r)
    assert _exit_code(pid) == 0
    assert _snapshot.held_path(str(path)) is None
