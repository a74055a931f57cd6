"""Adversarial review pgf of the PostgreSQL ledger under ``os.fork()`` and pickle."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import subprocess
import sys

import _pgserver
import psycopg
import pytest
from _sqlite_edits import in_child as _in_child

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)
OWNER = _pgserver.OWNER

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _backend(ledger: Ledger) -> int:
    return int(ledger._store._conn.info.backend_pid)


def _charges(url: str) -> int:
    reader = Ledger.open(url, read_only=True)
    try:
        return int(reader._acc.journal.charges)
    finally:
        reader.close()


@pytest.mark.parametrize("kw", [{"lease": 1}, {}, {"prefetch": True}])
def test_a_child_charges_on_its_own_session_and_leaves_the_parents_alone(pg, kw):
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, **kw)
    for _ in range(3):
        ledger.charge(STEP, label="train")
    parent = _backend(ledger)

    def child():
        ledger.charge(STEP, label="child")
        mine = _backend(ledger)
        ledger.close()
        gc.collect()
        return mine

    assert int(_in_child(child)) != parent
    ledger.charge(STEP, label="after")
    assert _backend(ledger) == parent  # the parent's session was never touched
    ledger.close()
    assert _charges(url) >= 5


def test_a_child_at_a_reused_pid_never_uses_the_parents_session(pg):
    # The store told its connection from an inherited one by the pid that opened it
    # alone. A process whose pid is the opener's (a pid reused: a grandchild of an
    # opener that has exited, a child in another PID namespace) took the inherited
    # connection for its own: its charges went over the parent's session (a socket libpq
    # forbids sharing across a fork), and its close sent Terminate on it. The at-fork hook
    # now drops the inherited connection, as it does SQLite's (review sq).
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, lease=1)
    ledger.charge(STEP)
    parent = _backend(ledger)

    def child():
        ledger._store._pid = os.getpid()  # what a reused pid reads
        ledger.charge(STEP)
        mine = _backend(ledger)
        ledger.close()
        return mine

    assert int(_in_child(child)) != parent
    ledger.charge(STEP)
    assert _backend(ledger) == parent  # not reconnected: no Terminate reached it
    ledger.close()
    assert _charges(url) == 3


def _recreate(srv, db: str, name: str) -> None:
    """Delete ledger ``name`` (as a superuser, past the append-only triggers) and create a
    new, empty one under that name: what a dropped and restored schema, or another server
    at the same URL, holds."""
    with psycopg.connect(srv.url(db=db), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no trigger fires
        for table in ("entries", "checkpoints", "mechanisms", "chargers", "ledgers"):
            conn.execute(f"DELETE FROM privguard.{table} WHERE "
                         f"{'name' if table == 'ledgers' else 'ledger'} = %s", (name,))
    Ledger(3.0, 1e-5, path=srv.url(OWNER, db, name), lease=1).close()


def test_a_pickled_ledger_refuses_another_ledger_at_its_url(pg):
    # Before the fix a server ledger pickled as its URL alone: loaded after the ledger was
    # dropped and created again (or against another server at that URL), it opened the
    # new, empty ledger silently, and the loader went on charging a budget with none of
    # the pickled ledger's charges. It now carries the ledger_id and refuses another.
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, lease=1)
    ledger.charge(STEP, times=5)
    data = pickle.dumps(ledger)
    ledger.close()
    assert pickle.loads(data).runs[0].count == 5  # the same ledger loads
    _recreate(srv, db, name)
    with pytest.raises(LedgerStateError, match="not the ledger that was pickled"):
        pickle.loads(data)
    assert _charges(url) == 0  # (the new ledger is untouched)


def test_a_pickle_without_a_ledger_id_still_loads(pg):
    # A pickle written before the ledger_id travelled (URL alone) loads as it did.
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    ledger = Ledger(3.0, 1e-5, path=url, lease=1)
    ledger.charge(STEP, times=2)
    ledger.close()
    copy = Ledger.__new__(Ledger)
    copy.__setstate__({"store": {"path": url}})
    try:
        assert copy.runs[0].count == 2
    finally:
        copy.close()


def test_a_fork_inside_a_transaction_leaves_the_child_no_session_to_go_on_with(pg):
    # No public call forks inside a transaction (listeners are told outside it), but a
    # store's copy in such a child went on with the parent's connection: its nested
    # statements and its COMMIT went over the parent's session, in the parent's
    # transaction. It now refuses (LedgerStateError) and leaves the parent's alone.
    srv, db, name = pg
    ledger = Ledger(3.0, 1e-5, path=srv.url(OWNER, db, name), lease=1)
    ledger.charge(STEP)
    store = ledger._store
    parent = _backend(ledger)
    with ledger._txn, ledger._lock, store._session(False, ledger._acc):

        def child():
            with pytest.raises(LedgerStateError, match="forked inside"):
                with store._session(False, None):
                    pass
            with pytest.raises(LedgerStateError, match="forked inside"):
                store._commit()
            return "refused"

        assert _in_child(child) == "refused"
    ledger.charge(STEP)
    assert _backend(ledger) == parent
    ledger.close()


@contextlib.contextmanager
def _killed_inside_a_charge(path: str):
    """A process (tests/_pgf_killed.py) that forked a child, locked ``path``'s ledger in a
    write transaction and was killed there; its child lives until the block ends."""
    Ledger(3.0, 1e-5, path=path, lease=1).close()
    holder = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                            "_pgf_killed.py"), path],
                              stdout=subprocess.PIPE, text=True)
    line = holder.stdout.readline()
    if not line:
        holder.wait()
        pytest.fail("the lock holder exited before locking the ledger")
    child = int(line)
    try:
        holder.kill()
        holder.wait()
        yield
    finally:
        os.kill(child, signal.SIGKILL)
    assert _charges(path) == 2


def test_a_killed_parents_lock_is_not_held_by_its_childs_copy_of_the_socket(pg):
    # A forked child kept the parent's socket open (its inherited connection is never
    # used or closed). A parent killed inside a charge then left its session, and the
    # ledger's head lock, to the server for as long as any child lived: the server saw no
    # end of the connection, and every client's charge waited for it and failed. The
    # child's copy of the socket now points at /dev/null from the fork on.
    srv, db, name = pg
    url = srv.url(OWNER, db, name)
    with _killed_inside_a_charge(url):
        ledger = Ledger.open(url)  # before: LedgerStateError, lock timeout (the child lived)
        ledger.charge(STEP)
        ledger.close()


def _charge_in_a_process(path: str, timeout: float) -> str:
    """Charge ``path`` once in a new process; its output, or "waited" past ``timeout``."""
    code = ("import sys\nfrom privguard import Ledger, mechanisms as M\n"
            "with Ledger.open(sys.argv[1]) as l:\n    l.charge(M.SubsampledGaussian(1.0, 0.01))\n"
            "print('charged')")
    try:
        return subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                              text=True, timeout=timeout).stdout.strip()
    except subprocess.TimeoutExpired:
        return "waited"


def test_a_killed_parents_flock_is_not_held_by_its_childs_copy(tmp_path):
    # The SQLite store's flock lives in the open file description a forked child shares
    # (kept open, never used: review sq). A parent killed inside a charge left the file
    # locked for as long as any child lived, and every other process's charge waited on
    # the flock for ever. The child's copy of the descriptor now points at /dev/null.
    path = str(tmp_path / "l.db")
    with _killed_inside_a_charge(path):
        assert _charge_in_a_process(path, 60) == "charged"  # before: waited (for ever)
