"""Closing the SQLite store's flock descriptors without dropping SQLite's own locks.

POSIX record locks belong to a process and an inode: closing ANY descriptor of a file
releases every ``fcntl`` lock the process holds on it, including those SQLite's
other connections to the same file in this process hold (SQLite itself defers such
closes; see its ``unixInodeInfo``). In WAL mode every connection holds a shared lock
on the database file while it is open, and a connection that closes and finds no
other lock there takes itself for the last one: it checkpoints and DELETES the
``-wal`` and ``-shm``. A ledger still open in this process whose lock was dropped
would then commit into an unlinked ``-wal`` that no other process reads: its
charges lost (issue 26; ``tests/test_sqlite_journal.py``).

So the store's flock descriptor (its own open file description, so that two ledgers
in one process still exclude each other) is closed only once no store in this
process has that file open; until then it is kept, unlocked, in a list, and the
next store of this process that opens the file reuses it (so a loop that opens and
closes a ledger beside one that stays open holds one spare descriptor, not one per
iteration).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

_lock = threading.Lock()
_open: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> stores holding it open
_deferred: dict[tuple[int, int], list[int]] = {}  # descriptors waiting for the last close


def retain(identity: tuple[int, int]) -> None:
    """Count one more store of this process holding the file ``identity`` open."""
    with _lock:
        _open[identity] = _open.get(identity, 0) + 1


def reuse(path: str) -> int | None:
    """A kept descriptor of the file at ``path`` for a store that opens it, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    with _lock:
        fds = _deferred.get((st.st_dev, st.st_ino))
        return fds.pop() if fds else None


def release(identity: tuple[int, int] | None, fd: int) -> None:
    """Close ``fd`` (the file's flock descriptor, unlocked) once no store of this
    process holds the file open; until then keep it open. ``identity`` None: the
    descriptor was never :func:`retain`-ed (closed at once).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     st = os.fstat(f.fileno())
        ...     a, b = os.open(f.name, os.O_RDONLY), os.open(f.name, os.O_RDONLY)
        ...     retain((st.st_dev, st.st_ino)); retain((st.st_dev, st.st_ino))
        ...     release((st.st_dev, st.st_ino), a)  # kept: the other store is open
        ...     os.fstat(a).st_ino == st.st_ino
        ...     release((st.st_dev, st.st_ino), b)  # the last one: both closed
        True
    """
    if identity is None:
        os.close(fd)
        return
    with contextlib.suppress(OSError):  # a kept descriptor never holds the flock
        fcntl.flock(fd, fcntl.LOCK_UN)
    with _lock:
        left = _open.get(identity, 0) - 1
        if left > 0:
            _open[identity] = left
            _deferred.setdefault(identity, []).append(fd)
            return
        _open.pop(identity, None)
        fds = [*_deferred.pop(identity, []), fd]
    for each in fds:
        os.close(each)


def forked() -> list[int]:
    """In a forked child: forget the parent's stores and hand back its kept descriptors,
    which the child must neither unlock (their flock is the parent's too) nor close
    (review sq; ``SQLiteStore.forked``). The lock is made anew: another thread of the
    parent may have held it at the fork."""
    global _lock
    _lock = threading.Lock()
    kept = [fd for fds in _deferred.values() for fd in fds]
    _open.clear()
    _deferred.clear()
    return kept

