"""Review radv5 of task adv5 (a run's last time never goes back): the journals written
before that change, where a wall clock stepped back inside a run, open again.

adv5 made every new run keep last time ≥ first time, but left the replay's refusal of a
run whose last time is before its first: a SQLite file, a pickled ledger or a 0.1 journal
written across such a clock step (as every privguard before adv5 wrote it) still raised
"run 0 does not follow the journal" at every open, a ledger lost for good. The times count
for nothing in the accounting; the rows still verify by their digests.

And server-init's role names: adv5 counted their bytes in UTF-8, where the server truncates
them in the database's encoding."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sqlite3
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard._cli._cli import main

STEP = M.SubsampledGaussian(1.0, 0.01)
DATA = Path(__file__).parent / "data"


def _as_before_adv5():
    """A run's last time is the newest charge's, as before task adv5 (``c[6] = t``)."""
    return mock.patch("privguard._accounting._journal.max", lambda old, new: new, create=True)


def _two_charges_across_a_clock_step(ledger):
    ledger.charge(STEP, label="a")
    real = time.time
    with mock.patch("time.time", lambda: real() - 3600.0):  # NTP steps the clock back
        ledger.charge(STEP, label="a")


def test_a_sqlite_file_written_across_a_clock_step_before_adv5_opens(tmp_path):
    path = tmp_path / "budget.db"
    with _as_before_adv5():
        ledger = Ledger(3.0, 1e-5, path=path)
        _two_charges_across_a_clock_step(ledger)
        ledger.close()
    again = Ledger.open(path)  # raised "run 0 does not follow the journal"
    run, = again.runs
    assert run.count == 2 and run.last_time < run.first_time  # as written, replayed as is
    again.charge(STEP, label="a")
    assert len(again.history) == 3 and again._store.verify()["charges"] == 3
    again.close()
    assert main(["verify", str(path)]) == 0


def test_a_ledger_pickled_across_a_clock_step_before_adv5_loads():
    with _as_before_adv5():
        ledger = Ledger(3.0, 1e-5)
        _two_charges_across_a_clock_step(ledger)
        data = pickle.dumps(ledger)
    loaded = pickle.loads(data)  # raised "state journal entry 1: run 0 does not follow"
    run, = loaded.runs
    assert run.count == 2 and run.last_time < run.first_time  # as written
    assert loaded.epsilon() == ledger.epsilon()


def test_a_0_1_file_whose_clock_stepped_back_inside_a_run_upgrades(tmp_path):
    """0.1 kept each charge's time: its first run (40 "train" charges) with the last one an
    hour before the first, its hash chain recomputed, is upgraded (it was refused)."""
    path = tmp_path / "budget.db"
    shutil.copy(DATA / "ledger-0.1.db", path)
    conn = sqlite3.connect(path)
    first = conn.execute("SELECT time FROM journal WHERE idx = 0").fetchone()[0]
    conn.execute("UPDATE journal SET time = ? WHERE idx = 39", (first - 3600.0,))
    previous = "privguard-journal-v1"  # 0.1's SHA-256 row chain, as tests/test_migration.py
    for row in conn.execute("SELECT idx, time, label, mechanism, curve, pid FROM journal "
                            "ORDER BY idx").fetchall():
        text = json.dumps([previous, *row], sort_keys=True, separators=(",", ":"),
                          allow_nan=True)
        previous = hashlib.sha256(text.encode()).hexdigest()
        conn.execute("UPDATE journal SET digest = ? WHERE idx = ?", (previous, row[0]))
    conn.execute("UPDATE totals SET digest = ?", (previous,))
    conn.commit()
    conn.close()
    assert main(["upgrade", str(path), "--epsilon", "4", "--delta", "1e-5"]) == 0
    ledger = Ledger.open(path)
    assert [(r.label, r.count) for r in ledger.runs] == [("train", 40), ("eval", 1),
                                                         ("train", 30)]
    assert ledger.runs[0].last_time == first - 3600.0


# -- server-init: a role name the server truncates in its own encoding ---------------------------
def test_server_init_refuses_a_role_name_the_server_truncates_in_its_encoding(pg_server):
    """adv5 counts a role name's bytes in UTF-8 (63 at most), but the server truncates it
    in the database's encoding: "万" is 3 bytes in UTF-8 and 4 in EUC_TW, so 21 of them
    (63 bytes) became 15 there, another role, which then owned the schema (server-init
    said it gave it to the one named)."""
    import psycopg
    from psycopg import sql

    from privguard import InvalidArgumentError
    from privguard._stores._pgadmin import server_init

    srv = pg_server
    db = "db_" + uuid.uuid4().hex[:12]
    srv.admin(f"CREATE DATABASE {db} ENCODING 'EUC_TW' TEMPLATE template0 LC_COLLATE 'C' "
              "LC_CTYPE 'C'")
    other = "万" * 15
    with psycopg.connect(srv.url(db=db), autocommit=True, client_encoding="UTF8") as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (other,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(other)))
    with pytest.raises(InvalidArgumentError, match=r"^owner="):
        server_init(srv.url(db=db), "team", 1.0, 1e-5, owner="万" * 21,
                    charger="c" + uuid.uuid4().hex[:8])
    with psycopg.connect(srv.url(db=db), autocommit=True, client_encoding="UTF8") as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'privguard'"
                            ).fetchone() is None
