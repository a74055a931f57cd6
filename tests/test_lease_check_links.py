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
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=False)  # its lease read below
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


@pytest.mark.parametrize("then", ["nothing", "another ledger put at the old path"])
def test_a_parent_directory_renamed_hands_out_at_most_the_lease_then_refuses(tmp_path, then):
    # Review rq: a change above the file (its directory renamed; a bind mount over the path
    # behaves alike) moves neither the file's link count nor its ctime, so the fstat sees
    # nothing; before t26 the step's stat of the path refused at once. Promise (theory §13,
    # "The leased step's check", (iii)): the steps handed out past the change are at most
    # what the lease had left, each journaled as spent in the file opened, and the next
    # transaction (the path's stat) refuses.
    run = tmp_path / "run"
    run.mkdir()
    path = run / "f.db"
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=True)
    for _ in range(40):
        ledger.charge(STEP)
    assert ledger._lease is not None
    # the lease's remainder and, with prefetch, the next lease if it
    # committed before the change (a read settles it; review rpf: _lease.left alone
    # failed at the pf head when the prefetch had committed; a prefetch committing after
    # the change: tests/test_review_rpf.py)
    left = ledger.leased_unused
    os.rename(run, tmp_path / "moved")
    if then != "nothing":
        run.mkdir()
        Ledger(3.0, 1e-5, path=path).close()
    kept = tmp_path / "moved" / "f.db"
    released = 40
    with pytest.raises(LedgerStateError, match=r"replaced|gone"):
        for _ in range(10_000):
            ledger.charge(STEP)
            released += 1
    assert released - 40 <= left  # at most the lease already committed
    assert released <= _journaled(kept)  # every step spent in the file opened
    with pytest.raises(LedgerStateError):
        ledger.charge(STEP)
    ledger.close()
    if then != "nothing":
        assert _journaled(path) == 0  # nothing of this ledger's in the file now at the path
