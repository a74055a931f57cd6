"""Task lo7, items 2 and 3: the read-back after a COMMIT lost with its connection
(``PostgresStore._resolve``).

2. It waited for the head's lock up to the whole timeout at each attempt, however little
   of the read-back's deadline was left: up to about twice the timeout in all. Each wait
   (the connect's and the lock's) now gets what is left of one deadline. Checked with a
   fake clock and a fake server: no timing.
3. An interrupt (KeyboardInterrupt) during that lock wait left the store usable (only the
   Ledger above it was broken). The store now fails closed too.
"""

from __future__ import annotations

import re
import types

import psycopg
import pytest

from privguard import LedgerStateError
from privguard._stores import _postgres
from privguard._stores._postgres import PostgresStore

TIMEOUT = 10.0


class Clock:
    """A fake ``time`` module: ``monotonic`` reads ``now``, which only the fakes move."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Server:
    """A fake server: ``refusals`` connects fail (3 s each), then a connection whose wait
    for the head's lock runs out (the lost session keeps it) after the lock_timeout set,
    or is interrupted (``interrupt``)."""

    def __init__(self, clock: Clock, refusals: int, interrupt: bool = False) -> None:
        self.clock, self.refusals, self.interrupt = clock, refusals, interrupt
        self.connects: list[tuple[float, float | None]] = []  # (when, within)
        self.lock_waits: list[tuple[float, float]] = []  # (when, lock_timeout in s)
        self.pending: float | None = None

    def connect(self, within: float | None = None) -> object:
        self.connects.append((self.clock.now, within))
        if len(self.connects) <= self.refusals:
            self.clock.now += 3.0
            raise psycopg.OperationalError("connection refused")
        return types.SimpleNamespace(execute=self.execute, closed=False, broken=False)

    def execute(self, query: str, params: object = None) -> object:
        found = re.search(r"lock_timeout = '(\d+)ms'", query)
        if found:
            self.pending = int(found.group(1)) / 1000
            self.lock_waits.append((self.clock.now, self.pending))
        if "lock_head" in query:
            if self.interrupt:
                raise KeyboardInterrupt
            assert self.pending is not None
            self.clock.now += self.pending  # waited the whole lock_timeout, in vain
            raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
        return types.SimpleNamespace(fetchone=lambda: None)


def _store(monkeypatch, server: Server, clock: Clock) -> PostgresStore:
    store = PostgresStore("postgresql://nobody@127.0.0.1:1/db?ledger=lost", timeout=TIMEOUT)
    store.ledger_id, store._written = "id", (3, "digest")
    monkeypatch.setattr(store, "_connect", server.connect)
    monkeypatch.setattr(_postgres, "time", clock)
    return store


def test_the_read_back_keeps_to_one_deadline(monkeypatch):
    clock = Clock()
    server = Server(clock, refusals=3)
    store = _store(monkeypatch, server, clock)
    with pytest.raises(LedgerStateError, match="may or may not have been recorded"):
        store._resolve(psycopg.errors.AdminShutdown("terminating connection"))
    assert store._desync is not None
    # three refused connects (0, 3.2, 6.4), then a lock wait begun at 9.6: with what is left
    assert server.lock_waits, server.connects
    for when, wait in server.lock_waits:
        assert wait <= TIMEOUT - when + 1e-3, server.lock_waits
    for when, within in server.connects:
        assert within is not None and within <= TIMEOUT - when + 1e-9, server.connects
    assert clock.now <= TIMEOUT + 1e-3  # not the ~2 × TIMEOUT of a whole wait at the end


def test_an_interrupt_during_the_lock_wait_leaves_the_store_failed_closed(monkeypatch):
    clock = Clock()
    server = Server(clock, refusals=0, interrupt=True)
    store = _store(monkeypatch, server, clock)
    with pytest.raises(KeyboardInterrupt):
        store._resolve(psycopg.errors.AdminShutdown("terminating connection"))
    assert store._desync is not None
    monkeypatch.setattr(store, "_connect", lambda *a: pytest.fail("connected again"))
    with pytest.raises(LedgerStateError, match="reopen"):
        with store._session(False, None):
            pass


class _Recorded(Exception):
    """Raised by the fake ``psycopg.connect`` below, once it has recorded its options."""


@pytest.mark.parametrize("url_timeout, within, most", [
    ("60", 3.0, 3), ("0", 4.0, 4), ("2", 9.0, 2), ("nonsense", 5.0, 5)])
def test_a_url_connect_timeout_does_not_overrun_the_read_back_deadline(
        monkeypatch, url_timeout, within, most):
    """Task lo8: a ``connect_timeout`` in the user's URL was passed on as given, so one
    read-back connect could take 60 s (or, with 0, wait indefinitely) of a 3 s deadline.
    Each connect within a deadline now waits at most the smaller of the two."""
    seen: list[dict] = []

    def connect(conninfo: str, **options: object) -> object:
        seen.append(options)
        raise _Recorded

    url = f"postgresql://nobody@127.0.0.1:1/db?ledger=lost&connect_timeout={url_timeout}"
    store = PostgresStore(url, timeout=TIMEOUT)
    monkeypatch.setattr(psycopg, "connect", connect)
    with pytest.raises(_Recorded):
        store._connect(within)
    assert seen and "connect_timeout" in seen[0], seen
    assert 1 <= int(seen[0]["connect_timeout"]) <= most, seen
    with pytest.raises(_Recorded):  # no deadline (an ordinary connect): the URL's value
        store._connect()
    assert "connect_timeout" not in seen[1], seen


@pytest.mark.parametrize("url, within, most", [
    # a password (percent-encoded or not) holding the parameter's name sets no timeout
    ("postgresql://nobody:my_connect_timeout@127.0.0.1:1/db?ledger=pw", None, 10),
    ("postgresql://nobody:connect_timeout%3D5@127.0.0.1:1/db?ledger=pw", None, 10),
    ("postgresql://nobody@127.0.0.1:1/db?ledger=pw&application_name=connect_timeout", 3.0, 3),
    # the parameter percent-encoded is the parameter (libpq decodes names): the URL's value
    ("postgresql://nobody@127.0.0.1:1/db?ledger=pw&connect%5Ftimeout=60", 3.0, 3)],
    ids=["password", "password-encoded", "other-value", "encoded-name"])
def test_connect_timeout_is_the_urls_parameter_not_a_substring(monkeypatch, url, within, most):
    """Review rlo8: ``_connect`` tested ``"connect_timeout" not in conninfo`` as a
    substring, so a password (or another parameter's value) holding those letters was
    taken for the parameter: an ordinary connection was then made with no
    ``connect_timeout`` at all, and libpq waits indefinitely for an unreachable server.
    The URL is now read as libpq reads it."""
    seen: list[dict] = []

    def connect(conninfo: str, **options: object) -> object:
        seen.append(options)
        raise _Recorded

    store = PostgresStore(url, timeout=TIMEOUT)
    monkeypatch.setattr(psycopg, "connect", connect)
    with pytest.raises(_Recorded):
        store._connect(within)
    assert "connect_timeout" in seen[0], seen
    assert 1 <= int(seen[0]["connect_timeout"]) <= most, seen
