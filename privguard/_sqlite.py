"""A durable, multi-process journal for a ledger, in one SQLite file.

Layout (schema version 1):

* ``meta(key, value)``: ``schema_version``, ``config`` (the ledger's grid,
  δ, budget, odometer and plan, as JSON), ``events`` (JSON list of explicit,
  logged actions such as a change of target), ``created``.
* ``journal(idx, time, label, mechanism, curve, pid, digest)``: one row per
  admitted charge, append-only. ``curve`` is the RDP curve charged, exactly
  as the ledger added it; ``digest`` chains each row to the previous one
  (SHA-256), so an edited or deleted row breaks the chain.
* ``totals(id=1, count, spent, digest)``: a cached total, rewritten in the
  same transaction as each append and verified against the replayed journal
  on every transaction.

A charge is one ``BEGIN IMMEDIATE`` transaction: it first replays the rows
other processes appended, verifies the totals, decides, appends, and
commits with ``synchronous=FULL`` before the ledger returns. Two processes
can therefore never both be admitted into the last bit of budget, and a
charge is durable before the caller acts on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from privguard._errors import LedgerStateError

SCHEMA_VERSION = 1
_GENESIS = "privguard-journal-v1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS journal (
    idx INTEGER PRIMARY KEY, time REAL NOT NULL, label TEXT, mechanism TEXT NOT NULL,
    curve TEXT NOT NULL, pid INTEGER NOT NULL, digest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 1), count INTEGER NOT NULL, spent TEXT NOT NULL,
    digest TEXT NOT NULL);
"""


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def row_digest(previous: str, idx: int, t: float, label: str | None, mechanism: str,
               curve: str, pid: int) -> str:
    text = _dumps([previous, idx, t, label, mechanism, curve, pid])
    return hashlib.sha256(text.encode()).hexdigest()


class SQLiteStore:
    """The SQLite journal behind ``Ledger(..., path=...)``. Not used directly."""

    def __init__(self, path: str | os.PathLike, timeout: float = 60.0) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self.last_digest = _GENESIS
        self.config_rev: str | None = None

    # -- connection --------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                       check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
            except sqlite3.DatabaseError as exc:
                raise LedgerStateError(f"{self.path}: not a readable ledger database ({exc})") from exc
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE (write) or BEGIN (read); COMMIT on success, ROLLBACK on error."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.DatabaseError as exc:
            raise LedgerStateError(f"{self.path}: cannot start a transaction ({exc})") from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                raise LedgerStateError(f"{self.path}: commit failed ({exc})") from exc

    # -- opening -------------------------------------------------------------
    def initialise_or_check(self, config: dict[str, Any], retarget: str | None
                            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Create the schema for a new file, or check a file's schema and config.

        Returns the configuration in force and the logged events.
        """
        with self.transaction(write=True) as conn:
            try:
                tables = {r[0] for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'")}
                if not tables:
                    for statement in _SCHEMA.split(";"):  # executescript would COMMIT
                        if statement.strip():
                            conn.execute(statement)
                    self._put(conn, "schema_version", str(SCHEMA_VERSION))
                    self._put(conn, "config", _dumps(config))
                    self._put(conn, "events", "[]")
                    self._put(conn, "config_rev", "0")
                    self._put(conn, "created", repr(time.time()))
                    self.config_rev = "0"
                    conn.execute("INSERT INTO totals VALUES (1, 0, ?, ?)",
                                 (_dumps([0.0] * len(config["orders"])), _GENESIS))
                    return config, []
                if not {"meta", "journal", "totals"} <= tables:
                    raise LedgerStateError(f"{self.path}: not a privguard ledger "
                                           f"(tables {sorted(tables)})")
                check = conn.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise LedgerStateError(f"{self.path}: database integrity check failed: {check}")
            except sqlite3.DatabaseError as exc:
                raise LedgerStateError(f"{self.path}: unreadable ledger database ({exc})") from exc
            stored, events, self.config_rev = self._read_meta(conn)
            if stored == config:
                return stored, events
            differs = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
            if retarget is None or set(differs) - {"filter", "delta", "plan"}:
                raise LedgerStateError(
                    f"{self.path} was created with another configuration ({', '.join(differs)} "
                    f"differ): stored {stored}, requested {config}. Open it with "
                    "Ledger.open(path) to use the stored configuration; changing the target "
                    "needs an explicit, logged Ledger(..., retarget='reason'), and the grid "
                    "and odometer can never change")
            events.append({"event": "retarget", "time": time.time(), "pid": os.getpid(),
                           "reason": retarget, "old": stored, "new": config})
            self.config_rev = str(int(self.config_rev) + 1)
            self._put(conn, "config", _dumps(config))
            self._put(conn, "events", _dumps(events))
            self._put(conn, "config_rev", self.config_rev)
            return config, events

    def read_config(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The stored configuration and events of an existing ledger file."""
        if not os.path.exists(self.path):
            raise LedgerStateError(f"{self.path}: no such ledger file")
        with self.transaction(write=False) as conn:
            config, events, _ = self._read_meta(conn)
            return config, events

    def _read_meta(self, conn: sqlite3.Connection) -> tuple[dict[str, Any], list, str]:
        """Schema check, then (config, events, config_rev); fails closed on anything odd."""
        try:
            version = self._get(conn, "schema_version")
            if not version.isdigit() or int(version) > SCHEMA_VERSION:
                raise LedgerStateError(
                    f"{self.path}: schema version {version} is newer than this privguard "
                    f"supports ({SCHEMA_VERSION}); refusing to open")
            return (json.loads(self._get(conn, "config")), json.loads(self._get(conn, "events")),
                    self._get(conn, "config_rev"))
        except sqlite3.DatabaseError as exc:
            raise LedgerStateError(f"{self.path}: unreadable ledger database ({exc})") from exc
        except ValueError as exc:
            raise LedgerStateError(f"{self.path}: ledger metadata unreadable ({exc})") from exc

    @staticmethod
    def _put(conn: sqlite3.Connection, key: str, value: str) -> None:
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _get(self, conn: sqlite3.Connection, key: str) -> str:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise LedgerStateError(f"{self.path}: ledger metadata {key!r} is missing")
        return row[0]

    def verify_config(self, conn: sqlite3.Connection) -> None:
        """Fail closed if another process changed the configuration since we opened."""
        try:
            rev = self._get(conn, "config_rev")
        except sqlite3.DatabaseError as exc:
            raise LedgerStateError(f"{self.path}: ledger metadata unreadable ({exc})") from exc
        if rev != self.config_rev:
            raise LedgerStateError(
                f"{self.path}: the ledger's configuration was changed by another process "
                "(an explicit retarget); reopen the ledger to continue")

    # -- journal -------------------------------------------------------------
    def rows_after(self, conn: sqlite3.Connection, count: int) -> list[tuple]:
        """Journal rows with idx >= count, each verified against the hash chain."""
        try:
            rows = conn.execute(
                "SELECT idx, time, label, mechanism, curve, pid, digest FROM journal "
                "WHERE idx >= ? ORDER BY idx", (count,)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerStateError(f"{self.path}: journal unreadable ({exc})") from exc
        out = []
        previous = self.last_digest
        for idx, t, label, mech, curve, pid, digest in rows:
            if idx != count + len(out):
                raise LedgerStateError(f"{self.path}: journal row {count + len(out)} is missing")
            if row_digest(previous, idx, t, label, mech, curve, pid) != digest:
                raise LedgerStateError(f"{self.path}: journal row {idx} fails its hash chain "
                                       "(edited, reordered or corrupted)")
            try:
                parsed = (idx, t, label, json.loads(mech), np.array(json.loads(curve), dtype=float),
                          pid)
            except (ValueError, TypeError) as exc:
                raise LedgerStateError(f"{self.path}: journal row {idx} unreadable ({exc})") from exc
            out.append(parsed)
            previous = digest
        self._pending_digest = previous
        return out

    def accept_rows(self) -> None:
        """Mark the rows returned by the last :meth:`rows_after` as replayed."""
        self.last_digest = self._pending_digest

    def totals(self, conn: sqlite3.Connection) -> tuple[int, np.ndarray, str]:
        try:
            row = conn.execute("SELECT count, spent, digest FROM totals WHERE id = 1").fetchone()
            if row is None:
                raise LedgerStateError(f"{self.path}: cached totals are missing")
            return int(row[0]), np.array(json.loads(row[1]), dtype=float), row[2]
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            raise LedgerStateError(f"{self.path}: cached totals unreadable ({exc})") from exc

    def append(self, conn: sqlite3.Connection, idx: int, t: float, label: str | None,
               mechanism: dict, curve: np.ndarray, pid: int, spent_after: np.ndarray) -> str:
        mech, crv = _dumps(mechanism), _dumps(curve.tolist())
        digest = row_digest(self.last_digest, idx, t, label, mech, crv, pid)
        conn.execute("INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (idx, t, label, mech, crv, pid, digest))
        conn.execute("UPDATE totals SET count = ?, spent = ?, digest = ? WHERE id = 1",
                     (idx + 1, _dumps(spent_after.tolist()), digest))
        return digest
