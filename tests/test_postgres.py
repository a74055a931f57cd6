"""The PostgreSQL store against a real server the suite starts (tests/_pgserver.py).

Roles, append-only enforcement, processes, a killed client, a restarted server,
a terminated backend, tampering, keys and the command line. The store contract
(tests/test_store_contract.py) runs against the same server.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import _pgserver
import _pgworkers
import _workers
import numpy as np
import psycopg
import pytest

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, LedgerStateError, Plan
from privguard import mechanisms as M
from privguard._accounting._lease import DEFAULT_CAP, RELATIVE
from privguard._cli._cli import main as cli
from privguard._stores._pgadmin import server_init

STEP = M.SubsampledGaussian(1.0, 0.01)
OWNER, CHARGER = _pgserver.OWNER, _pgserver.CHARGER


def _team(pg, epsilon=3.0, **kw):
    """A ledger created by server-init's path (the owner), open for the charging role."""
    srv, db, name = pg
    Ledger(epsilon, 1e-5, path=srv.url(OWNER, db, name), **kw).close()
    _pgserver.allow_charger(db, name)
    return srv.url(OWNER, db, name), srv.url(CHARGER, db, name)


def _filled(url, n=30, epsilon=3.0):
    ledger = Ledger(epsilon, 1e-5, path=url)
    for i in range(n):
        ledger.charge(STEP, label=f"step-{i}")
    ledger.charge(M.Laplace(5.0), label="count")
    return ledger


# -- locations ---------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["postgresql://u@h/db?ledger=", "postgresql://u@h/db?ledger=a b",
                                 "postgresql://u@h/db?ledger=a&ledger=b"])
def test_a_malformed_ledger_name_is_refused(url):
    with pytest.raises(InvalidArgumentError, match="path"):
        Ledger(3.0, 1e-5, path=url)


def test_no_password_is_shown_that_the_user_did_not_give(pg):
    srv, db, name = pg
    url = f"postgresql://{OWNER}:hunter2-secret@127.0.0.1:{srv.port}/{db}?ledger={name}"
    with pytest.raises(LedgerStateError) as err:  # wrong password for the owner
        Ledger(3.0, 1e-5, path=url)
    assert "hunter2" not in str(err.value) and "***" in str(err.value)
    ledger = _filled(srv.url(OWNER, db, name), n=2)
    assert ledger.path == srv.url(OWNER, db, name)  # none given: none added
    state = ledger.__getstate__()  # (and the journal's extent: review pgx)
    assert list(state) == ["store"] and {k: state["store"][k] for k in ("path", "ledger_id")} \
        == {"path": srv.url(OWNER, db, name), "ledger_id": ledger._store.ledger_id}
    assert pickle.loads(pickle.dumps(ledger)).runs == ledger.runs


# -- semantics shared with the SQLite store ---------------------------------------------------
def test_reopening_resumes_and_another_configuration_is_refused(pg):
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    a = _filled(url)
    eps, spent = a.epsilon(), a.spent
    a.close()
    b = Ledger(3.0, 1e-5, path=url)
    assert b.epsilon() == eps and np.array_equal(b.spent, spent) and len(b.history) == 31
    for kwargs, what in [(dict(epsilon=4.0), "epsilon: stored 3, requested 4"),
                         (dict(orders=[2.0, 4.0, 8.0]), "orders"),
                         (dict(odometer="paper"), "odometer")]:
        with pytest.raises(LedgerStateError, match=what):
            Ledger(kwargs.pop("epsilon", 3.0), 1e-5, path=url, **kwargs)
    assert len(Ledger.open(url).history) == 31


def test_in_memory_and_server_ledgers_agree_exactly(pg):
    srv, db, name = pg
    mem, server = Ledger(3.0, 1e-5), Ledger(3.0, 1e-5, path=srv.url(OWNER, db, name), lease=1)
    rng = np.random.default_rng(1)
    for _ in range(150):
        m = M.SubsampledGaussian(float(rng.choice([0.9, 1.0, 1.3])), 0.01)
        assert mem.can_afford(m) == server.can_afford(m)
        if mem.can_afford(m):
            mem.charge(m)
            server.charge(m)
    assert np.array_equal(mem.spent, Ledger.open(server.path).spent)


def test_retarget_is_the_owners_alone_explicit_and_logged(pg):
    owner_url, charger_url = _team(pg)
    job = _filled(charger_url, n=5)
    with pytest.raises(LedgerStateError, match="permission denied"):
        Ledger(4.0, 1e-5, path=charger_url, retarget="a job wants more")
    assert Ledger.open(charger_url).target == (3.0, 1e-5)
    new = Ledger(4.0, 1e-5, path=owner_url, retarget="DPO approved ε = 4")
    assert new.events[-1]["reason"] == "DPO approved ε = 4" and new.target == (4.0, 1e-5)
    with pytest.raises(LedgerStateError, match="changed by another client"):
        job.charge(STEP)  # the open job fails closed
    assert Ledger(4.0, 1e-5, path=charger_url).target == (4.0, 1e-5)
    with pytest.raises(LedgerStateError, match="orders"):
        Ledger(4.0, 1e-5, orders=[2.0, 3.0], path=owner_url, retarget="grid change")


def test_a_charging_role_cannot_create_a_ledger(pg):
    srv, db, name = pg
    with pytest.raises(LedgerStateError, match="cannot create"):
        Ledger(3.0, 1e-5, path=srv.url(CHARGER, db, name))
    with pytest.raises(LedgerStateError, match="no ledger"):
        Ledger.open(srv.url(OWNER, db, name))


def test_a_read_only_ledger_refuses_to_charge(pg):
    owner_url, _ = _team(pg)
    _filled(owner_url, n=3).close()
    ro = Ledger.open(owner_url, read_only=True)
    assert len(ro.history) == 4
    with pytest.raises(LedgerStateError, match="read-only"):
        ro.charge(STEP)


# -- the role model: the database enforces append-only charging --------------------------------
def _as_charger(pg, sql, params=()):
    srv, db, _ = pg
    with psycopg.connect(srv.url(CHARGER, db), autocommit=True) as conn:
        conn.execute(sql, params)


REWINDS = [
    ("DELETE FROM privguard.entries WHERE ledger = %(n)s", "permission denied"),
    ("TRUNCATE privguard.entries", "permission denied"),
    ("UPDATE privguard.entries SET count = 1 WHERE ledger = %(n)s", "permission denied"),
    ("UPDATE privguard.ledgers SET entries = 0, last_count = 0 WHERE name = %(n)s",
     "permission denied"),
    ("UPDATE privguard.ledgers SET config = replace(config, '\"epsilon\":3.0', "
     "'\"epsilon\":100.0') WHERE name = %(n)s", "permission denied"),
    ("INSERT INTO privguard.checkpoints SELECT ledger, entries, last_count, head, prev, "
     "replace(snapshot, '1', '0'), mac FROM privguard.checkpoints WHERE ledger = %(n)s",
     "permission denied"),
    ("DELETE FROM privguard.checkpoints", "permission denied"),
    ("SELECT privguard.append_event(%(n)s, %(id)s, %(rows)s, '{}', 'x', 'y', "
     "'{\"epsilon\": 100}')", "permission denied"),
    ("SELECT privguard.append(%(n)s, %(id)s, %(rows)s, 'event', NULL, NULL, NULL, NULL, NULL, "
     "NULL, '{\"event\": \"retarget\"}', 'x', 'y')", "runs and the fixed plan"),
    ("SELECT privguard.append(%(n)s, %(id)s, %(rows)s, 'fix', NULL, NULL, NULL, NULL, NULL, "
     "NULL, '{}', 'x', 'y')", "fixed once"),
    ("SELECT privguard.extend(%(n)s, %(id)s, %(rows)s - 1, 1, 0, 'x', 'y')", "never changes"),
    ("SELECT privguard.extend(%(n)s, %(id)s, 3, 99, 1e12, 'x', 'y')", "never changes"),
    ("SELECT privguard.append(%(n)s, %(id)s, 3, 'run', 1, 'l', 1, 1, 0, 0, NULL, 'x', 'y')",
     "out of sequence|not registered"),
    ("SELECT privguard.append(%(other)s, %(other_id)s, 0, 'fix', NULL, NULL, NULL, NULL, NULL, "
     "NULL, '{}', 'x', 'y')", "may not charge ledger"),
    ("SELECT * FROM privguard.lock_head(%(other)s)", "may not charge ledger"),
    ("CREATE TABLE privguard.x (a int)", "permission denied"),
    ("SET ROLE " + OWNER, "permission denied"),
]


@pytest.fixture(scope="module")
def team(pg_server):
    """A ledger the owner charged past its first checkpoint, open for the charging role, and
    a ledger the charging role was not given."""
    db = _pgserver.initialised_database()
    name, other = "team" + uuid.uuid4().hex[:8], "other" + uuid.uuid4().hex[:8]
    owner_url, charger_url = _team((pg_server, db, name))
    Ledger(3.0, 1e-5, path=pg_server.url(OWNER, db, other)).close()
    owner = Ledger(3.0, 1e-5, path=owner_url)
    for i in range(520):  # one row each: past the owner's first checkpoint (512 rows)
        owner.charge(STEP, label=f"o{i % 2}")
    return pg_server, db, name, other, owner_url, charger_url


@pytest.mark.parametrize("sql,match", REWINDS, ids=[f"attempt{i}" for i in range(len(REWINDS))])
def test_a_charging_role_can_neither_rewind_nor_retarget(team, sql, match):
    srv, db, name, other, owner_url, charger_url = team
    job = Ledger(3.0, 1e-5, path=charger_url)
    job.charge(STEP, label="job")
    before = (len(job.history), job.epsilon())
    ledger_id, rows = srv.admin("SELECT ledger_id, entries FROM privguard.ledgers WHERE name = %s",
                                (name,), db=db)[0]
    other_id = srv.admin("SELECT ledger_id FROM privguard.ledgers WHERE name = %s", (other,),
                         db=db)[0][0]
    with pytest.raises(psycopg.Error, match=match):
        _as_charger((srv, db, name), sql, {"n": name, "id": ledger_id, "rows": rows,
                                           "other": other, "other_id": other_id})
    # The ledger is untouched and consistent, for the job and for any later opener.
    job.charge(STEP, label="job")
    after = Ledger.open(charger_url)
    assert len(after.history) == before[0] + 1 and after.target == (3.0, 1e-5)
    assert after.epsilon() > before[1]
    assert after._store._checkpointed == 512  # the owner's checkpoint, not a forged one
    assert Ledger.open(owner_url, read_only=True)._store.verify()["charges"] == len(after.history)


def _forge_fix(pg, name, fixed):
    """What a charging role can do at a ledger's first charge: append its own fix row, with
    every digest computed by the library (the ledger is unkeyed)."""
    from privguard._stores._postgres import PostgresStore
    from privguard._stores._sqlite import _Cursor, _dumps

    srv, db, _ = pg
    store = PostgresStore(srv.url(CHARGER, db, name))
    store.open(None, None, None)
    body = _dumps(fixed)
    digest = store._entry_digest(store.genesis, 0, "fix", [body])
    mac = store._head_mac(_Cursor(1, 0, digest, store.genesis, "fix"))
    _as_charger(pg, "SELECT privguard.append(%s, %s, 0, 'fix', NULL, NULL, NULL, NULL, NULL, "
                "NULL, %s, %s, %s)", (name, store.ledger_id, body, digest, mac))
    store.close()


def test_a_forged_fix_row_is_never_adopted(pg):
    _srv, _db, name = pg
    owner_url, charger_url = _team(pg)
    honest = Ledger(3.0, 1e-5, plan=STEP)
    honest.charge(STEP)
    fixed = json.loads(json.dumps(honest._acc.fixed))
    weights = np.zeros(len(fixed["filter"]["weights"]))
    weights[int(np.argmax(fixed["filter"]["weights"]))] = 1.0  # all δ on one order: valid, not derived
    fixed["filter"]["weights"] = weights.tolist()
    _forge_fix(pg, name, fixed)
    with pytest.raises(LedgerStateError, match="forged"):
        Ledger.open(charger_url)
    with pytest.raises(LedgerStateError, match="forged"):
        Ledger.open(owner_url, read_only=True)._store.verify()


def test_an_honest_fix_row_from_the_charging_role_is_adopted(pg):
    _, charger_url = _team(pg)
    job = Ledger(3.0, 1e-5, path=charger_url)  # its first charge writes the fix row
    job.charge(M.Gaussian(20.0))
    again = Ledger.open(charger_url)
    assert again.plan == Plan(M.Gaussian(20.0))
    np.testing.assert_array_equal(again._acc.filter.weights, job._acc.filter.weights)


# -- tampering by a database superuser (outside the role model) ------------------------------------
@pytest.mark.parametrize("sql,match", [
    ("UPDATE privguard.entries SET label = 'edited' WHERE ledger = %(n)s AND idx = 3",
     "digest chain"),
    ("UPDATE privguard.ledgers SET entries = 3 WHERE name = %(n)s", "head"),
    ("UPDATE privguard.ledgers SET config = replace(config, '\"epsilon\":3.0', "
     "'\"epsilon\":100.0') WHERE name = %(n)s", "edited"),
    ("UPDATE privguard.mechanisms SET body = replace(body, '1.0', '9.0') WHERE ledger = %(n)s",
     "digest"),
    ("DELETE FROM privguard.entries WHERE ledger = %(n)s AND idx = 20", "head|missing|sequence"),
    ("ALTER TABLE privguard.entries DROP CONSTRAINT run_fields; "  # a superuser can; the
     "UPDATE privguard.entries SET pid = NULL WHERE ledger = %(n)s AND idx = 3; "  # rule is
     "ALTER TABLE privguard.entries ADD CONSTRAINT run_fields %(run_fields)s NOT VALID",  # back
     "row 3 is unreadable"),
])
def test_an_edit_behind_the_triggers_fails_closed(pg, sql, match):
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    _filled(url).close()
    rule = srv.admin("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = "
                     "'run_fields'", db=db)[0][0]  # for other tests sharing the database
    srv.admin("BEGIN; SET LOCAL session_replication_role = replica; "  # triggers off
              + sql.replace("%(n)s", f"'{name}'").replace("%(run_fields)s", rule) + "; COMMIT",
              db=db)
    with pytest.raises(LedgerStateError, match=match):
        Ledger(3.0, 1e-5, path=url)


def test_the_triggers_hold_for_the_owner_too(pg):
    srv, db, name = pg
    _filled(srv.url(OWNER, db, name), n=3).close()
    for sql in ["DELETE FROM privguard.entries", "UPDATE privguard.entries SET count = 1",
                "UPDATE privguard.ledgers SET entries = 0", "DELETE FROM privguard.mechanisms"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            srv.admin(sql + f" WHERE {'name' if 'ledgers' in sql else 'ledger'} = '{name}'",
                      db=db, user=OWNER)


def test_a_keyed_ledger_refuses_a_wrong_or_missing_key(pg, monkeypatch):
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "correct horse battery staple")
    _filled(url, n=3).close()
    assert len(Ledger.open(url).history) == 4
    monkeypatch.delenv("PRIVGUARD_LEDGER_KEY")
    with pytest.raises(LedgerStateError, match="protected by a ledger key"):
        Ledger.open(url)
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "wrong")
    with pytest.raises(LedgerStateError, match="not this ledger's key"):
        Ledger.open(url)


# -- processes, crashes, restarts ------------------------------------------------------------------
def test_eight_processes_never_overspend_together(pg):
    _, charger_url = _team(pg, epsilon=2.0)
    expected = Ledger(2.0, 1e-5, plan=STEP).remaining(STEP).repeats
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    attempts = expected // 4  # 8 × attempts = 2 × the budget
    procs = [ctx.Process(target=_workers.charge_until_refused,
                         args=(charger_url, attempts, queue, 2.0, 1)) for _ in range(8)]
    for p in procs:
        p.start()
    admitted = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ledger = Ledger.open(charger_url)
    assert sum(admitted) == expected == len(ledger.history)
    assert [r.index for r in ledger.history] == list(range(expected))  # none lost or doubled
    assert len({r.pid for r in ledger.history}) == 8
    assert not ledger.can_afford(STEP)
    assert ledger._store.verify()["charges"] == expected


def test_sigkill_mid_charge_loses_no_admitted_charge(pg, tmp_path):
    _, charger_url = _team(pg, epsilon=3.0)
    counter = str(tmp_path / "applied.txt")
    rng = random.Random(0)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    progress = []
    for kills in range(1, 4):
        child = subprocess.Popen([sys.executable, _pgworkers.__file__, charger_url, counter],
                                 env=env, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        # kill once the child has applied a few more updates (not after a fixed time: a
        # fast machine would exhaust the budget first), at a random point of a charge
        before = progress[-1] if progress else 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = int(open(counter).read()) if os.path.exists(counter) else 0
            if done >= before + 10:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        applied = int(open(counter).read()) if os.path.exists(counter) else 0
        journal = len(Ledger.open(charger_url).history)
        assert journal >= applied, "an applied update is missing from the journal"
        # at most one charged-but-not-applied step per kill, plus a lease's unused part
        assert journal <= applied + kills * max(DEFAULT_CAP, journal // RELATIVE)
        progress.append(applied)
    assert progress[0] > 0 and progress[-1] > progress[0]  # the kills landed mid-run
    assert Ledger.open(charger_url).can_afford(M.SubsampledGaussian(1.0, 16 / 1024))
    child = subprocess.run([sys.executable, _pgworkers.__file__, charger_url, counter], env=env,
                           capture_output=True, text=True, timeout=600)
    assert "exhausted" in child.stdout  # the budget still holds after the crashes
    assert not Ledger.open(charger_url).can_afford(M.SubsampledGaussian(1.0, 16 / 1024))


def _outcomes(path):
    ok, lost = [], []
    for line in open(path):
        kind, _, rest = line.strip().partition(" ")
        (ok if kind == "ok" else lost).append(int(rest) if kind == "ok" else rest)
    return ok, lost


def test_a_server_restart_loses_nothing_and_charges_nothing_twice(pg, tmp_path):
    srv, _db, _name = pg
    _, charger_url = _team(pg, epsilon=1e6)
    ctx = multiprocessing.get_context("spawn")
    logs = [str(tmp_path / f"w{i}.log") for i in range(4)]
    procs = [ctx.Process(target=_pgworkers.charge_through_restarts, args=(charger_url, 12.0, log))
             for log in logs]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    while sum(os.path.exists(log) and os.path.getsize(log) > 0 for log in logs) < 4:
        assert time.monotonic() < deadline, "the workers never started charging"
        time.sleep(0.1)
    time.sleep(1.0)
    srv.restart("fast")  # every backend is terminated mid-whatever
    time.sleep(1.5)
    srv.restart("immediate")  # a crash: recovery from the WAL
    for p in procs:
        p.join(timeout=180)
        assert p.exitcode == 0
    ledger = Ledger.open(charger_url)
    by_pid: dict[int, int] = {}
    for run in ledger.runs:
        by_pid[run.pid] = by_pid.get(run.pid, 0) + run.count
    ok_total = 0
    for p, log in zip(procs, logs):
        ok, lost = _outcomes(log)
        ok_total += len(ok)
        assert all("NOT recorded" in m or "may or may not" in m for m in lost), lost
        undecided = sum("may or may not" in m for m in lost)
        assert len(ok) <= by_pid.get(p.pid, 0) <= len(ok) + undecided  # none lost, none doubled
        assert len(set(ok)) == len(ok)
        for index in ok:
            assert ledger.history[index].pid == p.pid
    assert ok_total > 0 and len(ledger.history) == sum(by_pid.values())
    assert ledger._store.verify()["charges"] == len(ledger.history)


def _backend(srv, db, name, state_check, timeout=30, exclude=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = srv.admin("SELECT pid, wait_event_type, query FROM pg_stat_activity WHERE "
                         "application_name = %s AND state = 'active'", (f"privguard:{name}",),
                         db=db)
        for pid, wait, query in rows:
            if pid != exclude and state_check(wait, query):
                return pid
        time.sleep(0.05)
    raise AssertionError("the client's backend never reached the expected state")


def _charge_in_thread(ledger, label):
    result = {}

    def run():
        try:
            result["record"] = ledger.charge(STEP, label=label)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_connection_killed_while_waiting_for_the_lock_is_retried(pg):
    srv, db, name = pg
    _owner_url, charger_url = _team(pg)
    job = _filled(charger_url, n=3)
    with psycopg.connect(srv.url(OWNER, db)) as holder:  # holds the head's lock
        holder.execute("SELECT * FROM privguard.lock_head(%s)", (name,))
        thread, result = _charge_in_thread(job, "waits")
        pid = _backend(srv, db, name, lambda wait, q: wait == "Lock")
        srv.admin("SELECT pg_terminate_backend(%s)", (pid,), db=db)
        # retried on a new connection, which waits again
        _backend(srv, db, name, lambda wait, q: wait == "Lock", exclude=pid)
        holder.rollback()
    thread.join(timeout=60)
    assert "record" in result, result
    assert [r.label for r in Ledger.open(charger_url).history].count("waits") == 1
    job.charge(STEP)


def _kill_a_slow_charge(pg, deferred, in_state):
    """Charge once with a trigger that makes the charge sleep (inside the write, or inside
    COMMIT if ``deferred``), terminate the client's backend once it is ``in_state``, and
    return (the job's ledger, the charge's outcome, the charging URL)."""
    srv, db, name = pg
    _owner_url, charger_url = _team(pg)
    job = _filled(charger_url, n=3)
    srv.admin("CREATE OR REPLACE FUNCTION public.slow() RETURNS trigger LANGUAGE plpgsql AS "
              "$$ BEGIN IF NEW.label = 'slow' THEN PERFORM pg_sleep(30); END IF; RETURN NEW; "
              "END $$", db=db)
    trigger = f"slow_{name}"
    kind = ("CONSTRAINT TRIGGER", " DEFERRABLE INITIALLY DEFERRED") if deferred else \
        ("TRIGGER", "")
    srv.admin(f"CREATE {kind[0]} {trigger} AFTER INSERT ON privguard.entries{kind[1]} FOR "
              "EACH ROW EXECUTE FUNCTION public.slow()", db=db)
    try:
        thread, result = _charge_in_thread(job, "slow")
        pid = _backend(srv, db, name, in_state)
        srv.admin("SELECT pg_terminate_backend(%s)", (pid,), db=db)
        thread.join(timeout=60)
    finally:
        srv.admin(f"DROP TRIGGER {trigger} ON privguard.entries", db=db)
    return job, result, charger_url


def test_a_connection_killed_mid_write_records_nothing_and_says_so(pg):
    job, result, charger_url = _kill_a_slow_charge(
        pg, False, lambda wait, q: "privguard.append" in q)
    assert isinstance(result.get("error"), LedgerStateError), result
    assert "NOT recorded" in str(result["error"])
    with pytest.raises(LedgerStateError):  # its memory ran ahead: it fails closed
        job.charge(STEP)
    again = Ledger.open(charger_url)
    assert len(again.history) == 4 and "slow" not in {r.label for r in again.history}
    again.charge(STEP)
    assert again._store.verify()["charges"] == 5


def test_a_connection_killed_during_commit_is_resolved_as_not_recorded(pg):
    _, result, charger_url = _kill_a_slow_charge(
        pg, True, lambda wait, q: q.strip().upper() == "COMMIT")
    assert "NOT recorded" in str(result.get("error")), result  # read back after reconnecting
    again = Ledger.open(charger_url)
    assert len(again.history) == 4 and again._store.verify()["charges"] == 4


class _ReplyLost:
    """A connection whose COMMIT reaches the server but whose reply is lost."""

    def __init__(self, conn):
        self._conn = conn

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, query, *args, **kw):
        if query == "COMMIT":
            self._conn.execute("COMMIT")
            self._conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return self._conn.execute(query, *args, **kw)


def test_a_commit_whose_reply_was_lost_is_resolved_as_recorded(pg):
    _, charger_url = _team(pg)
    job = _filled(charger_url, n=3)
    job._store._conn = _ReplyLost(job._store._conn)
    record = job.charge(STEP, label="committed")  # read back: it was recorded
    assert record.index == 4 and record.label == "committed"
    job.charge(STEP, label="next")  # the ledger goes on, on a new connection
    again = Ledger.open(charger_url)
    assert [r.label for r in again.history][-2:] == ["committed", "next"]
    assert again._store.verify()["charges"] == 6


# -- checkpoints and the command line ----------------------------------------------------------------
def test_the_charging_role_writes_no_checkpoint_and_replays_the_tail(pg):
    srv, db, name = pg
    owner_url, charger_url = _team(pg)
    job = Ledger(3.0, 1e-5, path=charger_url)
    for i in range(600):
        job.charge(STEP, label=f"j{i % 2}")
    count = "SELECT count(*) FROM privguard.checkpoints WHERE ledger = %s"
    assert srv.admin(count, (name,), db=db) == [(0,)]
    Ledger.open(owner_url).close()  # an owner's open checkpoints a long tail
    assert srv.admin(count, (name,), db=db) == [(1,)]
    again = Ledger.open(charger_url)
    assert again._store._checkpointed == 601 and again.runs == job.runs
    assert again.epsilon() == job.epsilon()


def test_server_init_and_the_command_line(pg_server, capsys):
    srv = pg_server
    db = srv.new_database()
    url = srv.url(db=db)
    assert cli(["server-init", url, "--ledger", "team", "--epsilon", "3", "--delta", "1e-5",
                "--charger", CHARGER, "--owner", OWNER]) == 0
    out = capsys.readouterr().out
    charger_url = srv.url(CHARGER, db, "team")
    assert charger_url in out and "ε = 3" in out
    srv.set_passwords()
    _filled(charger_url, n=4).close()
    assert cli(["verify", charger_url]) == 0
    assert "OK" in capsys.readouterr().out
    assert cli(["report", charger_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    # Again with another target: refused, the ledger is unchanged.
    assert cli(["server-init", url, "--ledger", "team", "--epsilon", "9", "--delta", "1e-5",
                "--charger", CHARGER, "--owner", OWNER]) == 2
    assert "another configuration" in capsys.readouterr().err
    assert Ledger.open(charger_url).target == (3.0, 1e-5)
    srv.admin(f"CREATE ROLE sneaky_{db} LOGIN IN ROLE {OWNER}")
    with pytest.raises(LedgerStateError, match=f"it has membership in {OWNER}"):
        server_init(url, "x", 3.0, 1e-5, charger=f"sneaky_{db}", owner=OWNER)
    with pytest.raises(InvalidArgumentError, match="charger"):
        server_init(url, "x", 3.0, 1e-5, charger=OWNER, owner=OWNER)


def test_a_hybrid_ledger_is_charged_and_replayed_by_the_charging_role(pg):
    plan = Plan(STEP, steps=300)
    _, charger_url = _team(pg, plan=plan, filter="hybrid")
    job, mem = Ledger(3.0, 1e-5, plan=plan, filter="hybrid", path=charger_url, lease=1), \
        Ledger(3.0, 1e-5, plan=plan, filter="hybrid")
    assert job._acc.filter.kind == "hybrid"
    for _ in range(50):
        job.charge(STEP)
        mem.charge(STEP)
    again = Ledger.open(charger_url)
    assert again.remaining(STEP).repeats == mem.remaining(STEP).repeats
    assert again._store.verify()["charges"] == 50


def test_budget_exhaustion_is_shared_between_owner_and_job(pg):
    owner_url, charger_url = _team(pg, epsilon=1.0, plan=Plan(STEP, steps=100))
    owner, job = Ledger.open(owner_url), Ledger.open(charger_url)
    n = 0
    while True:
        try:
            (owner if n % 2 else job).charge(STEP)
            n += 1
        except BudgetExhausted:
            break
    assert n == Ledger(1.0, 1e-5, plan=Plan(STEP, steps=100)).remaining(STEP).repeats
    assert not owner.can_afford(STEP) and not job.can_afford(STEP)
