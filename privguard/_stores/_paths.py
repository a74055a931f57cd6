"""Why a ledger file cannot be opened, in words that name the file or directory (issue 24).

Two checks, one before and one after SQLite opens a path:

* :func:`require_regular_file` refuses, before anything opens it, a path
  that exists and is not a regular file (a FIFO, a directory, a device, a
  socket): opening a FIFO for reading blocks until a writer appears, so
  ``privguard report`` on one hung forever.
* :func:`explain` turns SQLite's "unable to open database file" into the
  cause: a missing directory, a directory that is not writable, a read-only
  file or file system, or a literal ``~`` (which neither ``sqlite3`` nor
  ``open()`` expands).
"""

from __future__ import annotations

import os
import stat

from privguard._errors import LedgerStateError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def require_regular_file(path: str) -> None:
    """Refuse ``path`` if it exists and is not a regular file; a missing path passes.

    ``os.stat`` never opens the path, so this returns at once for a FIFO.

    Raises:
        LedgerStateError: naming the path and what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # missing or unreadable: the open that follows says why
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise LedgerStateError(f"{path}: is {kind}, not a ledger file (a ledger is a regular "
                               "SQLite file)")


def _read_only_fs(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, ValueError):
        return False


def explain(path: str, *, write: bool) -> str | None:
    """The cause of a failed open of ``path`` in words, or None if none is found.

    ``write``: the open needed to write (create the file, or its journal next to it).
    """
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    if path.startswith("~") and not os.path.isdir(os.path.dirname(path) or "."):
        return (f"the path starts with '~', which is not expanded (sqlite3 and open() do not "
                f"expand it either); pass os.path.expanduser({path!r})")
    if not os.path.isdir(directory):
        return f"directory {directory} does not exist"
    exists = os.path.exists(absolute)
    if not exists and not write:
        return "no such ledger file"
    if write and _read_only_fs(directory):
        return f"directory {directory} is on a read-only file system"
    if exists and not os.access(absolute, os.R_OK):
        return "the file is not readable (permission denied)"
    if write and exists and not os.access(absolute, os.W_OK):
        return "the file is read-only"
    if write and not os.access(directory, os.W_OK | os.X_OK):
        what = "the ledger file cannot be created there" if not exists else \
            "SQLite cannot write its journal next to the file"
        return f"directory {directory} is not writable, so {what}"
    return None
