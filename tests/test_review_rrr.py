"""Review rrr (of rr: a run's row grows only through the ledger that wrote it).

The ownership is in memory (``Journal.own_runs_only``, ``_own``): nothing in a store
enforces it. A sync path that cleared ``_own`` on the ledger's own run (after its own
lease commit, a prefetch's commit, a read transaction, a pickle) would still be sound but
would start a row at every lease: these tests pin that one ledger's charges of one key
stay one row in each store that keeps rows, with leases, without, and with prefetch, with
reads, pickles and a reader of the same process in between.
"""

from __future__ import annotations

import os
import pickle
import shutil

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.Gaussian(100.0)

VARIANTS = {"leases": {}, "lease=1": {"lease": 1}, "prefetch": {"prefetch": True}}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_ledger_keeps_one_row_across_its_leases_and_reads(leased_store, variant):
    ledger = leased_store.make(30.0, 1e-5, **VARIANTS[variant])
    reader = Ledger.open(ledger.path, read_only=True)  # the same process, reading only
    try:
        for i in range(120):
            ledger.charge(STEP, label="a")
            if i % 17 == 0:  # read transactions of this ledger and of a reader
                assert ledger.can_afford(STEP)
                assert ledger.leased_unused >= 0
                len(ledger.history)
                pickle.dumps(ledger)
                reader.epsilon()
        runs = [(r.label, r.pid) for r in leased_store.reopen(ledger).runs]
        # one run of this ledger's key (a lease may run ahead: its count is not pinned)
        assert len(runs) == 1, runs
    finally:
        reader.close()
        ledger.close()


def test_a_run_resumed_from_a_checkpoint_is_not_grown_after_a_restore(tmp_path, monkeypatch):
    # rr's tests restore a file without checkpoints: the reopened ledger replays the run
    # (start_run). Here the older copy's newest checkpoint ends on that run, so reopening
    # resumes it from the checkpoint (Journal.from_snapshot), with no row replayed: that
    # run is not the reopened ledger's either, and its next charge starts a row.
    from privguard._stores import _sqlite

    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 4)
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", "rollback")  # a copy is a backup
    path, backup = tmp_path / "l.db", tmp_path / "backup.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP, label="a")  # rows: fix, run a
    ledger.charge(M.Gaussian(90.0), label="b")  # run b
    ledger.charge(STEP, times=116, label="a")  # run a, the 4th row: a checkpoint ends on it
    _copy(path, backup)
    ledger.charge(STEP, times=96, label="a")  # the same row, 212 charges
    blob = pickle.dumps(ledger)
    ledger.close()
    _copy(backup, path)
    again = Ledger.open(path, lease=1)
    assert again._acc.journal.runs_before == 2  # resumed from the checkpoint
    again.charge(STEP, times=100, label="a")
    assert [r.count for r in again._store.runs()] == [1, 1, 116, 100]
    again.close()
    with pytest.raises(LedgerStateError, match="restored from an older copy"):
        pickle.loads(blob)


def _copy(src, dst) -> None:
    tmp = str(dst) + ".tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
