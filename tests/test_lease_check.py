"""The per-step check of a leased step on a SQLite file (SQLiteStore.check_lease).

A step handed out from a lease makes no transaction; it checks that the path still
names the file opened (one ``os.stat``) and whether the file changed since the
ledger's last transaction, in which case the ledger syncs (and verifies) first. "Changed":
the size and times of that same ``stat``, plus, in rollback-journal mode only, the
header's change counter (a ``pread``): WAL commits do not move that counter, so the
``pread`` is left out in WAL mode (docs/performance.md, "Where a leased step's time goes").
"""

from __future__ import annotations

import os
import time

import pytest
from _lease_edits import edit_head_and_expect_refusal

from privguard import Ledger
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


def _leased(path, monkeypatch, mode: str) -> Ledger:
    """A file ledger in ``mode`` ("wal" or "rollback") holding a lease of several steps."""
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=False)  # its lease read below
    assert ledger._store._wal == (mode == "wal")
    for _ in range(40):
        ledger.charge(STEP)
    assert ledger._lease is not None and ledger._lease.left > 3
    return ledger


def _next_tick(path) -> None:
    """Wait until a write in ``path``'s directory gets a later ctime than ``path`` has (the
    filesystem's timestamp granularity: a few ms, or a second or two on some)."""
    probe = path.with_name(path.name + ".tick")
    before = os.stat(path).st_ctime_ns
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe.write_bytes(b"x")
        if os.stat(probe).st_ctime_ns > before:
            return
        time.sleep(0.005)
    raise AssertionError("the filesystem's ctime did not move in 10 s")


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_the_header_counter_is_read_at_a_leased_step_in_rollback_mode_only(tmp_path,
                                                                           monkeypatch, mode):
    # Promise: in rollback-journal mode every leased step reads the header's change counter
    # (every commit there bumps it); in WAL mode, where commits do not move it, no leased
    # step pays that system call. The decisions are the same: each step is handed out,
    # from the lease, at the next journal index. (FAILS before y26 in WAL mode: a pread
    # at every step.)
    ledger = _leased(tmp_path / "c.db", monkeypatch, mode)
    store, lease = ledger._store, ledger._lease
    calls = []
    real = store._change_counter

    def counted():
        calls.append(1)
        return real()

    monkeypatch.setattr(store, "_change_counter", counted)
    steps = lease.left - 1
    first = lease.next_index
    for i in range(steps):
        assert ledger.charge(STEP).index == first + i
    assert ledger._lease is lease and lease.left == 1  # all from the lease, no transaction
    assert len(calls) == (0 if mode == "wal" else steps)
    ledger.close()


def test_wal_a_checkpoint_by_another_process_is_read_in_at_the_next_leased_step(
        tmp_path, monkeypatch):
    # Promise (docs/reference.md "The ledger file", "What the file format detects"): a file changed since the ledger's
    # last transaction is synced and verified before a leased step is released. In WAL
    # mode the main file changes at checkpoints (another process's close checkpoints),
    # which the header's counter does not show; the stat's times do: the other process's
    # charge is read in at that step, which is still handed out from the lease. Twice: a
    # file's first checkpoint in WAL mode may move the counter, later ones do not.
    # (FAILS before y26 at the second: no sync at the step in WAL mode.)
    path = tmp_path / "w.db"
    ledger = _leased(path, monkeypatch, "wal")
    lease = ledger._lease
    for k in range(2):
        charges, index = ledger._acc.journal.charges, lease.next_index
        _next_tick(path)
        helper = Ledger.open(path, lease=1)  # another writer: a charge, then its close
        helper.charge(M.Gaussian(50.0), label=f"other {k}")
        helper.close()  # checkpoints: the main file is written
        assert ledger.charge(STEP).index == index  # a leased step...
        assert ledger._acc.journal.charges == charges + 1  # ...after syncing the other's
        assert ledger._lease is lease
    ledger.close()


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_an_edited_head_is_refused_at_the_next_leased_step(tmp_path, monkeypatch, mode):
    # Promise: an edit written into the main file under an open ledger (here the head's
    # count, lowered and checkpointed) is synced and verified at the next leased step:
    # LedgerStateError, nothing handed out, the ledger stays closed. In WAL mode the edit
    # reaches the main file at a checkpoint, which moves its stat's times.
    path = tmp_path / "e.db"
    ledger = _leased(path, monkeypatch, mode)
    _next_tick(path)
    edit_head_and_expect_refusal(ledger, path, STEP, checkpoint=mode == "wal")


# The path check of a leased step (deleted or replaced -> LedgerStateError), in WAL mode
# (the default): tests/test_adv_repeat_lane.py::test_a_leased_step_through_the_lane_checks_the_file.
