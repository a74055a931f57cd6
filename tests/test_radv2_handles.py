"""Review radv2 of task adv2: the process-wide registry of a stored ledger's handles
(privguard/_stores/_handles.py), which a tuner's hold reaches, and the Optuna trial's checks."""

from __future__ import annotations

import copy
import gc
import os
import pickle
import signal
import threading
import warnings

import pytest
from _tuning_holds import probes_refused, usable_after
from _tuning_holds import try_charge as _charges_seen
from _tuning_holds import tuner as _tuner

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores import _handles

# ---- a copy made before the run

@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copy_made_before_the_run_is_held(tmp_path, how):
    # __setstate__ opened the file as a temporary ledger (registered) and moved its
    # __dict__ into the copy, which was never registered: a copy made before the run
    # (a closure's deep-copied config, a pickled handle for a helper) charged the journal
    # once per candidate, ['tuning', 'leak', 'leak', ...]: K in the journal.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    early = pickle.loads(pickle.dumps(ledger)) if how == "pickle" else copy.deepcopy(ledger)
    probes_refused(ledger, lambda seen: _charges_seen(early, seen))
    usable_after(early)  # the hold ended with the run
    ledger.close()


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_tuner_on_a_copy_holds_the_original(tmp_path, how):
    path = str(tmp_path / "budget.db")
    original = Ledger(epsilon=50.0, delta=1e-5, path=path)
    ledger = pickle.loads(pickle.dumps(original)) if how == "pickle" else copy.deepcopy(original)
    probes_refused(ledger, lambda seen: _charges_seen(original, seen), journal=original)
    original.close()
    ledger.close()


# ---- the registry of a long-lived process

def test_the_registry_forgets_stores_whose_handles_are_gone(tmp_path):
    # A key per store ever opened stayed in _handles for the life of the process (a
    # service opening one ledger per tenant or per experiment grew without bound).
    gc.collect()
    start = len(_handles._handles)
    for i in range(30):
        ledger = Ledger(epsilon=1.0, delta=1e-5, path=str(tmp_path / f"l{i}.db"))
        ledger.close()
        del ledger
        gc.collect()
    keep = Ledger(epsilon=1.0, delta=1e-5, path=str(tmp_path / "kept.db"))
    assert len(_handles._handles) <= start + 1
    assert _handles._handles[keep._store_key]  # a live handle stays known
    keep.close()


# ---- a fork while another thread is inside the registry

needs_fork = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.fork")


@needs_fork
def test_a_child_forked_while_a_thread_holds_the_registry_lock_can_open_a_ledger(tmp_path):
    # A thread inside hold_others/release holds _handles._lock (it waits there for
    # a ledger's state lock, which the at-fork hook holds during a fork). The child has
    # the lock held by a thread it does not have: its first Ledger(path=...) (a DataLoader
    # worker's, a subprocess helper's) waited for ever.
    inside, leave = threading.Event(), threading.Event()

    def in_registry():
        with _handles._lock:
            inside.set()
            leave.wait(60)

    thread = threading.Thread(target=in_registry)
    thread.start()
    assert inside.wait(60)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                signal.alarm(20)
                child = Ledger(epsilon=1.0, delta=1e-5, path=str(tmp_path / "child.db"))
                child.charge(M.Gaussian(100.0))
                child.close()
                code = 0
            finally:
                os._exit(code)
    finally:
        leave.set()
        thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@needs_fork
def test_a_child_forked_inside_a_candidate_stays_held(tmp_path):
    # A DataLoader worker forked by a candidate: the hold is the parent's and the child
    # never releases it, so it refuses the file (fail closed), by its own handle too.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    codes: list = []

    def objective(params, child):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                signal.alarm(20)
                for handle in (ledger, Ledger.open(path)):
                    try:
                        handle.charge(M.Gaussian(100.0), label="leak")
                        code = 2
                    except LedgerStateError:
                        pass
                code = 0 if code == 1 else code
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
        return 1.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _tuner().run(objective, ledger)
    assert codes and set(codes) == {0}
    assert [r.label for r in ledger.history] == ["tuning"]
    ledger.close()


# ---- links and paths: one file, one key

def test_a_symlink_and_a_relative_path_are_the_same_file(tmp_path, monkeypatch):
    # (a hard link's second name is refused by SQLite itself: "disk I/O error")
    path = tmp_path / "budget.db"
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=str(path))
    os.symlink(path, tmp_path / "soft.db")
    monkeypatch.chdir(tmp_path)

    def probe(seen):
        for name in ("soft.db", "budget.db", str(tmp_path / "." / "budget.db")):
            other = Ledger.open(name)
            _charges_seen(other, seen)
            other.close()

    probes_refused(ledger, probe)
    ledger.close()


# ---- server ledgers: the ledger_id is the key

def test_two_handles_of_one_server_ledger_are_held_and_another_ledger_is_not(pg):
    import _pgserver

    srv, db, name = pg
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=srv.url(_pgserver.OWNER, db, name))
    _pgserver.allow_charger(db, name)
    separate = Ledger(epsilon=50.0, delta=1e-5, path=srv.url(_pgserver.OWNER, db, name + "b"))
    separate_seen: list = []

    def probe(seen):
        for url in (srv.url(_pgserver.OWNER, db, name), srv.url(_pgserver.CHARGER, db, name)):
            other = Ledger.open(url)
            _charges_seen(other, seen)
            other.close()
        _charges_seen(separate, separate_seen)

    probes_refused(ledger, probe)
    assert separate_seen and set(separate_seen) == {"charged"}
    ledger.close()
    separate.close()


# ---- a hold that begins while another handle's hold ends

class _HookedLock:
    """A ledger's state lock that runs ``hook()`` once, when armed, before a thread takes it."""

    def __init__(self, real):
        self._real, self.hook = real, None

    def acquire(self, blocking=True, timeout=-1):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
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


def test_a_hold_begun_while_another_ends_holds_the_ending_handle(tmp_path):
    # A's release cleared its hold of the other handles, then set A's own state from what
    # it had read as left in force, outside the registry's lock. C's tuner holding in
    # between found A still held by its own tuner (so did not hold it), and A's release
    # then set A free: C's candidates could charge the file through A, once each.
    path = str(tmp_path / "budget.db")
    a, c = Ledger(epsilon=50.0, delta=1e-5, path=path), Ledger.open(path)
    assert a._hold("A's tuner")
    hooked = a._lock = _HookedLock(a._lock)
    held: list = []

    def c_begins():  # another thread's tuner, at that instant
        # A's release holds the registry (re-entrant: task lo6): C's thread waits for it
        if _handles._lock._is_owned():
            thread = threading.Thread(target=lambda: held.append(c._hold("C's tuner")))
            thread.start()
            held.append(thread)
        else:
            held.append(c._hold("C's tuner"))

    hooked.hook = c_begins
    a._unhold()
    if isinstance(held[0], threading.Thread):
        held.pop(0).join(60)
    assert held == [True]
    with pytest.raises(LedgerStateError, match="C's tuner"):
        a.charge(M.Gaussian(100.0), label="leak")
    c._unhold()
    a.charge(M.Gaussian(100.0), label="after")
    assert [r.label for r in c.history] == ["after"]
    a.close()
    c.close()


# ---- a retarget is a write too

def _retargets_refused(open_url, ledger):
    opened: list = []
    n = [0]

    def objective(params, child):
        n[0] += 1
        try:  # a training helper that "raises the budget" of the file it was given
            other = Ledger(epsilon=50.0 + n[0], delta=1e-5, path=open_url,
                           retarget=f"helper {n[0]}")
            opened.append("retargeted")
            other.close()
        except LedgerStateError as exc:
            assert "held by a privguard tuner" in str(exc)
            opened.append("refused")
        return 1.0

    _tuner().run(objective, ledger)
    assert opened and set(opened) == {"refused"}
    reopened = Ledger.open(open_url)
    assert not reopened.events and reopened.target == (50.0, 1e-5)
    reopened.close()


def test_a_candidate_cannot_retarget_the_held_file(tmp_path):
    # Ledger(path=..., retarget=...) writes a retarget event as it opens, before the new
    # handle is known to the registry: one event per candidate (K and each candidate's
    # time in the journal) and a new target for the file, from inside a candidate.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    _retargets_refused(path, ledger)
    ledger.close()


def test_a_candidate_cannot_retarget_the_held_server_ledger(pg):
    import _pgserver

    srv, db, name = pg
    url = srv.url(_pgserver.OWNER, db, name)
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=url)
    _retargets_refused(url, ledger)
    ledger.close()
