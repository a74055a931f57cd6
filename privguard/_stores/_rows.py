"""What the stores that keep journal rows (SQLite, PostgreSQL) share: reading rows back,
checking them against the digest chain, replaying and verifying them."""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from privguard._accounting._accounting import Accounting, is_retarget
from privguard._accounting._derivation import DERIVATION, KNOWN, first_difference
from privguard._accounting._journal import Run
from privguard._accounting._plan import Plan
from privguard._curves import _legacy
from privguard._errors import LedgerStateError, PrivguardError
from privguard._mechanisms._base import Mechanism, mechanism_from_dict
from privguard._mechanisms._poisson_revision import poisson_tuning_hint
from privguard._stores._resumable import RESUMABLE, changed
from privguard._stores._revision import revised_up_only


class Cursor:
    """How far this process has replayed: rows, last row's count, chain head, previous digest."""

    __slots__ = ("digest", "entries", "last_count", "last_kind", "prev")

    def __init__(self, entries: int, last_count: int, digest: str, prev: str,
                 last_kind: str | None) -> None:
        self.entries, self.last_count, self.digest, self.prev = entries, last_count, digest, prev
        self.last_kind = last_kind

    def as_tuple(self) -> tuple[int, int, str, str]:
        return (self.entries, self.last_count, self.digest, self.prev)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector over a bulk replay, then restore it.

    A replay makes no reference cycles (reference counting frees everything
    it drops), but it keeps a growing list of runs, and the collector's
    passes over it cost about 7% of ``privguard verify`` on 10⁵ rows
    (benchmarks/journal_scale.py). Process-wide, like any ``gc.disable()``.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def loads(text: Any, where: str) -> Any:
    """JSON read back from a store; anything unreadable fails closed with LedgerStateError.

    Unreadable includes NULL (TypeError) and nesting deeper than the parser's
    recursion limit (RecursionError), which a party that can write rows could
    otherwise use to make a replay raise a built-in exception.
    """
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise LedgerStateError(f"{where} is unreadable ({type(exc).__name__})") from None


def decode_mechanism(store: Any, mech_id: Any, row: tuple | None, where: str
                     ) -> tuple[Mechanism, str]:
    """A mechanism row (body, digest) read back, checked against its digest, decoded and
    cached in ``store`` (``_mechs``, ``_mech_ids``, ``_body_of``) under ``mech_id``."""
    if row is None:
        raise LedgerStateError(f"{where} names a mechanism that is not in the ledger")
    body, digest = row
    if not isinstance(body, str) or store.integrity.digest("mechanism", body) != digest:
        raise LedgerStateError(f"{where}: its mechanism fails its digest (edited)")
    try:
        mechanism = mechanism_from_dict(loads(body, f"{where}: its mechanism"))
    except (PrivguardError, TypeError, ValueError, RecursionError) as exc:
        raise LedgerStateError(f"{where}: its mechanism is unreadable ({exc})") from None
    store._mechs[mech_id] = (mechanism, digest)
    store._mech_ids[body] = mech_id
    store._body_of[mechanism] = body
    return mechanism, digest


def run_numbers(label: Any, count: Any, first: Any, last: Any, pid: Any, where: str
                ) -> tuple[int, float, float, int]:
    """A run row's (count, first time, last time, pid) as read back, its label checked.

    An edit that leaves them unreadable (SQLite keeps text or a blob in any column;
    a PostgreSQL superuser can write NULL) fails closed with LedgerStateError.
    """
    if label is not None and type(label) is not str:
        raise LedgerStateError(f"{where} is unreadable (a label of type "
                               f"{type(label).__name__})")
    if type(count) is int and type(pid) is int and type(first) is float \
            and type(last) is float:  # as SQLite and psycopg give them back
        return count, first, last, pid
    try:
        read = int(count), float(first), float(last), int(pid)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LedgerStateError(f"{where} is unreadable ({exc})") from None
    # A keyed row's count edited from 5 to 5.9 was read as 5, which its digest covers: the
    # edit went unseen (task bs). An integer that is not an int must be one exactly.
    if read[0] != count or read[3] != pid:
        raise LedgerStateError(f"{where} is unreadable (a count {count!r} or pid {pid!r} "
                               "that is not an integer)")
    return read


def text_body(body: Any, where: str) -> Any:
    """A fix or event row's body as read back: text holding a JSON object."""
    if type(body) is not str:
        raise LedgerStateError(f"{where} is unreadable (a body of type {type(body).__name__})")
    parsed = loads(body, where)
    if not isinstance(parsed, dict):
        raise LedgerStateError(f"{where} is unreadable (not a JSON object)")
    return parsed


def checked_head(store: Any, row: tuple) -> Cursor:
    """The journal head (entries, last_count, digest, prev, mac) as read back, its MAC
    checked; ``store`` supplies ``path`` and ``_head_mac``."""
    entries, last_count, digest, prev, mac = row
    if type(entries) is not int or type(last_count) is not int or not all(
            type(x) is str for x in (digest, prev, mac)):
        raise LedgerStateError(f"{store.path}: the journal head is unreadable (edited or "
                               "corrupted)")
    head = Cursor(entries, last_count, digest, prev, None)
    if mac != store._head_mac(head):
        raise LedgerStateError(f"{store.path}: the journal head fails its digest (edited, "
                               "truncated or corrupted)")
    return head


CHECKPOINT_CURVES = 8
"""The curve evaluation a checkpoint's snapshot was computed with. A checkpoint holds spent
totals, not charges: one written before the subsampled Gaussian's fractional orders were
revised up (e08c1f5; privguard/_stores/_revision.py) holds the older, lower totals, up to
1e-4 (relative) below today's, and resuming from it would keep that under-count for every
charge before it. Such a checkpoint (no ``"curves"`` field) is read and checked as any other
(garbage still fails closed), then not resumed from: the journal is replayed from the
genesis (review rw). 3: Poisson random-K tuning's curve changed (7ea9ac5, 321fb2f: the
outcome K = 0 counted, the joint-convexity bound; docs/theory.md §7), and so did a Gaussian
curve whose 2σ² overflows (2ad6965); a version-2 checkpoint after a Poisson charge held
totals up to 70% below today's, and the file opened with them (review rpo). 4: a05d7b9
rounded the K = 0 bound up by 2⁻⁴⁸ after version 3 was written (a version-3 checkpoint of
67c2155 held Poisson totals up to 3.2e-16 below today's, and was resumed from: task ckr).
5: the truncated negative binomial's tuning bound (``RepeatAndSelect`` with D_{η,γ},
``DPHyPO``) rounded up (review al: its float value was up to 1.3e-14, relative, below seed
002 Theorem 2's; its subset-tuning sums and ``DeltaReserve``'s level too), and ``PureDP``'s curve
is ε₀ itself from ε₀ = 40 on (task cv; it was up to 6.3e-12 relative below the truth near
α = 1 from rounding), with every curve built on it there. 6: the subsampled Gaussian keeps
Opacus' values only within 1e-12 (was 1e-9) of its cancellation-free check (task sg: kept
values were up to 9.2e-10 below the truth), with every curve built on it. Also 6: task ul's ``PureDP`` near the smallest normal float (an absolute margin; ε₀ below
1e-140 only) and its round-up of the pure-ε corollaries of ``RepeatAndSelect`` and
``DPHyPO`` over a ``PureDP`` base. 7: the journal's spent curve is summed with every
product and sum rounded up (task sr, docs/theory.md §6, "Rounding up"): an older
checkpoint's spent totals were summed to nearest, up to about an ulp per run below the exact
sum of the charged curves, so no checkpoint of an older version is resumed from
(:data:`privguard._stores._resumable.RESUMABLE` is empty; docs/theory.md §7, "Resuming from
an older checkpoint"): the journal is replayed from the genesis, and a writable open writes
a fresh checkpoint (task ckw). 8: the Gaussian's α/(2σ²) (and every curve built on it: the
subsampled Gaussian at q = 1 and its cap, ``RandomAllocation``,
``AccumulatedSubsampledGaussian``) and zCDP's ρα are rounded up (review radv8; they were
rounded to nearest, up to about 2u below the exact value, task adv8): a version-7
checkpoint's totals may lie up to 2 ulps per such charge below today's."""


def checkpoint_body(acc: Accounting, last_kind: str | None) -> dict[str, Any]:
    """What a store writes as a checkpoint's snapshot (before JSON): the accounting, the
    kind of the journal's last row and :data:`CHECKPOINT_CURVES`."""
    return {"accounting": acc.snapshot(), "last_kind": last_kind, "curves": CHECKPOINT_CURVES}


def resume(store: Any, row: tuple | None, genesis_config: Any, conn: Any = None,
           rows_before: Callable[[int], Iterable[tuple]] | None = None
           ) -> tuple[Accounting, Cursor]:
    """The accounting and cursor at a checkpoint row (entries, last_count, head, prev,
    snapshot, mac), or at the genesis for None; the rows after it are replayed next.

    ``store`` supplies ``path``, ``genesis``, ``_checkpoint_mac`` and ``runs`` (the journal
    before the checkpoint, loaded only if asked for), and for a checkpoint of an older curve
    version what :func:`checked_items` needs; ``rows_before(n)`` returns the journal rows
    of index below n, in order, read on ``conn`` (:func:`_older_resumable`).
    """
    if row is None:
        genesis = str(store.genesis)
        return Accounting(genesis_config, fix_now=False), Cursor(0, 0, genesis, genesis, None)
    cursor, snapshot, where = checked_checkpoint(store, row)
    try:
        snap = loads(snapshot, where)
        acc = Accounting.from_snapshot(snap["accounting"])
        cursor.last_kind = snap["last_kind"]
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError,
            LedgerStateError) as exc:
        raise LedgerStateError(f"{where} is unreadable ({exc})") from None
    current = acc.journal.current_fields()
    # The row the checkpoint ends on: a run (the journal's current run, of that count),
    # or a fix or event row (no current run). A store writes what follows from this.
    if not ((cursor.last_kind == "run" and current is not None
             and current[2] == cursor.last_count)
            or (cursor.last_kind in ("fix", "event") and current is None
                and cursor.last_count == 0)):
        raise LedgerStateError(f"{where} is inconsistent: it ends on a "
                               f"{cursor.last_kind!r} row of count {cursor.last_count}")
    version = snap.get("curves")
    if version != CHECKPOINT_CURVES and not (
            type(version) is int and version in RESUMABLE and rows_before is not None
            and _older_resumable(store, conn, cursor, snap, acc, rows_before, genesis_config)):
        return resume(store, None, genesis_config)  # readable, but older totals: replay all
    before = acc.journal.runs_before
    acc.journal.load_prefix = lambda: store.runs()[:before]
    return acc, cursor


def passed_over(row: tuple | None, cursor: Cursor) -> bool:
    """Whether :func:`resume` could not resume from ``row``, the newest checkpoint, and
    returned ``cursor`` from the genesis instead (an older curve version whose rows before
    it changed, :func:`_older_resumable`): the opener then replays rows that checkpoint
    covers, and so does every opener after it, until a checkpoint of today's version is
    written past it (docs/theory.md §7, "A fresh checkpoint after such an open")."""
    return row is not None and cursor.entries != row[0]


def _older_resumable(store: Any, conn: Any, cursor: Cursor, snap: dict[str, Any],
                     acc: Accounting, rows_before: Callable[[int], Iterable[tuple]],
                     genesis_config: Any) -> bool:
    """Whether a checkpoint of an older curve version (:data:`RESUMABLE`) holds exactly what
    the journal before it replays to today (docs/theory.md §7, "Resuming from an older
    checkpoint"): every row before it chained from the genesis to the checkpoint's digests,
    and neither they nor the snapshot describe a mechanism whose curve changed since
    (:func:`privguard._stores._resumable.changed`, no curve computed); no retarget before it;
    its fixed choices the ones this library derives from the fix row. Anything else,
    unreadable included, is False: the replay from the genesis then decides (and names
    what is wrong)."""
    where = f"{store.path}: checkpoint at row {cursor.entries}"
    try:
        rows = list(rows_before(cursor.entries))
        version = snap["curves"]
        if ([r[0] for r in rows] != list(range(cursor.entries))
                or changed(snap["accounting"], version)):
            return False
        items = checked_items(store, conn, rows[:-1])
        if (rows[-2][9] if len(rows) > 1 else str(store.genesis)) != cursor.prev:
            return False
        idx, kind, mech_id, *_, body, _ = rows[-1]  # the last row: a run may have grown since
        if kind == "run":
            items.append(store._mechanism(conn, mech_id, where)[0].to_dict())
        elif kind in ("fix", "event") and store._entry_digest(
                cursor.prev, idx, kind, [body]) == cursor.digest:
            items.append([kind, text_body(body, where)])
        else:
            return False
        seen: set[int] = set()
        for item in items:
            if isinstance(item, Run):
                if id(item.mechanism) in seen:
                    continue
                seen.add(id(item.mechanism))
                item = item.mechanism.to_dict()
            if changed(item, version):
                return False
        return _fixed_as_derived(acc, items, genesis_config, where)
    except (LedgerStateError, TypeError, ValueError, KeyError, IndexError):
        return False


def _fixed_as_derived(acc: Accounting, items: list[Any], genesis_config: Any, where: str
                      ) -> bool:
    """Whether the checkpoint's fixed choices are what :func:`check_fix` installs today from
    the journal's first fix row, under the genesis configuration (no retarget before the
    checkpoint; one that is there makes this False)."""
    bodies = [item for item in items if isinstance(item, list)]
    if any(is_retarget(body) or "retargets" in body for kind, body in bodies if kind == "event"):
        return False
    fixes = [body for kind, body in bodies if kind == "fix"]
    if not fixes:
        return acc.fixed is None
    derived = check_fix(Accounting(genesis_config, fix_now=False), fixes[0], where)
    return bool(json.loads(json.dumps(derived)) == acc.fixed)


def checkpoint_due(entries_before: int, entries: int, every: int) -> bool:
    """Whether a transaction that took the journal from ``entries_before`` rows to
    ``entries`` reached a multiple of ``every``: then it writes a checkpoint, after its last
    change, where the accounting is exactly the journal so far (a first charge writes two
    rows, fix and run: a checkpoint between them would pair the fix row's cursor with the
    run's accounting)."""
    return entries // every > entries_before // every


def checked_checkpoint(store: Any, row: tuple) -> tuple[Cursor, Any, str]:
    """A checkpoint row (entries, last_count, head, prev, snapshot, mac) whose MAC holds:
    its cursor, its snapshot (text, not yet parsed) and how to name it in messages."""
    entries, last_count, head, prev, snapshot, mac = row
    where = f"{store.path}: checkpoint at row {entries}"
    if type(entries) is not int or type(last_count) is not int or not all(
            isinstance(x, str) for x in (head, prev, snapshot, mac)):
        raise LedgerStateError(f"{where} is unreadable (edited or corrupted)")
    cursor = Cursor(entries, last_count, head, prev, None)
    if mac != store._checkpoint_mac(cursor, snapshot):
        raise LedgerStateError(f"{where} fails its digest (edited or corrupted)")
    return cursor, snapshot, where


def sync(store: Any, conn: Any, acc: Accounting, head: Cursor,
         rows_from: Callable[[int], list[tuple]]) -> None:
    """Replay what other writers appended since ``store._cursor``; fail closed on anything
    else (a journal that went backwards, rows replayed before that changed or vanished).

    ``rows_from(start)`` returns the journal rows from index ``start`` on, in order.
    ``acc`` extends only the runs it began (``Journal.own_runs_only``, review rr).
    """
    acc.journal.own_runs_only = True
    mine = store._cursor
    assert mine is not None
    if head.as_tuple() == mine.as_tuple():
        if mine.entries:  # nothing appended: the last row is still the one this ledger saw
            check_last_row(store, conn, rows_from(mine.entries - 1), mine)
        return
    if head.entries < mine.entries or (head.entries == mine.entries
                                       and head.last_count < mine.last_count):
        raise LedgerStateError(
            f"{store.path}: the journal went backwards (this ledger saw {mine.entries} rows, "
            f"the last holding {mine.last_count} charges; now {head.entries} rows, the last "
            f"holding {head.last_count}): rows were deleted or the ledger was restored from "
            "an older copy. A ledger never goes backwards; refusing every charge")
    start = max(mine.entries - 2, 0)
    rows = rows_from(start)
    known = list(range(start, mine.entries))  # the last one or two rows already replayed
    if [r[0] for r in rows[:len(known)]] != known:
        raise LedgerStateError(f"{store.path}: journal rows this ledger replayed are missing "
                               "(deleted or truncated)")
    for row in rows:
        if row[0] == mine.entries - 2:
            if row[9] != mine.prev:
                raise LedgerStateError(f"{store.path}: journal row {row[0]} changed after "
                                       "this ledger replayed it")
            continue
        replay_row(store, conn, acc, row, mine)
    if mine.as_tuple() != head.as_tuple():
        raise LedgerStateError(f"{store.path}: the journal does not replay to its head "
                               f"({mine.entries} rows replayed, the head says {head.entries})")


def check_last_row(store: Any, conn: Any, rows: list[tuple], c: Cursor) -> None:
    """Fail closed unless ``rows`` (the journal from its last row on, as the head counts
    it) is exactly that last row, as this ledger last replayed or wrote it (review rl).

    The head names the last row's digest, not its fields: an edit of that row which
    leaves the head alone would otherwise go unseen by an open ledger, whose next charge
    extends the run (a store rewrites the last row's count, last time and digest) and so
    erases the edit's evidence. The row's fields are hashed again from the digest before
    it (``c.prev``) and must give ``c.digest``, and its stored digest must be
    ``c.digest``; its fields must have the types a store writes (so a count of 5.0 for 5
    shows too). One indexed row read and one digest per transaction.
    """
    where = f"{store.path}: journal row {c.entries - 1}"
    if len(rows) != 1 or rows[0][0] != c.entries - 1:
        raise LedgerStateError(f"{where}, the last one this ledger saw, is missing or is "
                               "followed by rows the journal head does not count (edited)")
    idx, kind, mech_id, label, pid, count, first, last, body, digest = rows[0]
    computed = None
    if kind == "run":
        if (type(count) is int and type(pid) is int and type(first) is float
                and type(last) is float and (label is None or type(label) is str)):
            mech_digest = store._mechanism(conn, mech_id, where)[1]
            if count == c.last_count:
                computed = store._run_digest(c.prev, idx, mech_digest, label, pid, count,
                                             first, last)
    elif kind in ("fix", "event") and type(body) is str and c.last_count == 0:
        computed = store._entry_digest(c.prev, idx, kind, [body])
    if computed is None or computed != c.digest or digest != c.digest:
        raise LedgerStateError(f"{where} changed after this ledger last read or wrote it "
                               "(edited in place, the journal head left alone); refusing "
                               "every charge: `privguard verify` shows the edit")


def replay_row(store: Any, conn: Any, acc: Accounting, row: tuple, c: Cursor) -> None:
    """Check one journal row (idx, kind, mech, label, pid, count, first, last, body, digest)
    against the digest chain and replay it into ``acc``; ``c`` moves past it.

    The row is the next one, or the last one read again (a run whose count grew). ``store``
    supplies ``path``, ``live``, ``PEER`` ("process" or "client", for messages),
    ``_mechanism``, ``_run_digest`` and ``_entry_digest``. Anything inconsistent raises
    LedgerStateError.
    """
    idx, kind, mech_id, label, pid, count, first, last, body, digest = row
    where = f"{store.path}: journal row {idx}"
    extends = idx == c.entries - 1
    if not extends and idx != c.entries:
        raise LedgerStateError(f"{where} is out of sequence (row {c.entries} is missing)")
    prev = c.prev if extends else c.digest
    if kind == "run":
        mechanism, mech_digest = store._mechanism(conn, mech_id, where)
        count, first, last, pid = run_numbers(label, count, first, last, pid, where)
        computed = store._run_digest(prev, idx, mech_digest, label, pid, count, first, last)
    elif kind in ("fix", "event"):
        if extends:
            if digest != c.digest:
                raise LedgerStateError(f"{where} changed after this ledger replayed it")
            return
        parsed = text_body(body, where)
        computed = store._entry_digest(prev, idx, kind, [body])
    else:
        raise LedgerStateError(f"{where} has an unknown kind {kind!r}")
    if computed != digest:
        raise LedgerStateError(f"{where} fails its digest chain (edited, reordered or "
                               "corrupted)")
    if kind == "run":
        if extends and count == c.last_count and digest != c.digest:
            raise LedgerStateError(f"{where} changed after this ledger replayed it")
        journal = acc.journal
        cur = journal.current_fields() if extends else None
        index, start = (cur[0], cur[1]) if cur is not None else (journal.run_count,
                                                                 journal.charges)
        acc.replay_run(Run(index, start, count, label, mechanism, first, last, pid), where)
        c.last_count = count
    elif kind == "fix":
        acc.replay_fix(check_fix(acc, parsed, where))
        c.last_count = 0
    else:
        if is_retarget(parsed) and store.live:
            raise LedgerStateError(
                f"{store.path}: the ledger's configuration was changed by another "
                f"{store.PEER} (an explicit retarget); reopen the ledger to continue")
        acc.replay_event(parsed, where)
        c.last_count = 0
    if not extends:
        c.prev, c.entries = c.digest, idx + 1
    c.digest, c.last_kind = digest, kind


def checked_items(store: Any, conn: Any, rows: Iterable[tuple]) -> list[Any]:
    """The whole journal in order (runs, ``[kind, body]`` for fix and event rows), each
    row checked against the digest chain from the genesis.

    ``rows`` are a store's journal rows in order, as (idx, kind, mech, label, pid, count,
    first, last, body, digest); ``store`` supplies ``path``, ``genesis``,
    ``_mechanism``, ``_run_fields`` and ``_entry_digest`` (the SQLite and PostgreSQL
    stores do).
    """
    items: list[Any] = []
    runs, start, prev = 0, 0, str(store.genesis)
    for position, row in enumerate(rows):
        idx, kind, mech_id, label, pid, count, first, last, body, digest = row
        where = f"{store.path}: journal row {idx}"
        if idx != position:
            raise LedgerStateError(f"{where} is out of sequence (row {position} missing)")
        if kind == "run":
            mechanism, mech_digest = store._mechanism(conn, mech_id, where)
            count, first, last, pid = run_numbers(label, count, first, last, pid, where)
            run = Run(runs, start, count, label, mechanism, first, last, pid)
            fields = store._run_fields(run, mech_digest)
            items.append(run)
            runs, start = runs + 1, start + count
        elif kind in ("fix", "event"):
            fields = [body]
            items.append([kind, text_body(body, where)])
        else:
            raise LedgerStateError(f"{where} has an unknown kind {kind!r}")
        if store._entry_digest(prev, idx, kind, fields) != digest:
            raise LedgerStateError(f"{where} fails its digest chain (edited, reordered or "
                                   "corrupted)")
        prev = digest
    return items


def verify(store: Any, conn: Any, checkpoint_rows: Iterable[tuple], rows: Iterable[tuple],
           started: float) -> dict[str, Any]:
    """``privguard verify``: replay every row from the genesis, check every checkpoint where
    the journal reaches it, then the head, the configuration and a hybrid filter's T_A.

    ``store`` supplies what :func:`replay_row` needs, ``genesis``, ``integrity``,
    ``_read_meta``, ``_read_head`` and ``_checkpoint_mac``; ``checkpoint_rows`` are
    (entries, last_count, head, prev, snapshot, mac); ``rows`` the journal in order
    (streamed if the store can). Raises LedgerStateError on any inconsistency.
    """
    genesis_config, current = store._read_meta(conn)
    acc = Accounting(genesis_config, fix_now=False)
    checkpoints: dict[int, list[tuple]] = {}  # a row may have several (PostgreSQL, task pgh)
    for r in checkpoint_rows:
        checkpoints.setdefault(int(r[0]), []).append(r)
    found = sum(len(at) for at in checkpoints.values())
    n_rows = _replay_all(store, conn, acc, rows, checkpoints)
    if acc.config != current:
        raise LedgerStateError(f"{store.path}: the stored configuration was edited")
    recertify(acc, store.path)
    seconds = time.perf_counter() - started
    return {"rows": n_rows, "runs": acc.journal.run_count, "charges": acc.journal.charges,
            "checkpoints": found, "seconds": seconds,
            "rows_per_second": n_rows / seconds if seconds > 0 else float("inf"),
            "keyed": store.integrity.keyed}


def recertify(acc: Accounting, path: str) -> None:
    """A hybrid filter's T_A, read back without certification, certified again."""
    flt = acc.filter
    if flt is not None and flt.kind == "hybrid":
        from privguard._accounting._hybrid import envelope_steps

        if flt.steps_a > envelope_steps(flt.envelope, flt.epsilon, flt.delta_a):
            raise LedgerStateError(f"{path}: the recorded hybrid filter admits more envelope "
                                   "steps than PLD accounting certifies")


def _replay_all(store: Any, conn: Any, acc: Accounting, rows: Iterable[tuple],
                checkpoints: dict[int, list[tuple]]) -> int:
    """Replay ``rows``; check each checkpoint (``checkpoints[n]``: those that end on row n - 1,
    a run's in the order of its count) where the journal reaches it."""
    cursor = Cursor(0, 0, str(store.genesis), str(store.genesis), None)
    live, store.live = store.live, False
    n_rows = 0
    unchanged = _Unchanged(store, conn)
    try:
        with gc_paused():
            for row in rows:
                n_rows += 1
                at_end, seen = [], None  # checkpoints that end on this row
                for cp in checkpoints.pop(row[0] + 1, []):
                    if not (row[1] == "run" and cp[1] != row[5]):
                        at_end.append(cp)
                        continue
                    # The run grew after the checkpoint was written: replay the row as the
                    # checkpoint saw it first, so that everything it holds is compared.
                    if cp[1] != seen:  # (not twice for two checkpoints of that count)
                        try:
                            replay_row(store, conn, acc, _as_checkpointed(store, cp, row),
                                       cursor)
                        except LedgerStateError as exc:  # the row or the checkpoint was edited
                            raise LedgerStateError(
                                f"{store.path}: checkpoint at row {row[0] + 1} does not match "
                                f"journal row {row[0]} as it saw it ({exc})") from None
                        unchanged.see(row)
                        seen = cp[1]
                    verify_checkpoint(store, cp, cursor, acc, unchanged.since)
                replay_row(store, conn, acc, row, cursor)
                unchanged.see(row)
                for cp in at_end:
                    verify_checkpoint(store, cp, cursor, acc, unchanged.since)
    finally:
        store.live = live
    if checkpoints:
        raise LedgerStateError(f"{store.path}: checkpoints at rows {sorted(checkpoints)} "
                               "are not on the journal")
    if store._read_head(conn).as_tuple() != cursor.as_tuple():
        raise LedgerStateError(f"{store.path}: the journal does not replay to its head")
    return n_rows


class _Unchanged:
    """Per older curve version v (:data:`RESUMABLE`), whether the rows replayed so far (each
    after :func:`replay_row` accepted it) describe no mechanism whose curve changed since v
    (:func:`_resumable.changed`): ``since[v]``. Then a checkpoint of version v there is one
    an opener resumes from, and ``verify`` holds it to the replay exactly."""

    def __init__(self, store: Any, conn: Any) -> None:
        self.store, self.conn = store, conn
        self.since = {version: True for version in RESUMABLE}
        self._seen: set[Any] = set()

    def see(self, row: tuple) -> None:
        if not any(self.since.values()):
            return
        idx, kind, mech_id = row[0], row[1], row[2]
        if kind == "run":
            if mech_id in self._seen:
                return
            self._seen.add(mech_id)
            where = f"{self.store.path}: journal row {idx}"
            data = self.store._mechanism(self.conn, mech_id, where)[0].to_dict()
        else:
            data = loads(row[8], f"{self.store.path}: journal row {idx}")
        for version, so_far in self.since.items():
            self.since[version] = so_far and not changed(data, version)


def _as_checkpointed(store: Any, cp: tuple, row: tuple) -> tuple:
    """Run row ``row`` as checkpoint ``cp`` saw it: the count and last time it had then,
    chained to the digest the checkpoint recorded as the journal's head (the replay checks
    that digest, so a checkpoint that misstates the row fails there)."""
    cursor, snapshot, where = checked_checkpoint(store, cp)
    try:
        last_time = loads(snapshot, where)["accounting"]["journal"]["last"][6]
    except (KeyError, TypeError, IndexError) as exc:
        raise LedgerStateError(f"{where} is unreadable ({exc!r})") from None
    idx, kind, mech_id, label, pid, _, first, _, body, _ = row
    return (idx, kind, mech_id, label, pid, cursor.last_count, first, last_time, body,
            cursor.digest)


def _unchanged_at(unchanged: dict[int, bool] | None, snap: dict[str, Any]) -> bool:
    """``unchanged`` for the checkpoint's own curve version (False for one not listed)."""
    version = snap.get("curves")
    if unchanged is None:
        return True
    return type(version) is int and unchanged.get(version, False)


def verify_checkpoint(store: Any, cp: tuple, cursor: Cursor, acc: Accounting,
                      unchanged: dict[int, bool] | None = None) -> None:
    """A checkpoint row must carry its MAC and equal the journal replayed up to it: the
    cursor, the kind of its last row and the whole accounting snapshot (one of an older
    curve version: see :func:`_same_accounting`; ``unchanged[v]``: no row up to it describes
    a mechanism whose curve changed since version v; None: none did, for every version)."""
    recorded, snapshot, where = checked_checkpoint(store, cp)
    try:
        snap = loads(snapshot, where)
        same = (recorded.as_tuple() == cursor.as_tuple()
                and snap["last_kind"] == cursor.last_kind
                and _same_accounting(snap, acc.snapshot(), _unchanged_at(unchanged, snap)))
    except (TypeError, KeyError) as exc:  # re-MAC'd garbage (unkeyed file)
        raise LedgerStateError(f"{where} is unreadable ({exc!r})") from None
    if not same:
        raise LedgerStateError(f"{where} does not match the replayed journal"
                               + poisson_tuning_hint(*acc.journal.held_runs()))


def check_fix(acc: Accounting, fixed: Any, where: str, derivation: int = DERIVATION
              ) -> dict[str, Any]:
    """A fix entry must hold what this library derives from its plan (issue 24, item 1): a
    PostgreSQL charging role writes it, a re-chained file (unkeyed) or a re-checksummed
    state may hold anything, such as weaker filter weights, a larger T_A or an odometer
    record that only fails when ε is read.

    ``derivation`` names the code that derived it (:mod:`privguard._accounting._derivation`). A
    recorded hybrid T_A may be at most the derived one (fewer certified steps are safe, so
    a dependency that certifies more later keeps old records loadable); everything else
    must match (floats to 1e-9 relative, another CPU's libm; a forged record differs by
    far more). The refusal names the first field that differs.

    Derivation 1 is this code with either curve revision: today's, or the subsampled
    Gaussian's curve before e08c1f5 (:mod:`privguard._curves._legacy`; a ledger fixed then
    keeps that entry for life). A record that differs from today's derivation is compared
    with the older one, field for field as above; the refusal names today's difference.

    Returns the record to install: the derived one (with the recorded T_A), never the
    recorded floats, which a forger may move within that tolerance (adv24: odometer
    weights nudged by 1e-9 lowered ε by 5e-12).
    """
    try:
        plan = Plan.from_dict(fixed["plan"])
        derived = acc.derive_fixed(plan)
    except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LedgerStateError(f"{where}: the fixed plan is unreadable ({exc})") from exc
    if derivation not in KNOWN:  # one derivation so far: version 1, this code
        raise LedgerStateError(f"{where}: derivation {derivation!r} is unknown to this privguard")
    derived = _at_recorded_steps(fixed, derived)
    field = first_difference(fixed, derived)
    if field is not None:
        # the same plan, derived with the curves before task sg (the subsampled Gaussian's
        # 1e-9 tolerance: checkpoint curves version 5), before task cv (PureDP from ε₀ = 40:
        # version 4) or before e08c1f5 (docs/theory.md §1.1, "Fix entries derived before
        # the revision"): another data-independent choice
        # with Composed's sums to nearest (before 4fcbec5: _legacy.pre_sum_up; the older
        # three imply it), where a near tie moved Concentrated's order (task lo6); with
        # the Gaussian's and zCDP's curves to nearest (before checkpoint curves version 8:
        # _legacy.pre_gaussian_up; every older context implies it; review radv8)
        for context in (_legacy.pre_gaussian_up, _legacy.pre_sum_up, _legacy.pre_sg,
                        _legacy.pre_flat, _legacy.pre_revision):
            try:
                legacy = _at_recorded_steps(fixed, acc.derive_fixed_legacy(plan, context))
            except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
                raise LedgerStateError(f"{where}: the fixed plan is unreadable ({exc})") from exc
            if first_difference(fixed, legacy) is None:
                return legacy
        raise LedgerStateError(f"{where}: the choices fixed from the plan are not the ones this "
                               f"library derives from it ({field or 'the record'} differs: a "
                               "forged or foreign fix entry)" + poisson_tuning_hint(plan.step))
    return derived


def _at_recorded_steps(fixed: Any, derived: dict[str, Any]) -> dict[str, Any]:
    """``derived`` with the recorded hybrid T_A in place of its own when the recorded one
    is an integer in [0, derived T_A] (then the two are compared on everything else)."""
    flt = derived.get("filter")
    if not (isinstance(flt, dict) and flt.get("kind") == "hybrid"):
        return derived
    try:
        steps = fixed["filter"]["config"]["steps_a"]
    except (KeyError, TypeError):
        return derived
    if type(steps) is not int or not 0 <= steps <= flt["config"]["steps_a"]:
        return derived
    return {**derived, "filter": {**flt, "config": {**flt["config"], "steps_a": steps}}}


def _same_accounting(snap: Any, replayed: dict[str, Any], unchanged: bool = False) -> bool:
    """A checkpoint's accounting against the replay up to it: equal, as for one of an older
    curve version that an opener may resume from (:data:`RESUMABLE`, ``unchanged``: no row
    up to it describes a mechanism whose curve changed since); for any other older one
    (never resumed from), its spent totals may lie below the replayed ones by the revision
    :func:`revised_up_only` allows, everything else equal."""
    recorded = snap["accounting"]
    version = snap.get("curves")
    if (version == CHECKPOINT_CURVES or recorded == replayed
            or (unchanged and type(version) is int and version in RESUMABLE)):
        return bool(recorded == replayed)
    old, new = dict(recorded), dict(replayed)
    old_journal, new_journal = dict(old.pop("journal")), dict(new.pop("journal"))
    old_base, new_base = old_journal.pop("base"), new_journal.pop("base")
    try:
        revised = revised_up_only(np.array(new_base, dtype=float),
                                  np.array(old_base, dtype=float))
    except (TypeError, ValueError):
        return False
    return old == new and old_journal == new_journal and revised
