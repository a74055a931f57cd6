"""``privguard upgrade FILE``: turn a privguard 0.1 ledger file into the current format.

Never silent: opening a 0.1 file refuses and names this command. The upgrade

1. reads the 0.1 file and verifies it the way 0.1 did: the SHA-256 chain of
   its rows (from ``privguard-journal-v1``), each row's stored curve against
   the curve recomputed from its mechanism, and the cached totals (count,
   digest and spent curve) against the replay;
2. writes a new file whose first entry is a ``migrate`` event (source
   schema, rows, final digest, any 0.1 retargets, time, process), then the
   choices 0.1 fixed at its first charge, then the charges grouped into runs,
   each re-admitted by the current filter;
3. verifies the new file from its genesis and checks that it replays to the
   0.1 file's spent curve exactly;
4. keeps the original as ``FILE.v1`` and atomically replaces ``FILE``.

It refuses (changing nothing) if any step fails or ``FILE.v1`` exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import sqlite3
import time
from typing import Any

import numpy as np

from privguard import _config
from privguard._accounting import Accounting, Change
from privguard._base import mechanism_from_dict
from privguard._errors import LedgerStateError, PrivguardError
from privguard._journal import Run
from privguard._plan import Plan
from privguard._stores._sqlite import SQLiteStore

_V1_GENESIS = "privguard-journal-v1"


def _v1_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def read_v1(conn: sqlite3.Connection, path: str) -> dict[str, Any]:
    """Read and verify a privguard 0.1 file; returns its configuration, events and records."""
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema_version") != "1":
            raise LedgerStateError(f"{path}: not a privguard 0.1 ledger "
                                   f"(schema {meta.get('schema_version')!r})")
        config = json.loads(meta["config"])
        events = json.loads(meta["events"])
        rows = conn.execute("SELECT idx, time, label, mechanism, curve, pid, digest FROM "
                            "journal ORDER BY idx").fetchall()
        count, spent, total_digest = conn.execute(
            "SELECT count, spent, digest FROM totals WHERE id = 1").fetchone()
    except (sqlite3.Error, KeyError, TypeError, ValueError) as exc:
        raise LedgerStateError(f"{path}: unreadable privguard 0.1 ledger ({exc})") from exc
    grid = np.array(config["orders"], dtype=float)
    previous, records = _V1_GENESIS, []
    for position, (idx, t, label, mech, curve, pid, digest) in enumerate(rows):
        where = f"{path}: 0.1 journal row {idx}"
        text = _v1_dumps([previous, idx, t, label, mech, curve, pid])
        if idx != position or hashlib.sha256(text.encode()).hexdigest() != digest:
            raise LedgerStateError(f"{where} fails its hash chain (edited, reordered or missing)")
        try:
            mechanism = mechanism_from_dict(json.loads(mech))
            stored = np.array(json.loads(curve), dtype=float)
        except (PrivguardError, ValueError) as exc:
            raise LedgerStateError(f"{where} is unreadable ({exc})") from exc
        if not np.array_equal(mechanism._rdp_checked(grid), stored):
            raise LedgerStateError(f"{where}: its stored curve is not its mechanism's curve")
        records.append((label, mechanism, float(t), int(pid)))
        previous = digest
    if count != len(rows) or total_digest != previous:
        raise LedgerStateError(f"{path}: the 0.1 totals do not match its journal")
    return {"config": config, "events": events, "records": records, "final_digest": previous,
            "spent": np.array(json.loads(spent), dtype=float)}


def upgrade(path: str) -> dict[str, Any]:
    """Upgrade the privguard 0.1 ledger file at ``path`` (see the module docstring)."""
    backup, tmp = path + ".v1", path + ".upgrading"
    if not os.path.exists(path):
        raise LedgerStateError(f"{path}: no such ledger file")
    if os.path.exists(backup):
        raise LedgerStateError(f"{backup} exists; move it away before upgrading {path}")
    with open(path, "rb") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # no 0.1 writer runs meanwhile
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # 0.1 used WAL: fold it in
            old = read_v1(conn, path)
        finally:
            conn.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        try:
            result = _write_v2(tmp, path, old)
            shutil.copy2(path, backup)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    return {**result, "path": path, "original": backup}


def _write_v2(tmp: str, path: str, old: dict[str, Any]) -> dict[str, Any]:
    config = _config.from_dict(old["config"])
    records = old["records"]
    store = SQLiteStore(tmp)
    try:
        acc = store.open(config, Accounting(config, fix_now=False), None)
        event = {"event": "migrate", "time": time.time(), "pid": os.getpid(),
                 "from": "privguard 0.1 (schema 1)", "rows": len(records),
                 "final_digest": old["final_digest"],
                 "retargets": [e for e in old["events"] if e.get("event") == "retarget"]}
        with store.transaction(acc, write=True) as txn:
            acc.replay_event(event)
            txn.write(acc, [Change("event", body=event)])
            if records:
                plan = config.plan or Plan(records[0][1])
                fixed = acc.derive_fixed(plan)
                acc.replay_fix(fixed)
                txn.write(acc, [Change("fix", body=fixed)])
            for (label, mech, pid), group in itertools.groupby(
                    records, key=lambda r: (r[0], r[1], r[3])):
                times = [r[2] for r in group]
                run = Run(acc.journal.run_count, acc.journal.charges, len(times), label, mech,
                          times[0], times[-1], pid)
                acc.replay_run(run, f"{path}: 0.1 record {run.start}")
                txn.write(acc, [Change("run", run=acc.journal.last)])
        if not np.array_equal(acc.spent(), old["spent"]):
            raise LedgerStateError(f"{path}: the upgraded journal does not replay to the 0.1 "
                                   "file's spent curve; nothing was changed")
        verified = store.verify()
    finally:
        store.close()
    return {"charges": verified["charges"], "runs": verified["runs"], "rows": verified["rows"]}
