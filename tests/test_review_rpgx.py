"""Review rpgx: the journal extent a pickled file or server ledger carries (pgx)."""

from __future__ import annotations

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M


@pytest.mark.parametrize("at", [0, 1])
@pytest.mark.parametrize("value", [2**70, -1])
def test_a_pickle_with_an_out_of_range_journal_position_is_refused(leased_store, at, value):
    # An edited pickle's row or charge count no journal can hold: the SQLite query raised
    # OverflowError (a built-in exception) for 2**70, and a negative count was taken as a
    # position; both are unreadable positions, refused with LedgerStateError.
    ledger = leased_store.make(3.0, 1e-5, lease=1)
    ledger.charge(M.Gaussian(10.0), times=3, label="a")
    state = ledger.__getstate__()
    ledger.close()
    state["store"]["seen"][at] = value
    copy = Ledger.__new__(Ledger)
    with pytest.raises(LedgerStateError, match="journal position"):
        copy.__setstate__(state)
