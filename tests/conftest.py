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
