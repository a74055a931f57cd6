"""Review rr: a restored older copy whose last run the same process grew past the pickled
count must not load.

A pickled file or server ledger carries how far its journal went; a run's row grows in
place. Before the fix, any ledger of the process that wrote a run could grow it: an
older copy restored (the run at 116 charges) and charged again by the same process past
the pickled count (212) read, at loading, as the pickled run grown, and loaded; the
charges the restore dropped were lost. Now a run's row grows only through the ledger
that wrote it (docs/reference.md "Framework callbacks", "a run's row grows in place"), so another ledger, even in the
same process, starts a row of its own, and the older copy no longer extends the pickle.
"""

from __future__ import annotations

import os
import pickle
import shutil

import _pgserver
import pytest
from _pgbackup import backup as _backup
from _pgbackup import restore as _restore
from _sqlite_edits import charges as _charges

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.Gaussian(100.0)


def _loaded_charges(blob: bytes) -> int:
    """The charges the ledger pickled in ``blob`` holds once loaded (then closed)."""
    copy = pickle.loads(blob)
    try:
        return int(copy._acc.journal.charges)
    finally:
        copy.close()


def _copy(src, dst) -> None:
    """``dst`` made a copy of the ledger file ``src`` (a new inode)."""
    tmp = str(dst) + ".tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


@pytest.mark.parametrize("then", ["regrown", "regrown, then a row added"])
def test_a_file_restored_and_regrown_by_the_same_process_does_not_load(tmp_path, monkeypatch,
                                                                       then):
    # The rollback journal: the file holds every commit, so copying it while the ledger
    # is open is a backup of it.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", "rollback")
    path, backup = tmp_path / "l.db", tmp_path / "backup.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP, times=116, label="a")
    _copy(path, backup)  # the run at 116 charges
    ledger.charge(STEP, times=96, label="a")  # the same run, 212 charges
    blob = pickle.dumps(ledger)
    ledger.close()
    _copy(backup, path)  # restored: 116 charges
    again = Ledger.open(path, lease=1)  # the same process (pid), mechanism and label
    again.charge(STEP, times=100, label="a")  # past the pickled 212 if it grew the row
    if then != "regrown":
        again.charge(STEP, label="b")
    again.close()
    assert _charges(path) == 216 + (then != "regrown")
    with pytest.raises(LedgerStateError, match="restored from an older copy"):
        pickle.loads(blob)


def test_another_ledger_of_the_process_writes_a_row_of_its_own(tmp_path):
    # What makes the refusal sound: a ledger grows only the run it wrote; a second ledger
    # on the file (the same process, mechanism and label) starts a row, and both pickles,
    # taken before, load: the rows they saw are as they saw them.
    path = tmp_path / "l.db"
    first = Ledger(3.0, 1e-5, path=path, lease=1)
    first.charge(STEP, times=3, label="a")
    blob = pickle.dumps(first)
    second = Ledger.open(path, lease=1)
    second.charge(STEP, times=2, label="a")
    blob2 = pickle.dumps(second)
    first.charge(STEP, label="a")  # first's run ended with second's row: a row again
    second.charge(STEP, label="a")
    rows = [(r.count, r.label) for r in second._store.runs()]
    assert rows == [(3, "a"), (2, "a"), (1, "a"), (1, "a")]
    assert second._store.verify()["runs"] == 4  # the checkpoints and the chain agree
    first.close()
    second.close()
    assert _loaded_charges(blob) == _loaded_charges(blob2) == 7


def test_the_ledger_that_wrote_a_run_still_grows_it(tmp_path):
    path = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    ledger.charge(STEP, times=3, label="a")
    blob = pickle.dumps(ledger)
    for _ in range(4):
        ledger.charge(STEP, label="a")
    assert [r.count for r in ledger._store.runs()] == [7]
    ledger.close()
    copy = pickle.loads(blob)  # the pickled run, grown since by the ledger that wrote it
    try:
        copy.charge(STEP, label="a")  # the loaded ledger did not write it: a row of its own
        assert [r.count for r in copy._store.runs()] == [7, 1]
    finally:
        copy.close()


def test_a_server_restored_and_regrown_by_the_same_process_does_not_load(pg):
    srv, db, name = pg
    url = srv.url(_pgserver.OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, lease=1)
    ledger.charge(STEP, times=116, label="a")
    backup = _backup(srv, db, name)
    ledger.charge(STEP, times=96, label="a")
    blob = pickle.dumps(ledger)
    ledger.close()
    _restore(srv, db, name, backup)
    again = Ledger.open(url, lease=1)
    again.charge(STEP, times=100, label="a")
    again.close()
    assert _charges(url) == 216
    with pytest.raises(LedgerStateError, match="restored from an older copy"):
        pickle.loads(blob)


def test_another_server_ledger_of_the_process_writes_a_row_of_its_own(pg):
    srv, db, name = pg
    url = srv.url(_pgserver.OWNER, db, name)
    first = Ledger(3.0, 1e-5, path=url, lease=1)
    first.charge(STEP, times=3, label="a")
    blob = pickle.dumps(first)
    second = Ledger.open(url, lease=1)
    second.charge(STEP, times=2, label="a")
    first.charge(STEP, label="a")
    assert [r.count for r in second._store.runs()] == [3, 2, 1]
    first.close()
    second.close()
    assert _loaded_charges(blob) == 6
