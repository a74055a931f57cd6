"""A ledger's listeners: callables told of every admitted charge and every refusal.

A mixin of :class:`privguard.Ledger`.
"""

from __future__ import annotations

from collections.abc import Callable

from privguard._accounting._results import LedgerEvent
from privguard._errors import InvalidArgumentError


class LedgerListeners:
    """Listeners of :class:`privguard.Ledger` (see the module docstring)."""

    _listeners: list[Callable[[LedgerEvent], None]]

    def add_listener(self, fn: Callable[[LedgerEvent], None]) -> None:
        """Call ``fn(event)`` after every admitted charge and every refusal.

        The event is delivered after the journal is updated (a refusal's once
        its transaction rolled back, outside it: ``fn`` may charge the ledger);
        an exception raised by ``fn`` propagates to the caller of ``charge``.
        """
        if not callable(fn):
            raise InvalidArgumentError("fn", fn, "must be callable")
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[LedgerEvent], None]) -> None:
        """Stop calling ``fn``.

        Raises:
            InvalidArgumentError: ``fn`` is not a listener of this ledger.
        """
        if fn not in self._listeners:
            raise InvalidArgumentError("fn", fn, "is not a listener of this ledger")
        self._listeners.remove(fn)

    def _notify(self, event: LedgerEvent) -> None:
        for fn in list(self._listeners):
            fn(event)
