"""Shared by the leased-step check tests (test_lease_check.py, test_adv_repeat_lane.py)."""

from __future__ import annotations

import sqlite3

import pytest

from privguard import LedgerStateError


def edit_head_and_expect_refusal(ledger, path, step, *, checkpoint: bool = False) -> None:
    """Lower the head row's count in the file behind an open, leased ledger (checkpointed
    into the main file when ``checkpoint``), then check the promise: the next charge is
    refused with a LedgerStateError naming the head, the lease hands nothing out, and the
    ledger stays closed."""
    lease = ledger._lease
    left = lease.left
    conn = sqlite3.connect(path)
    conn.execute("UPDATE head SET last_count = last_count - 1")
    conn.commit()
    if checkpoint:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with pytest.raises(LedgerStateError, match="head"):
        ledger.charge(step)
    assert lease.left == left
    with pytest.raises(LedgerStateError):
        ledger.charge(step)
