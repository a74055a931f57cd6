"""Review rckw of task ckw (a fresh checkpoint written by a writable open that replayed past
an older one, docs/theory.md §7 "A fresh checkpoint after such an open").

A write that fails where SQLite undoes the whole transaction, not the statement alone: a
full disk or an I/O error at the checkpoint's INSERT (the ``ROLLBACK TO refresh`` then
finds no savepoint), or at the COMMIT (in WAL mode nothing reaches the disk before it). The
open failed there ("commit failed (database or disk is full)", seen on a full tmpfs), where
before ckw it opened: a file on which the write fails must open as before, nothing written.
"""

from __future__ import annotations

import functools
import shutil
import sqlite3
from typing import ClassVar

import pytest
from test_checkpoint_refresh import OLD_V4_TNB, ROWS, _checkpoints, _same_state, _state
from test_checkpoint_v2_resume import RESUMED, replayed  # noqa: F401  (a fixture)
from test_sqlite import cli_verify

from privguard import Ledger, LedgerStateError
from privguard._stores import _rows, _sqlite


class _Failing(sqlite3.Connection):
    """A connection whose next COMMIT fails as on a full disk, once armed."""

    armed: ClassVar[list[bool]] = [False]

    def execute(self, sql, *args):  # type: ignore[override]
        if sql == "COMMIT" and _Failing.armed[0]:
            _Failing.armed[0] = False
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)


def _sql(path, statement):
    conn = sqlite3.connect(path)
    try:
        conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def _resumed_as_replayed(path, tmp_path, replayed, rows):  # noqa: F811
    """A writable open resumes from the fresh checkpoint, to the state of the whole journal
    replayed from the genesis (a copy with no checkpoint, ``rows`` rows at least); verify
    accepts both checkpoints."""
    again = _state(path, replayed, False)
    assert again[0] <= RESUMED
    whole = str(tmp_path / "whole.db")
    shutil.copy(path, whole)
    _sql(whole, "DELETE FROM checkpoints")
    replay = _state(whole, replayed, True)
    assert replay[0] >= rows
    _same_state(again, replay)
    assert cli_verify(path)["checkpoints"] == 2


@pytest.mark.parametrize("where", ["commit", "insert"])
def test_a_refresh_that_undoes_the_transaction_opens_as_before(tmp_path, replayed,  # noqa: F811
                                                                monkeypatch, where):
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_V4_TNB, path)
    replay = _state(path, replayed, True)
    real = _sqlite.SQLiteStore._checkpoint
    tried = [0]

    def failing(self, conn, acc, c):
        tried[0] += 1
        if where == "commit":  # written, and the COMMIT after it fails (WAL, disk full)
            real(self, conn, acc, c)
            _Failing.armed[0] = True
        else:  # SQLite rolled the whole transaction back (SQLITE_FULL / SQLITE_IOERR)
            conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("disk I/O error")

    _Failing.armed[0] = False
    with monkeypatch.context() as patch:
        patch.setattr(_sqlite.sqlite3, "connect",
                      functools.partial(sqlite3.connect, factory=_Failing))
        patch.setattr(_sqlite.SQLiteStore, "_checkpoint", failing)
        ledger = Ledger.open(path)  # it opens, as before ckw
        try:
            assert tried[0] == 1
            assert ledger.state_dict() == replay[1]
        finally:
            ledger.close()
    assert _checkpoints(path) == [(512, 4)]  # nothing written
    _Failing.armed[0] = False
    # the next writable open, whose write succeeds, refreshes it as ckw does
    first = _state(path, replayed, False)
    assert first[0] == ROWS
    _same_state(first, replay)
    assert _checkpoints(path) == [(512, 4), (ROWS, _rows.CHECKPOINT_CURVES)]
    assert _state(path, replayed, True)[0] <= RESUMED
    assert cli_verify(path)["checkpoints"] == 2


def test_an_open_that_fails_otherwise_is_not_retried_into_success(tmp_path, monkeypatch):
    """The retry is the open before ckw: an error of its own is raised as before (here the
    stored configuration edited: no retry hides it, and nothing is written)."""
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_V4_TNB, path)
    _sql(path, "UPDATE meta SET value = replace(value, '1e-05', '2e-05') WHERE key = 'config'")
    with pytest.raises(Exception, match="stored configuration was edited"):
        Ledger.open(path)
    assert _checkpoints(path) == [(512, 4)]


def test_a_run_grown_by_its_ledger_after_the_refresh(tmp_path, replayed):  # noqa: F811
    """The head's run, begun by a ledger still open, grows after another ledger's open
    wrote the fresh checkpoint at that row: the checkpoint is then stale at its row (as a
    periodic one may be); a later opener resumes from it to the same state as the replay,
    and verify accepts it (the row as the checkpoint saw it, then as it is)."""
    from test_checkpoint_refresh import TNB
    from test_checkpoint_v2_resume import EVERY, _charges, _curve_version

    path = str(tmp_path / "v4.db")
    charges = _charges(first=[TNB])
    with _curve_version(4):
        first = Ledger(epsilon=1e6, delta=1e-5, path=path, lease=1)  # a row a charge
        for mechanism, label in charges:
            first.charge(mechanism, label=label)
    assert _checkpoints(path) == [(EVERY, 4)]
    refreshing = _state(path, replayed, False)  # another ledger's open
    assert refreshing[0] > EVERY
    assert _checkpoints(path)[-1][1] == _rows.CHECKPOINT_CURVES
    grown = charges + [charges[-1]] * 5
    for mechanism, label in grown[len(charges):]:  # the first ledger's run grows
        first.charge(mechanism, label=label)
    first.close()
    conn = sqlite3.connect(path)
    stale = conn.execute("SELECT c.last_count < h.last_count AND c.entries = h.entries FROM "
                         "checkpoints c, head h ORDER BY c.entries DESC LIMIT 1").fetchone()
    conn.close()
    assert stale == (1,)  # the fresh checkpoint's row grew since
    _resumed_as_replayed(path, tmp_path, replayed, EVERY + 1)


def test_a_keyed_files_edited_stale_checkpoint_is_refused_not_replaced(tmp_path, monkeypatch):
    """A keyed file whose version-4 checkpoint sits at the head's row (the run grew since),
    its snapshot edited: the open checks its MAC before it would replace it, and refuses."""
    from test_checkpoint_refresh import TNB
    from test_checkpoint_v2_resume import EVERY, _charges, _curve_version

    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "correct horse battery staple")
    path = str(tmp_path / "keyed.db")
    charges = _charges(first=[TNB])[:EVERY - 1]
    with _curve_version(4):
        ledger = Ledger(epsilon=1e6, delta=1e-5, path=path, lease=1)
        for mechanism, label in charges + [charges[-1]] * 3:
            ledger.charge(mechanism, label=label)
        ledger.close()
    assert _checkpoints(path) == [(EVERY, 4)]
    _sql(path, "UPDATE checkpoints SET snapshot = replace(snapshot, '\"curves\":4', "
               "'\"curves\": 4')")
    edited = open(path, "rb").read()
    for read_only in (False, True):
        with pytest.raises(LedgerStateError, match="fails its digest"):
            Ledger.open(path, read_only=read_only)
    assert open(path, "rb").read() == edited  # not replaced


def test_a_retarget_at_the_refreshing_open(tmp_path, replayed):  # noqa: F811
    """``Ledger(..., path=, retarget=)`` on a file that must be replayed: the fresh checkpoint
    holds the state before the retarget row the same open writes after it; a later opener
    resumes from it and replays that row, to the state of the whole journal replayed."""
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_V4_TNB, path)
    ledger = Ledger(epsilon=20000.0, delta=1e-5, path=path, retarget="a larger budget")
    ledger.close()
    conn = sqlite3.connect(path)
    (config,) = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()
    conn.close()
    assert '"epsilon":20000.0' in config
    assert _checkpoints(path) == [(512, 4), (ROWS, _rows.CHECKPOINT_CURVES)]
    _resumed_as_replayed(path, tmp_path, replayed, ROWS + 1)  # the retarget row too
