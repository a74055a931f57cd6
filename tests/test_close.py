"""Closing a ledger (issue 26): every normal close records a lease's unused remainder
as a ``lease-unused`` event (it stays spent)."""

from __future__ import annotations

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting import _lease
from privguard._cli._report import report

STEP = M.SubsampledGaussian(1.0, 0.01)


def _leased(path) -> Ledger:
    """A file ledger holding a live lease: 10 steps released, 6 leased and unused."""
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=False)
    for _ in range(10):
        ledger.charge(STEP)
    assert (len(ledger.history), ledger.leased_unused) == (16, 6)
    return ledger


def _recorded(path) -> list[dict]:
    again = Ledger.open(path, read_only=True)
    try:
        assert len(again.history) == 16  # the remainder stays spent
        data = report(again)
        assert (data["leased_unused"], data["released"]) == (6, 10)
        return [e for e in again.events if e["event"] == _lease.UNUSED]
    finally:
        again.close()


@pytest.mark.parametrize("how", ["close", "with"])
def test_a_plain_close_records_the_remainder(tmp_path, how):
    path = tmp_path / "l.db"
    ledger = _leased(path)
    if how == "with":
        with ledger:
            pass
    else:
        ledger.close()
    assert [(e["steps"], e["reason"]) for e in _recorded(path)] == [(6, "close")]


def test_a_held_ledger_closes_and_records_the_remainder(tmp_path):
    # A ledger held by private_optimize while its trials run refuses reads and charges;
    # its close raised that refusal (after closing the file) and left the remainder
    # unrecorded. Closing reads and charges nothing: it closes, records, and ends the hold.
    path = tmp_path / "l.db"
    ledger = _leased(path)
    assert ledger._hold("held for a test")
    ledger.close()
    ledger._unhold()  # the holder's release, after the close: the ledger stays closed
    with pytest.raises(LedgerStateError, match="closed"):
        ledger.charge(STEP)
    assert [(e["steps"], e["reason"]) for e in _recorded(path)] == [(6, "close")]
