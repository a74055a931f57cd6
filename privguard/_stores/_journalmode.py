"""Which SQLite journal mode a ledger file uses: WAL, or the rollback journal where WAL
cannot work.

Issue 26, item 3 (the evidence: ``benchmarks/journal_mode.py``,
``benchmarks/commit_crash.py``, ``benchmarks/power_loss.py``; the threat model: README
"On disk"). Both modes commit with ``synchronous=FULL``, so a charge that returned
survives a process crash and a power cut in either; WAL commits with one fsync of
an append-only file instead of two (the journal's and the database's).

WAL needs every process that opens the file to share memory (its ``-shm`` index is
a memory map), so it does not work on a network filesystem: there the rollback
journal (``TRUNCATE``) is kept. The filesystem is read from ``/proc/self/mountinfo``
(Linux); where it cannot be read, or to override the detection, set
``PRIVGUARD_SQLITE_JOURNAL`` to ``wal`` or ``rollback``.
"""

from __future__ import annotations

import os

from privguard._errors import InvalidArgumentError

#: The environment variable that overrides the detection.
JOURNAL_ENV = "PRIVGUARD_SQLITE_JOURNAL"

#: Filesystem types (as ``/proc/self/mountinfo`` names them) whose files may be shared
#: by processes on several machines: WAL's shared-memory index cannot work there.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs",
    "lustre", "gpfs", "beegfs", "ocfs2", "gfs2", "orangefs", "fuse.sshfs",
    "fuse.glusterfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse", "fuse.cephfs",
})

_MODES = {"wal": "WAL", "rollback": "TRUNCATE"}


def _unescape(field: str) -> str:
    """A mountinfo path field: octal escapes (``\\040`` for a space) decoded."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding ``path`` (``ext4``, ``nfs4``...), or None if unknown.

    Example:
        >>> filesystem_type("/", mountinfo="/no/such/file") is None
        True
    """
    try:
        directory = os.path.dirname(os.path.realpath(path)) or os.sep
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return None
    best, kind = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        inside = directory == point or directory.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the innermost mount; the last one stacked
            best, kind = point, tail[0]
    return kind


def journal_mode(path: str) -> str:
    """The ``PRAGMA journal_mode`` for a ledger file at ``path``: ``WAL`` or ``TRUNCATE``.

    Raises:
        InvalidArgumentError: ``PRIVGUARD_SQLITE_JOURNAL`` is set to another value.

    Example:
        >>> journal_mode("/tmp/budget.db") in ("WAL", "TRUNCATE")
        True
    """
    chosen = os.environ.get(JOURNAL_ENV)
    if chosen:
        mode = _MODES.get(chosen.strip().lower())
        if mode is None:
            raise InvalidArgumentError(JOURNAL_ENV, chosen, "must be 'wal' or 'rollback'")
        return mode
    return "TRUNCATE" if filesystem_type(path) in NETWORK_FILESYSTEMS else "WAL"
