"""A background commit of a streak's next lease (``Ledger(prefetch=True)``).

A lease commit (an fsync, or a server round trip) stalls the training step that
needs it. A prefetch takes the streak's next lease while the current one still
has a few steps: in one background thread, through the ledger's own lease
transaction, so the commit overlaps training and the leased steps themselves
(sqlite3 and psycopg release the GIL during I/O). Its steps are handed out only
once the current lease is used up and only after its commit returned
(docs/theory.md §13, "Prefetch").

The thread holds the ledger's *transaction* lock (``Ledger._txn``) across its whole
transaction, and the ledger's state lock (``Ledger._lock``, which a leased step
takes) only for an instant, to look at the state before it (lock order: the
transaction lock first). The state machine is this object's: a thread that holds
the transaction lock sees a prefetch either not begun (it cancels it: the thread
then does nothing) or finished (its lease, its refusal or its error), never
half-way; a thread that holds only the state lock may find it in flight, and then
leaves it alone (``done`` says when it finished). Nothing waits for ``done``: a prefetch
whose thread never started (an interrupt before it) never sets it (task hl).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Prefetch:
    """One background lease commit following ``after`` (the current lease)."""

    def __init__(self, after: Any) -> None:
        self.after = after  # the lease this one follows (same key)
        # Its streak and remainder when the prefetch was due (sized from these, so the
        # size does not depend on when the thread runs; the remainder only shrinks).
        self.released, self.left = after.streak, after.left
        self._mutex = threading.Lock()  # started/cancelled
        self.started = False
        self.cancelled = False
        self.done = threading.Event()
        self.lease: Any = None  # the committed lease (None: refused or declined)
        self.error: BaseException | None = None
        self.ident: int | None = None  # the thread running it

    def mine(self) -> bool:
        """Whether the calling thread is the one running this prefetch."""
        return self.ident == threading.get_ident()

    def run(self, lock: Any, body: Callable[[Prefetch], Any]) -> None:
        """The thread's body: ``body(self)`` under ``lock`` (the ledger's transaction
        lock) unless cancelled first. Its result is set before ``lock`` is let go, and
        ``done`` after."""
        self.ident = threading.get_ident()
        try:
            with lock:
                with self._mutex:
                    if self.cancelled:
                        return
                    self.started = True
                try:
                    self.lease = body(self)
                except BaseException as exc:  # kept for the thread that needs the lease
                    self.error = exc
        finally:
            self.done.set()

    def start(self, lock: Any, body: Callable[[Prefetch], Any]) -> None:
        try:
            threading.Thread(target=self.run, args=(lock, body), daemon=True,
                             name="privguard-lease-prefetch").start()
        except RuntimeError:  # no thread to be had: no prefetch (the lease is taken when
            self.cancelled = True  # needed, as with prefetch=False)
            self.done.set()
        except BaseException:  # an interrupt: its thread may or may not have started;
            self.cancel()  # if it has, it does nothing (or it began: it finishes)
            raise

    def cancel(self) -> bool:
        """Cancel a prefetch not begun; False if it began (then it finishes)."""
        with self._mutex:
            if not self.started:
                self.cancelled = True
            return self.started


__all__ = ["Prefetch"]
