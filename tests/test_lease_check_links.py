"""The leased step's check reads the open descriptor (``os.fstat``), not the path.

A leased step refuses once the file it opened has no name left (deleted, or replaced by a
rename over the path: link count 0; tests/test_adv_repeat_lane.py covers those). When the
path stops naming that file while another name keeps it (a hard link, a rename away), the
change of link count or name moves the file's ctime (Linux), which the fstat sees: the
ledger syncs, and the sync's stat of the path refuses at that very step. Where a rename
does not move the ctime, the file still holds every charge the ledger journaled, its lease
included: the steps handed out are spent there, and the next transaction, which stats the
path, refuses (docs/theory.md §13, "The leased step's check").
"""

from __future__ import annotations

import os
import sqlite3
import sys

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


def _journaled(path) -> int:
    """Charges the journal at ``path`` holds (the -wal included: read through SQLite)."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT coalesce(sum(count), 0) FROM entries "
                                "WHERE kind = 'run'").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["renamed away", "replaced, old kept by a hard link"])
def test_a_step_past_the_paths_change_is_spent_in_the_file_and_the_next_commit_refuses(
        tmp_path, how):
    # Promise: every step handed out is journaled as spent in the file the ledger opened,
    # and the first transaction after the path changed refuses (LedgerStateError), nothing
    # written to either file.
    path = tmp_path / "f.db"
    kept = tmp_path / "kept.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    for _ in range(40):
        ledger.charge(STEP)
    assert ledger._lease is not None and ledger._lease.left > 1
    if how == "renamed away":
        for suffix in ("", "-wal", "-shm"):  # the file and its side files, as `mv` would
            if os.path.exists(str(path) + suffix):
                os.rename(str(path) + suffix, str(kept) + suffix)
    else:
        os.link(path, kept)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(str(path) + suffix):
                os.link(str(path) + suffix, str(kept) + suffix)
        other = tmp_path / "other.db"
        Ledger(3.0, 1e-5, path=other).close()
        os.replace(other, path)
    released = 40
    with pytest.raises(LedgerStateError, match=r"replaced|gone"):
        for _ in range(10_000):
            ledger.charge(STEP)
            released += 1
            assert released <= _journaled(kept)  # spent in the file opened
    if sys.platform.startswith("linux"):
        # link(), unlink() and rename() move the file's ctime on Linux: the fstat sees a
        # change, the ledger syncs, and the sync's stat of the path refuses at that step
        assert released == 40
    with pytest.raises(LedgerStateError):
        ledger.charge(STEP)
    ledger.close()
    assert released <= _journaled(kept)
