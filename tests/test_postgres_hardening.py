"""The PostgreSQL store against a hostile charging role and hostile input (an adversarial
review's findings, each kept as a test): powerful roles refused by server-init, checkpoints
only at the head, NULL and non-finite run fields refused by the database, deeply nested
bodies failing closed, an owner's open bounded by its timeout, mechanisms registered with
a wrong digest, large raw curves, and passwords in every spelling kept out of messages."""

from __future__ import annotations

import threading
import uuid

import _pgserver
import numpy as np
import psycopg
import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError, PrivguardError, RDPCurve
from privguard import mechanisms as M
from privguard._stores._pgadmin import server_init
from privguard._stores._postgres import PostgresStore
from privguard._stores._rows import Cursor
from privguard._stores._sqlite import _dumps

STEP = M.SubsampledGaussian(1.0, 0.01)
OWNER, CHARGER = _pgserver.OWNER, _pgserver.CHARGER


_team = _pgserver.team  # a ledger the charging role charged once (the fix row and one run)


def _as(pg, user, sql, params=()):
    srv, db, _ = pg
    with psycopg.connect(srv.url(user, db), autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else None


def _charger_store(pg):
    srv, db, name = pg
    store = PostgresStore(srv.url(CHARGER, db, name))
    store.open(None, None, None)
    return store


def _append_run(pg, store, mech_id, mech_digest, pid="1", count="1", first="0", last="0"):
    """As the charging role, append a run row whose digests the library computes."""
    _, _, name = pg
    c = store._cursor
    numbers = [0.0 if x == "NULL" else float(x.strip("'")) for x in (first, last)]
    digest = store._run_digest(c.digest, c.entries, mech_digest, "x", 1, 1, *numbers)
    mac = store._head_mac(Cursor(c.entries + 1, 1, digest, c.digest, "run"))
    _as(pg, CHARGER, f"SELECT privguard.append(%s, %s, %s, 'run', %s, 'x', {pid}, {count}, "
        f"{first}::float8, {last}::float8, NULL, %s, %s)",
        (name, store.ledger_id, c.entries, mech_id, digest, mac))


# -- server-init -------------------------------------------------------------------------------
@pytest.mark.parametrize("power", ["CREATEROLE", "IN ROLE pg_write_all_data",
                                   "IN ROLE pg_execute_server_program", "grant", "group"])
def test_server_init_refuses_a_charging_role_that_could_write_or_become_owner(pg_server, power):
    srv = pg_server
    db, role = srv.new_database(), "r" + uuid.uuid4().hex[:8]
    url, owner = srv.url(db=db), "o" + role
    plain = power in ("grant", "group")
    srv.admin(f"CREATE ROLE {role} LOGIN{' NOINHERIT' if plain else ' ' + power}")
    if plain:  # a plain role, set up, then given a write privilege by hand: its own, or
        server_init(url, "team", 3.0, 1e-5, charger=role, owner=owner)  # a group's it can
        grantee = role if power == "grant" else "w" + role  # SET ROLE to (NOINHERIT or not)
        if power == "group":
            srv.admin(f"CREATE ROLE {grantee} NOLOGIN")
            srv.admin(f"GRANT {grantee} TO {role}")
        srv.admin(f"GRANT INSERT ON privguard.checkpoints TO {grantee}", db=db)
    with pytest.raises(LedgerStateError, match=f"role '{role}' cannot be a charging role"):
        server_init(url, "team", 3.0, 1e-5, charger=role, owner=owner)
    if not plain:  # refused before anything was created or granted
        assert srv.admin("SELECT to_regnamespace('privguard') IS NULL", db=db) == [(True,)]
    else:  # refused again, and its grants stay what they were (no EXECUTE on append_event)
        assert srv.admin("SELECT has_function_privilege(%s, 'privguard.append_event(text, "
                         "text, bigint, text, text, text, text)', 'EXECUTE')", (role,),
                         db=db) == [(False,)]


def test_a_checkpoint_is_accepted_only_at_the_journal_head(pg):
    _srv, _db, name = pg
    owner_url, _ = _team(pg)
    store = PostgresStore(owner_url)
    store.open(None, None, None)
    head = store._cursor
    row = (name, head.entries - 1, 0, head.prev, head.prev, "{}", "m")  # one row back
    with pytest.raises(psycopg.errors.CheckViolation, match="at the journal's head only"):
        _as(pg, OWNER, "INSERT INTO privguard.checkpoints VALUES (%s,%s,%s,%s,%s,%s,%s)", row)
    store.close()


# -- what the database refuses ------------------------------------------------------------------
@pytest.mark.parametrize("fields", [dict(count="NULL"), dict(pid="NULL"), dict(last="NULL"),
                                    dict(first="'NaN'", last="'NaN'"),
                                    dict(first="'-Infinity'"), dict(last="'Infinity'")])
def test_a_run_with_null_or_nonfinite_fields_is_refused_by_the_database(pg, fields):
    _, charger_url = _team(pg)
    store = _charger_store(pg)
    mech_id, digest = store._mechanism_id(store._connect(), M.Laplace(5.0))
    with pytest.raises(psycopg.errors.CheckViolation):
        _append_run(pg, store, mech_id, digest, **fields)
    store.close()
    assert len(Ledger.open(charger_url).history) == 1


def test_extending_a_run_by_a_null_count_is_refused(pg):
    srv, db, name = pg
    _team(pg)
    ledger_id, rows = srv.admin("SELECT ledger_id, entries FROM privguard.ledgers WHERE "
                                "name = %s", (name,), db=db)[0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="never changes"):
        _as(pg, CHARGER, "SELECT privguard.extend(%s, %s, %s, NULL, 1e12, 'd', 'm')",
            (name, ledger_id, rows - 1))


# -- what the client refuses ------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["mechanism", "fix"])
def test_a_deeply_nested_body_fails_closed(pg, where):
    srv, db, name = pg
    nested = "[" * 100_000 + "]" * 100_000
    if where == "fix":  # on a fresh ledger, before any charge
        Ledger(3.0, 1e-5, path=srv.url(OWNER, db, name)).close()
        _pgserver.allow_charger(db, name)
        store = _charger_store(pg)
        body = '{"plan":' + nested + "}"
        digest = store._entry_digest(store.genesis, 0, "fix", [body])
        mac = store._head_mac(Cursor(1, 0, digest, store.genesis, "fix"))
        _as(pg, CHARGER, "SELECT privguard.append(%s, %s, 0, 'fix', NULL, NULL, NULL, NULL, "
            "NULL, NULL, %s, %s, %s)", (name, store.ledger_id, body, digest, mac))
    else:
        _team(pg)
        store = _charger_store(pg)
        digest = store.integrity.digest("mechanism", nested)
        mech_id = _as(pg, CHARGER, "SELECT privguard.mechanism(%s, %s, %s, %s)",
                      (name, store.ledger_id, nested, digest))[0][0]
        _append_run(pg, store, mech_id, digest)
    store.close()
    for reader in (lambda: Ledger.open(srv.url(OWNER, db, name)),
                   lambda: Ledger.open(srv.url(OWNER, db, name), read_only=True)._store.verify()):
        with pytest.raises(LedgerStateError, match="unreadable"):
            reader()


def test_a_mechanism_registered_with_a_wrong_digest_does_not_block_the_honest_one(pg):
    _, charger_url = _team(pg)
    store = _charger_store(pg)
    _, _, name = pg
    _as(pg, CHARGER, "SELECT privguard.mechanism(%s, %s, %s, 'not-its-digest')",
        (name, store.ledger_id, _dumps(M.Laplace(7.0).to_dict())))
    store.close()
    honest = Ledger.open(charger_url)
    honest.charge(M.Laplace(7.0))
    assert Ledger.open(charger_url).runs == honest.runs
    assert honest._store.verify()["runs"] == 2


def test_a_raw_curve_larger_than_an_index_row_is_charged(pg):
    srv, db, name = pg
    orders = np.linspace(1.01, 500.0, 2000)  # a body of about 80 kB
    curve = RDPCurve(orders, 1e-3 * orders + np.random.default_rng(0).random(2000) * 1e-6)
    ledger = Ledger(10.0, 1e-5, path=srv.url(OWNER, db, name))
    ledger.charge(curve)
    again = Ledger.open(srv.url(OWNER, db, name))
    assert again.epsilon() == ledger.epsilon() and again.runs == ledger.runs


def test_an_owners_open_waits_for_the_head_no_longer_than_its_timeout(pg):
    srv, db, name = pg
    owner_url, _ = _team(pg)
    holder = psycopg.connect(srv.url(CHARGER, db))  # a job that took the lock and stopped
    holder.execute("SELECT * FROM privguard.lock_head(%s)", (name,)).fetchall()
    store, outcome = PostgresStore(owner_url, timeout=1.0), []

    def opening():
        try:
            store.open(None, None, None)
            outcome.append("opened")
        except PrivguardError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=opening, daemon=True)
    thread.start()
    thread.join(120)  # a bound for a hang, not a timing assertion
    holder.close()
    assert outcome and isinstance(outcome[0], LedgerStateError), outcome
    assert "lock timeout" in str(outcome[0])
    store.close()


# -- locations ------------------------------------------------------------------------------------
@pytest.mark.parametrize("url", [
    "postgresql://u@127.0.0.1:1/db?pass%77ord=TOPSECRET&ledger=x",
    "postgresql://u@127.0.0.1:1/db?PassWord=TOPSECRET&ledger=x",
    "postgresql://u:TOP%00SECRET@127.0.0.1:1/db?ledger=x",
    "postgresql://u:TOP%zzSECRET@127.0.0.1:1/db?ledger=x",
    "postgresql://u:TOP%20SECRET@127.0.0.1:1/db?ledger=x&connect_timeout=1",
    "postgresql://u:TOPSECRET@127.0.0.1:1/db?ledger=x&password=a%20TOPSECRET",
    "postgresql://u:TOPSECRET@[::1/db?ledger=x",
    "postgresql://u:TOPSECRET@h:port/db?ledger=x",
])
def test_no_spelling_of_a_password_reaches_a_message(url):
    with pytest.raises(PrivguardError) as err:
        Ledger(3.0, 1e-5, path=url)
    text = str(err.value) + repr(err.value.args)
    assert "SECRET" not in text, text


@pytest.mark.parametrize("url", ["postgresql://u@127.0.0.1:1/\udcff",
                                 "postgresql://u@127.0.0.1:1/db?application_name=\udcff"])
def test_a_url_that_is_not_unicode_text_is_an_invalid_argument(url):
    for attempt in (lambda: Ledger(3.0, 1e-5, path=url), lambda: Ledger.open(url)):
        with pytest.raises(InvalidArgumentError, match="path"):
            attempt()
