"""How far a pickled ledger's journal went, and whether a store's journal extends it.

What the stores that keep journal rows (SQLite, PostgreSQL) share of
``reference()`` / ``check_reference()`` (reviews rsq, pgx): a pickled ledger
carries its cursor (``seen``: rows, the last row's count, its digest and the one
before it) and, where its last row is a run, what stays when that run grows
(``run``: mechanism digest, label, pid, first time). A store whose journal does
not extend it (an older copy restored, or the journal rewritten since) is
refused: loaded, the ledger would have gone backwards.

A pickled last run found grown is accepted, and that is sound because a run grows only
through the ledger that wrote it (``Journal.own_runs_only``, review rr), which refuses
a journal behind the one it wrote: an older copy restored is charged again in a row of
its own, even by the same process, and fails the test below. Leases are deterministic
in size, so the counts alone could not tell the two histories apart. A process running
a privguard before that change can still grow a restored run (README).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from privguard._errors import LedgerStateError
from privguard._stores import _rows
from privguard._stores._rows import Cursor

# a row count or charge count a journal can hold (SQLite's INTEGER, PostgreSQL's bigint):
# an edited pickle's 2**70 raised OverflowError from the SQLite query (review rpgx)
_ROWS_MAX = 2**63


def check_identity(store: Any, key: str, found: Any, pickled: Any, how: str) -> None:
    """Refuse a store whose identity (``key``: ``file_id``, ``ledger_id``) is not the
    pickled one (reviews sq, pgf); ``how``: how that comes about, for the message."""
    # the same type first: an edited pickle's array compared element-wise, and its truth
    # value raised ValueError out of pickle.loads (review radv)
    if type(pickled) is not type(found) or found != pickled:
        raise LedgerStateError(
            f"{store.path} is not the ledger that was pickled (its {key} is {found}, the "
            f"pickle's {pickled}): {how}")


def seen(c: Cursor) -> list[Any]:
    """The cursor as a pickled ledger carries it (``ref["seen"]``)."""
    return list(c.as_tuple())


def last_run(store: Any, conn: Any, row: tuple | None, where: str) -> list[Any] | None:
    """``ref["run"]`` from the journal's last row (mech, label, pid, first) as read back,
    or None where there is none."""
    if row is None:
        return None
    return [store._mechanism(conn, row[0], where)[1], *row[1:]]


def pickled_position(store: Any, ref: dict[str, Any]) -> list[Any] | None:
    """The pickle's ``seen``, checked readable; None where there is nothing to check: an
    old pickle (none carried) or an empty journal."""
    if "seen" not in ref:
        return None
    journal = ref["seen"]
    if not (isinstance(journal, list) and len(journal) == 4
            and all(type(x) is int and 0 <= x < _ROWS_MAX for x in journal[:2])
            and all(type(x) is str for x in journal[2:])):
        raise LedgerStateError(f"{store.path}: the pickle's journal position {journal!r} "
                               "is unreadable; nothing was loaded")
    return journal if journal[0] else None


def check(store: Any, conn: Any, rows: Iterable[tuple], journal: list[Any], run: Any,
          restored: str) -> None:
    """Fail closed unless the store's journal extends the pickled one, as
    :func:`_rows.sync` checks an open ledger's journal at every transaction: the row
    before the pickled last one still carries the pickled ``prev`` digest, and the pickled
    last row is as it was, or a run that has grown since (its digest chained from that
    ``prev``). ``rows``: the store's rows ``entries`` − 2 and − 1 (idx, kind, mech, label,
    pid, count, first, last, body, digest); ``restored``: what was restored, for the
    message ("the file", "the ledger")."""
    if _extends(store, conn, {r[0]: r for r in rows}, journal, run):
        return
    entries, last_count = journal[0], journal[1]
    raise LedgerStateError(
        f"{store.path}: its journal does not extend the journal of the ledger that was "
        f"pickled ({entries} rows, the last holding {last_count} charges): {restored} "
        "was restored from an older copy or rewritten since. A ledger never goes "
        "backwards; nothing was loaded")


def _extends(store: Any, conn: Any, rows: dict[Any, tuple], journal: list[Any],
             run: Any) -> bool:
    """:func:`check`'s test; ``run``: the pickled last row's (mechanism digest, label, pid,
    first time), which a run that grew keeps (as ``Accounting.replay_run`` checks)."""
    entries, last_count, digest, prev = journal
    before = rows.get(entries - 2)
    if (before[9] if before is not None else store.genesis if entries == 1
            else None) != prev:
        return False
    last = rows.get(entries - 1)
    if last is None:
        return False
    if last[9] == digest:
        return True
    idx, kind, mech_id, label, pid, count, first, when, _, stored = last
    if kind != "run" or type(count) is not int or count <= last_count or last_count == 0:
        return False
    where = f"{store.path}: journal row {idx}"
    count, first, when, pid = _rows.run_numbers(label, count, first, when, pid, where)
    mech_digest = store._mechanism(conn, mech_id, where)[1]
    return (run == [mech_digest, label, pid, first]
            and store._run_digest(prev, idx, mech_digest, label, pid, count, first,
                                  when) == stored)
