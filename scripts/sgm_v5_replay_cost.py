"""Review rsg: how long opening a ledger that main wrote (checkpoint curves version 5) takes
now that every subsampled-Gaussian row counts as changed (task sg: a replay from the genesis).

    git worktree add --detach /tmp/rsg-base main
    ln -s /tmp/rsg-base/integrations /tmp/rsg-base/privguard/integrations
    python scripts/sgm_v5_replay_cost.py /tmp/rsg-base [--pg]

main's code (the checkout) writes a journal of 10 DP-SGD streaks (σ from 0.6 to 100, 30
epochs each of ``SubsampledGaussian(σ, q, steps=100)`` and a ``Gaussian`` evaluation): 511
charges, so the version-5 checkpoint (every 512 rows) sits on the journal's head row, and
600 charges, past it. This branch then opens each four times (read-only, writable,
writable, read-only), each in a new process (no curve cached), and prints the seconds
and the checkpoints. ``--pg`` uses a throw-away PostgreSQL server (tests/_pgserver.py)
instead of SQLite files, whose database main's checkout makes (``privguard server-init``:
its schema version, 2 before task pgh), and prints the schema version after each open;
there it runs this branch's ``privguard server-upgrade`` after the first writable open
(review rpgh: no open upgrades a schema), then opens three more times.

Since main moved to curve version 6, the checkout is a commit before task sg, e.g.
``git worktree add --detach /tmp/pgh-v5 93d7b40`` (task pgh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

WRITE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {checkout!r})
from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _rows
assert _rows.CHECKPOINT_CURVES == 5, "the checkout must be main before task sg"
led = Ledger(epsilon=1e6, delta=1e-5, path={path!r})
sig = [0.6, 0.8, 1.0, 1.1, 1.3, 2.0, 3.0, 5.0, 10.0, 100.0]
qs = [1e-3, 4e-3, 0.01, 0.02, 1e-3, 4e-3, 0.01, 0.02, 1e-3, 4e-3]
charges = [M.SubsampledGaussian(s, q, steps=100) if i % 2 == 0 else M.Gaussian(50.0 + i // 2 % 30)
           for s, q in zip(sig, qs) for i in range(60)]
for i, mechanism in enumerate(charges[:{n}]):
    led.charge(mechanism, label="train" if i % 2 == 0 else "eval")
led.close()
"""


INIT = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {checkout!r})
from privguard._stores._pgadmin import server_init
server_init({url!r}, "setup", 1.0, 1e-5, charger={charger!r}, owner={owner!r})
"""


OPEN = """
import time
from privguard import Ledger
start = time.perf_counter()
Ledger.open({path!r}, read_only={read_only}).close()
print(time.perf_counter() - start)
"""


def main(checkout: str, pg: bool) -> None:
    tmp = tempfile.mkdtemp()
    for n in (511, 600):
        path = f"{_database(checkout, tmp)}?ledger=l{n}" if pg else os.path.join(tmp, f"l{n}.db")
        subprocess.run([sys.executable, "-c", WRITE.format(checkout=checkout, path=path, n=n)],
                       check=True, env=os.environ.copy(), cwd=tmp)
        steps: tuple = (True, False, False, True)
        if pg:  # review rpgh: the schema is upgraded by server-upgrade alone, never by an open
            steps = (True, False, "upgrade", False, False, True)
        for read_only in steps:
            if read_only == "upgrade":
                out = subprocess.run([sys.executable, "-m", "privguard", "server-upgrade",
                                      path.split("?ledger=")[0]], check=True,
                                     capture_output=True, text=True, env=os.environ.copy(),
                                     cwd=tmp).stdout.strip()
                print(f"{n} charges, privguard server-upgrade: {out}, schema {_schema(path)}",
                      flush=True)
                continue
            took = float(subprocess.run([sys.executable, "-c", OPEN.format(
                path=path, read_only=read_only)], check=True, capture_output=True, text=True,
                env=os.environ.copy(), cwd=tmp).stdout)
            print(f"{n} charges, {'read-only' if read_only else 'writable '} open: {took:.3f} s, "
                  f"checkpoints {json.dumps(_checkpoints(path, pg))}"
                  + (f", schema {_schema(path)}" if pg else ""), flush=True)


def _database(checkout: str, tmp: str) -> str:
    """A new database that ``checkout``'s server-init made (one per ledger: after this
    branch's owner migrated one to schema 3, main's code no longer opens it)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    import _pgserver

    srv = _pgserver.server()
    db = srv.new_database()
    subprocess.run([sys.executable, "-c", INIT.format(
        checkout=checkout, url=srv.url(db=db), charger=_pgserver.CHARGER,
        owner=_pgserver.OWNER)], check=True, env=os.environ.copy(), cwd=tmp)
    srv.set_passwords()
    return srv.url(user=_pgserver.OWNER, db=db)


def _schema(path: str) -> str:
    import psycopg

    with psycopg.connect(path.split("?ledger=")[0]) as conn:
        return str(conn.execute("SELECT value FROM privguard.meta WHERE key = "
                                "'schema_version'").fetchone()[0])


def _checkpoints(path: str, pg: bool) -> list:
    if pg:
        import psycopg

        url, ledger = path.split("?ledger=")
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT entries, snapshot::json->>'curves' FROM "
                                "privguard.checkpoints WHERE ledger = %s ORDER BY entries, "
                                "snapshot::json->>'curves'",
                                (ledger,)).fetchall()
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT entries, json_extract(snapshot, '$.curves') FROM "
                            "checkpoints ORDER BY entries").fetchall()
    finally:
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1], "--pg" in sys.argv[2:])
