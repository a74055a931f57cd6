"""Closing a ledger (issue 26): every normal close records a lease's unused remainder
as a ``lease-unused`` event (it stays spent)."""

from __future__ import annotations

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting import _lease
from privguard._cli._report import report

STEP = M.SubsampledGaussian(1.0, 0.01)


def _leased(path) -> Ledger:
    """A file ledger holding a live lease: 10 steps released, 6 leased and unused."""
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=False)
    for _ in range(10):
        ledger.charge(STEP)
    assert (len(ledger.history), ledger.leased_unused) == (16, 6)
    return ledger


def _recorded(path) -> list[dict]:
    again = Ledger.open(path, read_only=True)
    try:
        assert len(again.history) == 16  # the remainder stays spent
        data = report(again)
        assert (data["leased_unused"], data["released"]) == (6, 10)
        return [e for e in again.events if e["event"] == _lease.UNUSED]
    finally:
        again.close()


@pytest.mark.parametrize("how", ["close", "with"])
def test_a_plain_close_records_the_remainder(tmp_path, how):
    path = tmp_path / "l.db"
    ledger = _leased(path)
    if how == "with":
        with ledger:
            pass
    else:
        ledger.close()
    assert [(e["steps"], e["reason"]) for e in _recorded(path)] == [(6, "close")]


def test_a_held_ledger_refuses_a_close_and_closes_after_the_hold(tmp_path):
    # A ledger held by a tuner while its candidates run refuses reads and charges; its
    # close raised that refusal after closing the file and left the remainder unrecorded
    # (task lo), then closed it (task lo: a candidate's close, depending on its score, then
    # left a closed ledger after the run). Now it refuses before changing anything, and
    # closes (recording the remainder) once the hold has ended (task lo6).
    path = tmp_path / "l.db"
    ledger = _leased(path)
    assert ledger._hold("held for a test")
    with pytest.raises(LedgerStateError, match="refuses a close for now: held for a test"):
        ledger.close()
    ledger._unhold()  # the holder's release: the ledger is as it was
    ledger.charge(STEP)
    assert (len(ledger.history), ledger.leased_unused) == (16, 5)
    ledger.close()
    with pytest.raises(LedgerStateError, match="closed"):
        ledger.charge(STEP)
    again = Ledger.open(path, read_only=True)
    try:
        assert [(e["steps"], e["reason"]) for e in again.events
                if e["event"] == _lease.UNUSED] == [(5, "close")]
    finally:
        again.close()


_CHARGE_THEN_DIE = r"""
import os, signal, sys
from privguard import Ledger
from privguard import mechanisms as M

ledger = Ledger(3.0, 1e-5, path=sys.argv[1], prefetch=False)
for _ in range(int(sys.argv[2])):
    ledger.charge(M.SubsampledGaussian(1.0, 0.01), label="child")
os.kill(os.getpid(), signal.SIGKILL)  # no close: its charges stay in the -wal
"""


def _charge_and_sigkill(path, steps: int) -> None:
    import os
    import signal
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", _CHARGE_THEN_DIE, str(path), str(steps)],
                          env=env, timeout=120, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def test_close_checkpoints_what_a_sigkilled_process_committed(tmp_path):
    # Issue 26, "checkpoint on close": a process sharing the file is SIGKILLed with its
    # charges in the -wal; the parent's close folds them into budget.db, so a copy of
    # budget.db alone (no -wal, no -shm) holds every committed charge.
    import os
    import shutil

    path = tmp_path / "budget.db"
    parent = _leased(path)  # open before the child, and after it
    _charge_and_sigkill(path, 40)
    assert os.path.getsize(str(path) + "-wal") > 0
    parent.charge(STEP)  # from the lease: no transaction
    parent.charge(STEP, label="parent")  # a transaction that reads the child's rows
    journal = len(parent.history)
    other = Ledger.open(path)  # open, idle: SQLite's last close is not the parent's
    parent.close()
    assert os.path.getsize(str(path) + "-wal") == 0  # checkpointed and truncated
    copy = tmp_path / "copy" / "budget.db"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)  # the main file only
    again = Ledger.open(copy, read_only=True)
    try:
        assert len(again.history) == journal
        assert sum(1 for r in again.history if r.label == "child") >= 40
    finally:
        again.close()
        other.close()


def _behind_a_reader(path, after: int):
    """A file ledger (no leases) charged once, a ``sqlite3`` connection holding a read
    transaction (its snapshot: that charge), then ``after`` charges past its snapshot."""
    import sqlite3

    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM entries").fetchone()  # its snapshot: 1 charge
    for _ in range(after):
        ledger.charge(STEP, label="after the reader's snapshot")
    return ledger, reader


@pytest.mark.parametrize("warnings_as", ["warnings", "errors"])
def test_a_close_that_cannot_checkpoint_past_a_reader_says_so_and_loses_nothing(tmp_path,
                                                                                 warnings_as):
    # A connection holding a read transaction (a snapshot older than the last charges)
    # blocks the checkpoint: the close waits the busy timeout, then leaves those charges in
    # the -wal (safe there) and warns that budget.db alone is no copy of the ledger. It
    # returned silently, and a copy of budget.db alone then lacked charges or was unreadable.
    import os

    path = tmp_path / "budget.db"
    ledger, reader = _behind_a_reader(path, 5)
    journal = len(ledger.history)
    ledger._store._conn.execute("PRAGMA busy_timeout = 100")  # not the default 60 s
    if warnings_as == "errors":  # raised once the ledger and its file are closed
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="stay in its -wal"):
                ledger.close()
        assert ledger._store._conn is None
        with pytest.raises(LedgerStateError, match="closed"):
            ledger.charge(STEP)
    else:
        with pytest.warns(RuntimeWarning, match="stay in its -wal"):
            ledger.close()
    assert os.path.getsize(str(path) + "-wal") > 0
    reader.execute("COMMIT")
    reader.close()
    again = Ledger.open(path)  # the -wal beside it: every charge
    assert len(again.history) == journal
    again.close()  # the last close: folded in, no warning
    assert not os.path.exists(str(path) + "-wal") or os.path.getsize(str(path) + "-wal") == 0


@pytest.mark.parametrize("where", ["memory", "file"])
def test_a_closed_ledger_refuses_reads_and_charges_in_memory_as_on_file(tmp_path, where):
    # Task lo: a closed file ledger refused reads and charges while a closed in-memory one
    # went on answering and charging. Both now refuse, as a closed sqlite3 connection does.
    ledger = Ledger(3.0, 1e-5, path=None if where == "memory" else tmp_path / "c.db")
    ledger.charge(STEP)
    ledger.close()
    ledger.close()  # again: nothing
    for call in (lambda: ledger.charge(STEP), lambda: ledger.charge(STEP, times=2),
                 lambda: ledger.can_afford(STEP), ledger.epsilon, ledger.budget,
                 ledger.remaining, ledger.guarantee, ledger.state_dict,
                 lambda: ledger.spent, lambda: ledger.history, lambda: ledger.events,
                 lambda: ledger.leased_unused):
        with pytest.raises(LedgerStateError, match="refuses charges and reads: closed"):
            call()
    assert ledger.target == (3.0, 1e-5) and len(ledger.orders) > 0  # its configuration


def test_a_reader_whose_snapshot_holds_every_charge_gives_no_warning(tmp_path, recwarn):
    # Review rlo: a reader that began after the last charge holds the -wal's reset back
    # (the TRUNCATE checkpoint reports busy) but not the copy of any charge: budget.db
    # alone holds every charge, and the close warned that charges stayed in the -wal.
    import os
    import shutil
    import sqlite3

    path = tmp_path / "budget.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    for _ in range(5):
        ledger.charge(STEP)
    journal = len(ledger.history)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM entries").fetchone()[0] > 0  # every charge
    ledger._store._conn.execute("PRAGMA busy_timeout = 100")  # not the default 60 s
    ledger.close()
    assert not [w for w in recwarn.list if issubclass(w.category, RuntimeWarning)]
    copy = tmp_path / "copy" / "budget.db"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)  # the main file only, the -wal not yet emptied
    assert os.path.getsize(str(path) + "-wal") > 0
    reader.execute("COMMIT")
    reader.close()
    again = Ledger.open(copy, read_only=True)
    try:
        assert len(again.history) == journal
    finally:
        again.close()


def test_a_held_ledger_refuses_a_close_then_records_its_remainder_on_every_store(
        leased_store):
    # Review rlo: task lo's held close on PostgreSQL (owner, charging role) as on SQLite;
    # task lo6: refused while held, nothing changed, and closed as usual after the hold
    ledger = leased_store.make(8.0, 1e-5, prefetch=False)
    for _ in range(10):
        ledger.charge(STEP, label="train")
    left, spent = ledger._lease.left, len(ledger.history)
    assert left > 0 and ledger._hold("held for a test")
    with pytest.raises(LedgerStateError, match="refuses a close"):
        ledger.close()
    ledger._unhold()
    assert (ledger._lease.left, len(ledger.history)) == (left, spent)
    ledger.close()
    for call in (lambda: ledger.charge(STEP, label="train"), ledger.epsilon):
        with pytest.raises(LedgerStateError, match="closed"):
            call()
    again = leased_store.reopen(ledger)
    try:
        assert len(again.history) == spent  # the remainder stays spent
        unused = [e["steps"] for e in again.events if e.get("event") == _lease.UNUSED]
        # a charging role appends charges only: its remainder stays spent, unrecorded
        assert unused == ([] if leased_store.name == "postgres-charger" else [left])
    finally:
        again.close()


def test_a_refused_open_beside_a_reader_raises_its_own_error_under_a_warnings_filter(
        tmp_path, monkeypatch):
    # Review rlo: an open that fails closes its store, which checkpoints; a reader holding
    # charges back made that close warn "closed, but ..." of a ledger never opened, and a
    # warnings filter "error" raised that RuntimeWarning instead of the LedgerStateError.
    import warnings

    from privguard._stores._sqlite import SQLiteStore

    monkeypatch.setitem(SQLiteStore.__init__.__kwdefaults__, "timeout", 0.1)  # not 60 s
    path = tmp_path / "budget.db"
    ledger, reader = _behind_a_reader(path, 3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(LedgerStateError, match="another configuration"):
                Ledger(5.0, 1e-5, path=path)
    finally:
        reader.execute("COMMIT")
        reader.close()
        ledger.close()


def test_a_trial_cannot_close_the_tuned_ledger(tmp_path):
    # Task lo through the public path: private_optimize holds the ledger while its trials
    # run; a trial's close raised the hold's refusal after closing the file, and the
    # lease's remainder was never recorded. Task lo made it close and record the
    # remainder; a trial that did so depending on its score then left a closed ledger and
    # a lease-unused event after the run (task lo6). Now the close is refused before it
    # changes anything, and the ledger is as the tuning charge left it.
    from privguard.integrations.optuna import private_optimize
    from privguard.tuning import Poisson

    path = tmp_path / "t.db"
    ledger = _leased(path)
    refused = []

    def objective(trial, child):
        child.charge(M.Gaussian(10.0))
        try:
            ledger.close()
        except LedgerStateError as exc:
            refused.append(str(exc))
        return trial.suggest_float("x", -1.0, 1.0) ** 2

    private_optimize(objective, ledger, runs=Poisson(3.0), cost=M.Gaussian(10.0),
                     progress=False, seed=1)
    assert refused and all("refuses a close" in text for text in refused)
    assert len(ledger.history) == 16 + 1  # the training lease and the tuning bound
    ledger.close()
    again = Ledger.open(path, read_only=True)
    try:
        unused = [(e["steps"], e["reason"]) for e in again.events if e["event"] == _lease.UNUSED]
        assert unused == [(6, "close")]  # the close after the run, once
    finally:
        again.close()
