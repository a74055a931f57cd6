"""The store protocol: what the ledger needs from wherever its journal lives."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from privguard._accounting._accounting import Accounting, Change
from privguard._accounting._config import Config
from privguard._accounting._journal import Run


class Transaction(Protocol):
    """A store transaction; the accounting is in sync with the store inside it."""

    def write(self, acc: Accounting, changes: list[Change]) -> None:
        """Persist ``changes`` (already applied to ``acc``), durably at commit."""

    def accepts(self, label: str | None) -> None:
        """Refuse (InvalidArgumentError naming ``label``), before anything is decided or
        written, a valid label (``check_label``'s) that this store cannot keep."""


class Store(Protocol):
    @property
    def path(self) -> str | None:
        """The store's location as the user gave it (None in memory)."""

    live: bool
    """Set by the ledger once it is open: a retarget by another process then fails it closed."""

    read_only: bool
    """Opened for reading only: the ledger refuses charges before starting a transaction."""

    def open(self, config: Config | None, acc: Accounting | None,
             retarget: str | None) -> Accounting:
        """Create the store for a new ledger, or open an existing one.

        With ``config`` None, adopt the stored configuration. Returns the
        accounting to use (the stored journal replayed and verified).
        """

    def transaction(self, acc: Accounting, write: bool) -> AbstractContextManager[Transaction]:
        """Begin; replay what other processes appended into ``acc``; commit at exit."""

    def runs(self) -> list[Run]:
        """Every run, from the first (for the history of a ledger opened from a checkpoint)."""

    def items(self, acc: Accounting) -> list[Any]:
        """The whole journal in order: runs, and ["fix" | "event", body] entries."""

    def verify(self) -> dict[str, Any]:
        """Replay and check everything; raise LedgerStateError on any inconsistency."""

    def reference(self) -> dict[str, Any]:
        """What a pickled ledger keeps to reopen this store."""

    def close(self) -> None: ...
