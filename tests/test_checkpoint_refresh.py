"""Task ckw: a writable open that could not resume from the newest checkpoint writes a fresh
one (today's curve version) at the head, so the next opener resumes from it
(docs/theory.md §7, "A fresh checkpoint after such an open").

Curve version 5 changed the truncated negative binomial's tuning, ``SubsetTuning``,
``DeltaReserve`` and ``PureDP`` from ε₀ = 40: a file with one of them before an older
checkpoint replays its journal from the genesis. Before this, it did so at every open,
until a charge crossed the next ``CHECKPOINT_EVERY`` boundary (with leases, maybe never).
Whether a file was resumed from is seen in the number of rows replayed on opening.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
from test_checkpoint_v2_resume import (
    EVERY,
    RESUMED,
    _charges,
    _curve_version,
    _open,
    _todays,
    _write,
    replayed,  # noqa: F401  (a fixture)
)
from test_sqlite import cli_verify

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _rows, _sqlite
from privguard.tuning import TruncatedNegativeBinomial

OLD_V4_TNB = Path(__file__).parent / "data" / "ledger-curves4-73f7c2e-tnb.db"
"""Written by main 73f7c2e (tests/test_review_ral.py): 531 rows, one checkpoint of curve
version 4 at row 512, a truncated negative binomial tuner before it (changed in version 5)."""
ROWS = 531
TNB = M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, steps=1000),
                        TruncatedNegativeBinomial(-0.5, mean=1.01))


def _checkpoints(path):
    """(entries, curve version) of every checkpoint of the file, in order."""
    conn = sqlite3.connect(path)
    try:
        return [(n, json.loads(s)["curves"]) for n, s in
                conn.execute("SELECT entries, snapshot FROM checkpoints ORDER BY entries")]
    finally:
        conn.close()


def _state(path, replayed, read_only):  # noqa: F811
    ledger, rows = _open(path, replayed, read_only)
    out = (rows, ledger.state_dict(), ledger.spent_curve.epsilons, ledger.epsilon())
    ledger.close()
    return out


def _spent(path):
    ledger = Ledger.open(path, read_only=True)
    try:
        return ledger.spent
    finally:
        ledger.close()


def _files(path):
    """The main file's bytes and mtime, and the -wal's bytes (a reader of a WAL file may
    leave an empty one beside it: no frame, nothing written)."""
    wal = Path(path + "-wal")
    return (Path(path).read_bytes(), os.stat(path).st_mtime_ns,
            wal.read_bytes() if wal.exists() else b"")


def _same_state(a, b):
    assert a[1] == b[1]  # the whole state dict, spent totals included
    assert np.array_equal(a[2], b[2]) and a[3] == b[3]


def test_a_file_main_wrote_is_replayed_once_then_resumed_from(tmp_path, replayed):  # noqa: F811
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_V4_TNB, path)
    assert _checkpoints(path) == [(512, 4)]
    # read-only: replayed from the genesis, nothing written (bytes and mtime unchanged)
    before = _files(path)
    replay = _state(path, replayed, True)
    assert replay[0] == ROWS
    assert _files(path) == before and _checkpoints(path) == [(512, 4)]
    # writable: replayed once more, then a fresh checkpoint of today's version at the head
    first = _state(path, replayed, False)
    assert first[0] == ROWS
    _same_state(first, replay)
    assert _checkpoints(path) == [(512, 4), (ROWS, _rows.CHECKPOINT_CURVES)]
    # every later opener resumes from it, with the same state bit for bit
    for read_only in (True, False):
        again = _state(path, replayed, read_only)
        assert again[0] <= RESUMED
        _same_state(again, replay)
    assert cli_verify(path)["checkpoints"] == 2  # the fresh one equal to the replay


def test_a_stale_checkpoint_at_the_head_is_replaced(tmp_path, replayed):  # noqa: F811
    """The newest checkpoint at the head (its last run grew since, with no row added):
    the fresh one at the same row takes its place."""
    path = str(tmp_path / "v4.db")
    charges = _charges(first=[TNB])[:EVERY - 1]  # and the fix row: EVERY rows
    with _curve_version(4):
        ledger = Ledger(epsilon=1e6, delta=1e-5, path=path)
        for mechanism, label in charges + [charges[-1]] * 3:  # the last run grows
            ledger.charge(mechanism, label=label)
        ledger.close()
    assert _checkpoints(path) == [(EVERY, 4)]
    first = _state(path, replayed, False)
    assert first[0] > EVERY - 2  # from the genesis
    assert np.array_equal(_spent(path), _todays(charges + [charges[-1]] * 3))
    assert _checkpoints(path) == [(EVERY, _rows.CHECKPOINT_CURVES)]
    again = _state(path, replayed, False)
    assert again[0] <= RESUMED
    _same_state(again, first)
    assert cli_verify(path)["checkpoints"] == 1


def test_a_file_that_cannot_be_written_opens_as_before(tmp_path, replayed, monkeypatch):  # noqa: F811
    """A writable open of a file SQLite could open only read-only (a read-only file, as a
    user other than root): the refresh's write fails, is rolled back, and the open goes on."""
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_V4_TNB, path)
    tried = [0]

    def readonly(self, conn, acc, c):
        tried[0] += 1
        conn.execute("INSERT INTO checkpoints VALUES (?, 0, '', '', '', '')", (c.entries,))
        raise sqlite3.OperationalError("attempt to write a readonly database")

    replay = _state(path, replayed, True)
    monkeypatch.setattr(_sqlite.SQLiteStore, "_checkpoint", readonly)
    first = _state(path, replayed, False)
    assert tried[0] == 1  # the refresh was tried at the open
    assert first[0] == ROWS
    _same_state(first, replay)
    assert _checkpoints(path) == [(512, 4)]  # its partial write rolled back
    monkeypatch.undo()
    assert cli_verify(path)["checkpoints"] == 1


def test_a_file_at_the_current_version_writes_no_checkpoint_at_open(tmp_path, replayed):  # noqa: F811
    """A file resumed from its newest checkpoint is not written at opening."""
    path = str(tmp_path / "current.db")
    _write(path, _charges(first=[TNB]), version=_rows.CHECKPOINT_CURVES)
    before = _files(path)
    rows, *_ = _state(path, replayed, False)
    assert rows <= RESUMED
    assert _checkpoints(path) == [(EVERY, _rows.CHECKPOINT_CURVES)]
    assert _files(path)[::2] == before[::2]  # the same bytes


def test_a_server_ledger_owner_writes_a_fresh_checkpoint(pg, replayed):  # noqa: F811
    import _pgserver

    server, db, name = pg
    charges = _charges(first=[TNB])
    owner = server.url(_pgserver.OWNER, db, name)
    charger = server.url(_pgserver.CHARGER, db, name)
    _write(owner, charges, version=4)
    _pgserver.allow_charger(db, name)
    # a charging role cannot write checkpoints: it replays, and keeps replaying
    for _ in range(2):
        rows, *_ = _state(charger, replayed, False)
        assert rows > EVERY
    replay = _state(owner, replayed, True)  # read-only: replays, writes nothing
    assert replay[0] > EVERY
    first = _state(owner, replayed, False)
    assert first[0] > EVERY
    _same_state(first, replay)
    for url in (owner, charger):
        again = _state(url, replayed, False)
        assert again[0] <= RESUMED
        _same_state(again, replay)
    assert np.array_equal(_spent(owner), _todays(charges))


def test_a_reader_open_meanwhile_follows_the_refreshing_open(tmp_path, replayed):  # noqa: F811
    """A ledger opened read-only before the refresh goes on reading the file after it, and
    sees the charges made after it; the refreshing ledger charges on."""
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_V4_TNB, path)
    reader, rows = _open(path, replayed, True)
    assert rows == ROWS
    writer, rows = _open(path, replayed, False)
    assert rows == ROWS
    assert _checkpoints(path)[-1] == (ROWS, _rows.CHECKPOINT_CURVES)
    for i in range(3):
        writer.charge(M.Gaussian(5.0 + i))
    assert np.array_equal(reader.spent, writer.spent)  # synced: the charges after it
    writer.close()
    reader.close()
    again, rows = _open(path, replayed, True)
    assert rows <= RESUMED + 3
    again.close()
    assert cli_verify(path)["checkpoints"] == 2
