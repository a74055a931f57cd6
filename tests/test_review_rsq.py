"""Adversarial review rsq of branch sq (SQLite schema check, fork, pickle identity)."""

from __future__ import annotations

import os
import sqlite3

import pytest
from _sqlite_edits import charges as _charges
from _sqlite_edits import child_charges_while_the_parent_closes
from _sqlite_edits import execute as _execute
from _sqlite_edits import in_child as _in_child

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)

# Together they make SQLite skip every write a charge makes, without an error.
SKIP_ALL = [f"CREATE TRIGGER t{i} BEFORE {event} ON {table} BEGIN SELECT RAISE(IGNORE); END"
            for i, (event, table) in enumerate([("UPDATE", "head"), ("UPDATE", "entries"),
                                                ("INSERT", "entries"),
                                                ("INSERT", "mechanisms")])]




@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_a_forked_childs_new_connection_checks_the_schema(tmp_path, monkeypatch, mode):
    # The schema is checked where the cookie moved; an editor who puts the cookie back by
    # hand (PRAGMA schema_version) leaves an open connection on its cached schema, without
    # the triggers, but a forked child opens a new connection, which loads them. Before
    # the fix the child compared the cookie with the parent's, did not check, and its
    # charge returned with every write skipped: a fresh opener found it nowhere.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    for _ in range(5):
        ledger.charge(STEP, label="train")
    conn = sqlite3.connect(path, isolation_level=None)
    cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
    for statement in SKIP_ALL:
        conn.execute(statement)
    conn.execute(f"PRAGMA schema_version = {cookie}")
    conn.close()

    def charge() -> str:
        ledger.charge(STEP, label="train")
        return "returned"

    got = _in_child(charge)
    assert "LedgerStateError" in got and "schema is not the one privguard writes" in got
    # The parent's open connection keeps its cached schema: the triggers are not in it,
    # so its charge is written (README "On disk"), and a fresh opener finds it
    ledger.charge(STEP, label="train")
    ledger.close()
    _execute(path, "PRAGMA writable_schema = ON",
             "DELETE FROM sqlite_master WHERE type = 'trigger'",
             f"PRAGMA schema_version = {cookie + 7}")
    assert _charges(path) == 6


def _copy(src, dst) -> None:
    """``dst`` made a copy of the closed ledger file ``src`` (a new inode)."""
    import shutil

    tmp = str(dst) + ".tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def test_a_pickled_file_ledger_refuses_an_older_copy_of_its_file(tmp_path):
    # The pickle named the file and its file_id only: a backup of the same file restored
    # at that path (same file_id, fewer charges) loaded as the pickled ledger, which had
    # spent more: the loaded ledger went backwards, and its budget was spent again.
    import pickle

    path, backup = tmp_path / "l.db", tmp_path / "backup.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(M.Gaussian(10.0), times=10)
    ledger.close()
    _copy(path, backup)
    ledger = Ledger.open(path, lease=1)
    ledger.charge(M.Gaussian(10.0), times=10)  # another ledger: a row of its own, 20 charges
    blob = pickle.dumps(ledger)
    ledger.close()
    _copy(backup, path)  # restored: 10 charges
    with pytest.raises(LedgerStateError, match="does not extend the journal"):
        pickle.loads(blob)


def test_a_pickled_file_ledger_refuses_a_journal_rewritten_after_it(tmp_path):
    # Restored from the backup and charged again past the pickle's count: as many rows
    # or more, but not the rows the pickled ledger saw (another label in the last one).
    import pickle

    path, backup = tmp_path / "l.db", tmp_path / "backup.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(M.Gaussian(10.0), times=10, label="a")
    ledger.close()
    _copy(path, backup)
    ledger = Ledger.open(path, lease=1)
    ledger.charge(M.Gaussian(10.0), times=10, label="b")
    blob = pickle.dumps(ledger)
    ledger.close()
    _copy(backup, path)
    ledger = Ledger.open(path, lease=1)
    ledger.charge(M.Gaussian(10.0), times=30, label="c")
    ledger.close()
    with pytest.raises(LedgerStateError, match="does not extend the journal"):
        pickle.loads(blob)


@pytest.mark.parametrize("how", ["same", "copy", "hard link", "charged since"])
def test_a_pickled_file_ledger_loads_its_journal_or_a_later_one(tmp_path, how):
    # What must still load: the file itself, a copy of it (a new inode, the same journal),
    # a hard link to it, and the file after the pickled ledger (or another) charged more.
    import pickle

    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(M.Gaussian(10.0), times=10, label="a")
    blob = pickle.dumps(ledger)
    if how == "charged since":
        ledger.charge(M.Gaussian(10.0), times=5, label="a")
        ledger.charge(M.Gaussian(10.0), times=5, label="b")
    ledger.close()
    if how == "copy":
        _copy(path, path)
    if how == "hard link":
        os.link(path, tmp_path / "m.db")
        path.unlink()
        os.link(tmp_path / "m.db", path)
    copy = pickle.loads(blob)
    try:
        assert copy._acc.journal.charges == (20 if how == "charged since" else 10)
        copy.charge(M.Gaussian(10.0))
    finally:
        copy.close()


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_a_child_forked_during_a_read_refuses_the_file(tmp_path, monkeypatch, mode):
    # Another thread of the parent was inside a read transaction of ledger A (a history,
    # a report) at the fork: the hook could not take A's locks, so the child kept its copy
    # of A's connection open, and with it SQLite's per-file state, which says this
    # process holds the parent's locks. Before the fix the child's own Ledger(path) took
    # no lock, the parent's close checkpointed and deleted the -wal under the child's
    # transaction, and the child's charge returned, on no disk.
    import threading

    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    path = tmp_path / "l.db"
    a = Ledger(1e9, 1e-5, path=path, lease=1)
    a.charge(STEP, label="parent")
    held = Ledger(1e9, 1e-5)  # the forking thread holds a ledger lock: it only tries A's
    inside, resume = threading.Event(), threading.Event()

    def reader() -> None:
        with a._txn, a._store._locked(write=False) as conn:
            conn.execute("SELECT count(*) FROM entries").fetchone()
            inside.set()
            resume.wait()

    thread = threading.Thread(target=reader)
    thread.start()
    inside.wait()

    def fork() -> int:
        with held._txn:
            return os.fork()

    def resume_the_reader() -> None:  # the child's open waits for its flock
        resume.set()
        thread.join()

    outcome, runs = child_charges_while_the_parent_closes(
        path, a, STEP, own=True, fork=fork, before_close=resume_the_reader)
    assert "LedgerStateError" in outcome and "forked while another thread" in outcome, (
        outcome, runs)
    assert runs == [("parent", 1)]


def test_upgrading_a_0_1_file_with_a_damaged_schema_is_a_ledger_state_error(tmp_path):
    # Review sq made SQLite's UnicodeDecodeError (its message quoting a damaged schema's
    # bytes) a LedgerStateError when a ledger opens, but not in `privguard upgrade`, which
    # opens a 0.1 file itself: the built-in exception escaped upgrade() (the CLI exited 1,
    # "error: UnicodeDecodeError").
    import shutil
    from pathlib import Path

    from privguard._cli._cli import main
    from privguard._stores._migrate import upgrade

    path = tmp_path / "budget.db"
    shutil.copy(Path(__file__).parent / "data" / "ledger-0.1.db", path)
    _execute(path, "PRAGMA writable_schema = ON",
             "INSERT INTO sqlite_master VALUES ('table', CAST(X'78e17a' AS TEXT), "
             "CAST(X'78e17a' AS TEXT), 0, CAST(X'435245415445205441424c45e1' AS TEXT))")
    with pytest.raises(LedgerStateError, match="not a readable SQLite ledger"):
        upgrade(str(path), epsilon=4.0, delta=1e-5)
    assert main(["upgrade", str(path), "--epsilon", "4", "--delta", "1e-5"]) == 2
    assert not (tmp_path / "budget.db.v1").exists()


def test_verify_names_a_row_that_is_no_utf8(tmp_path, capsys):
    # A row before the newest checkpoint (never read at opening) whose label is no UTF-8:
    # sqlite3 raised OperationalError out of the store's verify, and `privguard verify`
    # exited 1 with its repr instead of 2 with a LedgerStateError naming the file.
    from privguard._cli._cli import main

    path = tmp_path / "l.db"
    ledger = Ledger(1e9, 1e-5, path=path, lease=1)
    for i in range(520):  # past the first checkpoint (512 rows)
        ledger.charge(M.Gaussian(50.0), label=f"l{i % 2}")
    ledger.close()
    _execute(path, "UPDATE entries SET label = CAST(X'ff' AS TEXT) WHERE idx = 3")
    capsys.readouterr()
    assert main(["verify", str(path)]) == 2
    assert "unreadable journal" in capsys.readouterr().err


def test_a_child_forked_inside_a_transaction_gets_a_ledger_state_error(tmp_path, monkeypatch):
    # Code run inside a charge's transaction forks (here: in the write), and the child
    # goes on with that charge: the at-fork hook let go of its copy of the connection and
    # flock descriptor, the write failed (LedgerStateError), and then the unlock of a
    # descriptor that was None raised TypeError, a built-in exception, out of charge().
    from privguard._stores._sqlite import SQLiteStore

    path = tmp_path / "l.db"
    ledger = Ledger(1e9, 1e-5, path=path, lease=1)
    ledger.charge(STEP, label="parent")
    real = SQLiteStore._write
    out_r, out_w = os.pipe()
    forked: list[int] = []

    def forking(self, *args):
        real(self, *args)
        forked.append(os.fork())

    monkeypatch.setattr(SQLiteStore, "_write", forking)
    try:
        ledger.charge(STEP, label="forked inside")
        outcome = "returned"
    except BaseException as exc:
        outcome = repr(exc)
    if forked == [0]:  # pragma: no cover (the child)
        os.write(out_w, outcome.encode()[:500])
        os._exit(0)
    os.close(out_w)
    got = os.read(out_r, 1000).decode()
    os.close(out_r)
    os.waitpid(forked[0], 0)
    assert outcome == "returned"
    assert got.startswith("LedgerStateError"), got
    monkeypatch.setattr(SQLiteStore, "_write", real)
    ledger.close()
    assert _charges(path) == 2
