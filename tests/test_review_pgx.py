"""Review pgx: a pickled PostgreSQL ledger must not load an older copy of itself."""

from __future__ import annotations

import pickle

import _pgserver
import pytest
from _pgbackup import backup as _backup
from _pgbackup import restore as _restore
from _sqlite_edits import charges as _charges

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

OWNER = _pgserver.OWNER


def _charged(pg, times: int) -> tuple[str, Ledger]:
    """The URL of a new server ledger charged ``times`` times in one run, and the ledger."""
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, lease=1)
    ledger.charge(M.Gaussian(10.0), times=times, label="a")
    return url, ledger


@pytest.mark.parametrize("later", ["the run grew", "a row was added", "rewritten after"])
def test_a_pickled_server_ledger_refuses_an_older_backup_of_itself(pg, later):
    # Before the fix a server ledger pickled its URL and ledger_id alone: a database
    # restored from an older backup (the same ledger_id, fewer charges) loaded as the
    # pickled ledger, which had spent more: the loaded ledger went backwards, and its
    # budget was spent again. "rewritten after": restored, then charged past the pickle's
    # count: more charges, but not the rows the pickled ledger saw (another label).
    srv, db, name = pg
    url, ledger = _charged(pg, 10)
    backup = _backup(srv, db, name)
    ledger.charge(M.Gaussian(10.0), times=10, label="a" if later == "the run grew" else "b")
    blob = pickle.dumps(ledger)
    ledger.close()
    _restore(srv, db, name, backup)
    assert _charges(url) == 10  # the backup opens as a ledger of its own
    if later == "rewritten after":
        other = Ledger.open(url, lease=1)
        other.charge(M.Gaussian(10.0), times=30, label="c")
        other.close()
    with pytest.raises(LedgerStateError, match="does not extend the journal"):
        pickle.loads(blob)


@pytest.mark.parametrize("how", ["same", "run grown", "rows added"])
def test_a_pickled_server_ledger_loads_its_journal_or_a_later_one(pg, how):
    # What must still load: the ledger as pickled, and the ledger charged since (its last
    # run grown, or rows appended after it), by this ledger or another client.
    _, ledger = _charged(pg, 3)
    assert "run" in ledger.__getstate__()["store"]  # (what a grown run keeps)
    blob = pickle.dumps(ledger)
    if how == "run grown":
        ledger.charge(M.Gaussian(10.0), times=2, label="a")
    elif how == "rows added":
        ledger.charge(M.Laplace(1.0), label="b")
        ledger.charge(M.Gaussian(10.0), label="a")
    ledger.close()
    copy = pickle.loads(blob)
    try:
        assert copy._acc.journal.charges == {"same": 3, "run grown": 5, "rows added": 5}[how]
    finally:
        copy.close()


def test_a_pickle_with_an_unreadable_journal_position_is_refused(pg):
    _, ledger = _charged(pg, 2)
    state = ledger.__getstate__()
    ledger.close()
    state["store"]["seen"] = [2, "2", "x", "y"]
    copy = Ledger.__new__(Ledger)
    with pytest.raises(LedgerStateError, match="journal position"):
        copy.__setstate__(state)


def test_a_pickle_without_a_journal_position_still_loads(pg):
    # A pickle from before the extent travelled (URL and ledger_id: review pgf) loads, and
    # is checked by its ledger_id alone (compatibility; it loaded before this change too).
    url, ledger = _charged(pg, 2)
    store = {"path": url, "ledger_id": ledger._store.ledger_id}
    ledger.close()
    copy = Ledger.__new__(Ledger)
    copy.__setstate__({"store": store})
    try:
        assert copy._acc.journal.charges == 2
    finally:
        copy.close()
    copy = Ledger.__new__(Ledger)
    with pytest.raises(LedgerStateError, match="not the ledger that was pickled"):
        copy.__setstate__({"store": store | {"ledger_id": "0" * 32}})
