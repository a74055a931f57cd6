"""Read a closed WAL ledger file without writing beside it (private; the CLI's reports).

A read-only SQLite connection (``mode=ro``) to a WAL-mode file creates the
``-wal`` and ``-shm`` files when they are missing and, being read-only, cannot
run the checkpoint that would remove them at its close: ``privguard report``
left an empty ``budget.db-wal`` and a 32 KiB ``budget.db-shm`` beside a ledger
that had none. SQLite's ``immutable=1`` reads the main file alone and creates
nothing, but trusts that the file cannot change while it is open (no locks,
pages cached across transactions): sound only while no writer can commit.

:func:`snapshot` makes that true for as long as it is held. It takes a shared
``flock`` of the file on its own descriptor: every privguard charge, and every
checkpoint privguard runs, takes the exclusive ``flock`` first, so none can run
while it is held (writers wait). A missing ``-wal``, seen under that lock, means
no connection has the file open with frames not yet in the main file (SQLite
deletes the ``-wal`` only at the last close, after a complete checkpoint), so
the main file holds every committed charge and stays as it is until the
snapshot ends: a read-only store opened inside it reads the main file as
immutable, and refuses to read once the snapshot has ended (it could be stale).
With a ``-wal`` present, a writer has the file open and its ``-wal``/``-shm``
belong to it: the store reads as before (``mode=ro``), and leaves them to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
from collections.abc import Iterator

from privguard._stores import _lockfds

_lock = threading.Lock()
_held: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> snapshots held in this process


@contextlib.contextmanager
def snapshot(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the file at ``path`` still (a shared flock) while the block reads it.

    Anything but an existing regular file (a PostgreSQL URL, a missing path,
    a FIFO) is left to the opener, which refuses it: the block runs unheld.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, TypeError, ValueError):
        yield
        return
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)  # never retained: no store of this process holds a FIFO or folder
        yield
        return
    identity = (st.st_dev, st.st_ino)
    _lockfds.retain(identity)  # closed like a store's flock descriptor (SQLite's locks)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits for a charge being written
        with _lock:
            _held[identity] = _held.get(identity, 0) + 1
        try:
            yield
        finally:
            with _lock:  # (none left in a child forked inside the block: its count was
                left = _held.pop(identity, 0) - 1  # cleared at the fork)
                if left > 0:
                    _held[identity] = left
    finally:
        _lockfds.release(identity, fd)  # unlocks, then closes once no store has it open


def held(identity: tuple[int, int] | None) -> bool:
    """Whether this process holds a snapshot of the file ``identity`` (dev, inode)."""
    with _lock:
        return identity is not None and identity in _held


def held_path(path: str) -> tuple[int, int] | None:
    """The identity of the file at ``path`` if a snapshot of it is held, else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    identity = (st.st_dev, st.st_ino)
    return identity if held(identity) else None


def _after_fork_in_child() -> None:
    """A fresh lock in a forked child (task lo8): a thread of the parent counting a snapshot
    in or out at the fork left the child's copy of the lock held by a thread the child does
    not have, and the child's next snapshot (or read-only store) waited for ever.

    No snapshot held either (review rlo8): the parent's counts were copied, but the
    threads that hold those snapshots are the parent's, and when one ends it unlocks the
    shared flock (the open file description is the parent's too). A child that kept the
    count read the file as immutable, with no lock, for ever after: a stale read once a
    writer commits. A child forked inside a snapshot block holds none either: its
    read-only stores read as outside one (``mode=ro``), and an immutable one opened
    before the fork refuses to read (fail closed)."""
    global _lock
    _lock = threading.Lock()
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
