"""Issue 24 item 5: every PostgreSQL error path closes its connection.

psycopg warns ("connection ... was deleted while still open", a
ResourceWarning) when the garbage collector finds a connection nobody
closed. Each test runs one error path with ResourceWarnings recorded,
collects garbage, and requires that none was emitted.
"""

from __future__ import annotations

import contextlib
import gc
import uuid
import warnings

import _pgserver
import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores._pgadmin import server_init
from privguard._stores._postgres import PostgresStore

OWNER, CHARGER = _pgserver.OWNER, _pgserver.CHARGER


@contextlib.contextmanager
def no_unclosed_connection():
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_a_wrong_password_leaves_no_connection(pg):
    srv, db, name = pg
    url = f"postgresql://{OWNER}:not-the-password@127.0.0.1:{srv.port}/{db}?ledger={name}"
    with no_unclosed_connection(), pytest.raises(LedgerStateError):
        Ledger(3.0, 1e-5, path=url)


def test_an_unknown_role_leaves_no_connection(pg):
    srv, db, name = pg
    with no_unclosed_connection(), pytest.raises(LedgerStateError):
        Ledger(3.0, 1e-5, path=srv.url("no_such_role_" + uuid.uuid4().hex[:6], db, name))


def test_a_role_that_cannot_be_taken_leaves_no_connection(pg):
    """SET ROLE to a role the login may not take (server-init's owner path)."""
    srv, db, name = pg
    store = PostgresStore(srv.url(CHARGER, db, name), role=OWNER)
    with no_unclosed_connection():
        with pytest.raises(LedgerStateError):
            store.open(None, None, None)
        store.close()
        del store


@pytest.mark.parametrize("opener", ["open", "read-only", "constructor"])
def test_an_unknown_ledger_leaves_no_connection(pg, opener):
    srv, db, _ = pg
    url = srv.url(OWNER, db, "nosuch" + uuid.uuid4().hex[:8])
    with no_unclosed_connection(), pytest.raises(LedgerStateError):
        if opener == "constructor":
            Ledger(3.0, 1e-5, path=srv.url(CHARGER, db, "nosuch" + uuid.uuid4().hex[:8]))
        else:
            Ledger.open(url, read_only=opener == "read-only")


def test_a_configuration_mismatch_leaves_no_connection(pg):
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    Ledger(3.0, 1e-5, path=url).close()
    with no_unclosed_connection(), pytest.raises(LedgerStateError):
        Ledger(4.0, 1e-5, path=url)


def test_server_init_refusals_leave_no_connection(pg):
    srv, db, name = pg
    with no_unclosed_connection(), pytest.raises(LedgerStateError):
        server_init(srv.url(CHARGER, db), name, 3.0, 1e-5)  # may not create roles


def test_a_server_that_goes_away_leaves_no_connection(pg):
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    with no_unclosed_connection():
        srv.stop("immediate")  # the server is gone: the ledger's connection is dead
        try:
            with pytest.raises(LedgerStateError):
                ledger.charge(M.SubsampledGaussian(1.0, 0.01))
            with pytest.raises(LedgerStateError):
                Ledger.open(url)
            del ledger  # a user who never calls close() after the failure
        finally:
            srv.start()


def _server_connections(srv, db, name) -> int:
    """The connections the server holds open for ledger ``name`` (privguard names them),
    after up to 5 s for a closed one's backend to exit (a leaked one never does)."""
    import time

    deadline = time.monotonic() + 5.0
    while True:
        count = srv.admin("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                          ("privguard:" + name,), db=db)[0][0]
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


_TAMPER = {  # as the superuser, triggers off: what an attacker with the database could do
    "genesis": "UPDATE privguard.ledgers SET genesis = 'x' WHERE name = %s",
    "head": "UPDATE privguard.ledgers SET mac = 'x' WHERE name = %s",
    "config": "UPDATE privguard.ledgers SET config = replace(config, '3.0', '4.0') WHERE name = %s",
    "entry": "UPDATE privguard.entries SET digest = 'x' WHERE ledger = %s",
}


@pytest.mark.parametrize("tamper", sorted(_TAMPER))
def test_an_open_of_a_tampered_ledger_leaves_no_server_connection(pg, tamper):
    """Counted on the server (pg_stat_activity), with each refusal's traceback kept alive:
    a connection only the garbage collector would close stays open while it is referenced."""
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    ledger.close()
    srv.admin("SET session_replication_role = replica; " + _TAMPER[tamper].replace("%s", f"'{name}'"),
              db=db)
    assert _server_connections(srv, db, name) == 0
    kept = []
    for opener in ("open", "read-only", "constructor"):
        with pytest.raises(LedgerStateError) as info:
            if opener == "constructor":
                Ledger(3.0, 1e-5, path=url)
            else:
                Ledger.open(url, read_only=opener == "read-only")
        kept.append(info)  # the traceback holds the failed open's frames
        assert _server_connections(srv, db, name) == 0, opener
