"""An adversarial pass over the PostgreSQL store (task adv5), each finding kept as a test:
a client encoding or a float output setting of the URL, the role or the database that made
the client fail (a built-in exception out of ``charge``, a legitimate journal refused as
edited), a wall clock stepped back between two charges of one run (SQLite's journal too),
a COMMIT still running on the server when the client lost its connection, which the
read-back reported as not recorded, and server-init's role names and client encoding."""

from __future__ import annotations

import time
import uuid
from unittest import mock

import _pgserver
import psycopg
import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores._pgadmin import server_init

STEP = M.SubsampledGaussian(1.0, 0.01)
OWNER, CHARGER = _pgserver.OWNER, _pgserver.CHARGER


# -- what the session reads and writes in ------------------------------------------------------
def test_a_label_outside_a_latin1_client_encoding_is_charged(pg):
    """``client_encoding=LATIN1`` in the URL: the label was encoded by psycopg as Latin-1,
    and UnicodeEncodeError escaped ``charge`` (a built-in exception; the ledger broke)."""
    _, charger_url = _pgserver.team(pg, "first")
    job = Ledger.open(charger_url + "&client_encoding=LATIN1")
    job.charge(STEP, label="日本")
    job.charge(STEP, label="日本")  # the ledger goes on
    job.close()
    assert [r.label for r in Ledger.open(charger_url).history] == ["first", "日本", "日本"]
    assert Ledger.open(charger_url)._store.verify()["charges"] == 3


def test_a_database_that_rounds_floats_does_not_make_the_journal_read_as_edited(pg_server):
    """``extra_float_digits = 0`` (a database default here; a role's or the URL's
    ``options`` as well) rounds every float8 the server sends to 15 digits: the run times
    read back differed from the ones digested, and every replay refused the journal as
    edited (the ledger could never be opened again)."""
    srv = pg_server
    db, name = srv.new_database(), "t" + uuid.uuid4().hex[:12]
    srv.admin(f"ALTER DATABASE {db} SET extra_float_digits = 0")
    url = srv.url(db=db, ledger=name)
    with mock.patch("time.time", lambda: 1795800000.1234567):  # 17 significant digits
        first = Ledger(3.0, 1e-5, path=url)
        first.charge(STEP, label="a")
        first.close()
    again = Ledger.open(url)  # replays the row written
    again.charge(STEP, label="b")
    assert [r.label for r in again.history] == ["a", "b"]
    assert again.history[0].time == 1795800000.1234567
    assert again._store.verify()["charges"] == 2


# -- a wall clock stepped back ------------------------------------------------------------------
def _charge_across_a_clock_step(path):
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(STEP, label="a")
    real = time.time
    with mock.patch("time.time", lambda: real() - 3600.0):  # NTP steps the clock back
        ledger.charge(STEP, label="a")  # the same run grows
    ledger.close()
    again = Ledger.open(path)
    assert [r.label for r in again.history] == ["a", "a"]
    runs = again._store.runs()
    assert len(runs) == 1 and runs[0].count == 2 and runs[0].last_time >= runs[0].first_time
    again.charge(STEP, label="a")
    assert len(Ledger.open(path).history) == 3


def test_a_clock_stepped_back_inside_a_run_on_the_server(pg):
    """The run's last time went back: the server's triggers refused the charge (reported
    as a permission denied) and the ledger had to be reopened."""
    srv, db, name = pg
    _charge_across_a_clock_step(srv.url(OWNER, db, name))


def test_a_clock_stepped_back_inside_a_run_in_sqlite(tmp_path):
    """SQLite wrote a run whose last time is before its first: no open replayed the
    journal again ("run 0 does not follow the journal"), a ledger lost for good."""
    _charge_across_a_clock_step(str(tmp_path / "budget.db"))


# -- a COMMIT whose outcome the client did not see -----------------------------------------------
def _send_commit_and_drop(conn):
    """Make ``conn`` send COMMIT and drop at once, while the server still runs it."""
    plain = conn.execute

    def execute(query, *args, **kw):
        if query != "COMMIT":
            return plain(query, *args, **kw)
        conn.pgconn.send_query(b"COMMIT")
        conn.pgconn.flush()
        conn.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    conn.execute = execute


def test_a_commit_still_running_when_the_connection_dropped_is_read_back_as_recorded(pg):
    """The server finishes a COMMIT whose client went away (here a deferred trigger takes
    2 s; a slow flush or a synchronous standby in production). The read-back ran at once,
    saw no row yet and said "the charge was NOT recorded", which was recorded a moment
    later: the caller was told wrong (and a retry charged twice). It now waits for the
    head's lock, which the old session holds until its transaction ends."""
    srv, db, name = pg
    _, charger_url = _pgserver.team(pg, "first")
    job = Ledger.open(charger_url)
    job.charge(STEP, label="before")
    label, trigger = f"adv5-{name}", f"adv5_slow_{name}"
    srv.admin("CREATE OR REPLACE FUNCTION public.adv5_slow() RETURNS trigger LANGUAGE plpgsql "
              "AS $$ BEGIN IF NEW.label LIKE 'adv5-%' THEN PERFORM pg_sleep(2); END IF; "
              "RETURN NEW; END $$", db=db)
    srv.admin(f"CREATE CONSTRAINT TRIGGER {trigger} AFTER INSERT ON privguard.entries "
              "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.adv5_slow()",
              db=db)
    try:
        _send_commit_and_drop(job._store._conn)
        try:  # the COMMIT's read-back waits for the old session (2 s here)
            outcome = {"record": job.charge(STEP, label=label)}
        except LedgerStateError as exc:
            outcome = {"error": exc}
    finally:
        srv.admin(f"DROP TRIGGER {trigger} ON privguard.entries", db=db)
    labels = [r.label for r in Ledger.open(charger_url).history]
    assert labels.count(label) == 1  # the server committed it
    assert "record" in outcome, outcome  # and the client says so, and goes on
    job.charge(STEP, label="after")
    assert [r.label for r in Ledger.open(charger_url).history] == ["first", "before", label,
                                                                   "after"]


# -- server-init's role names and encoding ---------------------------------------------------
@pytest.mark.parametrize("arg", ["charger", "owner"])
@pytest.mark.parametrize("role", ["\ud800x", "a\x00b", "Ü" * 32])
def test_server_init_refuses_a_role_name_the_server_would_not_keep(pg_server, arg, role):
    """A lone surrogate raised UnicodeEncodeError out of server-init, a NUL was reported as
    the server's failure, and a name of 32 "Ü" (64 bytes, 32 characters) was truncated by
    the server to another role's name, 31 "Ü", which then owned the schema."""
    srv = pg_server
    db = srv.new_database()
    roles = {"charger": "c" + uuid.uuid4().hex[:8], "owner": "o" + uuid.uuid4().hex[:8]}
    roles[arg] = role
    with pytest.raises(InvalidArgumentError, match=f"^{arg}="):
        server_init(srv.url(db=db), "team", 1.0, 1e-5, **roles)
    assert srv.admin("SELECT 1 FROM pg_namespace WHERE nspname = 'privguard'", db=db) == []


def test_server_init_under_a_latin1_client_encoding_names_any_role(pg_server):
    """``client_encoding=LATIN1`` in the URL: a role name outside Latin-1 raised
    UnicodeEncodeError out of server-init."""
    srv = pg_server
    db, tag = srv.new_database(), uuid.uuid4().hex[:8]
    charger, owner = f"訓練{tag}", f"o{tag}"
    done = server_init(srv.url(db=db) + "?client_encoding=LATIN1", "team", 1.0, 1e-5,
                       charger=charger, owner=owner)
    assert done["charger"] == charger
    assert srv.admin("SELECT 1 FROM privguard.chargers WHERE ledger = 'team' AND role = %s",
                     (charger,), db=db) == [(1,)]
