import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest


@pytest.fixture(scope="session")
def pg_server():
    """The suite's PostgreSQL server (tests/_pgserver.py), shut down at the end of the session."""
    import _pgserver

    if _pgserver.binaries() is None:
        if os.environ.get("CI") == "true":  # CI must test the server store, never skip it
            pytest.fail(_pgserver.SKIP_REASON + " (CI=true: failing rather than skipping)")
        pytest.skip(_pgserver.SKIP_REASON)
    yield _pgserver.server()
    _pgserver.stop()


@pytest.fixture
def pg(pg_server):
    """(server, database with server-init's roles, a fresh ledger name)."""
    import uuid

    import _pgserver

    return pg_server, _pgserver.initialised_database(), "t" + uuid.uuid4().hex[:12]


LEASED_STORES = ["sqlite", "postgres", "postgres-charger"]


@pytest.fixture(params=LEASED_STORES, ids=LEASED_STORES)
def leased_store(request, tmp_path):
    """A store kind that takes leases (tests/test_store_contract.py's KINDS): ``make(...)``
    a ledger, ``reopen(ledger)``; PostgreSQL as the owner and as a charging role."""
    from test_store_contract import KINDS

    if request.param.startswith("postgres"):
        request.getfixturevalue("pg_server")
    return KINDS[request.param](tmp_path)
