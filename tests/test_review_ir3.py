"""Review ir3: an integration review of the merged branch fin11 (tb, acc, rpo; lo2, rlo2;
sq, rsq): what the branches do together."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest
from _sqlite_edits import in_child

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M


def _pickled_in_a_child(ledger: Ledger) -> bytes:
    """``pickle.dumps(ledger)`` in a forked child (before it ran any transaction)."""
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.write(out_w, pickle.dumps(ledger))
        finally:
            os._exit(0)
    os.close(out_w)
    chunks = []
    while chunk := os.read(out_r, 1 << 16):
        chunks.append(chunk)
    os.close(out_r)
    os.waitpid(pid, 0)
    return b"".join(chunks)


@pytest.mark.parametrize("mode", ["wal", "rollback"])
def test_a_ledger_pickled_in_a_forked_child_refuses_an_older_copy_of_its_file(
        tmp_path, monkeypatch, mode):
    # sq lets a forked child's store drop the parent's connection (SQLiteStore.forked) and
    # rsq pickles the journal's extent only while the store has a connection: a ledger
    # pickled in a forked child (a multiprocessing fork worker sending it on) carried its
    # file_id alone, and a restored older copy of the file loaded as it, with fewer charges
    # (1 of 3): the ledger went backwards.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", mode)
    path, backup = tmp_path / "l.db", tmp_path / "backup.db"
    ledger = Ledger(10.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(2.0))
    ledger.close()
    shutil.copyfile(path, backup)
    ledger = Ledger.open(path)
    ledger.charge(M.Gaussian(2.0))
    ledger.charge(M.Laplace(1.0))
    blob = _pickled_in_a_child(ledger)
    ledger.close()
    shutil.copyfile(backup, path)
    with pytest.raises(LedgerStateError, match="does not extend the journal"):
        pickle.loads(blob)


def test_a_ledger_pickled_in_a_forked_child_loads_its_own_file(tmp_path):
    # ... and the file itself, charged since, still loads from that pickle.
    path = tmp_path / "l.db"
    ledger = Ledger(10.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(2.0), times=3, label="a")
    blob = _pickled_in_a_child(ledger)
    ledger.charge(M.Gaussian(2.0), label="b")
    ledger.close()
    copy = pickle.loads(blob)
    try:
        assert copy._acc.journal.charges == 4
    finally:
        copy.close()


def test_a_closed_ledger_pickled_in_a_forked_child_opens_no_connection(tmp_path):
    # The at-fork hook lets go of every ledger's connection, a closed one's too (it has
    # none): pickling that closed ledger in the child must not reopen its file.
    path = tmp_path / "l.db"
    ledger = Ledger(10.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(2.0), times=3, label="a")
    ledger.close()

    def work() -> str:
        pickle.dumps(ledger)
        return "no connection" if ledger._store._conn is None else "opened"

    got = in_child(work)
    assert got == "no connection"


def test_the_hook_floor_follows_a_later_hook_after_one_whose_rate_is_nan():
    # rlo2's floor: the largest rate of Opacus' accountant hooks seen. One at attach whose
    # sample_rate is NaN made the floor NaN, which no later rate compares above: a hook at
    # 0.04 set after attach left the hand rate 0.01 charged.
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant

    from privguard.integrations.opacus import _at_least_hook, _HookFloor

    floor = _HookFloor(float("nan"))
    floor.follow(RDPAccountant().get_optimizer_hook_fn(sample_rate=0.04))
    assert _at_least_hook(0.01, floor.rate) == 0.04
