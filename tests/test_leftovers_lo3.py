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
