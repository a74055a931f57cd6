"""The journal: admitted charges as runs of identical consecutive charges.

A run is (mechanism, label, process, count, first and last time). Charging
the same mechanism with the same label from the same process again extends
the current run, so a 10⁶-step DP-SGD run whose σ changes every 1,000 steps
costs a thousand runs, not a million records, in memory and on disk.

The spent curve is kept as ``base + count × curve`` for the current streak, the
product and the sum each rounded up (:func:`scaled_sum`; docs/theory.md §6, "Rounding
up"), so it is never below the exact sum of the charged float curves, and T identical
charges cost the floats of one mechanism of T steps. Every process that replays the same
runs in the same order computes the same floats.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from privguard import _validation as check
from privguard._curves._upward import scaled_sum_up
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism

#: Below this, no entry of ``base + n × curve`` nor of its operations overflows, and none is
#: inf (:func:`scaled_sum_up` then skips numpy's error state).
_SAFE = 1e300


def _bound(curve: np.ndarray) -> float:
    """An upper bound on a curve's entries (inf if any is inf; curves are ≥ 0, not NaN)."""
    return float(curve.max()) if curve.size else 0.0


def scaled_sum(base: np.ndarray, base_bound: float, n: int, curve: np.ndarray,
               curve_bound: float) -> np.ndarray:
    """An upper bound on the exact ``base + n × curve`` (n ≥ 1) for curves ≥ 0 with these
    upper bounds (docs/theory.md §6, "Rounding up"): ``n × curve`` rounded up
    (:func:`times_up`), then the sum rounded up (:func:`sum_up`): each the exact result
    rounded toward +inf, so an exact result stays exact. Never below the exact
    (rational) value; a 0 stays 0 where the exact value is 0; monotone in ``n`` and in
    ``base`` (each step is). A huge curve (``PureDP(1e308)`` charged twice) sends an order
    past the float range: +inf there, above every budget (refused, the safe side; review
    bd), without numpy's overflow warning (an error under ``-W error``). The bounds are
    Python floats, whose products and sums go to inf without a warning."""
    finite = base_bound + float(n) * curve_bound < _SAFE  # Python floats: inf, no warning
    return scaled_sum_up(None if base_bound == 0.0 else base, n, curve, finite)  # onto 0s: exact


@dataclasses.dataclass(frozen=True)
class ChargeRecord:
    """One admitted charge: what was charged, when, and under which label.

    ``time`` is known for the first and last charge of a run; for the charges
    in between it is None (a run keeps only its first and last time).
    """

    index: int
    label: str | None
    mechanism: Mechanism
    time: float | None
    pid: int

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "mechanism": self.mechanism.to_dict(),
                "time": self.time, "pid": self.pid}


class Run(NamedTuple):
    """``count`` identical consecutive charges of ``mechanism`` with one label, by one process.

    An immutable value (a named tuple: a replay builds one for every journal row, and a
    named tuple costs a quarter of a frozen dataclass to build).

    Attributes:
        index: position of the run in the journal.
        start: index of its first charge among all charges.
        count: number of charges.
        label, mechanism, pid: what every charge of the run shares.
        first_time, last_time: when its first and last charge were admitted.
    """

    # ``index`` and ``count`` are fields, as they were when Run was a dataclass; they
    # shadow tuple's index() and count() methods, which a run does not offer.
    index: int  # type: ignore[assignment]
    start: int
    count: int  # type: ignore[assignment]
    label: str | None
    mechanism: Mechanism
    first_time: float
    last_time: float
    pid: int

    def record(self, i: int) -> ChargeRecord:
        """The i-th charge of the run (0 ≤ i < count) as a :class:`ChargeRecord`.

        Raises:
            InvalidArgumentError: ``i`` is not an integer in [0, count) (review bd: -1 or
                10⁹ gave a record of a charge the run does not hold).
        """
        n = check._as_int("i", i)
        if not 0 <= n < self.count:
            raise InvalidArgumentError("i", i, f"must lie in [0, {self.count}) (the run's "
                                       "charges)")
        return self._record(n)

    def _record(self, i: int) -> ChargeRecord:
        """:meth:`record` for an ``i`` known to be in range (the journal's own reads)."""
        t = self.first_time if i == 0 else self.last_time if i == self.count - 1 else None
        return ChargeRecord(self.start + i, self.label, self.mechanism, t, self.pid)

    def key(self) -> tuple[Mechanism, str | None, int]:
        return (self.mechanism, self.label, self.pid)


def _position(record: ChargeRecord) -> int | None:
    """``record.index`` as an int if it is an int or a numpy integer, else None (a bool, a
    float, an array). A list matches a record whose index is ``np.int64(2)`` to the one at
    2 (their ``==`` is the fields'), and indexing takes numpy integers (task lo5); the
    lookups matched it to nothing (task lo6)."""
    index = record.index
    if type(index) is int:
        return index
    return int(index) if isinstance(index, np.integer) else None


def _same_record(held: ChargeRecord, other: ChargeRecord) -> bool:
    """``held == other`` without comparing an array: each field of the same type first
    (review rlo5: a record built with an array label or time made ``in``, ``count``,
    ``index`` and ``==`` raise ValueError, the truth value of the array ``==`` gave); the
    index as :func:`_position` reads it (``held``'s is an int)."""
    return _position(other) == held.index and all(
        type(a) is type(b) and bool(a == b) for a, b in (
            (getattr(held, f.name), getattr(other, f.name))
            for f in dataclasses.fields(held) if f.name != "index"))


class _HistoryIndexError(InvalidArgumentError, IndexError):
    """An index past either end of a :class:`History`: an :class:`InvalidArgumentError`
    that names it, and an ``IndexError`` as the sequence protocol expects (a loop over
    ``history[i]`` or ``reversed`` stops at it)."""


class History(Sequence[ChargeRecord]):
    """Every admitted charge, one :class:`ChargeRecord` each, expanded from runs on demand.

    A read-only sequence as a list is, except that a bad argument (a float or bool index,
    a zero slice step, a value not held) raises :class:`InvalidArgumentError` naming it;
    an index out of range raises one that is also an ``IndexError``.

    Every spent step is in it, leases' unused steps included (nothing is refunded):
    :attr:`released` and :attr:`leased_unused` count the two kinds separately.
    """

    def __init__(self, runs: Sequence[Run], leased_unused: int = 0) -> None:
        self._runs = list(runs)
        self._starts = [r.start for r in self._runs]
        self._len = self._runs[-1].start + self._runs[-1].count if self._runs else 0
        self._unused = check._as_int("leased_unused", leased_unused)
        if not 0 <= self._unused <= self._len:
            raise InvalidArgumentError("leased_unused", leased_unused,
                                       f"must lie in [0, {self._len}] (the history's charges)")

    @property
    def leased_unused(self) -> int:
        """How many of these charges were leased but never released (docs/theory.md §13):
        the ``lease-unused`` events' steps, and the ledger's own open leases'. They stay
        in the history, spent. Which records they are is not told: an event records a
        lease's remainder as a count (its last steps), not where the lease began, and
        another process's charges (or another ledger's in this one) may lie between a
        lease and the one prefetched after it."""
        return self._unused

    @property
    def released(self) -> int:
        """How many of these charges were released: ``len(self) - leased_unused`` (another
        process's open lease, and the remainder of one that died holding it, unrecorded,
        are counted here)."""
        return self._len - self._unused

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> ChargeRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[ChargeRecord]: ...
    def __getitem__(self, i: int | slice) -> ChargeRecord | list[ChargeRecord]:
        if isinstance(i, slice):
            parts = [None if x is None else check._as_int("index", x)
                     for x in (i.start, i.stop, i.step)]
            if parts[2] == 0:
                raise InvalidArgumentError("index", i, "a slice step must not be zero")
            return [self._at(j) for j in range(*slice(*parts).indices(self._len))]
        # an int, a numpy integer or a 0-d integer array, as a list takes them (task lo5:
        # history[np.int64(2)] raised TypeError); a bool or a float is refused
        n = check._as_int("index", i)
        if n < 0:
            n += self._len
        if not 0 <= n < self._len:
            raise _HistoryIndexError("index", i, f"must lie in [-{self._len}, {self._len}) "
                                     "(the history's charges)")
        return self._at(n)

    def _at(self, i: int) -> ChargeRecord:
        """The i-th charge, for 0 ≤ i < len(self)."""
        run = self._runs[bisect.bisect_right(self._starts, i) - 1]
        return run._record(i - run.start)

    def _holds(self, value: object) -> bool:
        """Whether ``value`` is one of the records (a record's ``index`` is its position;
        anything but a :class:`ChargeRecord` equals none of them, and is never compared:
        an array's ``==`` would give an array, whose truth raises ValueError)."""
        if not isinstance(value, ChargeRecord):
            return False
        at = _position(value)
        return at is not None and 0 <= at < self._len and _same_record(self._at(at), value)

    def __contains__(self, value: object) -> bool:
        return self._holds(value)

    def count(self, value: Any) -> int:
        return 1 if self._holds(value) else 0  # records differ in ``index``: at most one

    def index(self, value: Any, start: Any = 0, stop: Any = None) -> int:
        """The position of ``value``, searched in ``[start, stop)`` as ``list.index`` does.

        Raises:
            InvalidArgumentError: ``start`` or ``stop`` is not an integer, or ``value`` is
                not in that part of the history (list.index raises ValueError, which this
                is too).
        """
        lo, hi, _ = slice(check._as_int("start", start),
                          None if stop is None else check._as_int("stop", stop)).indices(self._len)
        if self._holds(value) and lo <= value.index < hi:
            return int(value.index)
        raise InvalidArgumentError("value", check.short(value),
                                   f"is not in the history's charges [{lo}, {hi})")

    def __reversed__(self) -> Iterator[ChargeRecord]:
        for run in reversed(self._runs):
            for i in range(run.count - 1, -1, -1):
                yield run._record(i)

    def __iter__(self) -> Iterator[ChargeRecord]:
        for run in self._runs:
            for i in range(run.count):
                yield run._record(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            return self._runs == other._runs
        if isinstance(other, (list, tuple)):
            return len(other) == self._len and all(
                isinstance(b, ChargeRecord) and _same_record(a, b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"History({self._len} charges in {len(self._runs)} runs)"


class Journal:
    """Runs and the spent curve, with exact repeated composition. No I/O, no locks.

    Closed runs are kept as :class:`Run` values; the current run is kept as
    mutable fields, so extending it allocates nothing. The spent curve is
    ``base + streak × curve`` rounded up (:func:`scaled_sum`), where the streak counts
    consecutive charges of one mechanism across runs (labels and processes do not matter
    to it), so T consecutive identical charges add up to one mechanism of T steps.

    A journal resumed from a checkpoint holds only the runs from the
    checkpoint on, plus the spent state before them; ``load_prefix``
    supplies the older runs on demand.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._closed: list[Run] = []
        self._runs_before = 0  # runs not held (before a checkpoint)
        self._charges_closed = 0  # charges in every run before the current one
        self._cur: list[Any] | None = None  # [index, start, count, label, mech, first, last, pid]
        self._cur_run: Run | None = None  # a Run equal to ``_cur`` if one is at hand, else None
        # Totals, kept up to date by every change (read on every charge and replayed row).
        self.run_count = 0  # runs, the current one included
        self.charges = 0  # charges, the current run's included
        self._base = np.zeros(size)  # spent before the streak
        self._streak: Mechanism | None = None
        self._streak_curve = np.zeros(size)
        self._streak_count = 0
        # upper bounds on the entries of ``_base`` and ``_streak_curve`` (see scaled_sum)
        self._base_bound = self._streak_bound = 0.0
        self.load_prefix: Callable[[], list[Run]] | None = None

    # -- state ---------------------------------------------------------------
    @property
    def last(self) -> Run | None:
        """The current run (None before the first charge or right after an event)."""
        if self._cur is None:
            return None
        return Run(*self._cur) if self._cur_run is None else self._cur_run

    @property
    def runs_before(self) -> int:
        """Runs before the first one held (resumed from a checkpoint), else 0."""
        return self._runs_before

    def spent(self) -> np.ndarray:
        if not self._streak_count:
            return self._base
        cached = self._spent_cache
        if cached is None:
            cached = self._spent_cache = scaled_sum(self._base, self._base_bound,
                                                    self._streak_count, self._streak_curve,
                                                    self._streak_bound)
        return cached

    _spent_cache: np.ndarray | None = None

    def spent_after(self, mechanism: Mechanism, curve: np.ndarray, times: int) -> np.ndarray:
        """The spent curve after ``times`` more charges of ``mechanism``."""
        if mechanism is self._streak or mechanism == self._streak:
            return scaled_sum(self._base, self._base_bound, self._streak_count + times,
                              self._streak_curve, self._streak_bound)
        return scaled_sum(self.spent(), self._spent_bound(), times, curve, _bound(curve))

    def _spent_bound(self) -> float:
        """An upper bound on the entries of :meth:`spent`."""
        return self._base_bound + self._streak_count * self._streak_bound

    # -- changes -------------------------------------------------------------
    def append(self, mechanism: Mechanism, label: str | None, pid: int, curve: np.ndarray,
               t: float, times: int = 1, spent_after: np.ndarray | None = None
               ) -> tuple[Run, bool]:
        """Record ``times`` charges; returns (the run now current, whether it was extended).

        ``spent_after``: :meth:`spent_after` for these charges, if just computed."""
        self._add(mechanism, curve, times, spent_after)
        c = self._cur
        self.charges += times
        if c is not None and c[4] == mechanism and c[3] == label and c[7] == pid \
                and (self._own or not self.own_runs_only):
            c[2] += times
            # A wall clock stepped back (NTP) between two charges of a run never moves its
            # last time back (task adv5: SQLite wrote last < first, a journal no open
            # replayed again; the server's triggers refused the charge as an edit).
            c[6] = max(c[6], t)
            run = self._cur_run = Run(*c)
            return run, True
        self.close_current()
        self._cur = [self.run_count, self._charges_closed, times, label, mechanism, t, t, pid]
        self.run_count += 1
        self._own = True
        run = self._cur_run = Run(*self._cur)
        return run, False

    #: Whether a run is extended only by the journal that began it (review rr): the stores
    #: that keep journal rows (SQLite, PostgreSQL) set it at every sync. A run's row grows
    #: in place, so where any ledger of the process could grow it, an older copy of the
    #: store restored and grown again by the same process past a pickled ledger's count
    #: read as that ledger's run grown (:mod:`privguard._stores._extent`); where only the
    #: ledger that wrote the run grows it, and that ledger refuses a journal behind the one
    #: it wrote, a run read back from a store (replayed, or resumed from a checkpoint) is
    #: never extended: the next charge of its key starts a run, and a row, of its own.
    own_runs_only = False
    #: Whether the current run was begun by :meth:`append` (not replayed or resumed).
    _own = False

    def repeat_key(self) -> tuple[Mechanism, str | None, int, int] | None:
        """What one more charge must match to be recorded by :meth:`repeat_current`:
        the current run's (mechanism, label, pid) and the streak's count, or None when
        there is no current run, it is not this journal's to extend
        (:attr:`own_runs_only`), or its mechanism does not continue the streak."""
        c = self._cur
        if c is None or not (self._own or not self.own_runs_only):
            return None
        m, streak = c[4], self._streak
        if not (m is streak or m == streak):  # equal whenever a run is current
            return None
        return m, c[3], c[7], self._streak_count

    def repeat_current(self, t: float) -> int:
        """One more charge of the current run, which continues the streak (the caller
        checked both with :meth:`repeat_key`: same mechanism, label and process): what
        :meth:`append` records for it with ``spent_after=None``, in O(1) and without
        building a :class:`Run` (:attr:`last` builds it on demand). Returns the charge's
        index (``Run.record(count - 1)``'s)."""
        c = self._cur
        assert c is not None
        c[2] += 1
        c[6] = max(c[6], t)  # as append: a run's last time never goes back (task adv5)
        self.charges += 1
        self._streak_count += 1
        self._spent_cache = None  # materialised lazily as base + count × curve (as append)
        self._cur_run = None
        return c[1] + c[2] - 1

    def current_last_time(self) -> float:
        """The current run's last time (the clamped one :meth:`repeat_current` and
        :meth:`append` keep: never before an earlier charge's), which the record of its
        newest charge carries."""
        c = self._cur
        assert c is not None
        return c[6]

    def time_at(self, i: int) -> float | None:
        """The time the journal shows for charge ``i`` (its run's first or last time, None
        between, as :meth:`Run.record`): what a step handed out from a lease carries
        (review rlo7: it carried the clock's time at hand-out, which history never shows).
        The current run first (a lease's, unless a charge beside it came after), then the
        held runs from the newest; None for a charge not held (before a checkpoint)."""
        c = self._cur
        if c is not None and c[1] <= i < c[1] + c[2]:
            return c[5] if i == c[1] else c[6] if i == c[1] + c[2] - 1 else None
        for run in reversed(self._closed):
            if run.start <= i:
                return run._record(i - run.start).time if i < run.start + run.count \
                    else None
        return None

    def start_run(self, run: Run, curve: np.ndarray, spent_after: np.ndarray | None) -> None:
        """Make ``run`` (read back from a store, already admitted) the current run.

        ``run.index`` and ``run.start`` must be :attr:`run_count` and :attr:`charges`
        (checked by the caller); ``spent_after`` is :meth:`spent_after` for it."""
        if self._cur is not None:  # a new row is a new run even if its key matches
            self.close_current()
        self._own = False  # read back: another ledger's run (own_runs_only)
        self._add(run.mechanism, curve, run.count, spent_after)
        cur = self._cur = [self.run_count, self._charges_closed, run.count, run.label,
                           run.mechanism, run.first_time, run.last_time, run.pid]
        self.run_count += 1
        self.charges += run.count
        # ``run`` itself is the current run when its position is right (closing reuses it)
        self._cur_run = run if run.index == cur[0] and run.start == cur[1] else None

    def current_fields(self) -> list[Any] | None:
        """The current run as [index, start, count, label, mechanism, first, last, pid]
        (read-only; None if there is none). Cheaper than :attr:`last`."""
        return self._cur

    def _add(self, mechanism: Mechanism, curve: np.ndarray, times: int,
             spent_after: np.ndarray | None = None) -> None:
        # ``spent_after``, when given, is what :meth:`spent_after` returned for this very
        # addition: the same operations on the same operands as :meth:`spent` would now
        # perform, so it is bit-identical to it, and kept instead of recomputed.
        if mechanism is self._streak or mechanism == self._streak:
            self._streak_count += times
        else:
            self._base, self._base_bound = self.spent(), self._spent_bound()
            self._streak, self._streak_curve, self._streak_count = mechanism, curve, times
            self._streak_bound = _bound(curve)
        self._spent_cache = spent_after

    def close_current(self) -> None:
        """End the current run, so that the next charge starts a new one."""
        c = self._cur
        if c is not None:
            self._charges_closed += c[2]
            self._closed.append(Run(*c) if self._cur_run is None else self._cur_run)
            self._cur = self._cur_run = None

    def extend_current(self, count: int, last_time: float, curve: np.ndarray,
                       spent_after: np.ndarray | None = None) -> None:
        """Adopt a newer state of the current run (replayed from a store)."""
        c = self._cur
        assert c is not None and count >= c[2]
        self._own = False  # grown by another ledger (own_runs_only)
        if count > c[2]:
            self._add(c[4], curve, count - c[2], spent_after)
            self.charges += count - c[2]
        c[2], c[6] = count, last_time
        self._cur_run = None

    # -- views ---------------------------------------------------------------
    def held_runs(self) -> list[Run]:
        """The runs this journal holds (all of them unless resumed from a checkpoint)."""
        return self._closed + ([] if self._cur is None else [Run(*self._cur)])

    def runs(self) -> list[Run]:
        """Every run, loading the ones before a checkpoint if needed."""
        held = self.held_runs()
        if not self._runs_before:
            return held
        from privguard._errors import LedgerStateError

        prefix = self.load_prefix() if self.load_prefix is not None else []
        if len(prefix) < self._runs_before:
            raise LedgerStateError(f"the journal holds {len(prefix)} runs before its "
                                   f"checkpoint, which says {self._runs_before}")
        return prefix[:self._runs_before] + held

    # -- checkpoints -----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint needs to resume exactly: spent state, current run, counts."""
        return {"base": self._base.tolist(),
                "streak": None if self._streak is None else [self._streak.to_dict(),
                                                             self._streak_count],
                "runs": self.run_count, "charges": self.charges,
                "last": None if self._cur is None else _run_to_list(Run(*self._cur))}

    @classmethod
    def from_snapshot(cls, size: int, snap: dict[str, Any],
                      curve_of: Callable[[Mechanism], np.ndarray]) -> Journal:
        """A journal resumed from :meth:`snapshot` output (validated)."""
        from privguard._errors import LedgerStateError
        from privguard._mechanisms._base import mechanism_from_dict

        journal = cls(size)
        base = np.array(snap["base"], dtype=float)
        if base.shape != (size,) or np.isnan(base).any() or (base < 0).any():
            raise LedgerStateError("checkpoint: spent curve is not a valid curve on the grid")
        journal._base, journal._base_bound = base, _bound(base)
        runs, charges = int(snap["runs"]), int(snap["charges"])
        if snap["streak"] is not None:
            mech, count = snap["streak"]
            if type(count) is not int or not 0 < count <= charges:
                raise LedgerStateError(f"checkpoint: a streak of {count!r} charges, of "
                                       f"{charges} in all")
            journal._streak = mechanism_from_dict(mech)
            journal._streak_curve = curve_of(journal._streak)
            journal._streak_bound = _bound(journal._streak_curve)
            journal._streak_count = count
        if snap["last"] is None:
            journal._runs_before, journal._charges_closed = runs, charges
            journal.run_count, journal.charges = runs, charges
            return journal
        last = _run_from_list(snap["last"])
        journal._runs_before, journal._charges_closed = last.index, last.start
        journal._cur = [last.index, last.start, last.count, last.label, last.mechanism,
                        last.first_time, last.last_time, last.pid]
        journal.run_count, journal.charges = last.index + 1, last.start + last.count
        if journal.charges != charges or journal.run_count != runs:
            raise LedgerStateError("checkpoint: run and charge counts disagree")
        return journal


def _run_to_list(run: Run) -> list[Any]:
    return [run.index, run.start, run.count, run.label, run.mechanism.to_dict(),
            run.first_time, run.last_time, run.pid]


def _run_from_list(data: list[Any]) -> Run:
    from privguard._mechanisms._base import mechanism_from_dict

    index, start, count, label, mech, first, last, pid = data
    return Run(int(index), int(start), int(count), label, mechanism_from_dict(mech),
               float(first), float(last), int(pid))


run_to_list = _run_to_list
run_from_list = _run_from_list
