"""Where a ledger's journal lives: one small protocol, several stores.

A store persists the journal changes an :class:`~privguard._accounting._accounting.Accounting`
produces and brings an accounting up to date with changes other processes
made. Every store passes one contract suite (tests/test_store_contract.py).

* :class:`MemoryStore` keeps nothing beyond the process (the default).
* :class:`SQLiteStore` is one file on a local disk, shared by processes.
* ``PostgresStore`` (:mod:`privguard._stores._postgres`) is a ledger in a
  PostgreSQL database, shared by processes on many machines, where the
  database enforces append-only charging (``pip install 'privguard[postgres]'``).
"""

from __future__ import annotations

import os
from typing import Any

from privguard._errors import InvalidArgumentError
from privguard._stores._memory import MemoryStore
from privguard._stores._pgurl import is_postgres_url
from privguard._stores._protocol import Store, Transaction
from privguard._stores._sqlite import SQLiteStore

__all__ = ["MemoryStore", "SQLiteStore", "Store", "Transaction", "open_store"]


def open_store(path: Any, *, read_only: bool = False) -> Store:
    """The store for ``Ledger(path=...)``: a SQLite file path or a ``postgresql://`` URL.

    Raises:
        InvalidArgumentError: ``path`` is not a usable location.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError("path", path, "must be a file path (str or os.PathLike)")
    try:
        text = os.fspath(path)
    except Exception:  # by design: a caller's __fspath__ that raises (adv24)
        raise InvalidArgumentError("path", path, "its __fspath__ failed") from None
    if not isinstance(text, str) or "\0" in text:  # sqlite3 raised ValueError (adv24)
        raise InvalidArgumentError("path", path, "must be a str path without NUL characters")
    if is_postgres_url(text):
        from privguard._stores._postgres import PostgresStore

        return PostgresStore(text, read_only=read_only)
    if not text.strip() or text == ":memory:" or text.startswith("file:"):
        raise InvalidArgumentError(
            "path", path, "must name a ledger file (SQLite's ':memory:', '' and URIs make a "
            "private temporary database whose charges vanish on close; omit path= for an "
            "in-memory ledger)")
    if text.startswith("~") and not os.path.isdir(os.path.dirname(text) or "."):
        raise InvalidArgumentError(
            "path", path, "starts with '~', which is not expanded (sqlite3 and open() do not "
            f"expand it either); pass os.path.expanduser({text!r})")
    return SQLiteStore(text, read_only=read_only)
