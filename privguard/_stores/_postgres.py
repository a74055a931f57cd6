"""The server store: a ledger's journal in PostgreSQL, shared by processes on many machines.

``Ledger(epsilon, delta, path="postgresql://USER@HOST:PORT/DB?ledger=NAME")``
keeps the journal in the schema of :mod:`privguard._stores._pgschema`, with
the SQLite store's semantics and format of rows: a digest chain from a
genesis over the ledger's identity and configuration, a MAC'd head, runs
whose count grows, ``fix`` and ``event`` rows, and checkpoints.

Every charge is one transaction: ``privguard.lock_head`` takes the ledger's
head row ``FOR UPDATE`` (so charges to one ledger are serialised, across any
number of clients), the rows other clients appended are replayed and
verified, the accounting decides in Python exactly as for SQLite, and the
changes are appended through the ``SECURITY DEFINER`` functions and
committed with ``synchronous_commit = on`` before the ledger returns. The
database itself refuses to delete or rewrite a row, for every role.

A *charging role* (``privguard server-init``) can only call the functions
that append: it cannot rewind, retarget or write a checkpoint. Checkpoints
come from the owner alone (an owner's ledger writes one every
``CHECKPOINT_EVERY`` rows, and whenever it opens a ledger whose tail is
longer, or whose newest checkpoint is of an older curve version and could not be
resumed from: schema 3 keeps the stale one and takes the new one beside it, on
the same row if need be; a version-2 schema is used as it is until
``privguard server-upgrade``), so an opener never adopts a snapshot that a charging
role wrote; it replays the rows after the owner's newest checkpoint. A fix row, which a
charging role writes at a ledger's first charge, must be exactly what this
library derives from its plan (floats to 1e-9 relative, for another CPU's
libm), so it cannot carry weaker filter weights.

A connection lost before anything was written (a restarted server, a
terminated backend) is reopened and the transaction retried. A connection
lost during the write or the commit is resolved: the store reconnects and,
once the lost session has let go of the head's lock (its COMMIT may still be
running on the server), reads back the row it wrote, so the caller learns
whether the charge was recorded; either way that ledger then fails closed (its memory may be ahead
of the journal) and must be reopened, unless the charge was recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

from privguard._accounting import _config
from privguard._accounting._accounting import Accounting, Change
from privguard._accounting._config import Config
from privguard._accounting._journal import Run
from privguard._errors import (
    InvalidArgumentError,
    LedgerStateError,
    PrivguardError,
    SchemaUpgradeWarning,
)
from privguard._mechanisms._base import Mechanism
from privguard._optional import require
from privguard._stores import _devnull, _extent, _handles, _pgschema, _pgurl, _rows
from privguard._stores._integrity import Integrity
from privguard._stores._rows import checked_items
from privguard._stores._sqlite import _Cursor, _dumps

CHECKPOINT_EVERY = 512
_GENESIS = "privguard-pg-journal-v1"
_ROW = "idx, kind, mech, label, pid, count, first, last, body, digest"
_RETRY_PAUSE = 0.2
_INHERITED: list[Any] = []  # connections inherited through fork, kept from finalisation
_FORKED_INSIDE = ("this process was forked inside one of the ledger's transactions, whose "
                  "connection is the parent's: reopen the ledger")


def _let_go_of_socket(conn: Any) -> None:
    """Point this process's descriptor of ``conn``'s socket at /dev/null (review pgf).

    A forked child's copy of its parent's socket kept the parent's session alive on the
    server after the parent died: a parent killed inside a charge left the ledger's head
    locked for as long as a child lived, and every client's charge waited and failed.
    The parent's session is not touched (nothing is sent, no ``shutdown``)."""
    _devnull.over(conn.pgconn.socket)


class _Txn:
    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def write(self, acc: Accounting, changes: list[Change]) -> None:
        self.store._write_guarded(acc, changes)

    def accepts(self, label: str | None) -> None:
        self.store._accepts(label)


#: How many non-ASCII labels a store of a non-UTF8 database remembers as kept (review
#: rlo7: one set that grew with every distinct label).
_LABELS_KEPT = 1024

_TOLD_UPGRADE: set[str] = set()  # ledger ids whose owner was told (SchemaUpgradeWarning)


def _snapshot_curves(snapshot: Any) -> int | None:
    """The curve version a checkpoint's snapshot names (schema 2 has no column for it); None
    where it names none or cannot be read (the warning is then left out: resuming decides)."""
    try:
        version = json.loads(snapshot).get("curves")
    except (TypeError, ValueError, AttributeError, RecursionError):
        return None
    return version if type(version) is int else None


class PostgresStore:
    """The PostgreSQL journal behind ``Ledger(path="postgresql://...")``. Not used directly."""

    PEER = "client"  # who else may write the journal (for messages)

    def __init__(self, url: str, *, read_only: bool = False, timeout: float = 60.0,
                 role: str | None = None) -> None:
        self._conninfo, self.ledger, self.path = _pgurl.parse(url)
        self._url = url
        self.read_only = read_only
        self.timeout = timeout
        self._role = role
        self.integrity = Integrity.from_environment()
        self.ledger_id: str | None = None
        self.genesis: str | None = None
        self._conn: Any = None
        self._pid: int | None = None
        self._cursor: _Cursor | None = None
        self._mechs: dict[int, tuple[Mechanism, str]] = {}
        self._mech_ids: dict[str, int] = {}
        self._body_of: dict[Mechanism, str] = {}
        self._owner = False  # may write checkpoints (the charging role may not)
        self._checkpointed = 0  # rows covered by the newest checkpoint
        self._schema = _pgschema.SCHEMA_VERSION  # the schema version read at opening
        self._newest: tuple[int, int | None] | None = None  # its (row, curve version) then
        self._depth = 0
        self._writing = False
        self._written: tuple[int, str] | None = None  # (row, digest) written in this transaction
        self._desync: str | None = None
        self._closed = False  # by the owning ledger (:meth:`close`)
        self._labels_fit: set[str] = set()  # non-ASCII labels a non-UTF8 database keeps
        self.live = False

    @property
    def writes_events(self) -> bool:
        """Whether this connection may append event rows (a lease's unused remainder,
        docs/theory.md §13): the owner may, the charging role may not."""
        return self._owner

    # -- connection ------------------------------------------------------------------------
    @property
    def _pg(self) -> Any:
        return require("psycopg", "postgres")

    def _connect(self, within: float | None = None) -> Any:
        """The open connection (a new one after a fork or a broken one); raises psycopg errors.
        ``within``: the seconds left to a caller's deadline, which a new connection's
        ``connect_timeout`` does not exceed, but for psycopg's least (2 s: a deadline with
        less left is overrun by up to 2 s) and a URL of several hosts (psycopg waits that
        long for each)."""
        conn = self._conn
        if conn is not None and self._pid == os.getpid() and not conn.closed and not conn.broken:
            return conn
        if conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                conn.close()
        elif conn is not None:  # inherited through fork: the parent's socket, never finalised
            _INHERITED.append(conn)  # here (libpq would send it a Terminate message)
        self._conn = None
        pg = self._pg
        options: dict[str, Any] = {"autocommit": True}
        # The URL's parameters as libpq reads them (review rlo8: a substring test took a
        # password holding "connect_timeout" for the parameter, and such a connection had
        # no connect_timeout at all: libpq then waits indefinitely)
        given = pg.conninfo.conninfo_to_dict(self._conninfo)
        if "connect_timeout" not in given:
            limit = min(self.timeout, 10) if within is None else min(self.timeout, 10, within)
            options["connect_timeout"] = max(1, int(limit))
        elif within is not None:  # the URL's own value, never past the caller's deadline
            # (task lo8: connect_timeout=60 in the URL let one read-back connect take 60 s
            # of a 10 s deadline); a keyword argument overrides the URL's value in psycopg
            seconds = _pgurl.connect_timeout(given["connect_timeout"])
            options["connect_timeout"] = max(1, int(within if seconds is None
                                                    else min(seconds, within)))
        if "application_name" not in given:
            options["application_name"] = f"privguard:{self.ledger}"
        # What the rows are read and written in, whatever the URL, the role or the database
        # set (task adv5): UTF-8, as a LATIN1 client encoding let a label outside it raise
        # UnicodeEncodeError out of charge(); and every float's shortest exact text, as
        # extra_float_digits <= 0 (a database or role default) rounded the run times read
        # back to 15 digits, and every replay refused the journal as edited.
        options["client_encoding"] = "UTF8"
        conn = pg.connect(self._conninfo, **options)
        try:
            conn.execute("SET extra_float_digits = 3")
            if self._role is not None:
                conn.execute(pg.sql.SQL("SET ROLE {}").format(pg.sql.Identifier(self._role)))
        except BaseException:  # a role it may not take: close, never leave it to the GC
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def forked(self, *, idle: bool) -> None:
        """In a forked child, let go of the parent's connection (review pgf, as
        ``SQLiteStore.forked`` does for SQLite): libpq forbids using a connection across a
        fork, and closing it here would send a Terminate message on the parent's socket.
        It is kept, never used nor finalised (:data:`_INHERITED`); the next transaction
        opens this process's own. The at-fork hook calls it (:mod:`privguard._ledger._fork`),
        so a child never takes the copy for its own, even at a reused pid (the pid check
        in :meth:`_connect` alone took a process at its opener's pid for the opener).
        ``idle`` is not needed: the copy is never closed here. A fork by a thread inside
        one of this store's transactions leaves the child's copy of it with no connection:
        it refuses to go on (fail closed), never on the parent's session."""
        conn, self._conn, self._pid = self._conn, None, None
        if self._depth:
            self._desync = _FORKED_INSIDE
        if conn is not None:
            _INHERITED.append(conn)
            with contextlib.suppress(Exception):
                _let_go_of_socket(conn)

    def close(self, *, warn: bool = True) -> None:
        """Close: the owning ledger is closed (``warn``, as ``SQLiteStore.close`` takes it:
        nothing here to warn of). :meth:`reference` then reads nothing (it would connect
        again)."""
        self._closed = True
        self._disconnect()

    def _disconnect(self) -> None:
        """Drop the connection; the next transaction opens a new one."""
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._conn.close()
        elif self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None

    def _rollback(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            conn.execute("ROLLBACK")
        except Exception:
            self._disconnect()

    def _error(self, exc: Exception, what: str) -> LedgerStateError:
        pg = self._pg
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = _pgurl.scrub(detail, self._url)
        if isinstance(exc, pg.errors.InsufficientPrivilege):
            return LedgerStateError(f"{self.path}: {what}: permission denied to this role "
                                    f"({detail})")
        return LedgerStateError(f"{self.path}: {what} ({detail})")

    def _lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection is gone (rather than a refused statement)."""
        pg = self._pg
        if isinstance(exc, (pg.errors.AdminShutdown, pg.errors.CrashShutdown,
                            pg.errors.CannotConnectNow)):
            return True
        conn = self._conn
        return isinstance(exc, pg.OperationalError) and (conn is None or conn.closed
                                                           or conn.broken)

    # -- transactions ----------------------------------------------------------------------
    def _lock_timeout(self, seconds: float | None = None) -> str:
        """How long a transaction waits for a lock: ``seconds`` (default: the store's
        timeout), at least 1 ms."""
        wait = self.timeout if seconds is None else seconds
        return f"SET LOCAL lock_timeout = '{max(1, int(wait * 1000))}ms'"

    def _begin(self, conn: Any, write: bool) -> _Cursor | None:
        """BEGIN; the head, locked when writing (None if the ledger does not exist)."""
        if write:
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED; "
                         f"SET LOCAL synchronous_commit = on; {self._lock_timeout()}")
            row = conn.execute("SELECT * FROM privguard.lock_head(%s)", (self.ledger,)).fetchone()
        else:
            # One snapshot for the head and the rows: a concurrent commit cannot split them.
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            row = conn.execute("SELECT ledger_id, entries, last_count, head, prev, mac FROM "
                               "privguard.ledgers WHERE name = %s", (self.ledger,)).fetchone()
        if row is None:
            return None
        if self.ledger_id is not None and row[0] != self.ledger_id:
            raise LedgerStateError(f"{self.path}: ledger {self.ledger!r} is no longer the ledger "
                                   "this client opened (its identity changed)")
        head = _Cursor(int(row[1]), int(row[2]), row[3], row[4], None)
        if self.ledger_id is not None and row[5] != self._head_mac(head):
            raise LedgerStateError(f"{self.path}: the journal head fails its digest (edited)")
        return head

    @contextlib.contextmanager
    def _session(self, write: bool, acc: Accounting | None) -> Iterator[Any]:
        """A transaction in which ``acc`` (if given) is in sync; commit (resolved) at exit."""
        if self._depth:
            if write and not self._writing:
                raise LedgerStateError(f"{self.path}: a write inside a read transaction")
            if self._conn is None:
                raise LedgerStateError(f"{self.path}: {self._desync or _FORKED_INSIDE}")
            yield self._conn
            return
        if write and self.read_only:
            raise LedgerStateError(f"{self.path} was opened read-only")
        if self._desync is not None:
            raise LedgerStateError(f"{self.path}: {self._desync}")
        conn = self._begin_synced(write, acc)
        self._depth, self._writing, self._written = 1, write, None
        try:
            try:
                yield conn
            except BaseException:
                self._rollback()
                if self._written is not None:
                    self._desync = ("a transaction that wrote was rolled back after an error; "
                                    "this ledger's memory is ahead of the journal: reopen it")
                raise
            self._commit()
        finally:
            self._depth, self._writing, self._written = 0, False, None

    def _begin_synced(self, write: bool, acc: Accounting | None) -> Any:
        """BEGIN and replay, retrying on a new connection while the server is unreachable."""
        pg = self._pg
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = self._connect()
                head = self._begin(conn, write)
                if head is None:
                    raise LedgerStateError(f"{self.path}: ledger {self.ledger!r} is gone")
                if acc is not None:
                    self._sync(conn, acc, head)
                return conn
            except LedgerStateError:
                self._rollback()
                raise
            except pg.Error as exc:
                if not self._lost(exc) and self._conn is not None:
                    self._rollback()
                    raise self._error(exc, "cannot start a transaction") from exc
                self._disconnect()
                if time.monotonic() >= deadline:
                    raise self._error(exc, f"the server stayed unreachable for "
                                      f"{self.timeout:g} s") from exc
                time.sleep(_RETRY_PAUSE)
            except BaseException:
                self._rollback()
                raise

    def _commit(self) -> None:
        pg = self._pg
        conn = self._conn
        if conn is None:  # forked inside this transaction (:meth:`forked`)
            self._desync = _FORKED_INSIDE
            raise LedgerStateError(f"{self.path}: {_FORKED_INSIDE}")
        try:
            conn.execute("COMMIT")
            return
        except pg.Error as exc:
            if self._written is None:  # nothing was written: nothing to lose
                self._disconnect()
                if self._writing:
                    raise self._error(exc, "commit failed") from exc
                return
            failure = exc
        except BaseException:
            # An interrupt during the COMMIT round trip (psycopg cancels the query on
            # SIGINT): treated like a lost connection whose outcome is unknown. The
            # connection is dropped (the server rolls back what it did not commit) and
            # this store refuses everything until reopened; the interrupt propagates.
            self._disconnect()
            if self._written is not None or self._writing:
                self._desync = "a commit was interrupted; its outcome is unknown: reopen the ledger"
            raise
        self._resolve(failure)

    def _resolve(self, failure: Exception) -> None:
        """After a failed COMMIT: read back the row written, to tell the caller what happened."""
        assert self._written is not None
        idx, digest = self._written
        if not self._lost(failure):
            self._rollback()
            self._desync = "a charge was refused by the database; reopen the ledger"
            raise self._error(failure, "the database refused the commit; the charge was NOT "
                              "recorded") from failure
        self._disconnect()
        # One deadline for the whole read-back (task lo7): each attempt's connect and lock
        # wait get what is left of it, never the whole timeout again (a lock wait of the
        # full timeout begun just before the deadline took up to about twice the timeout).
        deadline = time.monotonic() + self.timeout
        try:
            row = self._read_back(idx, deadline)
        except BaseException:
            # An interrupt (or any other failure) while reading back leaves the outcome
            # unknown: this store refuses everything until reopened (task lo7: a
            # KeyboardInterrupt during the lock wait left it usable), as the ledger does.
            self._disconnect()
            if self._desync is None:
                self._desync = "a commit's outcome is unknown; reopen the ledger"
            raise
        if row is not None and row[0] == digest:
            return  # it was committed: the ledger goes on
        self._desync = "a charge was not recorded; reopen the ledger"
        raise self._error(failure, "the connection was lost before the commit completed; "
                          "the charge was NOT recorded. This ledger now refuses charges: "
                          "reopen it") from failure

    def _read_back(self, idx: int, deadline: float) -> Any:
        """The digest row at ``idx`` (None if absent), read once the lost session let go of
        the head's lock; retried on a new connection until ``deadline`` (monotonic)."""
        pg = self._pg
        while True:  # at least one attempt, each with what is left of the deadline
            try:
                conn = self._connect(deadline - time.monotonic())
                # The head's lock first (task adv5): the lost session's COMMIT may still be
                # running on the server (a slow flush, a synchronous standby, a deferred
                # trigger), its row not yet visible; read at once, a charge committed a
                # moment later was reported as NOT recorded. The lock is the old session's
                # until its transaction ends, either way; waited for what is left of the
                # deadline.
                conn.execute(f"BEGIN; {self._lock_timeout(deadline - time.monotonic())}")
                conn.execute("SELECT * FROM privguard.lock_head(%s)", (self.ledger,))
                row = conn.execute("SELECT e.digest FROM privguard.entries e JOIN "
                                   "privguard.ledgers l ON l.name = e.ledger WHERE e.ledger = %s "
                                   "AND e.idx = %s AND l.ledger_id = %s",
                                   (self.ledger, idx, self.ledger_id)).fetchone()
                conn.execute("ROLLBACK")
                return row
            except pg.Error as exc:
                self._disconnect()
                if time.monotonic() + _RETRY_PAUSE >= deadline:
                    self._desync = "a commit's outcome is unknown; reopen the ledger"
                    raise self._error(exc, "the connection was lost during COMMIT and the "
                                      "server stayed unreachable (or the lost session kept "
                                      "the ledger's lock): the charge may or may not have "
                                      "been recorded; reopen the ledger to see") from exc
                time.sleep(_RETRY_PAUSE)

    def transaction(self, acc: Accounting, write: bool) -> contextlib.AbstractContextManager[_Txn]:
        return self._transaction(acc, write)

    @contextlib.contextmanager
    def _transaction(self, acc: Accounting, write: bool) -> Iterator[_Txn]:
        with self._session(write, acc):
            yield _Txn(self)

    # -- digests -----------------------------------------------------------------------------
    def _genesis_digest(self, config: dict[str, Any]) -> str:
        return self.integrity.digest("genesis", _GENESIS, self.ledger, self.ledger_id, config,
                                     self.integrity.keyed)

    def _entry_digest(self, prev: str, idx: int, kind: str, fields: list[Any]) -> str:
        return self.integrity.digest("entry", prev, idx, kind, fields)

    @staticmethod
    def _run_fields(run: Run, mech_digest: str) -> list[Any]:
        return [mech_digest, run.label, run.pid, run.count, run.first_time, run.last_time]

    def _run_digest(self, prev: str, idx: int, md: str, label: str | None, pid: int,
                    count: int, first: float, last: float) -> str:
        return self._entry_digest(prev, idx, "run", [md, label, pid, count, first, last])

    def _head_mac(self, c: _Cursor) -> str:
        return self.integrity.digest("head", self.ledger_id, *c.as_tuple())

    def _checkpoint_mac(self, c: _Cursor, snapshot: str) -> str:
        return self.integrity.digest("checkpoint", self.ledger_id, *c.as_tuple(), snapshot)

    # -- opening -------------------------------------------------------------------------------
    def open(self, config: Config | None, acc: Accounting | None,
             retarget: str | None) -> Accounting:
        pg = self._pg
        try:
            conn = self._connect()
        except pg.Error as exc:
            raise self._error(exc, "cannot connect") from exc
        create = config is not None and acc is not None and not self.read_only
        self._depth, self._writing = 1, not self.read_only
        try:
            try:
                result = self._open(conn, config, acc, retarget, create)
                conn.execute("COMMIT")
                return result
            except BaseException:
                self._rollback()
                self.close()  # nobody holds a store whose open failed: never leave it to the GC
                raise
        except pg.Error as exc:
            raise self._error(exc, "cannot open the ledger") from exc
        finally:
            self._depth, self._writing = 0, False

    @staticmethod
    def _schema_version(conn: Any) -> str | None:
        row = conn.execute("SELECT value FROM privguard.meta WHERE key = 'schema_version'"
                           ).fetchone()
        return None if row is None else str(row[0])

    def _open(self, conn: Any, config: Config | None, acc: Accounting | None,
              retarget: str | None, create: bool) -> Accounting:
        if self.read_only:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        else:
            # The owner's open waits for the head's lock like a charge does, never forever.
            conn.execute(f"BEGIN; SET LOCAL synchronous_commit = on; {self._lock_timeout()}")
        if not self._schema_exists(conn):
            if not create:
                raise LedgerStateError(f"{self.path}: this database has no privguard schema "
                                       "(privguard server-init creates it)")
            self._install(conn)
        version = self._schema_version(conn)
        if version not in {str(v) for v in _pgschema.READABLE_VERSIONS}:
            raise LedgerStateError(
                f"{self.path}: privguard schema version {version} is not supported by this "
                f"privguard (it reads {', '.join(map(str, sorted(_pgschema.READABLE_VERSIONS)))})")
        self._schema = int(str(version))
        self._owner = bool(conn.execute("SELECT has_table_privilege('privguard.checkpoints', "
                                        "'INSERT')").fetchone()[0]) and not self.read_only
        exists = conn.execute("SELECT 1 FROM privguard.ledgers WHERE name = %s",
                              (self.ledger,)).fetchone()
        if exists is None:
            if not create:
                raise LedgerStateError(f"{self.path}: no ledger named {self.ledger!r} in this "
                                       "database")
            assert acc is not None
            if not self._owner:
                raise LedgerStateError(
                    f"{self.path}: no ledger named {self.ledger!r}, and this role cannot create "
                    "one (a charging role only charges); create it with privguard server-init "
                    "or an owner's connection")
            if self._create(conn, acc):
                return acc
        if not self.read_only:
            conn.execute("SELECT * FROM privguard.lock_head(%s)", (self.ledger,))
        genesis_config, current = self._read_meta(conn)
        stored = self._resume(conn, genesis_config)
        if stored.config != current:
            raise LedgerStateError(f"{self.path}: the stored configuration was edited (the "
                                   "journal's retarget events do not lead to it)")
        if config is not None and config != stored.config:
            self._retarget(conn, stored, config, retarget)
        if self._owner and self._cursor is not None \
                and self._cursor.entries - self._checkpointed >= CHECKPOINT_EVERY:
            if self._head_takes_checkpoint(self._cursor):
                self._checkpoint(conn, stored, self._cursor)
            else:
                self._tell_upgrade(self._cursor)
        return stored

    def _tell_upgrade(self, head: _Cursor) -> None:
        """Warn the owner, once per ledger and process, that a version-2 schema keeps this
        ledger replaying from the genesis: its newest checkpoint, on the head row, is of an
        older curve version, and schema 2 holds one checkpoint per row (review rpgh: the
        schema is upgraded by an explicit ``privguard server-upgrade``, never by an open)."""
        newest = self._newest
        if self._schema >= 3 or newest is None or type(newest[1]) is not int \
                or newest[1] >= _rows.CHECKPOINT_CURVES or self.ledger_id in _TOLD_UPGRADE:
            return
        _TOLD_UPGRADE.add(str(self.ledger_id))
        warnings.warn(
            f"{self.path}: the newest checkpoint of ledger {self.ledger!r} is on the journal's "
            f"head row ({head.entries}) and of an older curve version ({newest[1]}; this "
            f"privguard writes {_rows.CHECKPOINT_CURVES}), and this database's privguard schema "
            "(version 2) takes one checkpoint per row: every open replays the journal from the "
            "genesis until a charge adds a row and the owner opens the ledger again. "
            f"`{_pgschema.UPGRADE_COMMAND}`, run once by the schema's owner or a superuser, "
            "upgrades the schema to version 3, after which the owner's next open writes a fresh "
            "checkpoint beside the stale one (privguard clients older than this one then "
            "refuse the database: upgrade them first)", SchemaUpgradeWarning, stacklevel=2)

    def _head_takes_checkpoint(self, head: _Cursor) -> bool:
        """Whether the journal's head row may take a checkpoint of today's curve version:
        it has none, or (schema 3) only older ones, such as the stale checkpoint an open could
        not resume from (:func:`_rows.passed_over`; task pgh: before, a version-5 checkpoint
        on the head row was never replaced and every open replayed from the genesis). The
        newest checkpoint is the one :meth:`_resume` read: at the head's row, any there is."""
        newest = self._newest
        if newest is None or newest[0] != head.entries:
            return True
        curves = newest[1]
        return self._schema >= 3 and curves is not None and curves < _rows.CHECKPOINT_CURVES

    @staticmethod
    def _schema_exists(conn: Any) -> bool:
        return conn.execute("SELECT to_regclass('privguard.ledgers') IS NOT NULL").fetchone()[0]

    def _install(self, conn: Any) -> None:
        """Create the schema (as this role, its owner), once even with concurrent creators."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('privguard schema'))")
        if self._schema_exists(conn):
            return
        conn.execute("CREATE SCHEMA IF NOT EXISTS privguard")
        for statement in _pgschema.STATEMENTS:
            conn.execute(statement)

    def _read_meta(self, conn: Any) -> tuple[Config, Config]:
        row = conn.execute("SELECT ledger_id, keyed, key_check, genesis_config, genesis, config "
                           "FROM privguard.ledgers WHERE name = %s", (self.ledger,)).fetchone()
        if row is None:
            raise LedgerStateError(f"{self.path}: no ledger named {self.ledger!r}")
        ledger_id, keyed, check, genesis_text, genesis, config_text = row
        self.ledger_id = ledger_id
        self.integrity.require_matches(bool(keyed), check, self.path)
        try:
            genesis_dict = _rows.loads(genesis_text, f"{self.path}: ledger metadata")
            current_dict = _rows.loads(config_text, f"{self.path}: ledger metadata")
            genesis_config = _config.from_dict(genesis_dict)
            current = _config.from_dict(current_dict)
        except (PrivguardError, KeyError, TypeError, ValueError) as exc:
            raise LedgerStateError(f"{self.path}: ledger metadata unreadable ({exc})") from exc
        self.genesis = self._genesis_digest(genesis_dict)
        if self.genesis != genesis:
            raise LedgerStateError(f"{self.path}: the configuration ledger {self.ledger!r} was "
                                   "created with was edited (its genesis digest does not match)")
        return genesis_config, current

    def _create(self, conn: Any, acc: Accounting) -> bool:
        """Insert the ledger; False if a concurrent opener created it first."""
        self.ledger_id = uuid.uuid4().hex
        config = acc.config.to_dict()
        self.genesis = self._genesis_digest(config)
        cursor = _Cursor(0, 0, self.genesis, self.genesis, None)
        row = conn.execute(
            "INSERT INTO privguard.ledgers (name, ledger_id, created, keyed, key_check, "
            "genesis_config, genesis, config, entries, last_count, head, prev, mac) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, 0, 0, %s, %s, %s) ON CONFLICT (name) DO NOTHING "
            "RETURNING name",
            (self.ledger, self.ledger_id, time.time(), self.integrity.keyed,
             self.integrity.key_check(), _dumps(config), self.genesis, _dumps(config),
             self.genesis, self.genesis, self._head_mac(cursor))).fetchone()
        if row is None:
            self.ledger_id = self.genesis = None
            return False
        self._cursor = cursor
        if acc.fixed is not None:  # a declared plan: its choices are the first entry
            self._write(conn, acc, [Change("fix", body=acc.fixed)])
        return True

    def _resume(self, conn: Any, genesis_config: Config) -> Accounting:
        """The accounting at the owner's newest checkpoint, then the rows after it replayed."""
        # Schema 3: of the checkpoints on the newest row, the newest curve version's (task pgh).
        newest = ("curves DESC" if self._schema >= 3 else "last_count DESC")
        row = conn.execute("SELECT entries, last_count, head, prev, snapshot, mac, "
                           f"{'curves' if self._schema >= 3 else 'NULL'} FROM "
                           "privguard.checkpoints WHERE ledger = %s ORDER BY entries DESC, "
                           f"{newest} LIMIT 1", (self.ledger,)).fetchone()
        self._newest = None if row is None else (
            row[0], row[6] if self._schema >= 3 else _snapshot_curves(row[4]))
        acc, self._cursor = _rows.resume(
            self, None if row is None else tuple(row[:6]), genesis_config, conn,
            lambda n: conn.execute(f"SELECT {_ROW} FROM privguard.entries WHERE ledger = %s "
                                   "AND idx < %s ORDER BY idx", (self.ledger, n)).fetchall())
        # 0 after an older checkpoint it could not resume from (_rows.passed_over): the tail
        # then counts from the genesis, and an owner's open writes a fresh checkpoint (_open),
        # beside the stale one where the journal's head is its row (schema 3, task pgh)
        self._checkpointed = self._cursor.entries
        head = self._read_head(conn)
        self._sync(conn, acc, head)
        return acc

    def _read_head(self, conn: Any) -> _Cursor:
        row = conn.execute("SELECT entries, last_count, head, prev, mac FROM privguard.ledgers "
                           "WHERE name = %s", (self.ledger,)).fetchone()
        if row is None:
            raise LedgerStateError(f"{self.path}: ledger {self.ledger!r} is gone")
        return _rows.checked_head(self, row)

    def _retarget(self, conn: Any, acc: Accounting, config: Config,
                  reason: str | None) -> None:
        differs = acc.config.differences(config)
        if reason is None or set(differs) - _config.RETARGETABLE:
            raise LedgerStateError(
                f"{self.path}: ledger {self.ledger!r} has another configuration "
                f"({acc.config.mismatch(config)}). " + _config.retarget_remedy(differs, "Ledger.open(url)", owner=True))
        # not while a tuner holds this ledger in this process (review radv2)
        _handles.refuse_if_held(self)
        if not reason.isascii():  # kept as written, or refused (review rlo7)
            self._keeps(conn, "retarget", reason, "nothing was written")
        body = {"event": "retarget", "time": time.time(), "pid": os.getpid(), "reason": reason,
                "old": acc.config.to_dict(), "new": config.to_dict()}
        acc.replay_event(body)
        self._write(conn, acc, [Change("event", body=body)], new_config=config)

    # -- replay --------------------------------------------------------------------------------
    def _sync(self, conn: Any, acc: Accounting, head: _Cursor) -> None:
        """Replay what other clients appended; fail closed on anything else."""
        _rows.sync(self, conn, acc, head, lambda start: conn.execute(
            f"SELECT {_ROW} FROM privguard.entries WHERE ledger = %s AND idx >= %s ORDER BY "
            "idx", (self.ledger, start)).fetchall())

    def _mechanism(self, conn: Any, mech_id: Any, where: str) -> tuple[Mechanism, str]:
        got = self._mechs.get(mech_id)
        if got is not None:
            return got
        row = conn.execute("SELECT body, digest FROM privguard.mechanisms WHERE id = %s AND "
                           "ledger = %s", (mech_id, self.ledger)).fetchone()
        return _rows.decode_mechanism(self, mech_id, row, where)

    # -- writing -------------------------------------------------------------------------------
    def _accepts(self, label: str | None) -> None:
        """Refuse a label this database's encoding cannot hold, before anything is decided
        or written (task lo7: a LATIN1 database refused a label outside LATIN1 at the
        write, the charge failed as a LedgerStateError and the ledger was broken for good).
        ASCII fits every server encoding, and UTF8 and SQL_ASCII (no conversion) take any
        label, asked nothing; otherwise the server itself converts the label and sends it
        back, once per label and store (up to ``_LABELS_KEPT`` remembered): refused when
        the conversion fails (any data error: review rlo7, EUC_JIS_2004 refuses U+0085 as
        an invalid byte sequence, not as untranslatable) or gives another string (review
        rlo7: EUC_JP keeps "¦" as what reads back "￤", and the row then failed its digest:
        the ledger never opened again). A refusal aborts this transaction, which the
        caller's error rolls back."""
        if label is None or label.isascii() or label in self._labels_fit:
            return
        if not self._keeps(self._conn, "label", label, "nothing was charged"):
            return  # a UTF8 or SQL_ASCII database: nothing asked, nothing remembered
        if len(self._labels_fit) >= _LABELS_KEPT:
            self._labels_fit.clear()
        self._labels_fit.add(label)

    def _keeps(self, conn: Any, argument: str, text: str, outcome: str) -> bool:
        """Refuse (InvalidArgumentError naming ``argument``) a non-ASCII ``text`` this
        database cannot keep as written (:meth:`_accepts`); True when the server was asked
        (a database that converts), False when its encoding takes any text."""
        encoding = str(conn.info.parameter_status("server_encoding") or "")
        if encoding.upper() in ("UTF8", "SQL_ASCII"):
            return False
        pg = self._pg
        try:
            back = conn.execute("SELECT %s::text", (text,)).fetchone()[0]
        except pg.DataError:
            back = None
        except pg.Error as exc:
            raise self._error(exc, f"cannot check the {argument}") from exc
        if back != text:
            raise InvalidArgumentError(
                argument, text, f"cannot be stored in this PostgreSQL database (its encoding "
                f"is {encoding}{'' if back is None else ', which reads it back changed'}); "
                f"{outcome}")
        return True

    def _write_guarded(self, acc: Accounting, changes: list[Change]) -> None:
        pg = self._pg
        try:
            self._write(self._conn, acc, changes)
        except pg.Error as exc:
            lost = self._lost(exc)
            self._rollback()
            self._written = None
            self._desync = "a charge was not recorded; reopen the ledger"
            what = "the connection was lost during" if lost else "the database refused"
            raise self._error(exc, f"{what} the charge, which was NOT recorded (an open "
                              "transaction is never committed); this ledger now refuses "
                              "charges: reopen it") from exc

    def _mechanism_id(self, conn: Any, mechanism: Mechanism) -> tuple[int, str]:
        body = self._body_of.get(mechanism)
        if body is None:
            body = _dumps(mechanism.to_dict())
            self._body_of[mechanism] = body
        mech_id = self._mech_ids.get(body)
        if mech_id is None:
            mech_id = conn.execute("SELECT privguard.mechanism(%s, %s, %s, %s)",
                                   (self.ledger, self.ledger_id, body,
                                    self.integrity.digest("mechanism", body))).fetchone()[0]
            self._mechanism(conn, mech_id, f"{self.path}: mechanism {mech_id}")
        return mech_id, self._mechs[mech_id][1]

    def _write(self, conn: Any, acc: Accounting, changes: list[Change],
               new_config: Config | None = None) -> None:
        c = self._cursor
        assert c is not None
        entries_before = c.entries
        for change in changes:
            if change.kind == "run" and change.extended:
                run = change.run
                assert run is not None and c.last_kind == "run"
                _, mech_digest = self._mechanism_id(conn, run.mechanism)
                idx = c.entries - 1
                digest = self._entry_digest(c.prev, idx, "run", self._run_fields(run, mech_digest))
                after = _Cursor(c.entries, run.count, digest, c.prev, "run")
                conn.execute("SELECT privguard.extend(%s, %s, %s, %s, %s, %s, %s)",
                             (self.ledger, self.ledger_id, idx, run.count, run.last_time, digest,
                              self._head_mac(after)))
            else:
                idx = c.entries
                if change.kind == "run":
                    run = change.run
                    assert run is not None
                    mech_id, mech_digest = self._mechanism_id(conn, run.mechanism)
                    digest = self._entry_digest(c.digest, idx, "run",
                                                self._run_fields(run, mech_digest))
                    after = _Cursor(idx + 1, run.count, digest, c.digest, "run")
                    conn.execute("SELECT privguard.append(%s, %s, %s, 'run', %s, %s, %s, %s, %s, "
                                 "%s, NULL, %s, %s)",
                                 (self.ledger, self.ledger_id, idx, mech_id, run.label, run.pid,
                                  run.count, run.first_time, run.last_time, digest,
                                  self._head_mac(after)))
                else:
                    body = _dumps(change.body)
                    digest = self._entry_digest(c.digest, idx, change.kind, [body])
                    after = _Cursor(idx + 1, 0, digest, c.digest, change.kind)
                    if change.kind == "fix":
                        conn.execute("SELECT privguard.append(%s, %s, %s, 'fix', NULL, NULL, "
                                     "NULL, NULL, NULL, NULL, %s, %s, %s)",
                                     (self.ledger, self.ledger_id, idx, body, digest,
                                      self._head_mac(after)))
                    else:
                        conn.execute("SELECT privguard.append_event(%s, %s, %s, %s, %s, %s, %s)",
                                     (self.ledger, self.ledger_id, idx, body, digest,
                                      self._head_mac(after),
                                      None if new_config is None else _dumps(new_config.to_dict())))
            self._written = (idx, digest)
            c.entries, c.last_count, c.digest, c.prev = after.as_tuple()
            c.last_kind = after.last_kind
        if self._owner and _rows.checkpoint_due(entries_before, c.entries, CHECKPOINT_EVERY):
            self._checkpoint(conn, acc, c)

    def _checkpoint(self, conn: Any, acc: Accounting, c: _Cursor) -> None:
        snapshot = _dumps(_rows.checkpoint_body(acc, c.last_kind))
        conn.execute("INSERT INTO privguard.checkpoints (ledger, entries, last_count, head, "
                     "prev, snapshot, mac) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                     "ON CONFLICT DO NOTHING",
                     (self.ledger, *c.as_tuple(), snapshot, self._checkpoint_mac(c, snapshot)))
        self._checkpointed = c.entries

    # -- whole-journal views ---------------------------------------------------------------------
    def _all_rows(self, conn: Any) -> list[tuple]:
        return conn.execute(f"SELECT {_ROW} FROM privguard.entries WHERE ledger = %s ORDER BY "
                            "idx", (self.ledger,)).fetchall()

    def items(self, acc: Accounting | None = None) -> list[Any]:
        """The whole journal in order (runs, ["fix" | "event", body]), checked from the genesis."""
        with self._reading() as conn:
            return checked_items(self, conn, self._all_rows(conn))

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Any]:
        """The current transaction's connection, or a read-only snapshot of its own."""
        pg = self._pg
        try:
            with self._session(False, None) as conn:
                yield conn
        except pg.Error as exc:
            raise self._error(exc, "database error") from exc

    def runs(self) -> list[Run]:
        """Every run from the first row, verifying the chain from the genesis."""
        return [item for item in self.items() if isinstance(item, Run)]

    def verify(self) -> dict[str, Any]:
        """Replay every row from the genesis; check every checkpoint, the head, the config."""
        started = time.perf_counter()
        with self._reading() as conn:
            return _rows.verify(self, conn, conn.execute(
                "SELECT entries, last_count, head, prev, snapshot, mac FROM "
                "privguard.checkpoints WHERE ledger = %s ORDER BY entries, last_count",
                (self.ledger,)),
                self._all_rows(conn), started)

    def reference(self) -> dict[str, Any]:
        """The URL as the user gave it (a password only if the user's URL had one), and the
        ledger's ``ledger_id`` (review pgf: with the URL alone, a copy loaded after the
        ledger was dropped and created again, or against another server at that URL,
        opened the other ledger, silently). And how far this ledger's journal went
        (review pgx, :meth:`check_reference`), as ``SQLiteStore.reference`` pickles it;
        a closed store's is not (reading it would connect again). The caller holds the
        ledger's transaction lock (the read here is a transaction of its own)."""
        ref: dict[str, Any] = {"path": self._url, "ledger_id": self.ledger_id}
        c = self._cursor
        if c is None or self._closed:
            return ref
        ref["seen"] = _extent.seen(c)
        # the last row a run: what stays when it grows (unreadable now: left out, and a
        # grown run is refused at loading, fail closed)
        with contextlib.suppress(LedgerStateError):
            if c.last_count:
                with self._reading() as conn:
                    where = f"{self.path}: journal row {c.entries - 1}"
                    run = _extent.last_run(self, conn, conn.execute(
                        "SELECT mech, label, pid, first FROM privguard.entries WHERE "
                        "ledger = %s AND idx = %s", (self.ledger, c.entries - 1)).fetchone(),
                        where)
                    if run is not None:
                        ref["run"] = run
        return ref

    def check_reference(self, ref: dict[str, Any]) -> None:
        """Fail closed unless this is the pickled ledger (its ``ledger_id``, review pgf)
        and its journal extends the one :meth:`reference` pickled (review pgx): with the
        ``ledger_id`` alone, a database restored from an older backup (the same
        ``ledger_id``, fewer charges) loaded as the pickled ledger, which had spent more:
        the loaded ledger went backwards. The test is ``SQLiteStore.check_reference``'s
        (:func:`_extent.check`); the ledger charged since loads, and old pickles (no
        ``seen``; no ``ledger_id`` either) are checked by what they carry."""
        if "ledger_id" in ref:
            _extent.check_identity(self, "ledger_id", self.ledger_id, ref["ledger_id"],
                                   "it was deleted and created again, or another one has "
                                   "its name")
        journal = _extent.pickled_position(self, ref)
        if journal is None:
            return
        with self._reading() as conn:
            _extent.check(self, conn, conn.execute(
                f"SELECT {_ROW} FROM privguard.entries WHERE ledger = %s AND idx >= %s AND "
                "idx <= %s", (self.ledger, journal[0] - 2, journal[0] - 1)).fetchall(),
                journal, ref.get("run"), "the ledger")
