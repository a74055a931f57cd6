"""Reading a journal row's numbers back, shared by the stores that keep rows."""

from __future__ import annotations

from typing import Any

from privguard._errors import LedgerStateError


def run_numbers(count: Any, first: Any, last: Any, pid: Any, where: str
                ) -> tuple[int, float, float, int]:
    """A run row's (count, first time, last time, pid) as read back.

    An edit that leaves them unreadable (SQLite keeps text in a numeric column;
    a PostgreSQL superuser can write NULL) fails closed with LedgerStateError.
    """
    try:
        return int(count), float(first), float(last), int(pid)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LedgerStateError(f"{where} is unreadable ({exc})") from None
