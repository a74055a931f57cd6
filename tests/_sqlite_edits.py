"""Shared by the SQLite review tests (test_review_sq.py, test_review_rsq.py): edits a user
of the file can make with the ``sqlite3`` module, and what a fresh reader then finds."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable

from privguard import Ledger


def execute(path, *sql: str) -> None:
    """Run ``sql`` on the file at ``path`` through a connection of its own (autocommit)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in sql:
            conn.execute(statement)
    finally:
        conn.close()


def charges(path) -> int:
    """The charges a fresh read-only opener of ``path`` finds."""
    ledger = Ledger.open(path, read_only=True)
    try:
        return int(ledger._acc.journal.charges)
    finally:
        ledger.close()


def child_charges_while_the_parent_closes(path, ledger, step, *, own: bool,
                                          fork: Callable[[], int] = os.fork,
                                          before_close: Callable[[], None] = lambda: None
                                          ) -> tuple[str, list]:
    """``fork()`` with ``ledger`` (on ``path``) open; the child charges ``step`` (through
    the inherited ledger, or its own ``Ledger.open(path)`` when ``own``) and stops between
    its write and its commit while the parent runs ``before_close()`` and closes
    ``ledger``; then commits. The child's outcome ("returned" or its exception's repr)
    and the runs a fresh reader then finds on disk."""
    from privguard._stores._sqlite import SQLiteStore

    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            real = SQLiteStore._write

            def paused(self, *args):
                real(self, *args)
                os.write(ready_w, b"x")
                os.read(go_r, 1)

            SQLiteStore._write = paused
            mine = Ledger.open(path, lease=1) if own else ledger
            mine.charge(step, label="child")
            os.write(out_w, b"returned")
            code = 0
        except BaseException as exc:
            os.write(ready_w, b"x")
            os.write(out_w, repr(exc).encode()[:500])
        finally:
            os._exit(code)
    for fd in (ready_w, go_r, out_w):
        os.close(fd)
    before_close()
    os.read(ready_r, 1)  # the child is between its write and its commit, or failed
    ledger.close()
    with contextlib.suppress(BrokenPipeError):  # a child that failed is gone
        os.write(go_w, b"x")
    outcome = os.read(out_r, 1000).decode()
    os.waitpid(pid, 0)
    for fd in (ready_r, go_w, out_r):
        os.close(fd)
    reader = Ledger.open(path, read_only=True)
    try:
        return outcome, [(run.label, run.count) for run in reader._store.runs()]
    finally:
        reader.close()


def in_child(work) -> str:
    """Run ``work()`` in a forked child; what it returned, or the exception's repr."""
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.write(out_w, str(work()).encode()[:500])
        except BaseException as exc:
            os.write(out_w, repr(exc).encode()[:500])
        finally:
            os._exit(0)
    os.close(out_w)
    got = os.read(out_r, 1000).decode()
    os.close(out_r)
    os.waitpid(pid, 0)
    return got
