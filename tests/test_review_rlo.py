"""Review rlo of task lo, on every store that takes leases (SQLite, PostgreSQL as owner and
as a charging role): a held ledger's close, a closed ledger's refusals, and ``times=k``
beside a lease, which task lo tested on SQLite only."""

from __future__ import annotations

import numpy as np
import pytest
from test_store_contract import KINDS

from privguard import LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)
EVAL = M.Gaussian(40.0)
LEASED = [k for k in KINDS if k != "memory"]


@pytest.fixture(params=LEASED, ids=LEASED)
def kind(request, tmp_path):
    if request.param.startswith("postgres"):
        request.getfixturevalue("pg_server")
    return KINDS[request.param](tmp_path)


def _leased(kind):
    """A ledger 40 training steps in, with its live lease (prefetch off: exact counts)."""
    ledger = kind.make(8.0, 1e-5, prefetch=False)
    for _ in range(40):
        ledger.charge(STEP, label="train")
    assert ledger._lease is not None and ledger._lease.left > 0
    return ledger


def test_a_held_ledger_closes_records_its_remainder_and_refuses(kind):
    ledger = _leased(kind)
    left, spent = ledger._lease.left, len(ledger.history)
    assert ledger._hold("held for a test")
    ledger.close()  # it raised the hold's refusal on the code before task lo
    ledger._unhold()
    with pytest.raises(LedgerStateError, match="closed"):
        ledger.charge(STEP, label="train")
    with pytest.raises(LedgerStateError, match="closed"):
        ledger.epsilon()
    again = kind.reopen(ledger)
    try:
        assert len(again.history) == spent  # the remainder stays spent
        unused = [e["steps"] for e in again.events if e.get("event") == "lease-unused"]
        # a charging role appends charges only: its remainder stays spent, unrecorded
        assert unused == ([] if kind.name == "postgres-charger" else [left])
    finally:
        again.close()


@pytest.mark.parametrize("k", [2, 3])
def test_times_k_beside_a_lease_records_what_k_single_charges_record(kind, k):
    def run(times):
        ledger = _leased(kind)
        if times:
            ledger.charge(EVAL, label="eval", times=k)
        else:
            for _ in range(k):
                ledger.charge(EVAL, label="eval")
        for _ in range(5):
            ledger.charge(STEP, label="train")
        decisions = [ledger.can_afford(m) for m in (STEP, EVAL, M.Gaussian(0.5))]
        ledger.close()
        again = kind.reopen(ledger)
        try:
            return ([{key: v for key, v in e.items() if key not in ("time", "pid")}
                     for e in again.events if e.get("event") == "lease-unused"],
                    [(r.index, r.label, r.mechanism) for r in again.history],
                    again.spent, decisions)
        finally:
            again.close()

    at_once, singles = run(True), run(False)
    assert at_once[0] == singles[0]
    assert at_once[1] == singles[1]
    assert np.array_equal(at_once[2], singles[2]) and at_once[3] == singles[3]
