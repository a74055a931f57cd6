"""A durable, multi-process, tamper-evident journal in one SQLite file.

Layout (schema version 2):

* ``meta(key, value)``: ``schema_version``, ``file_id`` (random, chosen at
  creation), ``created``, ``keyed`` and ``key_check`` (see
  :mod:`privguard._stores._integrity`), ``genesis_config`` (the configuration at
  creation), ``genesis`` (its digest), ``config`` (the configuration in
  force, which the journal's retarget events must reproduce).
* ``mechanisms(id, body, digest)``: each distinct mechanism once, as JSON.
* ``entries(idx, kind, mech, label, pid, count, first, last, body, digest)``:
  the journal. ``kind`` is ``run`` (``count`` identical consecutive charges
  of mechanism ``mech``, first and last time), ``fix`` (what was fixed from
  the plan before the first charge) or ``event`` (an explicit, logged action
  such as a retarget). Only the last row ever changes: charging the current
  run's mechanism again raises its count (through the ledger that wrote the run
  alone: ``Journal.own_runs_only``). Each row's digest chains it to the
  previous row, from a genesis digest over the file's identity and
  configuration.
* ``head(id=1, ...)``: the number of rows, the last row's count, the chain
  head and the digest before it, with a MAC; rewritten by every charge.
  Deleting the newest rows therefore breaks the head, and a ledger that
  already saw them notices a shorter or changed journal at its next sync.
* ``checkpoints``: at the end of the transaction that reaches each multiple of
  ``CHECKPOINT_EVERY`` rows, the accounting state
  (spent curve, current run, filter state), MAC'd and tied to the chain, so
  that opening replays only the rows after the newest checkpoint.
  ``privguard verify FILE`` replays everything from the genesis instead.

Every charge is one transaction under an exclusive ``flock`` of the file
(taken before ``BEGIN IMMEDIATE``, so concurrent processes queue in the
kernel instead of in SQLite's sleep-and-retry backoff): it checks that the
file is still the file it opened (inode and ``file_id``), replays the rows
other processes appended (verifying the chain and that no row it had already
seen changed), decides, writes and commits with ``synchronous=FULL`` before
the ledger returns. The journal mode is WAL (one fsync'd append per commit), or
the rollback journal on a network filesystem, where WAL cannot work (see
:mod:`privguard._stores._journalmode`); in WAL a committed charge may live in
``budget.db-wal`` until a checkpoint, and closing a ledger checkpoints it into the
main file (README, "On disk", has the threat model).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import stat
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

from privguard._accounting import _config
from privguard._accounting._accounting import Accounting, Change
from privguard._accounting._config import Config, retarget_remedy
from privguard._accounting._journal import Run
from privguard._errors import InvalidArgumentError, LedgerStateError
from privguard._mechanisms._base import Mechanism
from privguard._stores import _extent, _handles, _lockfds, _rows, _snapshot
from privguard._stores._integrity import Integrity, canonical
from privguard._stores._journalmode import journal_mode
from privguard._stores._paths import explain, require_regular_file
from privguard._stores._rows import Cursor as _Cursor
from privguard._stores._rows import checked_items

SCHEMA_VERSION = 2
#: What SQLite raises on a damaged file: its errors, and (review sq) a UnicodeDecodeError
#: where an error message quotes the file's bytes that are no UTF-8 (a damaged schema).
_DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)
#: A forked child's copies of its parent's connections and flock descriptors, kept open
#: and never used (:meth:`SQLiteStore.forked`).
INHERITED: list[Any] = []
#: The files (st_dev, st_ino) one of whose inherited connections was kept because it was
#: inside a transaction at the fork: SQLite's state for them in this process is the
#: parent's, and no connection here may be opened to them (review rsq).
UNTRUSTED: set[tuple[int, int]] = set()
CHECKPOINT_EVERY = 512
_GENESIS = "privguard-journal-v2"

_SCHEMA = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE mechanisms (id INTEGER PRIMARY KEY, body TEXT NOT NULL UNIQUE, "
    "digest TEXT NOT NULL)",
    "CREATE TABLE entries (idx INTEGER PRIMARY KEY, kind TEXT NOT NULL, mech INTEGER, "
    "label TEXT, pid INTEGER, count INTEGER, first REAL, last REAL, body TEXT, "
    "digest TEXT NOT NULL)",
    "CREATE TABLE checkpoints (entries INTEGER PRIMARY KEY, last_count INTEGER NOT NULL, "
    "head TEXT NOT NULL, prev TEXT NOT NULL, snapshot TEXT NOT NULL, mac TEXT NOT NULL)",
    "CREATE TABLE head (id INTEGER PRIMARY KEY CHECK (id = 1), entries INTEGER NOT NULL, "
    "last_count INTEGER NOT NULL, digest TEXT NOT NULL, prev TEXT NOT NULL, "
    "mac TEXT NOT NULL)",
]

#: ``sqlite_master`` as :data:`_SCHEMA` leaves it: (type, name, table, sql), the two
#: indexes SQLite makes for the PRIMARY KEY and UNIQUE text columns included.
_MASTER = sorted([("table", s.split()[2], s.split()[2], s) for s in _SCHEMA]
                 + [("index", f"sqlite_autoindex_{t}_1", t, None) for t in ("meta", "mechanisms")],
                 key=repr)


def _is_wal(path: str) -> bool:
    """Whether the SQLite file at ``path`` is in WAL mode (header bytes 18-19 are 2)."""
    with open(path, "rb") as f:
        return f.read(20)[18:20] == b"\x02\x02"


def _dumps(value: Any) -> str:
    return canonical(value).decode("utf-8")


_LABELS: dict[str | None, str] = {}


def _atom(x: Any) -> str:
    if x is None or isinstance(x, str):
        text = _LABELS.get(x)
        if text is None:
            text = json.dumps(x, ensure_ascii=False)
            if len(_LABELS) < 4096:
                _LABELS[x] = text
        return text
    if isinstance(x, bool):
        raise TypeError("journal fields have no booleans")
    if isinstance(x, int):
        return str(x)
    return repr(float(x))


#: A journal row as the stores read it (``_rows.replay_row``, ``checked_items``), in order.
_ROW = "idx, kind, mech, label, pid, count, first, last, body, digest"

#: What :meth:`SQLiteStore._sync` reads at every transaction, in one statement: the
#: file_id, the head (its id: NULL when the row is missing), how many rows have an index
#: ``>= ?1`` (what the last-row check's own read ``idx >= ?1`` would return), and the row
#: at index ?1 (this ledger's last seen; NULLs when there is none). The count, not
#: ``max(idx)``: with the schema's primary key the two agree, but an ``entries`` table
#: rebuilt without it (another process, while this ledger is open) can hold two rows at
#: that index, which ``max`` does not show and the join returns one of (review rlc).
#: Last, the schema cookie, which any change to the schema moves (:meth:`_check_schema`).
_SYNC_READ = (
    "SELECT (SELECT value FROM meta WHERE key = 'file_id'), "
    "h.id, h.entries, h.last_count, h.digest, h.prev, h.mac, "
    "(SELECT count(*) FROM entries WHERE idx >= ?1), "
    "e.idx, e.kind, e.mech, e.label, e.pid, e.count, e.first, e.last, e.body, e.digest, "
    "(SELECT schema_version FROM pragma_schema_version) "
    "FROM (SELECT 1) LEFT JOIN head AS h ON h.id = 1 LEFT JOIN entries AS e ON e.idx = ?1")


class _Txn:
    def __init__(self, store: SQLiteStore, conn: sqlite3.Connection) -> None:
        self.store, self.conn = store, conn

    def write(self, acc: Accounting, changes: list[Change]) -> None:
        self.store._write(self.conn, acc, changes)

    def accepts(self, label: str | None) -> None:
        """SQLite keeps every label ``check_label`` lets through (UTF-8 text without NUL
        or lone surrogates, which it refuses up front; task lo7)."""


def _identity_before_connect(path: str) -> tuple[int, int] | None:
    """The (st_dev, st_ino) of the file at ``path`` before SQLite opens it (None: missing).

    Only stat'ed: closing any descriptor of it would drop the POSIX locks SQLite's other
    connections in this process hold on it (``_lockfds``). A file SQLite creates is not
    pre-created here (a failed open would leave an empty file behind, and the refusal of a
    read-only directory would name the journal instead): for a new file only the path and
    the lock descriptor are compared after the connect.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _absolute(path: str) -> str:
    """``path`` made absolute against the working directory now, once (task lo5: a relative
    path was resolved at every reconnect and check, so after ``os.chdir`` the ledger
    refused as "gone", and a fork's reconnect opened whatever file of that name lay in the
    new directory). Not normalised: ``a/../b`` stays as the OS resolves it.

    Raises:
        InvalidArgumentError: the path is relative and the working directory is gone.
    """
    if os.path.isabs(path):
        return path
    try:
        return os.path.join(os.getcwd(), path)
    except OSError as exc:
        raise InvalidArgumentError("path", path, "is relative, and the working directory "
                                   f"cannot be read ({exc}); pass an absolute path") from None


class SQLiteStore:
    """The SQLite journal behind ``Ledger(..., path=...)``. Not used directly."""

    PEER = "process"  # who else may write the journal (for messages)

    def __init__(self, path: str, *, read_only: bool = False, timeout: float = 60.0) -> None:
        self.path = _absolute(path)
        self.read_only = read_only
        self.timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self.integrity = Integrity.from_environment()
        self.file_id: str | None = None
        self.genesis: str | None = None
        self._cursor: _Cursor | None = None
        self._mechs: dict[int, tuple[Mechanism, str]] = {}
        self._mech_ids: dict[str, int] = {}
        self._body_of: dict[Mechanism, str] = {}
        self._depth = 0  # transactions are reentrant within one ledger
        self.live = False  # True once the owning ledger is open: retargets then fail it closed

    # -- connection and locking ------------------------------------------------------
    #: The process that opened ``_conn`` and ``_lock_fd`` (a forked child did not).
    _pid: int | None = None
    #: Let go of a parent's connection (:meth:`forked`), not closed: the next
    #: transaction opens this process's own.
    _forked = False

    def forked(self, *, idle: bool) -> None:
        """In a forked child, let go of the parent's connection and flock descriptor
        (review sq); the next transaction opens this process's own, on the same file (its
        identity is checked). The at-fork hook calls it (:mod:`privguard._ledger._fork`),
        and :meth:`_connect` does in a child the hook missed.

        SQLite: a connection must not be used across a fork. The child holds none of the
        POSIX locks its copy of SQLite's per-file state says it holds, and every
        connection this process opens to the file later trusts that state and takes no
        lock either. The parent's close then took itself for the file's last connection,
        checkpointed and deleted the ``-wal`` while a child was inside a transaction,
        and the child's commit went to the deleted log: its charge returned, on no disk
        (the child's own ``Ledger(path)`` too). ``idle``: no transaction was in flight at
        the fork (the hook took the ledger's locks), so the copy is closed, which lets
        SQLite's per-file state go (its WAL close checkpoints only under an exclusive lock
        of the file, which the parent's open connection's lock denies); otherwise it is
        kept open and never used (closing it could undo another thread's transaction in
        the shared index), and the file is :data:`UNTRUSTED` here. The flock descriptor
        shares its lock with the parent's (one open file description): it is kept, never
        unlocked or used, and the at-fork hook points it at /dev/null (review pgf: a killed
        parent's flock stayed held by a live child's copy)."""
        conn, fd = self._conn, self._lock_fd
        self._conn, self._lock_fd, self._pid = None, None, None
        # open, on no connection yet (review ir3: :meth:`reference`); a closed store's
        # (no connection, none let go of) stays closed
        self._forked = self._forked or conn is not None
        self._shm, self._stale = None, False  # the next connection's index, seen anew
        if conn is not None:
            if idle:
                with contextlib.suppress(*_DB_ERRORS):
                    conn.close()
            else:
                INHERITED.append(conn)
                if self._identity is not None:
                    UNTRUSTED.add(self._identity)
        if fd is not None:
            INHERITED.append(fd)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            if self._pid == os.getpid():
                return self._conn
            self.forked(idle=False)  # a fork the at-fork hook did not see
        require_regular_file(self.path)  # a FIFO would block the open below forever
        mode = None if self.read_only else journal_mode(self.path)
        conn, opened = None, None
        try:
            # review rq: the file SQLite opens (an existing one: its identity before the
            # connect) must be the one the lock descriptor below watches, and still the path's
            before = _identity_before_connect(self.path)
            if before in UNTRUSTED:
                # review rsq: the kept copy leaves SQLite's per-file state (the locks it
                # believes this process holds) as the parent's: a new connection took no
                # lock, the parent's close deleted the -wal under its transaction, and a
                # charge returned on no disk. Refused, as the kept copy's ledger is.
                raise LedgerStateError(
                    f"{self.path}: this process was forked while another thread of its "
                    "parent was inside a transaction on this file, so SQLite's locks on it "
                    "cannot be trusted here (a charge could return unwritten); open the "
                    "ledger in a process forked between transactions")
            if self.read_only:
                conn = self._connect_read_only()
            else:
                conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                       check_same_thread=False)
                # WAL, or the rollback journal on a network filesystem (_journalmode);
                # FULL: every commit is fsync'd before the charge returns, in either mode.
                got = conn.execute(f"PRAGMA journal_mode = {mode}").fetchone()[0]
                self._wal = str(got).lower() == "wal"
                conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            opened, self._identity = self._identity, None  # not None: a forked child's
            self._lock_fd = _lockfds.reuse(self.path)
            if self._lock_fd is None:
                self._lock_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            st = os.fstat(self._lock_fd)
            self._identity = (st.st_dev, st.st_ino)
            _lockfds.retain(self._identity)  # closed only with this process's last store
            if opened is not None and opened != self._identity:  # a forked child's reopen
                raise LedgerStateError(f"{self.path} was replaced by another file while "
                                       "this ledger was open; reopen it to use the new file")
            if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO meanwhile: still refused
                require_regular_file(self.path)
                raise LedgerStateError(f"{self.path}: not a regular file")
            after = os.stat(self.path)
            if before not in (None, self._identity) or self._identity != (after.st_dev,
                                                                          after.st_ino):
                raise LedgerStateError(f"{self.path} was replaced by another file while it "
                                       "was being opened; nothing was read or charged")
        except (*_DB_ERRORS, OSError, LedgerStateError) as exc:
            if conn is not None:
                conn.close()
            if self._lock_fd is not None:
                _lockfds.release(self._identity, self._lock_fd)
                self._lock_fd = self._identity = None
            if isinstance(exc, LedgerStateError):
                raise
            cause = explain(self.path, write=not self.read_only)
            if cause is not None:
                raise LedgerStateError(f"{self.path}: cannot open the ledger file: {cause} "
                                       f"({exc})") from exc
            raise LedgerStateError(f"{self.path}: not a readable ledger database ({exc})") from exc
        self._conn, self._pid, self._forked = conn, os.getpid(), False
        # A new connection loads the schema from the file, not from the cache the cookie
        # was compared against: checked at its first transaction (review rsq: a trigger
        # added with the cookie put back by hand, PRAGMA schema_version, is in the schema
        # a forked child's new connection loads, and the parent's cookie skipped the check)
        self._schema_cookie = None
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """A read-only connection. A WAL file needs its ``-shm`` index, which a reader
        cannot create in a directory it may not write (SQLite: "attempt to write a
        readonly database"). If no ``-wal`` exists then, no writer has the file open (the
        last close removes it) and the main file holds every charge: it is read as
        immutable. With a ``-wal`` present the error stands (its charges cannot be read).
        """
        # every byte but '/' and the unreserved ones percent-encoded (review sq): a '#' left
        # as is ended the path there, and dropped "?mode=ro" with it ("a#b.db" opened, and
        # created, "a" read-write), a '%' was decoded ("c%41.db" named "cA.db"). The path
        # as the OS resolves it (absolute since task lo5), not os.path.abspath's: that drops
        # "link/.." lexically, and SQLite read another file than the one the identity
        # checks watch (review rlo5)
        uri = ("file:" + urllib.parse.quote(os.fsencode(self.path), safe="/")
               + "?mode=ro")
        held = _snapshot.held_path(self.path)
        if held is not None and not os.path.exists(self.path + "-wal") and _is_wal(self.path):
            # held still by a snapshot, every charge in the main file (_snapshot.py): read it
            # as immutable, which creates no -wal/-shm beside it
            self._snapshot = held
            return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=self.timeout,
                                   isolation_level=None, check_same_thread=False)
        conn = sqlite3.connect(uri, uri=True, timeout=self.timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "readonly" not in str(exc) or os.path.exists(self.path + "-wal"):
                raise
        if not _is_wal(self.path):
            raise LedgerStateError(f"{self.path}: cannot be read without writing beside it")
        return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=self.timeout,
                               isolation_level=None, check_same_thread=False)

    def close(self, *, warn: bool = True) -> None:
        """Checkpoint (:meth:`_checkpoint_wal`) and close. ``warn``: say so (RuntimeWarning)
        when a reader held committed charges back in the ``-wal``; not for an open that
        failed (review rlo: its close warned of a ledger never opened, and a warnings filter
        "error" raised that RuntimeWarning instead of the open's LedgerStateError)."""
        held_back = False
        if self._conn is not None and self._pid != os.getpid():
            self.forked(idle=False)  # a forked child's copy: nothing to fold in, or close
        self._forked = False  # closed: reference() reads nothing (it would reopen the file)
        if self._conn is not None:
            if self._wal and self._lock_fd is not None and not self._depth and not self._stale:
                held_back = self._checkpoint_wal()  # never through a stale -shm index
            self._conn.close()
            self._conn = None
            self._shm, self._stale = None, False  # a new connection opens the index anew
        if self._lock_fd is not None:
            # not os.close: that would drop this process's other connections' SQLite locks
            _lockfds.release(self._identity, self._lock_fd)
            self._lock_fd = None
        if held_back and warn:  # once closed: a warnings filter "error" raises after it
            # Another connection held a read transaction past the busy timeout: SQLite
            # copies what it can and leaves the rest in the -wal, where the charges are
            # safe (that reader's, or the last, close folds them in), but budget.db alone
            # is then no copy of the ledger (task lo; README "On disk").
            warnings.warn(f"{self.path}: closed, but another connection was reading it, so "
                          "committed charges stay in its -wal: copy budget.db only after "
                          "every process closed it, or all three files at once",
                          RuntimeWarning, stacklevel=3)

    def _checkpoint_wal(self) -> bool:
        """Fold the ``-wal`` into the main file and empty it, unless a process is inside a
        transaction (it checkpoints at its own close; SQLite's last close does too).
        True: a reader's transaction held the checkpoint back past the busy timeout, with
        committed frames not yet copied into the main file.

        After a normal close, then, the main file alone holds every charge: a copy of
        ``budget.db`` without its ``-wal`` taken while the ledger is open can miss
        committed charges (README, "On disk"), one taken after every close cannot.
        """
        assert self._conn is not None and self._lock_fd is not None
        behind = False
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a charge is being written: its process closes later
        try:
            try:
                # review sa: the index may have been deleted or replaced since this store's
                # last transaction (_check_shm ran there only); a TRUNCATE through the old one
                # empties the -wal another open process committed its charges to
                self._check_shm()
            except LedgerStateError:
                return False  # the charges stay in the -wal (its next opener folds them in)
            with contextlib.suppress(*_DB_ERRORS):  # the charges stay in the -wal then
                busy, frames, copied = self._conn.execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                # Busy with every frame copied (a reader whose snapshot holds every charge):
                # the -wal is not emptied, but budget.db alone holds every charge (review
                # rlo: that case warned that charges stayed in the -wal)
                behind = bool(busy) and copied < frames
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        return behind

    def _check_identity(self) -> os.stat_result:
        """Fail closed if the path now names another file than the one opened; the path's
        stat otherwise."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise LedgerStateError(f"{self.path}: the ledger file is gone ({exc}); "
                                   "its charges can no longer be verified") from exc
        if (st.st_dev, st.st_ino) != self._identity:
            raise LedgerStateError(f"{self.path} was replaced by another file while this "
                                   "ledger was open; reopen it to use the new file")
        return st

    #: The ``-shm`` index's (st_dev, st_ino) as this connection first saw it (WAL mode).
    _shm: tuple[int, int] | None = None
    _stale = False  # that index was found deleted or replaced: never checkpoint through it

    def _check_shm(self) -> None:
        """Fail closed if the ``-shm`` index beside a WAL file is not the one this
        connection uses (review rl). Deleted while the ledger is open, the next process to
        open the file builds a new index from the ``-wal`` and commits through it, while
        this connection, on the old unlinked one, would append its frames over those
        commits and erase charges that process returned. One ``stat`` a transaction."""
        try:
            st = os.stat(self.path + "-shm")
        except OSError as exc:
            if self._shm is None:
                return  # never seen (no index to lose): nothing to compare
            self._stale = True
            raise LedgerStateError(f"{self.path}-shm, the write-ahead log's index, was deleted "
                                   f"while this ledger was open ({exc}); reopen the ledger "
                                   "(README, 'On disk')") from exc
        if self._shm is None:
            self._shm = (st.st_dev, st.st_ino)
        elif (st.st_dev, st.st_ino) != self._shm:
            self._stale = True
            raise LedgerStateError(f"{self.path}-shm, the write-ahead log's index, was deleted "
                                   "or replaced while this ledger was open; its commits and "
                                   "another process's could overwrite each other: reopen the "
                                   "ledger (README, 'On disk')")

    #: The database header's file change counter (bytes 24..27) as of this store's last
    #: transaction: SQLite's rollback-journal modes bump it at every commit.
    _seen: bytes | None = None

    def _change_counter(self) -> bytes | None:
        try:
            return None if self._lock_fd is None else os.pread(self._lock_fd, 4, 24)
        except OSError:
            return None

    #: The main file's (size, mtime, ctime) in ns as of this store's last transaction.
    _seen_stat: tuple[int, int, int] | None = None

    def _stat_key(self) -> tuple[int, int, int] | None:
        try:
            st = None if self._lock_fd is None else os.fstat(self._lock_fd)
        except OSError:
            return None
        return None if st is None else (st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def check_lease(self) -> bool:
        """The check before a step is handed out from a lease (no transaction): the file
        opened still has a name (one ``os.fstat`` of the open descriptor: LedgerStateError
        once its link count is 0, i.e. deleted, or replaced by a rename over the path),
        and whether it is unchanged since this store's last transaction. False: another
        writer, a checkpoint or an in-place rollback changed it; the caller syncs (which
        verifies the journal).

        "Unchanged": the size, mtime and ctime of that same ``fstat`` (free: any write to
        the main file, ``cp backup.db budget.db`` included, sets its ctime, which
        ``touch`` or ``utime`` cannot set back; a write within the same
        filesystem-timestamp tick as the last change before this store's last
        transaction keeps them), and, in rollback-journal mode,
        the header's change counter (one ``pread``), which every commit bumps there. In
        WAL mode commits do not move that counter (they append to the ``-wal``) and the
        main file changes at checkpoints, which move the stat's times: the ``pread``
        (about 1 µs in a loop, about 20 µs inside a training step, with cold caches) is
        left out there (docs/performance.md, "Where a leased step's time goes").

        Why ``fstat`` of the descriptor and not ``stat`` of the path (docs/theory.md §13,
        "The leased step's check"): for the file opened both give the same size and
        times; they differ only once the path no longer names it. With no other name
        left (deleted, or renamed over) its link count is 0 and the step is refused here.
        With another name kept (a hard link, ``mv budget.db elsewhere.db``) the file
        still holds every charge this ledger journaled, its whole lease included, so the
        steps handed out are all spent there; the next transaction's ``os.stat`` of the
        path (:meth:`_check_identity`, at every lease commit) refuses then. A path lookup
        is left out of every leased step."""
        fd = self._lock_fd
        if fd is None:  # not open (a ledger never asks then): the path's stat, as before
            st = self._check_identity()
        else:
            try:
                st = os.fstat(fd)
            except OSError as exc:
                raise LedgerStateError(f"{self.path}: the ledger file cannot be checked "
                                       f"({exc}); its charges can no longer be "
                                       "verified") from exc
            if st.st_nlink == 0:
                raise LedgerStateError(f"{self.path}: the ledger file was deleted or replaced "
                                       "while this ledger was open; its charges can no "
                                       "longer be verified: reopen the ledger")
        if self._seen is None or (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != self._seen_stat:
            return False
        return self._wal or self._change_counter() == self._seen

    @contextlib.contextmanager
    def _locked(self, write: bool) -> Iterator[sqlite3.Connection]:
        """flock, then BEGIN; COMMIT (or ROLLBACK) and unlock at exit. Reentrant."""
        conn = self._connect()
        if self._snapshot is not None and not _snapshot.held(self._snapshot):
            raise LedgerStateError(f"{self.path}: was read as a snapshot that has ended (the "
                                   "file may have changed since); open the ledger again")
        if self._depth:
            if write and not self._writing:
                raise LedgerStateError(f"{self.path}: a write inside a read transaction")
            yield conn
            return
        assert self._lock_fd is not None
        if write and self.read_only:
            raise LedgerStateError(f"{self.path} was opened read-only")
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
        self._depth, self._writing = 1, write
        try:
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except _DB_ERRORS as exc:
                raise LedgerStateError(f"{self.path}: cannot start a transaction ({exc})") from exc
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(*_DB_ERRORS):
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except _DB_ERRORS as exc:
                raise LedgerStateError(f"{self.path}: commit failed ({exc})") from exc
            except BaseException:  # an interrupt at the COMMIT: never leave it open
                with contextlib.suppress(*_DB_ERRORS):
                    conn.execute("ROLLBACK")
                raise
            self._seen = self._change_counter()  # still under the flock: ours
            self._seen_stat = self._stat_key()
        finally:
            self._depth, self._writing = 0, False
            if self._lock_fd is not None:  # None: a child forked inside this transaction,
                # whose copy the at-fork hook let go of (review rsq: fcntl.flock(None)
                # raised TypeError over the transaction's LedgerStateError)
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    _writing = False
    _wal = False
    _refresh_tried = False  # this open tried a fresh checkpoint (_refresh_checkpoint)
    _snapshot: tuple[int, int] | None = None  # read as immutable while this snapshot is held

    # -- digests -------------------------------------------------------------------------
    def _genesis_digest(self, config: dict[str, Any]) -> str:
        return self.integrity.digest("genesis", _GENESIS, self.file_id, config,
                                     self.integrity.keyed)

    def _entry_digest(self, prev: str, idx: int, kind: str, fields: list[Any]) -> str:
        # A compact canonical text (the rows' hot path): fields separated by U+001E, each
        # str/None as JSON, each int as decimal, each float as its exact repr.
        if kind == "run":  # [mech digest, label, pid, count, first, last]
            return self._run_digest(prev, idx, *fields)
        return self.integrity.digest_text(
            "\x1e".join(["entry", prev, str(idx), kind, *map(_atom, fields)]))

    #: The last run digest computed, with its inputs (a commit's row, read back and checked
    #: by the next transaction: _rows.check_last_row).
    _run_memo: tuple[tuple[Any, ...], str] | None = None

    def _run_digest(self, prev: str, idx: int, md: str, label: str | None, pid: int,
                    count: int, first: float, last: float) -> str:
        """:meth:`_entry_digest` of a run row (the replay's hot path calls it directly).

        Its last input and output are remembered: the next transaction checks the row a
        commit wrote (``check_last_row``) and asks for the same digest. A pure function of
        its inputs; the memo answers only for exact types (ints, nonzero floats, a str or
        None label), for which equal inputs write the same text (0.0 == -0.0, whose reprs
        differ; a NaN equals nothing)."""
        key = (prev, idx, md, label, pid, count, first, last)
        exact = (type(pid) is int and type(count) is int and type(idx) is int
                 and type(first) is float and type(last) is float
                 and first != 0.0 and last != 0.0 and type(prev) is str and type(md) is str
                 and (label is None or type(label) is str))
        memo = self._run_memo
        if exact and memo is not None and memo[0] == key:
            return memo[1]
        digest = self.integrity.digest_text(
            f"entry\x1e{prev}\x1e{idx}\x1erun\x1e{md}\x1e{_atom(label)}\x1e{pid:d}"
            f"\x1e{count:d}\x1e{float(first)!r}\x1e{float(last)!r}")
        if exact:
            self._run_memo = (key, digest)
        return digest

    def _run_fields(self, run: Run, mech_digest: str) -> list[Any]:
        return [mech_digest, run.label, run.pid, run.count, run.first_time, run.last_time]

    #: The last head MAC computed, with what it was computed over (file_id, cursor tuple).
    _mac_memo: tuple[tuple[Any, ...], str] | None = None

    def _head_mac(self, c: _Cursor) -> str:
        # A pure function of (file_id, entries, last_count, digest, prev), remembered for
        # its last input: a commit computes the MAC of the head it writes, and the next
        # transaction's check of the head it reads back (_rows.checked_head, which has
        # checked the types: ints and strs) asks for the same one. Same MAC, one HMAC less.
        # Exact ints only (True == 1, but JSON writes them apart).
        key = (self.file_id, *c.as_tuple())
        memo = self._mac_memo
        if memo is not None and memo[0] == key and type(c.entries) is int \
                and type(c.last_count) is int:
            return memo[1]
        mac = self.integrity.digest("head", *key)
        if type(c.entries) is int and type(c.last_count) is int:
            self._mac_memo = (key, mac)
        return mac

    def _checkpoint_mac(self, c: _Cursor, snapshot: str) -> str:
        return self.integrity.digest("checkpoint", self.file_id, *c.as_tuple(), snapshot)

    # -- meta ------------------------------------------------------------------------------
    @staticmethod
    def _get(conn: sqlite3.Connection, key: str, path: str) -> str:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise LedgerStateError(f"{path}: ledger metadata {key!r} is missing")
        return str(row[0])

    def _read_meta(self, conn: sqlite3.Connection) -> tuple[Config, Config]:
        """Check schema, identity, key and genesis; return (genesis config, current config)."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if {"meta", "journal", "totals"} <= tables:
            version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if version is not None and version[0] == "1":
                raise LedgerStateError(
                    f"{self.path} was written by privguard 0.1 (schema 1). Upgrade it "
                    "explicitly, as a logged step that verifies it first; a 0.1 file does "
                    "not protect its target, so restate the one you set: privguard upgrade "
                    f"{self.path} --epsilon E --delta D (--delta D alone for a ledger "
                    "without an ε target; run it without options to see the target the "
                    "file claims)")
        if not {"meta", "mechanisms", "entries", "checkpoints", "head"} <= tables:
            raise LedgerStateError(f"{self.path}: not a privguard ledger (tables {sorted(tables)})")
        version = self._get(conn, "schema_version", self.path)
        if version != str(SCHEMA_VERSION):
            raise LedgerStateError(
                f"{self.path}: schema version {version} is not supported by this privguard "
                f"(it reads {SCHEMA_VERSION}); refusing to open")
        self._check_schema(conn)
        self.file_id = self._get(conn, "file_id", self.path)
        keyed = self._get(conn, "keyed", self.path)
        if keyed not in ("0", "1"):  # "yes" was read as unkeyed (task bs): ambiguous, refused
            raise LedgerStateError(f"{self.path}: ledger metadata 'keyed' is {keyed!r}, "
                                   "neither '0' nor '1' (edited)")
        check = conn.execute("SELECT value FROM meta WHERE key='key_check'").fetchone()
        self.integrity.require_matches(keyed == "1", None if check is None else check[0],
                                       self.path)
        where = f"{self.path}: ledger metadata"
        genesis_dict = _rows.loads(self._get(conn, "genesis_config", self.path), where)
        current_dict = _rows.loads(self._get(conn, "config", self.path), where)
        genesis = self._genesis_digest(genesis_dict)
        if genesis != self._get(conn, "genesis", self.path):
            raise LedgerStateError(f"{self.path}: the configuration it was created with was "
                                   "edited (its genesis digest does not match)")
        self.genesis = genesis
        return _config.from_dict(genesis_dict), _config.from_dict(current_dict)

    #: The schema cookie (``PRAGMA schema_version``) when :meth:`_check_schema` last passed.
    _schema_cookie: int | None = None

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """Fail closed unless the schema is exactly the one :data:`_SCHEMA` creates (review
        sq). A trigger (``BEFORE UPDATE ON head BEGIN SELECT RAISE(IGNORE); END``) makes
        SQLite skip this store's writes without an error: a charge returned whose rows were
        never written, which a fresh opener cannot see; a table declared otherwise
        (``ON CONFLICT IGNORE``, another column type) changes what the writes do alike.
        Checked at opening, and again by any transaction that finds the schema cookie
        moved (a ``VACUUM`` moves it too; ``ANALYZE``'s ``sqlite_stat`` tables are
        allowed: they change no row)."""
        master = sorted((tuple(r) for r in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE NOT (type = 'table' AND name LIKE 'sqlite\\_stat%' ESCAPE '\\')")),
                        key=repr)  # any values (a forged schema row): never a TypeError
        if master != _MASTER:
            extra = sorted(f"{r[0]} {r[1]}" for r in set(master) - set(_MASTER))
            raise LedgerStateError(
                f"{self.path}: its schema is not the one privguard writes (edited: "
                f"{', '.join(extra) or 'tables missing'}); a trigger or a changed table can "
                "silently drop or alter charges, so nothing is read or charged")
        self._schema_cookie = conn.execute("PRAGMA schema_version").fetchone()[0]

    # -- opening -----------------------------------------------------------------------------
    def open(self, config: Config | None, acc: Accounting | None,
             retarget: str | None) -> Accounting:
        self._refresh_tried = False
        try:
            return self._open(config, acc, retarget)
        except BaseException as exc:
            # A failed open leaves nothing behind: no connection, no flock fd (issue 26).
            self.close(warn=False)
            if not (self._refresh_tried and isinstance(exc, LedgerStateError)
                    and isinstance(exc.__cause__, sqlite3.Error)):
                raise
        # review rckw: the fresh checkpoint's write failed where SQLite rolled the whole
        # transaction back (disk full or an I/O error at the INSERT: "no such savepoint"),
        # or at the COMMIT (WAL writes at the commit: a full disk failed the open, which
        # opened before). The open again as before ckw, writing nothing; its own error,
        # if it has one, is the one raised.
        try:
            return self._open(config, acc, retarget, refresh=False)
        except BaseException:
            self.close(warn=False)
            raise

    def _open(self, config: Config | None, acc: Accounting | None,
              retarget: str | None, refresh: bool = True) -> Accounting:
        if config is None and not os.path.exists(self.path):
            raise LedgerStateError(f"{self.path}: no such ledger file")
        if self.read_only and not os.path.exists(self.path):
            raise LedgerStateError(f"{self.path}: no such ledger file")
        with self._locked(write=not self.read_only) as conn:
            try:
                tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if tables == 0:
                    if acc is None or config is None or self.read_only:
                        raise LedgerStateError(f"{self.path}: not a privguard ledger (empty)")
                    self._create(conn, acc)
                    return acc
                quick = conn.execute("PRAGMA quick_check").fetchone()[0]
                if quick != "ok":
                    raise LedgerStateError(f"{self.path}: database integrity check failed: "
                                           f"{quick}")
                genesis_config, current = self._read_meta(conn)
                stored = self._resume(conn, genesis_config, refresh)
                if stored.config != current:
                    raise LedgerStateError(
                        f"{self.path}: the stored configuration was edited (the journal's "
                        "retarget events do not lead to it)")
                if config is not None and config != stored.config:
                    self._retarget(conn, stored, config, retarget)
                return stored
            except _DB_ERRORS as exc:
                raise LedgerStateError(f"{self.path}: unreadable ledger database ({exc})") from exc

    def _create(self, conn: sqlite3.Connection, acc: Accounting) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        self.file_id = uuid.uuid4().hex
        config = acc.config.to_dict()
        self.genesis = self._genesis_digest(config)
        meta = {"schema_version": str(SCHEMA_VERSION), "file_id": self.file_id,
                "created": repr(time.time()), "keyed": "1" if self.integrity.keyed else "0",
                "genesis_config": _dumps(config), "genesis": self.genesis, "config": _dumps(config)}
        self._schema_cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
        check = self.integrity.key_check()
        if check is not None:
            meta["key_check"] = check
        conn.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
        self._cursor = _Cursor(0, 0, self.genesis, self.genesis, None)
        conn.execute("INSERT INTO head VALUES (1, 0, 0, ?, ?, ?)",
                     (self.genesis, self.genesis, self._head_mac(self._cursor)))
        if acc.fixed is not None:  # a declared plan: its choices are the first entry
            self._write(conn, acc, [Change("fix", body=acc.fixed)])

    def _resume(self, conn: sqlite3.Connection, genesis_config: Config,
                refresh: bool = True) -> Accounting:
        """The accounting at the newest checkpoint, then the rows after it replayed; with
        ``refresh``, a fresh checkpoint where that replay passed over the newest one
        (:meth:`_refresh_checkpoint`)."""
        row = conn.execute("SELECT entries, last_count, head, prev, snapshot, mac FROM "
                           "checkpoints ORDER BY entries DESC LIMIT 1").fetchone()
        acc, self._cursor = _rows.resume(self, row, genesis_config, conn, lambda n: conn.execute(
            f"SELECT {_ROW} FROM entries WHERE idx < ? ORDER BY idx", (n,)))
        passed_over = _rows.passed_over(row, self._cursor)
        # _sync checks that the rows the checkpoint ends on still carry its digests.
        self._sync(conn, acc)
        if passed_over and refresh and not self.read_only:
            self._refresh_checkpoint(conn, acc)
        return acc

    def _refresh_checkpoint(self, conn: sqlite3.Connection, acc: Accounting) -> None:
        """A checkpoint of today's curve version at the head, in the open's transaction (the
        writable open's flock and ``BEGIN IMMEDIATE``, as a charge's), after an open that
        replayed past the newest checkpoint (:func:`_rows.passed_over`): the next opener
        resumes from it (docs/theory.md §7, "A fresh checkpoint after such an open"). It
        holds the replay every opener computes. A file this process cannot write (SQLite
        opens a read-only file read-only) opens as before: the write is rolled back; where
        SQLite undid the whole transaction (a full disk, an I/O error) or the COMMIT fails,
        :meth:`open` opens again without it (review rckw)."""
        assert self._cursor is not None
        self._refresh_tried = True  # a failure that undid the open's transaction: open()
        conn.execute("SAVEPOINT refresh")
        try:
            self._checkpoint(conn, acc, self._cursor)
        except sqlite3.OperationalError:  # readonly: nothing written, open as before
            conn.execute("ROLLBACK TO refresh")
        conn.execute("RELEASE refresh")

    def _retarget(self, conn: sqlite3.Connection, acc: Accounting, config: Config,
                  reason: str | None) -> None:
        differs = acc.config.differences(config)
        if reason is None or set(differs) - _config.RETARGETABLE:
            raise LedgerStateError(
                f"{self.path} has another configuration ({acc.config.mismatch(config)}). "
                + retarget_remedy(differs, "Ledger.open(path)"))
        # not while a tuner holds this ledger in this process (review radv2)
        _handles.refuse_if_held(self)
        body = {"event": "retarget", "time": time.time(), "pid": os.getpid(), "reason": reason,
                "old": acc.config.to_dict(), "new": config.to_dict()}
        acc.replay_event(body)
        self._write(conn, acc, [Change("event", body=body)])
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (_dumps(config.to_dict()),))

    # -- transactions ------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, acc: Accounting, write: bool) -> Iterator[_Txn]:
        with self._locked(write) as conn:
            try:
                self._sync(conn, acc)
                yield _Txn(self, conn)
            except _DB_ERRORS as exc:
                raise LedgerStateError(f"{self.path}: database error ({exc})") from exc

    def _read_head(self, conn: sqlite3.Connection) -> _Cursor:
        row = conn.execute("SELECT entries, last_count, digest, prev, mac FROM head "
                           "WHERE id = 1").fetchone()
        if row is None:
            raise LedgerStateError(f"{self.path}: the journal head is missing")
        return _rows.checked_head(self, row)

    def _sync(self, conn: sqlite3.Connection, acc: Accounting) -> None:
        """Replay what other processes appended; fail closed on anything else.

        One statement reads what every transaction checks (review lc: a lease commit ran
        three): the ``file_id``, the head, and the row this ledger saw last with how
        many rows lie from its index on. The checks and their order are those of three separate
        reads (file identity, ``-shm``, head, then :func:`_rows.sync`); the last row is
        handed to ``_rows.sync`` only where it is exactly what its own read
        (``idx >= entries − 1``) returns: one row counted from that index on, and that
        row at the index (whatever the table's schema: review rlc), and read by that
        query otherwise."""
        self._check_identity()
        last = -1 if self._cursor is None else self._cursor.entries - 1
        got = conn.execute(_SYNC_READ, (last,)).fetchone()
        if got[0] != self.file_id:
            raise LedgerStateError(f"{self.path} is no longer the ledger file this ledger "
                                   "opened (its identity changed)")
        if self._wal:
            self._check_shm()
        if got[1] is None:
            raise LedgerStateError(f"{self.path}: the journal head is missing")
        if got[18] != self._schema_cookie:  # a schema change (a trigger added?) meanwhile
            self._check_schema(conn)
        head = _rows.checked_head(self, got[2:7])
        row = got[8:18]
        # One row from index `last` on, and the joined row is at `last`: that row is
        # exactly what `idx >= last` returns (the join's row satisfies it, and no other).
        seen = [row] if last >= 0 and got[7] == 1 and row[0] == last else None

        def rows_from(start: int) -> list[tuple]:
            if seen is not None and start == last:
                return seen
            return conn.execute(f"SELECT {_ROW} FROM entries WHERE idx >= ? ORDER BY idx",
                                (start,)).fetchall()

        _rows.sync(self, conn, acc, head, rows_from)

    def _mechanism(self, conn: sqlite3.Connection, mech_id: Any, where: str
                   ) -> tuple[Mechanism, str]:
        got = self._mechs.get(mech_id)
        if got is not None:
            return got
        row = conn.execute("SELECT body, digest FROM mechanisms WHERE id = ?",
                           (mech_id,)).fetchone()
        return _rows.decode_mechanism(self, mech_id, row, where)

    # -- writing ------------------------------------------------------------------------------
    def _mechanism_id(self, conn: sqlite3.Connection, mechanism: Mechanism) -> tuple[int, str]:
        body = self._body_of.get(mechanism)
        if body is None:
            body = _dumps(mechanism.to_dict())
            self._body_of[mechanism] = body
        mech_id = self._mech_ids.get(body)
        if mech_id is None:
            row = conn.execute("SELECT id FROM mechanisms WHERE body = ?", (body,)).fetchone()
            if row is None:
                digest = self.integrity.digest("mechanism", body)
                cursor = conn.execute("INSERT INTO mechanisms (body, digest) VALUES (?, ?)",
                                      (body, digest))
                assert cursor.lastrowid is not None
                mech_id = cursor.lastrowid
            else:
                mech_id = int(row[0])
            self._mechanism(conn, mech_id, f"{self.path}: mechanism {mech_id}")
        return mech_id, self._mechs[mech_id][1]

    def _write(self, conn: sqlite3.Connection, acc: Accounting, changes: list[Change]) -> None:
        c = self._cursor
        assert c is not None
        entries_before = c.entries
        for change in changes:
            if change.kind == "run" and change.extended:
                assert change.run is not None and c.last_kind == "run"
                mech_id, mech_digest = self._mechanism_id(conn, change.run.mechanism)
                idx = c.entries - 1
                digest = self._entry_digest(c.prev, idx, "run",
                                            self._run_fields(change.run, mech_digest))
                conn.execute("UPDATE entries SET count = ?, last = ?, digest = ? WHERE idx = ?",
                             (change.run.count, change.run.last_time, digest, idx))
                c.digest, c.last_count = digest, change.run.count
                continue
            idx = c.entries
            if change.kind == "run":
                run = change.run
                assert run is not None
                mech_id, mech_digest = self._mechanism_id(conn, run.mechanism)
                digest = self._entry_digest(c.digest, idx, "run",
                                            self._run_fields(run, mech_digest))
                conn.execute("INSERT INTO entries VALUES (?, 'run', ?, ?, ?, ?, ?, ?, NULL, ?)",
                             (idx, mech_id, run.label, run.pid, run.count, run.first_time,
                              run.last_time, digest))
                last_count = run.count
            else:
                body = _dumps(change.body)
                digest = self._entry_digest(c.digest, idx, change.kind, [body])
                conn.execute("INSERT INTO entries (idx, kind, body, digest) VALUES (?, ?, ?, ?)",
                             (idx, change.kind, body, digest))
                last_count = 0
            c.prev, c.digest, c.entries = c.digest, digest, idx + 1
            c.last_count, c.last_kind = last_count, change.kind
        if _rows.checkpoint_due(entries_before, c.entries, CHECKPOINT_EVERY):
            self._checkpoint(conn, acc, c)
        conn.execute("UPDATE head SET entries = ?, last_count = ?, digest = ?, prev = ?, "
                     "mac = ? WHERE id = 1", (*c.as_tuple(), self._head_mac(c)))

    def _checkpoint(self, conn: sqlite3.Connection, acc: Accounting, c: _Cursor) -> None:
        snapshot = _dumps(_rows.checkpoint_body(acc, c.last_kind))
        conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)",
                     (*c.as_tuple(), snapshot, self._checkpoint_mac(c, snapshot)))

    # -- whole-journal views ---------------------------------------------------------------------
    def items(self, acc: Accounting | None = None) -> list[Any]:
        """The whole journal in order (runs, ["fix" | "event", body]), checked from the genesis."""
        with self._locked(write=False) as conn, self._read_errors():
            return checked_items(self, conn, conn.execute(
                f"SELECT {_ROW} FROM entries ORDER BY idx"))

    @contextlib.contextmanager
    def _read_errors(self) -> Iterator[None]:
        """SQLite's errors reading the whole journal as LedgerStateError (review rsq: a row
        with bytes that are no UTF-8, ``Could not decode to UTF-8``, made ``privguard
        verify`` exit 1 with an ``OperationalError``, not 2 naming the file)."""
        try:
            yield
        except _DB_ERRORS as exc:
            raise LedgerStateError(f"{self.path}: unreadable journal ({exc})") from exc

    def runs(self) -> list[Run]:
        """Every run from the first row, verifying the chain from the genesis."""
        return [item for item in self.items() if isinstance(item, Run)]

    def verify(self) -> dict[str, Any]:
        """Replay every row from the genesis; check every checkpoint, the head, the config."""
        started = time.perf_counter()
        with self._locked(write=False) as conn, self._read_errors():
            # the rows streamed, not fetched whole: a long journal is never all in memory
            return _rows.verify(self, conn, conn.execute(
                "SELECT entries, last_count, head, prev, snapshot, mac FROM checkpoints"),
                conn.execute("SELECT idx, kind, mech, label, pid, count, first, last, body, "
                             "digest FROM entries ORDER BY idx"), started)

    def reference(self) -> dict[str, Any]:
        """The file, absolute, and its identity (review sq): a pickled ledger that a
        process with another working directory loaded opened whatever ledger had that
        relative name there, and one loaded after the file was deleted and created again
        opened the new, empty ledger, silently. The loader refuses another ``file_id``.
        And how far this ledger's journal went (review rsq, :meth:`check_reference`)."""
        # self.path, absolute and as the OS resolves it (os.path.abspath's "link/.."
        # dropped lexically named another file: the pickle was refused; review rlo5)
        ref: dict[str, Any] = {"path": self.path, "file_id": self.file_id}
        c = self._cursor
        # review ir3: a forked child's store let go of the parent's connection (forked)
        # and is still open: its extent is pickled too (before, a ledger pickled in a
        # forked child carried its file_id alone, and an older copy of the file loaded)
        if c is not None and (self._conn is not None or self._forked):
            ref["seen"] = _extent.seen(c)
            # the last row a run: what stays when it grows (unreadable now: left out, and
            # a grown run is refused at loading, fail closed). The caller holds the
            # ledger's transaction lock (a read here must not join another thread's).
            with contextlib.suppress(LedgerStateError, *_DB_ERRORS):
                if c.last_count:
                    with self._locked(write=False) as conn:
                        run = _extent.last_run(self, conn, conn.execute(
                            "SELECT mech, label, pid, first FROM entries WHERE idx = ?",
                            (c.entries - 1,)).fetchone(), f"{self.path}: journal row "
                            f"{c.entries - 1}")
                        if run is not None:
                            ref["run"] = run
        return ref

    def check_reference(self, ref: dict[str, Any]) -> None:
        """Fail closed unless this file's journal extends the one :meth:`reference`
        pickled (review rsq): the file's ``file_id`` alone let a restored older copy of
        it (the same ``file_id``, fewer charges) load as the pickled ledger, which had
        spent more: the loaded ledger went backwards. As :func:`_rows.sync` checks an open
        ledger's journal at every transaction: the row before the pickled last one still
        carries the pickled ``prev`` digest, and the pickled last row is as it was, or a
        run that has grown since (its digest chained from that ``prev``). A copy of the
        same journal (a new inode), a hard link, or the file charged since all load; old
        pickles (no ``seen``) are checked by their ``file_id`` alone."""
        _extent.check_identity(self, "file_id", self.file_id, ref.get("file_id"),
                               "the file was replaced, deleted and created again, or "
                               "another one has its name")
        journal = _extent.pickled_position(self, ref)
        if journal is None:
            return
        # SQLite's errors reading the rows (a row no UTF-8, the file locked or damaged
        # since it was opened) as LedgerStateError: no sqlite3.Error escapes pickle.loads
        with self._locked(write=False) as conn, self._read_errors():
            _extent.check(self, conn, conn.execute(
                f"SELECT {_ROW} FROM entries WHERE idx >= ? AND idx <= ?",
                (journal[0] - 2, journal[0] - 1)),
                journal, ref.get("run"), "the file")
