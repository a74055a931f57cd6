"""The in-memory store: the journal lives in the accounting itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from privguard._accounting._accounting import Accounting, Change
from privguard._accounting._config import Config
from privguard._accounting._journal import Run
from privguard._errors import LedgerStateError


class _NoTransaction:
    def write(self, acc: Accounting, changes: list[Change]) -> None:
        pass

    def accepts(self, label: str | None) -> None:
        pass  # memory keeps any label


class MemoryStore:
    """Keeps nothing outside the process; ``state_dict()`` is how it travels."""

    path = None
    live = False
    read_only = False

    def __init__(self) -> None:
        self._acc: Accounting | None = None

    def open(self, config: Config | None, acc: Accounting | None,
             retarget: str | None) -> Accounting:
        if acc is None:
            raise LedgerStateError("an in-memory ledger needs a configuration")
        self._acc = acc
        return acc

    @contextlib.contextmanager
    def transaction(self, acc: Accounting, write: bool) -> Iterator[_NoTransaction]:
        yield _NoTransaction()

    def runs(self) -> list[Run]:
        return [] if self._acc is None else self._acc.journal.held_runs()

    def items(self, acc: Accounting) -> list[Any]:
        return acc.items()

    def verify(self) -> dict[str, Any]:
        return {"store": "memory"}

    def reference(self) -> dict[str, Any]:
        raise LedgerStateError("an in-memory ledger has no store to reference")

    def close(self) -> None:
        pass
