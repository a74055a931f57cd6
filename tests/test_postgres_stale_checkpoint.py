"""Task pgh: a PostgreSQL ledger whose checkpoint on the journal's head row is of an older curve
version (review rsg) gets a fresh one beside it at its owner's next writable open (schema 3),
and a database whose schema main created (version 2) works as it is until an administrator
runs ``privguard server-upgrade`` (review rpgh: no open migrates a schema).

Before, a checkpoint was keyed by its row alone and never replaced: a version-5 checkpoint on
the head row of a subsampled-Gaussian ledger (changed in curve version 6) made every open
replay the journal from the genesis, until a charge and then an owner's open. Whether an open
resumed is seen in the number of rows it replayed (``replayed``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import _pgserver
import numpy as np
import psycopg
import pytest
from test_checkpoint_v2_resume import (
    EVERY,
    RESUMED,
    _charges,
    _curve_version,
    _open,
    _todays,
    replayed,  # noqa: F401  (a fixture)
)

from privguard import InvalidArgumentError, Ledger, LedgerStateError, SchemaUpgradeWarning
from privguard import mechanisms as M
from privguard._cli._cli import main as cli
from privguard._stores import _rows
from privguard._stores._pgadmin import server_upgrade
from privguard._stores._postgres import PostgresStore

OWNER, CHARGER = _pgserver.OWNER, _pgserver.CHARGER
SCHEMA_V2 = Path(__file__).parent / "data" / "pgschema-v2-main-5a474ed.sql"
V = _rows.CHECKPOINT_CURVES  # the curve version this library writes
DPSGD = M.SubsampledGaussian(1.0, 0.01, steps=100)  # its curve changed in version 6 (task sg)
CHARGES = _charges(first=[DPSGD])[:EVERY - 1]  # and the fix row: the checkpoint's row is EVERY
GROWN = CHARGES + [CHARGES[-1]] * 3  # then the last run grows: the head stays on that row


def _version_2_database(srv):
    """A new database whose privguard schema is main's (version 2), owned by the test owner,
    the test charging role granted as server-init granted it."""
    _pgserver.initialised_database()  # the roles, with their passwords
    db = srv.new_database()
    srv.admin(f"CREATE SCHEMA privguard AUTHORIZATION {OWNER}", db=db)
    text = "\n".join(line for line in SCHEMA_V2.read_text().splitlines()
                     if not line.startswith("--"))
    statements = [s.strip() for s in text.split("\n;;") if s.strip()]
    with psycopg.connect(srv.url(OWNER, db), autocommit=True) as conn:
        with conn.transaction():
            for statement in statements:
                conn.execute(statement)
            for grant in (f"GRANT USAGE ON SCHEMA privguard TO {CHARGER}",
                          f"GRANT SELECT ON ALL TABLES IN SCHEMA privguard TO {CHARGER}",
                          f"GRANT EXECUTE ON FUNCTION privguard.lock_head(text) TO {CHARGER}"):
                conn.execute(grant)
            for fn in ("mechanism(text, text, text, text)",
                       "append(text, text, bigint, text, bigint, text, bigint, bigint, double "
                       "precision, double precision, text, text, text)",
                       "extend(text, text, bigint, bigint, double precision, text, text)"):
                conn.execute(f"GRANT EXECUTE ON FUNCTION privguard.{fn} TO {CHARGER}")
    assert _schema_version(srv, db) == "2"
    return db


def _schema_version(srv, db):
    return srv.admin("SELECT value FROM privguard.meta WHERE key = 'schema_version'", db=db)[0][0]


def _write_stale(url, charges):
    """The ledger at ``url`` charged with ``charges`` as main wrote it: its checkpoint of curve
    version 5, a version-2 schema left as it is (main's code never migrated)."""
    with _curve_version(5):
        ledger = Ledger(epsilon=1e6, delta=1e-5, path=url)
        for mechanism, label in charges:
            ledger.charge(mechanism, label=label)
        epsilon = ledger.epsilon()
        ledger.close()
    return epsilon


def _checkpoints(srv, db, name):
    """(row, count, curve version) of each checkpoint of ledger ``name``, in order."""
    return [(n, c, json.loads(s)["curves"]) for n, c, s in srv.admin(
        "SELECT entries, last_count, snapshot FROM privguard.checkpoints WHERE ledger = %s "
        "ORDER BY entries, last_count, snapshot::json->>'curves'", (name,), db=db)]


def _opened(url, replayed, read_only):  # noqa: F811
    ledger, rows = _open(url, replayed, read_only)
    out = rows, ledger.epsilon(), ledger.spent, ledger.state_dict()
    ledger.close()
    return out


def _replaced_once(srv, db, name, replayed, written, charges=GROWN):  # noqa: F811
    """The checks both tests make: the owner's first writable open replays from the genesis
    and writes a checkpoint of today's version beside the stale one; every later open (owner,
    charging role, read-only) resumes from it, with the same state; the ledger charges on."""
    owner, charger = srv.url(OWNER, db, name), srv.url(CHARGER, db, name)
    stale = _checkpoints(srv, db, name)
    assert stale == [(EVERY, 1, 5)]
    for url in (charger, owner):  # cannot (or, read-only, may not) write one: replays each time
        for read_only in (False, True) if url == charger else (True,):
            assert _opened(url, replayed, read_only)[0] > EVERY - 2
    assert _checkpoints(srv, db, name) == stale
    first = _opened(owner, replayed, False)
    assert first[0] > EVERY - 2  # from the genesis, once
    assert first[1] >= written  # the ε it showed then, or higher (today's curves)
    assert np.array_equal(first[2], _todays(charges))
    count = 1 + len(charges) - len(CHARGES)  # the count of the head's run now
    assert _checkpoints(srv, db, name) == [(EVERY, 1, 5), (EVERY, count, _rows.CHECKPOINT_CURVES)]
    for url, read_only in ((owner, False), (owner, True), (charger, False), (charger, True)):
        again = _opened(url, replayed, read_only)
        assert again[0] <= RESUMED  # resumed from the fresh checkpoint
        assert again[1] == first[1] and np.array_equal(again[2], first[2])
        assert again[3] == first[3]
    for url in (owner, charger):
        ledger = Ledger.open(url)
        ledger.charge(M.Gaussian(7.0), label="after")
        ledger.close()
    ledger, rows = _open(charger, replayed, False)
    assert rows <= RESUMED + 2 and ledger.epsilon() > first[1]
    report = ledger._store.verify()  # every checkpoint, both on row EVERY, held to the replay
    assert report["checkpoints"] == 2 and report["charges"] == len(charges) + 2
    ledger.close()


@pytest.mark.parametrize("charges", [CHARGES, GROWN], ids=["same-count", "grown"])
def test_a_stale_checkpoint_on_the_head_row_is_replaced_once(pg, replayed, charges):  # noqa: F811
    srv, db, name = pg
    written = _write_stale(srv.url(OWNER, db, name), charges)
    _pgserver.allow_charger(db, name)
    _replaced_once(srv, db, name, replayed, written, charges)


def test_a_database_main_created_is_upgraded_by_server_upgrade_alone(
        pg_server, replayed, capsys):  # noqa: F811
    """Review rpgh: no open migrates a schema (the builder's owner's open did, locking every
    older client of the server out mid-fleet). On a version-2 schema every open works as
    main's did, replaying where main replayed, and the owner is told once what to run;
    ``privguard server-upgrade`` upgrades it, after which the owner's open refreshes."""
    srv, name = pg_server, "old"
    db = _version_2_database(srv)
    written = _write_stale(srv.url(OWNER, db, name), GROWN)
    short = _write_stale(srv.url(OWNER, db, "short"), CHARGES[:5])  # no checkpoint
    for ledger in (name, "short"):
        srv.admin("INSERT INTO privguard.chargers VALUES (%s, %s)", (ledger, CHARGER), db=db,
                  user=OWNER)
    assert _schema_version(srv, db) == "2"
    stale = _checkpoints(srv, db, name)
    for url, read_only in ((srv.url(CHARGER, db, name), False), (srv.url(OWNER, db, name), True)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # only the owner's writable open is told
            assert _opened(url, replayed, read_only)[1] >= written
    with pytest.warns(SchemaUpgradeWarning, match="privguard server-upgrade"):
        rows, epsilon, *_ = _opened(srv.url(OWNER, db, name), replayed, False)
    assert rows > EVERY - 2 and epsilon >= written  # replayed, as main did, and charges on
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per ledger and process
        assert _opened(srv.url(OWNER, db, name), replayed, False)[0] > EVERY - 2
    assert _schema_version(srv, db) == "2" and _checkpoints(srv, db, name) == stale
    assert srv.admin("SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                     "'privguard' AND table_name = 'checkpoints' AND column_name = 'curves'",
                     db=db) == [(0,)]
    # the charging role may not upgrade it; the owner (or a superuser) does, once
    with pytest.raises(LedgerStateError, match="owned by"):
        server_upgrade(srv.url(CHARGER, db))
    assert cli(["server-upgrade", srv.url(db=db)]) == 0
    assert "upgraded from version 2 to 3" in capsys.readouterr().out
    assert _schema_version(srv, db) == "3"
    assert server_upgrade(srv.url(OWNER, db)) == {"schema_owner": OWNER, "from": 3, "to": 3}
    _replaced_once(srv, db, name, replayed, written)
    for user in (CHARGER, OWNER):  # the other ledger: the same ε, and it charges on
        ledger = Ledger.open(srv.url(user, db, "short"))
        assert ledger.epsilon() >= short
        ledger.charge(M.Gaussian(7.0), label=user)
        assert ledger.epsilon() > short
        ledger.close()
    assert Ledger.open(srv.url(CHARGER, db, "short"))._store.verify()["charges"] == 7
    assert srv.admin("SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE proname = "
                     "'snapshot_curves'", db=db) == [(OWNER,)]


def _as_owner(srv, db, sql, params=()):
    with psycopg.connect(srv.url(OWNER, db), autocommit=True) as conn:
        conn.execute(sql, params)


@pytest.fixture
def refreshed(pg, replayed):  # noqa: F811
    """A ledger whose head row holds a stale (version 5) and a fresh checkpoint."""
    srv, db, name = pg
    _write_stale(srv.url(OWNER, db, name), GROWN)
    _pgserver.allow_charger(db, name)
    Ledger.open(srv.url(OWNER, db, name)).close()
    assert [c[2] for c in _checkpoints(srv, db, name)] == [5, _rows.CHECKPOINT_CURVES]
    return srv, db, name


REFUSED = [  # (statement as the owner, what the database says)
    ("INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, prev, snapshot, mac)"
     f" SELECT ledger, entries, last_count, head, prev, replace(snapshot, '\"curves\":{V}', "
     f"'\"curves\":5'), mac FROM privguard.checkpoints WHERE ledger = %(n)s AND curves = {V}",
     "this curve version or a newer one"),
    ("INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, prev, snapshot, mac)"
     " SELECT ledger, entries, last_count, head, prev, 'not json', mac FROM "
     f"privguard.checkpoints WHERE ledger = %(n)s AND curves = {V}",
     "this curve version or a newer one"),
    ("INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, prev, snapshot, mac)"
     " SELECT ledger, entries, last_count, head, prev, snapshot, mac FROM privguard.checkpoints"
     " WHERE ledger = %(n)s AND curves > 5", "duplicate key|this curve version or a newer one"),
    ("INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, prev, snapshot, mac)"
     " SELECT ledger, entries - 1, last_count, head, prev, snapshot || ' ', mac FROM "
     "privguard.checkpoints WHERE ledger = %(n)s AND curves = 5", "at the journal's head only"),
    ("INSERT INTO privguard.checkpoints SELECT * FROM privguard.checkpoints WHERE ledger = %(n)s",
     "generated column|non-DEFAULT value"),
    ("UPDATE privguard.checkpoints SET snapshot = replace(snapshot, '\"curves\":5', "
     "'\"curves\":9') WHERE ledger = %(n)s", "append-only"),
    ("DELETE FROM privguard.checkpoints WHERE ledger = %(n)s AND curves = 5", "append-only"),
]


@pytest.mark.parametrize("sql,match", REFUSED, ids=[f"owner{i}" for i in range(len(REFUSED))])
def test_the_owner_adds_only_a_newer_checkpoint_at_the_head(refreshed, sql, match):
    srv, db, name = refreshed
    before = _checkpoints(srv, db, name)
    with pytest.raises(psycopg.Error, match=match):
        _as_owner(srv, db, sql, {"n": name})
    assert _checkpoints(srv, db, name) == before


def test_a_charging_role_still_writes_no_checkpoint(refreshed):
    srv, db, name = refreshed
    with psycopg.connect(srv.url(CHARGER, db), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, "
                         "prev, snapshot, mac) SELECT ledger, entries, last_count, head, prev, "
                         f"replace(snapshot, '\"curves\":{V}', '\"curves\":{V + 2}'), mac FROM "
                         f"privguard.checkpoints WHERE ledger = %s AND curves = {V}", (name,))


@pytest.mark.parametrize("snapshot", ['{"curves": 99}', f'{{"curves": {V + 1}, "accounting": {{}}}}'])
def test_a_forged_newer_checkpoint_is_refused_not_resumed(refreshed, snapshot):
    """The reader takes the newest curve version on the newest row: a forged one there (the
    owner's INSERT, with no valid MAC) fails closed, at every open and in verify."""
    srv, db, name = refreshed
    _as_owner(srv, db, "INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, "
              "prev, snapshot, mac) SELECT ledger, entries, last_count, head, prev, %s, 'forged' "
              f"FROM privguard.checkpoints WHERE ledger = %s AND curves = {V}", (snapshot, name))
    for user, read_only in ((OWNER, False), (OWNER, True), (CHARGER, False)):
        with pytest.raises(LedgerStateError, match="digest"):
            Ledger.open(srv.url(user, db, name), read_only=read_only)


def test_verify_refuses_a_remacd_newer_checkpoint_that_disagrees(pg):
    """Unkeyed, the owner can compute a MAC: a checkpoint beside the stale one whose
    accounting is not the journal's (half its spending) is refused by verify, which holds every
    checkpoint on the row to the replay."""
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    _write_stale(url, GROWN)
    store = PostgresStore(url, read_only=True)
    acc = store.open(None, None, None)
    c = store._cursor
    snap = _rows.checkpoint_body(acc, c.last_kind)  # today's, at the head: what a refresh writes
    journal = snap["accounting"]["journal"]
    journal["base"] = [x / 2 for x in journal["base"]]  # half what the journal spent
    text = json.dumps(snap, separators=(",", ":"))
    mac = store._checkpoint_mac(c, text)
    store.close()
    _as_owner(srv, db, "INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, "
              "prev, snapshot, mac) VALUES (%s, %s, %s, %s, %s, %s, %s)",
              (name, *c.as_tuple(), text, mac))
    ledger = Ledger.open(url, read_only=True)
    try:
        with pytest.raises(LedgerStateError, match="does not match the replayed journal"):
            ledger._store.verify()
    finally:
        ledger.close()


def test_server_init_leaves_a_version_2_schema_and_names_the_upgrade(pg_server, capsys):
    """server-init on a database main initialised adds the ledger to the version-2 schema as
    it is (review rpgh: the builder's migrated it), says so, and the charging role charges."""
    srv = pg_server
    db = _version_2_database(srv)
    assert cli(["server-init", srv.url(db=db), "--ledger", "team", "--epsilon", "3",
                "--delta", "1e-5", "--charger", CHARGER, "--owner", OWNER]) == 0
    assert "privguard server-upgrade" in capsys.readouterr().out
    assert _schema_version(srv, db) == "2"
    ledger = Ledger.open(srv.url(CHARGER, db, "team"))
    ledger.charge(DPSGD, label="job")
    assert ledger._store.verify()["charges"] == 1
    ledger.close()
    fresh = srv.new_database()  # a new schema is this version: nothing to say
    assert cli(["server-init", srv.url(db=fresh), "--ledger", "team", "--epsilon", "3",
                "--delta", "1e-5", "--charger", CHARGER, "--owner", OWNER]) == 0
    assert "server-upgrade" not in capsys.readouterr().out
    assert _schema_version(srv, fresh) == "3"


# -- server-upgrade beside running clients (review rpgh) ----------------------------------------
def _curves_column(srv, db):
    return srv.admin("SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                     "'privguard' AND table_name = 'checkpoints' AND column_name = 'curves'",
                     db=db)[0][0]


def test_two_upgrades_at_once_upgrade_once(pg_server):
    import concurrent.futures

    srv = pg_server
    db = _version_2_database(srv)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda user: server_upgrade(srv.url(user, db)), [OWNER, _pgserver.SUPERUSER]))
    assert sorted(d["from"] for d in done) == [2, 3] and _schema_version(srv, db) == "3"
    assert _curves_column(srv, db) == 1


def test_an_upgrade_that_cannot_lock_changes_nothing(pg_server):
    """A client's transaction holds the checkpoints (an open reading them): the upgrade waits
    its lock timeout, then fails with nothing changed (one transaction), and runs later."""
    srv = pg_server
    db = _version_2_database(srv)
    with psycopg.connect(srv.url(OWNER, db)) as reader:
        reader.execute("SELECT count(*) FROM privguard.checkpoints").fetchone()  # in a txn
        with pytest.raises(LedgerStateError, match="run it again"):
            server_upgrade(srv.url(db=db), lock_timeout=0.3)
        reader.rollback()
    assert _schema_version(srv, db) == "2" and _curves_column(srv, db) == 0
    assert srv.admin("SELECT count(*) FROM pg_proc WHERE proname = 'snapshot_curves'",
                     db=db) == [(0,)]
    assert server_upgrade(srv.url(db=db))["from"] == 2 and _schema_version(srv, db) == "3"


def test_clients_charge_and_open_through_an_upgrade(pg_server):
    """A charging role charging and opening in a loop, and an owner's ledger opened on the
    version-2 schema that charges on across the upgrade and past a checkpoint row: no charge
    lost, no error, and the journal verifies with its checkpoints after."""
    import threading
    import time

    srv = pg_server
    db = _version_2_database(srv)
    owner_url, name = srv.url(OWNER, db, "team"), "team"
    Ledger(epsilon=1e6, delta=1e-5, path=owner_url).close()
    srv.admin("INSERT INTO privguard.chargers VALUES (%s, %s)", (name, CHARGER), db=db,
              user=OWNER)
    owner = Ledger.open(owner_url, lease=1)  # opened on schema 2: keeps its reading of it
    for i in range(EVERY - 20):
        owner.charge(M.Gaussian(5.0 + i % 2), label="o")
    stop, errors, charged = threading.Event(), [], [0]

    def charging():
        try:
            while not stop.is_set():
                ledger = Ledger.open(srv.url(CHARGER, db, name), lease=1)  # a charge, a count
                for _ in range(3):
                    ledger.charge(M.Gaussian(9.0), label="c")
                    charged[0] += 1
                ledger.close()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=charging)
    thread.start()
    try:
        time.sleep(0.5)
        assert server_upgrade(srv.url(db=db), lock_timeout=30)["from"] == 2
        for i in range(40):  # past row EVERY: the owner's checkpoint, written on schema 3
            owner.charge(M.Gaussian(5.0 + i % 2), label="o")
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    # The checkpoint is the owner's, written by its own transaction that reaches a multiple
    # of EVERY. Under load the charging role's rows could reach EVERY first, and then none
    # was written (this test failed in 2 of 4 runs on main d3c4666 at load 2, and in CI59):
    # the owner then charges on, alone, each charge a row, to the next multiple.
    extra = 0
    if not _checkpoints(srv, db, name):
        owner.charge(M.Gaussian(7.0), label="o")  # its sync reads the charging role's rows
        extra = 1
        target = (owner._store._cursor.entries // EVERY + 1) * EVERY
        while owner._store._cursor.entries < target:
            owner.charge(M.Gaussian(5.0 + extra % 2), label="o")
            extra += 1
    owner.close()
    assert charged[0] > 0
    again = Ledger.open(owner_url, read_only=True)
    report = again._store.verify()
    assert report["charges"] == EVERY - 20 + 40 + extra + charged[0]
    assert report["checkpoints"] >= 1
    again.close()
    assert [c[2] for c in _checkpoints(srv, db, name)] == [_rows.CHECKPOINT_CURVES]


def test_verify_holds_two_checkpoints_of_a_run_that_grew_past_both(pg):
    """The stale checkpoint (count 1) and the fresh one (count 4) on the head row, and then
    the run that wrote that row grows on (count 6): verify replays the row as each saw it,
    in the order of its count, then as it is; a fresh one edited fails there."""
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    with _curve_version(5):
        writer = Ledger(epsilon=1e6, delta=1e-5, path=url, lease=1)  # a charge, a count
        for mechanism, label in CHARGES:
            writer.charge(mechanism, label=label)
    for _ in range(3):
        writer.charge(*CHARGES[-1][:1], label=CHARGES[-1][1])
    Ledger.open(url).close()  # the owner's open: a fresh checkpoint beside the stale one
    for _ in range(2):
        writer.charge(*CHARGES[-1][:1], label=CHARGES[-1][1])
    writer.close()
    assert _checkpoints(srv, db, name) == [(EVERY, 1, 5), (EVERY, 4, _rows.CHECKPOINT_CURVES)]
    assert srv.admin("SELECT count FROM privguard.entries WHERE ledger = %s AND idx = %s",
                     (name, EVERY - 1), db=db) == [(6,)]  # written as each saw it
    ledger = Ledger.open(url, read_only=True)
    report = ledger._store.verify()
    assert report["checkpoints"] == 2 and report["charges"] == len(CHARGES) + 5
    ledger.close()


def test_two_owners_opening_at_once_write_one_fresh_checkpoint(pg):
    """Both owner's opens find the stale checkpoint on the head row; the head's lock orders
    them, the second reads the first's fresh checkpoint and resumes from it (no error from
    the trigger's newer-only rule), and one fresh checkpoint is written."""
    import concurrent.futures

    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    _write_stale(url, GROWN)

    def opened(_):
        ledger = Ledger.open(url)
        try:
            return ledger.epsilon()
        finally:
            ledger.close()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.map(opened, range(2))
    assert first == second
    assert [c[2] for c in _checkpoints(srv, db, name)] == [5, _rows.CHECKPOINT_CURVES]


def test_server_upgrade_refuses_what_it_cannot_upgrade(pg_server, capsys):
    srv = pg_server
    bare = srv.new_database()
    assert cli(["server-upgrade", srv.url(db=bare)]) == 2
    assert "no privguard schema" in capsys.readouterr().err
    db = _version_2_database(srv)
    srv.admin("UPDATE privguard.meta SET value = '1' WHERE key = 'schema_version'", db=db,
              user=OWNER)
    with pytest.raises(LedgerStateError, match="version 1 cannot be upgraded"):
        server_upgrade(srv.url(db=db))
    assert _curves_column(srv, db) == 0
    with pytest.raises(InvalidArgumentError, match="lock_timeout"):
        server_upgrade(srv.url(db=db), lock_timeout=0)
