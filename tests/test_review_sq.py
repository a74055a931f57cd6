"""Adversarial review sq of the SQLite ledger on disk: edits a user of the file can make
with the ``sqlite3`` module, each checked to fail closed (LedgerStateError, nothing charged).
"""

from __future__ import annotations

import sqlite3

import pytest
from _sqlite_edits import charges as _charges
from _sqlite_edits import child_charges_while_the_parent_closes
from _sqlite_edits import execute as _execute

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)

# Each makes SQLite skip privguard's writes without an error (RAISE(IGNORE)).
TRIGGERS = [
    "CREATE TRIGGER t BEFORE UPDATE ON head BEGIN SELECT RAISE(IGNORE); END",
    "CREATE TRIGGER t BEFORE UPDATE ON entries BEGIN SELECT RAISE(IGNORE); END",
    "CREATE TRIGGER t BEFORE INSERT ON entries BEGIN SELECT RAISE(IGNORE); END",
]



def _five(path) -> Ledger:
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    for _ in range(5):
        ledger.charge(STEP, label="train")
    return ledger



@pytest.mark.parametrize("mode", ["wal", "rollback"])
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_file_with_a_trigger_is_refused_at_opening(tmp_path, monkeypatch, mode, trigger):
    # Before the fix the file opened, and a charge returned whose update the trigger had
    # skipped: the step was released, and a fresh opener found one charge fewer.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    path = tmp_path / "l.db"
    ledger = _five(path)
    ledger.close()
    _execute(path, trigger)
    with pytest.raises(LedgerStateError, match="schema is not the one privguard writes"):
        Ledger(3.0, 1e-5, path=path, lease=1)
    with pytest.raises(LedgerStateError, match="trigger t"):
        Ledger.open(path, read_only=True)


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_trigger_added_under_an_open_ledger_is_refused_before_it_writes(tmp_path, trigger):
    path = tmp_path / "l.db"
    ledger = _five(path)
    _execute(path, trigger)
    with pytest.raises(LedgerStateError, match="trigger t"):
        ledger.charge(STEP, label="other")  # a new run: an INSERT as well as updates
    with pytest.raises(LedgerStateError):
        ledger.charge(STEP, label="train")
    _execute(path, "DROP TRIGGER t")
    assert _charges(path) == 5  # every charge returned is on disk, and no other


def test_a_table_declared_otherwise_is_refused(tmp_path):
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP)
    ledger.close()
    _execute(path, "ALTER TABLE entries RENAME TO old",
             "CREATE TABLE entries (idx INTEGER PRIMARY KEY ON CONFLICT IGNORE, kind TEXT "
             "NOT NULL, mech INTEGER, label TEXT, pid INTEGER, count INTEGER, first REAL, "
             "last REAL, body TEXT, digest TEXT NOT NULL)",
             "INSERT INTO entries SELECT * FROM old", "DROP TABLE old")
    with pytest.raises(LedgerStateError, match="schema is not the one privguard writes"):
        Ledger.open(path)


def test_analyze_and_vacuum_change_no_row_and_are_accepted(tmp_path):
    # The schema cookie moves at both: an open ledger checks the schema again, and goes on.
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP)
    _execute(path, "ANALYZE")
    ledger.charge(STEP)
    ledger.close()
    _execute(path, "VACUUM")
    ledger = Ledger.open(path)
    ledger.charge(STEP)
    ledger.close()
    assert _charges(path) == 3


@pytest.mark.parametrize("name", ["a#b.db", "c%41.db", "d?e.db", "f%3fg.db", "ü 😀.db"])
def test_read_only_opens_the_file_named_whatever_its_characters(tmp_path, name):
    # Before the fix the read-only URI was the path with '?' alone escaped: "a#b.db" opened
    # (and created) "a" read-write, its "?mode=ro" cut off as a URI fragment; "c%41.db"
    # opened "cA.db". Another ledger at that name was read in place of the one asked for.
    other = Ledger(3.0, 1e-5, path=tmp_path / "a", lease=1)
    other.charge(STEP, times=7)
    other.close()
    ledger = Ledger(3.0, 1e-5, path=tmp_path / name, lease=1)
    ledger.charge(STEP, times=2)
    ledger.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    reader = Ledger.open(tmp_path / name, read_only=True)
    try:
        assert reader._acc.journal.charges == 2
    finally:
        reader.close()
    assert not {"cA.db", "f?g.db"} & {p.name for p in tmp_path.iterdir()}
    assert set(before) <= {p.name for p in tmp_path.iterdir()}


def _forge_checkpoint(path, tmp_path) -> None:
    """Insert, at the journal's end, a checkpoint whose totals are those of 2 charges,
    re-MAC'd as anyone with privguard can for an unkeyed file."""
    from privguard._stores import _rows
    from privguard._stores._sqlite import _dumps

    real = Ledger.open(path)
    scratch = Ledger(3.0, 1e-5, path=tmp_path / "scratch.db", lease=1)
    scratch.charge(STEP, label="a")
    scratch.charge(M.Gaussian(5.0), label="b")
    cursor = real._store._cursor
    snapshot = _dumps(_rows.checkpoint_body(scratch._acc, "run"))
    row = (*cursor.as_tuple(), snapshot, real._store._checkpoint_mac(cursor, snapshot))
    real.close()
    scratch.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", row)
    conn.close()


def test_a_forged_checkpoint_fools_an_unkeyed_opener_and_verify_finds_it(tmp_path):
    # What docs/reference.md "The ledger file" states: an unkeyed file is not protected against a forger;
    # one inserted checkpoint row is enough, and `privguard verify` refuses the file.
    from privguard._cli._cli import main

    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP, label="a", times=200)
    ledger.charge(M.Gaussian(5.0), label="b")
    ledger.close()
    _forge_checkpoint(path, tmp_path)
    assert _charges(path) == 2  # the documented limit of an unkeyed file
    assert main(["verify", str(path)]) != 0


def _child_charges_while_the_parent_closes(path, own: bool) -> tuple[str, list]:
    """Fork with the ledger open; the child charges (through the inherited ledger, or its
    own ``Ledger(path)``), and stops between its write and its commit while the parent
    closes its ledger; then commits. Returns the child's outcome and the runs on disk."""
    ledger = Ledger(1e9, 1e-5, path=path, lease=1)
    ledger.charge(STEP, label="parent")
    return child_charges_while_the_parent_closes(path, ledger, STEP, own=own)


@pytest.mark.parametrize("own", [False, True], ids=["inherited ledger", "child's own ledger"])
def test_a_forked_childs_returned_charge_survives_the_parents_close(tmp_path, own):
    # Before the fix the child used (or, opening its own, was poisoned by) the parent's
    # SQLite connection: it held none of the locks SQLite believed it held, the parent's
    # close took itself for the last connection and deleted the -wal mid-transaction, and
    # the child's charge returned with no row on disk.
    outcome, runs = _child_charges_while_the_parent_closes(tmp_path / "l.db", own)
    assert outcome == "returned"
    assert runs == [("parent", 1), ("child", 1)]


def test_a_damaged_schema_whose_error_is_not_utf8_is_a_ledger_state_error(tmp_path):
    # SQLite's message for a malformed schema quotes the file's bytes; Python's sqlite3
    # decodes it and raised UnicodeDecodeError, a built-in exception, out of every open
    # (found by flipping random bytes of a ledger file).
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    ledger.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("INSERT INTO sqlite_master VALUES ('table', CAST(X'78e17a' AS TEXT), "
                 "CAST(X'78e17a' AS TEXT), 0, CAST(X'435245415445205441424c45e1' AS TEXT))")
    conn.close()
    for use in (lambda: Ledger.open(path), lambda: Ledger(3.0, 1e-5, path=path),
                lambda: Ledger.open(path, read_only=True)):
        with pytest.raises(LedgerStateError, match="not a readable ledger database"):
            use()


def test_a_pickled_file_ledger_reopens_its_own_file_or_refuses(tmp_path, monkeypatch):
    # Before the fix a pickle kept the path as given: loaded where the working directory
    # differs it opened the ledger of that name there, and loaded after the file was
    # deleted and created again it opened the new, empty ledger, silently (0 charges
    # where the pickled ledger had spent 20).
    import pickle

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    ledger = Ledger(3.0, 1e-5, path="budget.db")
    ledger.charge(M.Gaussian(10.0), times=20)
    blob = pickle.dumps(ledger)
    monkeypatch.chdir(tmp_path / "b")
    Ledger(3.0, 1e-5, path="budget.db").close()
    copy = pickle.loads(blob)
    assert copy._acc.journal.charges == 20
    copy.close()
    ledger.close()
    (tmp_path / "a" / "budget.db").unlink()
    Ledger(3.0, 1e-5, path=tmp_path / "a" / "budget.db").close()
    with pytest.raises(LedgerStateError, match="not the ledger that was pickled"):
        pickle.loads(blob)


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_children_letting_go_of_their_copies_leave_the_parent_undisturbed(tmp_path,
                                                                          monkeypatch, mode):
    # The at-fork hook closes each child's copy of the parent's connection (review sq):
    # SQLite's close of that copy must not checkpoint or delete the parent's -wal/-shm
    # (the parent's next transaction would refuse a replaced index), whether the child
    # charges through its copy (a connection of its own) or exits at once.
    import os

    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    path = tmp_path / "l.db"
    ledger = Ledger(1e9, 1e-5, path=path, lease=1)
    for i in range(6):
        ledger.charge(STEP, label="parent")
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                if i % 2:
                    ledger.charge(STEP, label="child")
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        ledger.charge(STEP, label="parent")
    ledger.close()
    reader = Ledger.open(path, read_only=True)
    try:
        counts: dict = {}
        for run in reader._store.runs():
            counts[run.label] = counts.get(run.label, 0) + run.count
    finally:
        reader.close()
    assert counts == {"parent": 12, "child": 3}
