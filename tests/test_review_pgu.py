"""Review pgu: the PostgreSQL ledger as a user of a shared server sees it."""

from __future__ import annotations

import _pgserver
import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores._pgurl import parse

STEP = M.SubsampledGaussian(1.0, 0.01)


@pytest.mark.parametrize("param,value", [
    ("options", "-c%20statement_timeout%3D61000"),
    ("application_name", "team%20a+b"),
])
def test_other_parameters_reach_libpq_as_written(param, value):
    # libpq decodes %XX in a URI but not "+": "%20" re-encoded as "+" reached the
    # server as "-c+statement_timeout=61000", a parameter it refused
    conninfo, name, _ = parse(f"postgresql://u@h/d?ledger=x&{param}={value}")
    assert name == "x" and conninfo == f"postgresql://u@h/d?{param}={value}"


def test_a_session_option_in_the_url_applies(pg):
    srv, db, name = pg
    url = srv.url(_pgserver.OWNER, db, name) + "&options=-c%20statement_timeout%3D61000"
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(STEP)
    shown = ledger._store._conn.execute("SHOW statement_timeout").fetchone()[0]
    assert shown == "61s"
    ledger.close()
