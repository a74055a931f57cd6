"""Leftovers of the last closing notes (task lo3): each test fails on the code before."""

from __future__ import annotations

import pickle

import pytest
from _sqlite_edits import execute as _execute

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M


def test_a_pickled_file_ledger_whose_rows_are_no_utf8_is_a_ledger_state_error(tmp_path):
    # check_reference reads the two rows at the pickle's position; a row before the newest
    # checkpoint (never read at opening) whose label is no UTF-8 let sqlite3's
    # OperationalError ("Could not decode to UTF-8") escape pickle.loads.
    path = tmp_path / "l.db"
    ledger = Ledger(1e9, 1e-5, path=path, lease=1)
    for i in range(10):
        ledger.charge(M.Gaussian(50.0), label=f"l{i % 2}")
    blob = pickle.dumps(ledger)
    for i in range(510):  # past the first checkpoint (512 rows)
        ledger.charge(M.Gaussian(50.0), label=f"l{i % 2}")
    ledger.close()
    _execute(path, "UPDATE entries SET label = CAST(X'ff' AS TEXT) WHERE idx BETWEEN 5 AND 15")  # the pickle's last two rows among them
    with pytest.raises(LedgerStateError, match="unreadable journal"):
        pickle.loads(blob)


@pytest.mark.parametrize("variant", [1, 2])
def test_subset_tuning_at_an_order_just_above_an_integer_takes_the_next_integer(variant):
    # The bounds hold at integer orders and extend to α by ε(α) ≤ ε(⌈α⌉); an order within
    # 1e-12 above an integer k was rounded DOWN to k (ceil(α − 1e-12)), charging ε(k) <
    # ε(k + 1): an under-count. The next float above 3 must get the value at 4.
    import math

    from privguard.tuning import Poisson

    run = M.SubsampledGaussian(1.0, 0.01, steps=100)
    plan = M.SubsetTuning(M.RepeatAndSelect(run, Poisson(3.0)), run, q=0.1, variant=variant)
    at_3, at_4 = plan.rdp([3.0, 4.0])
    assert at_3 < at_4  # what makes rounding down an under-count here
    for above in (math.nextafter(3.0, math.inf), 3.0 + 5e-13):
        assert plan.rdp([2.0, above])[1] == at_4
