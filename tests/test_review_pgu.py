"""Review pgu: the PostgreSQL ledger as a user of a shared server sees it."""

from __future__ import annotations

import _pgserver
import psycopg
import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError, PrivguardError
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


@pytest.mark.parametrize("url,shown", [
    ("postgresql://ann:pa/Hunter2@127.0.0.1:1/db?ledger=x", ["Hunter2"]),
    ("postgresql://ann:pa?Hunter2@127.0.0.1:1/db?ledger=x", ["Hunter2"]),
    ("postgresql://ann:pa#Hunter2@127.0.0.1:1/db", ["Hunter2"]),
    ("postgresql://ann:pa@Hunter2@127.0.0.1:1/db", ["Hunter2"]),
    # review lo2: a password of digits before its delimiter read as a port, so the check
    # passed it, and the message showed the URL unmasked (libpq resolved the host "ann", or
    # read the password up to the '@'): every digit of it reached the message
    ("postgresql://ann:9876/5432@127.0.0.1:1/db?ledger=x", ["9876", "5432"]),
    ("postgresql://ann:9876?5432@127.0.0.1:1/db?ledger=x", ["9876", "5432"]),
    ("postgresql://ann:9876#5432@127.0.0.1:1/db", ["9876", "5432"]),
    ("postgresql://ann:98765432/@127.0.0.1:1/db", ["9876", "5432"]),
    # review rlo2: the '@' past the path, in the query or the fragment, passed lo2's check
    ("postgresql://ann:9876/5432?10@127.0.0.1:1/db", ["9876", "5432"]),
    ("postgresql://ann:9876?5432/10@127.0.0.1:1/db", ["9876", "5432"]),
    ("postgresql://ann:9876/5432#10@127.0.0.1:1/db", ["9876", "5432"]),
    ("postgresql://ann:9876#5432/10@127.0.0.1:1/db", ["9876", "5432"]),
])
def test_a_password_with_an_unencoded_delimiter_is_refused_unshown(url, shown):
    # urlsplit ends the authority at the first '/', '?' or '#' (so "ann:pa" had no
    # password to mask) and libpq ends the credentials at the first '@' (it then
    # resolved the host "Hunter2@127.0.0.1"): the password reached the message
    for attempt in (lambda: Ledger.open(url), lambda: Ledger(3.0, 1e-5, path=url)):
        with pytest.raises(PrivguardError) as caught:
            attempt()
        assert not [part for part in shown if part in str(caught.value)], str(caught.value)
        assert isinstance(caught.value, InvalidArgumentError) and caught.value.argument == "path"


@pytest.mark.parametrize("url", [
    "postgresql://h1:1,h2:2/db?ledger=x&application_name=a@b",
    "postgresql://[::1]:1/db?ledger=x",
    "postgresql://ann:p%40ss@127.0.0.1:1/db?ledger=x",
])
def test_well_formed_urls_are_still_accepted(url):
    _, name, shown = parse(url)
    assert name == "x" and "p%40ss" not in shown


class _CommitLost:
    """A connection whose COMMIT never reaches the server, with a driver message that
    repeats the password (the other driver messages are scrubbed: _error)."""

    def __init__(self, conn, secret):
        self._conn, self._secret = conn, secret

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, query, *args, **kw):
        if query == "COMMIT":
            self._conn.close()  # the server rolls the transaction back
            raise psycopg.OperationalError(f"connection to user:{self._secret} lost")
        return self._conn.execute(query, *args, **kw)


def test_a_lost_commit_never_shows_the_password(pg):
    srv, db, name = pg
    secret = srv.passwords[_pgserver.OWNER]
    url = srv.url(_pgserver.OWNER, db, name).replace("@", f":{secret}@", 1)
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(STEP)
    ledger._store._conn = _CommitLost(ledger._store._conn, secret)
    with pytest.raises(LedgerStateError) as caught:
        ledger.charge(STEP, label="lost")
    assert "NOT recorded" in str(caught.value) and secret not in str(caught.value)
    again = Ledger.open(url)
    assert [r.label for r in again.history] == [None]
    again.close()


def test_a_unix_socket_url_without_a_host_keeps_its_empty_authority():
    # review rlo2: "postgresql:///db?host=/tmp" reached libpq as "postgresql:/db?host=/tmp",
    # which it refuses ("invalid connection option"), and was shown so
    from psycopg.conninfo import conninfo_to_dict

    conninfo, name, shown = parse("postgresql:///db?host=/tmp&ledger=x&password=secret")
    assert conninfo == "postgresql:///db?host=/tmp&password=secret" and name == "x"
    assert conninfo_to_dict(conninfo)["host"] == "/tmp"
    assert shown == "postgresql:///db?host=/tmp&ledger=x&password=***"
