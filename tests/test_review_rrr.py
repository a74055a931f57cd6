"""Review rrr (of rr: a run's row grows only through the ledger that wrote it).

The ownership is in memory (``Journal.own_runs_only``, ``_own``): nothing in a store
enforces it. A sync path that cleared ``_own`` on the ledger's own run (after its own
lease commit, a prefetch's commit, a read transaction, a pickle) would still be sound but
would start a row at every lease: these tests pin that one ledger's charges of one key
stay one row in each store that keeps rows, with leases, without, and with prefetch, with
reads, pickles and a reader of the same process in between.
"""

from __future__ import annotations

import pickle

import pytest

from privguard import Ledger
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
