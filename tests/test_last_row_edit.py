"""An edit of the journal's last row that leaves the head alone, under an open ledger
(review rl): the head names that row's digest, not its fields, so before the fix an open
ledger did not see such an edit, and its next charge extended the run, rewriting the row's
count, last time and digest: the edit's evidence was gone (no budget refunded). Each
transaction now reads the last row back and checks it against what the ledger last saw
(privguard/_stores/_rows.py, check_last_row): LedgerStateError, nothing charged, the edit
left in place for `privguard verify`.
"""

from __future__ import annotations

import sqlite3

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)

EDITS = [
    "UPDATE entries SET label = 'edited' WHERE idx = (SELECT max(idx) FROM entries)",
    "UPDATE entries SET count = count - 1 WHERE idx = (SELECT max(idx) FROM entries)",
    "UPDATE entries SET first = first - 1 WHERE idx = (SELECT max(idx) FROM entries)",
    "UPDATE entries SET count = count + 0.5 WHERE idx = (SELECT max(idx) FROM entries)",
]


def _rows(path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT * FROM entries ORDER BY idx").fetchall() + \
            conn.execute("SELECT * FROM head").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["wal", "rollback"])
@pytest.mark.parametrize("sql", EDITS)
def test_an_edited_last_row_is_refused_at_the_next_charge(tmp_path, monkeypatch, mode, sql):
    # Promise: the next charge that transacts raises LedgerStateError and charges nothing;
    # the edited row is left as the edit wrote it. (FAILS before the fix: the charge was
    # admitted and the extended run overwrote the edited row.)
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    for _ in range(5):
        ledger.charge(STEP, label="train")
    spent = ledger._acc.spent().copy()
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()
    edited = _rows(path)
    with pytest.raises(LedgerStateError, match="changed after this ledger"):
        ledger.charge(STEP, label="train")
    assert _rows(path) == edited  # nothing written: the evidence stays
    assert (ledger._acc.spent() == spent).all()
    with pytest.raises(LedgerStateError):  # broken: stays closed
        ledger.charge(STEP, label="train")


def test_an_edited_last_event_row_is_refused(tmp_path):
    # The last row an event (a retarget logged at open): its body edited in place.
    path = tmp_path / "e.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP, label="train")
    ledger.close()
    ledger = Ledger(4.0, 1e-5, path=path, lease=1, retarget="more data")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT kind FROM entries ORDER BY idx DESC LIMIT 1").fetchone() == (
        "event",)
    conn.execute("UPDATE entries SET body = replace(body, 'more data', 'less data') "
                 "WHERE idx = (SELECT max(idx) FROM entries)")
    conn.commit()
    conn.close()
    edited = _rows(path)
    with pytest.raises(LedgerStateError, match="changed after this ledger"):
        ledger.charge(STEP, label="train")
    assert _rows(path) == edited


def test_a_leased_ledger_refuses_at_its_next_lease_commit(tmp_path):
    # With leases (the default) steps handed out from memory make no transaction; the
    # one that commits the next lease reads the last row back and refuses.
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    for _ in range(8):
        ledger.charge(STEP, label="train")
    conn = sqlite3.connect(path)
    conn.execute(EDITS[0])
    conn.commit()
    conn.close()
    edited = _rows(path)
    with pytest.raises(LedgerStateError, match="changed after this ledger"):
        for _ in range(100):
            ledger.charge(STEP, label="train")
    assert _rows(path) == edited


def test_an_untouched_journal_is_not_refused(tmp_path):
    # The check reads back exactly what was written: fix, runs, events, reopened ledgers,
    # another process's rows (a second ledger) and a checkpoint (every 512 rows) all pass.
    path = tmp_path / "ok.db"
    a = Ledger(30.0, 1e-5, path=path, lease=1)
    b = Ledger.open(path, lease=1)
    for i in range(300):
        (a if i % 3 else b).charge(M.Gaussian(100.0 + i % 7), label=f"l{i % 5}")
        a.charge(STEP, label=None)
    a.close()
    b.close()
    ledger = Ledger.open(path, lease=1)
    ledger.charge(STEP)
    assert ledger._store._cursor.entries > 512
    ledger.close()


def test_postgres_an_edited_last_row_is_refused_at_the_next_charge(pg):
    # The same gap on the server: a superuser (triggers off) edits the newest run's label,
    # leaving the head alone; the open ledger's next charge refuses, nothing written.
    # (FAILS before the fix: the charge extended the run, its label kept as edited and
    # its digest rewritten over the edit.)
    import _pgserver

    srv, db, name = pg
    url = srv.url(_pgserver.OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, lease=1)
    for _ in range(5):
        ledger.charge(STEP, label="train")
    srv.admin("BEGIN; SET LOCAL session_replication_role = replica; "
              f"UPDATE privguard.entries SET label = 'edited' WHERE ledger = '{name}' AND "
              f"idx = (SELECT max(idx) FROM privguard.entries WHERE ledger = '{name}'); COMMIT",
              db=db)
    query = (f"SELECT idx, label, count, digest FROM privguard.entries WHERE ledger = '{name}' "
             "ORDER BY idx")
    edited = srv.admin(query, db=db)
    with pytest.raises(LedgerStateError, match="changed after this ledger"):
        ledger.charge(STEP, label="train")
    assert srv.admin(query, db=db) == edited
    ledger.close()


def test_a_checkpoint_at_the_head_is_resumed_and_its_last_row_checked(tmp_path, monkeypatch):
    # Opening resumes from the newest checkpoint; when it is at the head no row is
    # replayed, and the last row is still read back: untouched, the ledger opens and
    # charges; edited while closed (the head left alone), the open refuses.
    from privguard._stores import _sqlite

    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 4)
    path = tmp_path / "c.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    for label in ("a", "b", "a"):  # fix + 3 runs: 4 rows, a checkpoint at the head
        ledger.charge(STEP, label=label)
    ledger.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT max(entries) FROM checkpoints").fetchone() == (4,)
    assert conn.execute("SELECT entries FROM head").fetchone() == (4,)
    conn.close()
    ledger = Ledger.open(path, lease=1)
    assert ledger._store._cursor.entries == 4
    ledger.close()
    conn = sqlite3.connect(path)
    conn.execute(EDITS[0])
    conn.commit()
    conn.close()
    with pytest.raises(LedgerStateError, match="changed after this ledger"):
        Ledger.open(path, lease=1)
