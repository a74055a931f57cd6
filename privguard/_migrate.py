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


# What may go wrong decoding data an editor controls: all of it becomes LedgerStateError.
_DECODE_ERRORS = (PrivguardError, KeyError, TypeError, ValueError, AttributeError, IndexError,
                  RecursionError, OverflowError)


def read_v1(conn: sqlite3.Connection, path: str) -> dict[str, Any]:
    """Read and verify a privguard 0.1 file; returns its configuration, events and records.

    Raises:
        LedgerStateError: naming the file and the part of it that is unreadable, of the
            wrong type, or inconsistent (an edited file).
    """
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        rows = conn.execute("SELECT idx, time, label, mechanism, curve, pid, digest FROM "
                            "journal ORDER BY idx").fetchall()
        totals = conn.execute("SELECT count, spent, digest FROM totals WHERE id = 1").fetchone()
    except (sqlite3.Error, TypeError, ValueError) as exc:
        raise LedgerStateError(f"{path}: unreadable privguard 0.1 ledger ({exc})") from exc
    if meta.get("schema_version") != "1":
        raise LedgerStateError(f"{path}: not a privguard 0.1 ledger "
                               f"(schema {meta.get('schema_version')!r})")
    config_dict = _meta_json(meta, "config", path)
    try:
        config = _config.from_dict(config_dict)
    except _DECODE_ERRORS as exc:
        raise LedgerStateError(f"{path}: 0.1 metadata 'config' is invalid ({exc})") from exc
    retargets = _check_retargets(path, config_dict, _meta_json(meta, "events", path),
                                 meta.get("config_rev"))
    if totals is None:
        raise LedgerStateError(f"{path}: the 0.1 totals row is missing")
    count, spent, total_digest = totals
    records, previous = _read_rows(path, config.orders, rows)
    try:
        spent_curve = np.array(json.loads(spent), dtype=float)
    except _DECODE_ERRORS as exc:
        raise LedgerStateError(f"{path}: the 0.1 totals' spent curve is unreadable "
                               f"({type(exc).__name__}: {exc})") from exc
    if count != len(rows) or total_digest != previous:
        raise LedgerStateError(f"{path}: the 0.1 totals do not match its journal")
    return {"config": config_dict, "events": retargets, "records": records,
            "final_digest": previous, "spent": spent_curve}


def _meta_json(meta: dict[Any, Any], key: str, path: str) -> Any:
    text = meta.get(key)
    if not isinstance(text, str):
        raise LedgerStateError(f"{path}: 0.1 metadata {key!r} is "
                               f"{'missing' if text is None else type(text).__name__}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LedgerStateError(f"{path}: 0.1 metadata {key!r} is not JSON ({exc})") from exc


def _check_retargets(path: str, config: Any, events: Any, config_rev: Any) -> list[Any]:
    """0.1 logged each change of target as a retarget event."""
    if not isinstance(events, list):
        raise LedgerStateError(f"{path}: 0.1 metadata 'events' must be a list, got "
                               f"{type(events).__name__}")
    for i, event in enumerate(events):
        if not isinstance(event, dict) or event.get("event") != "retarget":
            raise LedgerStateError(f"{path}: 0.1 event {i} is not a retarget event, the only "
                                   "event 0.1 logged (edited metadata)")
    return events


_V1_COLUMNS: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("idx", int), ("time", float), ("label", (str, type(None))), ("mechanism", str),
    ("curve", str), ("pid", int), ("digest", str))


def _read_rows(path: str, grid: np.ndarray, rows: list[Any]) -> tuple[list[Any], str]:
    previous, records = _V1_GENESIS, []
    for position, row in enumerate(rows):
        where = f"{path}: 0.1 journal row {position}"
        for (column, kind), value in zip(_V1_COLUMNS, row):
            if not isinstance(value, kind) or isinstance(value, bool):
                raise LedgerStateError(f"{where}: column {column} holds a "
                                       f"{type(value).__name__} (edited or corrupt)")
        idx, t, label, mech, curve, pid, digest = row
        text = _v1_dumps([previous, idx, t, label, mech, curve, pid])
        if idx != position or hashlib.sha256(text.encode()).hexdigest() != digest:
            raise LedgerStateError(f"{where} fails its hash chain (edited, reordered or missing)")
        try:
            mechanism = mechanism_from_dict(json.loads(mech))
            stored = np.array(json.loads(curve), dtype=float)
            same = np.array_equal(mechanism._rdp_checked(grid), stored)
        except _DECODE_ERRORS as exc:
            raise LedgerStateError(f"{where} is unreadable ({type(exc).__name__}: {exc})") from exc
        if not same:
            raise LedgerStateError(f"{where}: its stored curve is not its mechanism's curve")
        records.append((label, mechanism, t, pid))
        previous = digest
    return records, previous


def upgrade(path: str) -> dict[str, Any]:
    """Upgrade the privguard 0.1 ledger file at ``path`` (see the module docstring).

    Raises:
        LedgerStateError: a file that is not a readable, consistent 0.1 ledger. Nothing is
            changed then.
    """
    backup, tmp = path + ".v1", path + ".upgrading"
    if not os.path.exists(path):
        raise LedgerStateError(f"{path}: no such ledger file")
    if os.path.exists(backup):
        raise LedgerStateError(f"{backup} exists; move it away before upgrading {path}")
    try:
        lock = open(path, "rb")
    except OSError as exc:
        raise LedgerStateError(f"{path}: cannot be opened ({exc})") from exc
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # no 0.1 writer runs meanwhile
        try:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # 0.1 used WAL: fold it in
                old = read_v1(conn, path)
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise LedgerStateError(f"{path}: not a readable SQLite ledger ({exc})") from exc
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
