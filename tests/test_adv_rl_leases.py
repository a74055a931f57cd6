"""Adversarial review rl of leases and the durable stores (issue 26; docs/theory.md §13).

Each test states the promise it checks and failed on the code before its fix.
"""

from __future__ import annotations

import pytest

from privguard import BudgetExhausted, Ledger
from privguard import mechanisms as M

SMALL = M.SubsampledGaussian(noise_multiplier=5.0, sample_rate=0.001)
BIG = M.Gaussian(noise_multiplier=0.05)  # refused by a 3.0 target at once


@pytest.mark.parametrize("lease", [None, 1])
def test_a_charge_from_a_refusal_listener_is_durable(tmp_path, lease):
    # Promise (theory §13 Lemma 1; README "On disk"): a charge returns only once it is
    # committed, and a leased step is handed out only once its lease is. The "refused"
    # event was delivered inside the refused charge's write transaction: a listener
    # charging the ledger then (a fallback step) wrote into that transaction, its lease
    # was installed, and the refusal's ROLLBACK erased both from the file while this
    # ledger handed the steps out (16 steps another process never saw, with leases).
    path = tmp_path / "l.db"
    ledger = Ledger(epsilon=3.0, delta=1e-5, path=path, lease=lease)
    for _ in range(40):
        ledger.charge(SMALL, label="s")
    while ledger._lease is not None and ledger._lease.left:  # the next step takes a lease
        ledger.charge(SMALL, label="s")
    released = len(ledger.history)

    def fallback(event):
        if event.kind == "refused":
            ledger.charge(SMALL, label="s")

    ledger.add_listener(fallback)
    with pytest.raises(BudgetExhausted):
        ledger.charge(BIG, label="big")
    ledger.remove_listener(fallback)
    released += 1  # the listener's charge returned
    while ledger._lease is not None and ledger._lease.left:
        ledger.charge(SMALL, label="s")
        released += 1
    # what the file holds, read by another store: every released step, spent
    other = Ledger.open(path, read_only=True)
    assert len(other.history) >= released
    other.close()
    ledger.charge(SMALL, label="s")  # and this ledger is still consistent with its file
    ledger.close()
