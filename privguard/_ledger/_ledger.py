"""The Ledger: the object users hold; every private computation is charged to it.

A thin façade. :mod:`privguard._accounting._accounting` decides and applies (pure),
:mod:`privguard._stores` persist and share the journal, :mod:`privguard._stores._state`
serialises. The ledger adds two locks (below) around decide-and-apply; its queries
(:mod:`privguard._ledger._ledger_queries`), listeners (:mod:`privguard._ledger._listeners`) and
state (:mod:`privguard._ledger._ledger_state`) are mixins. A ledger whose state proved
unusable refuses everything (fail closed).

Locks (docs/theory.md §13, "Prefetch"). ``_txn``, the transaction lock, is held across
every store transaction (``_synced``), hence every change of a file or server
ledger's journal and accounting; ``_lock``, the state lock, guards the in-memory state (the leases
``_lease``/``_next``, the prefetch ``_pending``, ``_broken``, ``_held``; the accounting of
an in-memory ledger's repeat lane, which has no store and no prefetch). Order: ``_txn``
before ``_lock``, never the other way: a thread that holds ``_lock`` without ``_txn``
never waits for ``_txn`` (it lets ``_lock`` go first). A transaction of the caller's
thread holds both; a prefetch's transaction holds ``_txn`` and takes ``_lock`` only for
an instant, so a leased step (``_lock`` alone) waits for its commit only when it finds
the file changed (the commit's own write in rollback-journal mode, or a checkpoint): it
then syncs (``_from_lease``). A fork takes both, in order, around ``os.fork``
(:mod:`privguard._ledger._fork`; docs/theory.md §13 "Forks").
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from privguard import _validation as check
from privguard._accounting import _config, _deviation
from privguard._accounting import _lease as leases
from privguard._accounting._accounting import Accounting, Change, check_label
from privguard._accounting._journal import ChargeRecord
from privguard._accounting._plan import Plan
from privguard._accounting._results import LedgerEvent, exact, stated_delta
from privguard._errors import BudgetExhausted, InvalidArgumentError, LedgerStateError
from privguard._ledger import _fork
from privguard._ledger._ledger_queries import LedgerQueries
from privguard._ledger._ledger_state import LedgerState
from privguard._ledger._listeners import LedgerListeners
from privguard._ledger._prefetch import Prefetch
from privguard._mechanisms._base import Mechanism
from privguard._stores import MemoryStore, _handles, open_store


class _GuardedTxn:
    """A store transaction whose write failure breaks the ledger (memory ran ahead of it)."""

    def __init__(self, ledger: Ledger, txn: Any) -> None:
        self._ledger, self._txn = ledger, txn
        self.wrote = False  # memory holds changes the store has not committed yet

    def write(self, acc: Accounting, changes: list[Any]) -> None:
        self.wrote = True
        try:
            self._txn.write(acc, changes)
        except BaseException as exc:  # any failure: a disk error, an interrupt, a bug
            # The accounting already holds these changes and the store rolls them back:
            # this ledger's memory is ahead of its store, so it must never be used again.
            self._ledger._break(f"a write to the store failed ({type(exc).__name__}: {exc}); "
                                "reopen the ledger")
            raise

    def accepts(self, label: str | None) -> None:
        """The store's refusal of a label it cannot keep (nothing written yet)."""
        self._txn.accepts(label)


def _listener_list(listeners: Any) -> list[Callable[[LedgerEvent], None]]:
    """``listeners=`` as a new list, checked before any store is opened (review bd: a bad
    one refused after ``path=``'s file was created or its server reached)."""
    try:  # a 0-d numpy array has __iter__ and raises TypeError on it (review bi)
        if isinstance(listeners, (str, bytes)):
            raise TypeError
        checked = list(listeners)
    except Exception:  # by design: a caller's iterable whose __iter__ or __next__ fails
        raise InvalidArgumentError("listeners", listeners,
                                   "must be an iterable of callables") from None
    for i, fn in enumerate(checked):
        if not callable(fn):
            raise InvalidArgumentError("listeners", listeners,
                                       f"must be an iterable of callables (item {i} is not)")
    return checked


class _Refused:
    """Catches the one refusal a charge raises inside its write transaction (which then
    rolls back), so that listeners are told after it, outside the transaction."""

    exc: BudgetExhausted | None = None

    def hold(self, exc: BudgetExhausted) -> BudgetExhausted:
        self.exc = exc
        return exc

    def __enter__(self) -> _Refused:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return exc is not None and exc is self.exc


class Ledger(LedgerQueries, LedgerListeners, LedgerState):
    """The privacy ledger: filter, odometer, journal and listeners over a grid of orders.

    Args:
        epsilon: target ε of a hard (ε, δ)-DP budget (a filter). Needs ``delta``.
        delta: δ of the filter and of the running odometer. Without ``epsilon``
            the ledger only reports (odometer, no refusals).
        plan: a :class:`Plan` (the step the run will repeat, its horizon and
            read cadence) or a bare mechanism ("this step, horizon unknown").
            It fixes, before any output, the δ shares of the filter, the
            odometer's weights and the hybrid filter's envelope. Default: the
            first charged mechanism, which is chosen before any output exists.
        filter: ``"rdp"`` (default) or ``"hybrid"`` (docs/theory.md §2).
        orders: the grid of Rényi orders (default :data:`DEFAULT_ORDERS`).
        shares: how the filter splits δ over orders (default ``Concentrated(0.9)``).
        rdp_budget: instead of (ε, δ), a per-order RDP budget (a mechanism, an
            :class:`RDPCurve` or one value per order), enforced strictly:
            refuse if ANY order would exceed.
        odometer: the running ε's construction (docs/theory.md §3).
        listeners: callables receiving a :class:`LedgerEvent` per charge and refusal.
        path: keep the journal in this SQLite file (created if missing), or in
            a PostgreSQL ledger named by a ``postgresql://USER@HOST/DB?ledger=NAME``
            URL (``pip install 'privguard[postgres]'``; README "Shared budgets").
            Reopening the same path resumes the same ledger; several processes
            (for a server ledger, on several machines) may share it. The file's configuration must equal this one (use
            :meth:`Ledger.open` to adopt the stored configuration).
        retarget: with ``path``, a reason for opening an existing file with
            another target or budget; the change is logged in the file.
        lease: the lease cap C, in steps (docs/theory.md §13, README "Leases"):
            a file or server ledger admits a block of identical steps of the
            current mechanism in one durable transaction (spent at once, shared
            with every process) and hands them out from memory. ``1`` charges
            every step durably (no leases); the default, None, is
            ``DEFAULT_CAP`` (16) steps for a file or server ledger and 1 in
            memory. A streak that released r steps takes leases of up to
            max(C, r // 64) steps. Unused leased steps stay spent (over-count,
            never under).
        prefetch: with leases, commit a streak's next lease in a background
            thread while the current one still has a few steps, so the
            commit overlaps the caller's work (docs/theory.md §13,
            "Prefetch"; README "Leases"). Default (None): on once a training
            hook charges the ledger (``attach``, the Lightning and Hugging Face
            callbacks), where a training step runs between charges; off for
            direct ``charge`` calls, where there is nothing to overlap. ``True``
            always on; ``False`` takes every lease when it is needed.

    Raises:
        InvalidArgumentError: any argument out of its domain.
        LedgerStateError: the file at ``path`` is unreadable, inconsistent,
            edited, of another schema or of another configuration.

    Example:
        >>> from privguard import Ledger, BudgetExhausted, mechanisms as M
        >>> ledger = Ledger(epsilon=3.0, delta=1e-5)
        >>> step = M.SubsampledGaussian(noise_multiplier=1.1, sample_rate=0.01)
        >>> for _ in range(100):
        ...     _ = ledger.charge(step, label="step")
        >>> 0 < ledger.epsilon() < 3.0
        True
        >>> ledger.can_afford(M.Gaussian(noise_multiplier=0.1))
        False
    """

    def __init__(self, epsilon: float | None = None, delta: float | None = None, *,
                 plan: Plan | Mechanism | None = None, filter: str | None = None,
                 orders: Any = None, shares: Any = None, rdp_budget: Any = None,
                 odometer: str | None = None, listeners: Any = (),
                 path: str | os.PathLike[str] | None = None, retarget: str | None = None,
                 lease: int | None = None, prefetch: bool | None = None) -> None:
        config = _config.build(epsilon, delta, orders=orders, shares=shares, plan=plan,
                               rdp_budget=rdp_budget, odometer=odometer, filter=filter)
        if retarget is not None:
            if path is None:
                raise InvalidArgumentError("retarget", retarget, "only applies with path=")
            if not isinstance(retarget, str) or not retarget.strip():
                raise InvalidArgumentError("retarget", retarget,
                                           "must be a non-empty reason (it is logged)")
            try:  # review rlo7: a lone surrogate escaped the store's write as Python's
                retarget.encode("utf-8")  # UnicodeEncodeError
            except UnicodeEncodeError:
                raise InvalidArgumentError("retarget", retarget, "must be encodable as UTF-8 "
                                           "(no lone surrogates), so that every store can "
                                           "keep it") from None
        cap = leases.check_cap(lease, path is not None)
        prefetch = check.optional_flag("prefetch", prefetch)
        listeners = _listener_list(listeners)  # every argument before the store (review bd)
        self._setup(listeners, None if path is None else open_store(path))
        self._set_leases(cap, prefetch)
        if self._store is None:
            self._acc = Accounting(config)
        else:
            self._acc = self._store.open(config, Accounting(config), retarget)
            self._store.live = True
            _handles.register(self)  # a hold of another handle of this store holds it (adv2)

    def _setup(self, listeners: list[Callable[[LedgerEvent], None]], store: Any) -> None:
        self._txn = threading.RLock()  # the transaction lock: taken before _lock
        self._lock = threading.RLock()  # the state lock (the module docstring)
        self._broken: str | None = None
        self._held: str | None = None
        # the hold in force when this handle was opened (_handles.register), if any: a
        # candidate's own handle, which it may close while that hold lasts (task lo6)
        self._born_under: str | None = None
        self._listeners = listeners  # checked by _listener_list
        self._store = store
        self._check_lease = getattr(store, "check_lease", None)  # a leased step's check
        self._backend = store or MemoryStore()
        self._lease: leases.Lease | None = None  # never pickled: reopening starts afresh
        # The (label, mechanism) of the last charge made beside the live lease (task sl):
        # one charge of another label leaves the lease live; its second in a row ends it.
        self._side: tuple[Any, Any] | None = None
        self._next: leases.Lease | None = None  # a committed prefetch following _lease
        self._pending: Prefetch | None = None  # a prefetch in flight, or finished, unsettled
        # A fork takes both locks, and the child drops the lease (docs/theory.md §13,
        # "Forks"): the at-fork hook's _txn waits for a prefetch in flight
        _fork.track(self)
        self._set_leases(1, None)

    def _set_leases(self, cap: int, prefetch: bool | None) -> None:
        self._lease_cap = cap
        self._prefetch_arg = prefetch  # as given (it travels with a pickled file ledger)
        # None: off until a training hook charges this ledger (_prefetch_for_hook)
        self._prefetch = cap > 1 and self._store is not None and prefetch is True

    def _prefetch_for_hook(self) -> None:
        """A training hook (``attach``) charges this ledger: with ``prefetch=None``, prefetch on.

        Between two of a hook's charges a training step runs, for the background commit
        to overlap; a loop of direct charges has nothing to overlap, and prefetch only
        adds commits and lock waits there (docs/performance.md, "Prefetching the next
        lease"). Whether it is on changes only where leases begin, never a decision.
        """
        with self._lock:
            if self._prefetch_arg is None and self._lease_cap > 1 and self._store is not None:
                self._prefetch = True

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, listeners: Any = (),
             read_only: bool = False, lease: int | None = None,
             prefetch: bool | None = None) -> Ledger:
        """Open an existing ledger file with the configuration stored in it.

        With ``read_only=True`` the file is opened for reading only (for
        inspecting a ledger you may not write); charging it raises. ``lease``
        and ``prefetch``: as for :class:`Ledger`.

        Raises:
            LedgerStateError: no such file, or it is unreadable, inconsistent or edited.
        """
        cap = leases.check_cap(lease, True)
        read_only = check.flag("read_only", read_only)  # "yes", 1, None were taken (review bx)
        prefetch = check.optional_flag("prefetch", prefetch)
        listeners = _listener_list(listeners)
        self = cls.__new__(cls)
        self._setup(listeners, open_store(path, read_only=read_only))
        self._set_leases(cap, prefetch)
        self._acc = self._store.open(None, None, None)
        self._store.live = True
        _handles.register(self)  # a hold of another handle of this store holds it (adv2)
        return self

    def close(self) -> None:
        """Close the ledger's file or server connection; it can then no longer be charged.

        A closed ledger, in memory too, refuses charges and reads of its
        journal and budget (``LedgerStateError``), as a closed ``sqlite3`` or
        psycopg connection refuses queries; its configuration (``orders``,
        ``target``, ``delta``, ``path``) stays readable. Closing again does
        nothing. Open a file or server ledger again to read it; keep an
        in-memory ledger open (or its ``state_dict()``) to read it later.

        The unused remainder of a lease is recorded in the journal as a
        ``lease-unused`` event first (it stays spent).

        Raises:
            LedgerStateError: a tuner holds the ledger (its candidates run), nothing
                changed: a candidate that closed the ledger it captured, or another
                handle of its store opened before the run, depending on its own score,
                left a closed ledger (and a ``lease-unused`` event) after the run that
                told its score (task lo6). A handle opened while the hold lasts (a
                candidate's own ``Ledger.open(path)``) closes as usual.
        """
        with self._txn, self._lock:  # a prefetch in flight commits first
            if (self._held is not None and self._held is not self._born_under
                    and self._broken != "closed"):  # closing again does nothing
                raise LedgerStateError(f"ledger refuses a close for now: {self._held}")
            if self._store is None:  # (task lo: an in-memory ledger went on answering)
                if self._broken is None:
                    self._broken = "closed"
            else:
                try:
                    self._settle()  # a prefetch in flight finished (or never begins)
                    # A held ledger's close raised the hold's refusal at this write (after
                    # closing the file) and left the remainder unrecorded (task lo); the
                    # only hold left here is the one this handle was opened under
                    self._held = None
                    self._record_unused("close")
                finally:
                    self._broken = "closed"  # first: a warning the store's close raises as
                    self._store.close()  # an error (a filter) leaves the ledger closed

    @property
    def leased_unused(self) -> int:
        """Steps the journal holds as spent that were leased but never released: the
        remainders recorded as ``lease-unused`` events, plus this process's open lease
        (docs/theory.md §13). A process that died with a lease leaves its remainder
        spent and unrecorded: it counts as released here. :attr:`history` lists every
        spent step, these included.

        Example:
            >>> from privguard import Ledger
            >>> Ledger(epsilon=3.0, delta=1e-5).leased_unused  # in memory: no leases
            0
        """
        with self._synced(write=False):
            return self._unused_now()

    def _unused_now(self) -> int:
        """Under :meth:`_synced`: :attr:`leased_unused` (also :attr:`history`'s, read in the
        same transaction as its charges)."""
        self._settle()
        live = sum(lease.left for lease in (self._lease, self._next)
                   if lease is not None and lease.pid == os.getpid())
        return leases.unused_steps(self._acc.events) + live

    def _logs_unused(self) -> bool:
        """Whether this ledger's store takes a lease-unused event (a PostgreSQL charging
        role may append charges only: its remainders stay spent, unrecorded, as after a
        crash)."""
        return self._store is not None and getattr(self._store, "writes_events", True)

    def _record_unused(self, reason: str) -> None:
        """Log this process's lease remainder and its prefetched next lease (still spent)
        and drop them."""
        held = [lease for lease in (self._lease, self._next) if lease is not None
                and lease.left and lease.pid == os.getpid()]
        self._lease = self._next = None
        if not held or self._broken is not None or not self._logs_unused():
            return
        with self._synced(write=True) as txn:
            changes = []
            for lease in held:
                body = leases.unused_event(lease, reason, time.time())
                self._acc.replay_event(body)
                changes.append(Change("event", body=body))
            txn.write(self._acc, changes)

    # ------------------------------------------------------------- prefetch
    def _settle(self) -> None:
        """Under both locks (or ``_lock`` alone once ``_pending.done`` is set): a finished
        prefetch's lease becomes ``_next``; one not begun is cancelled (it never begins);
        one that failed breaks the ledger and raises here (fail closed: none of its steps
        is handed out). A refused one leaves nothing."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        if not pending.cancel():
            return  # not begun, now never
        # Begun, hence finished: its whole transaction ran under _txn, which this thread
        # holds (or done was set: its result was set before it let _txn go).
        exc = pending.error
        if exc is not None:
            reason = f"a background lease commit failed ({type(exc).__name__}: {exc})"
            self._break(reason)
            if isinstance(exc, LedgerStateError):
                raise exc
            raise LedgerStateError(reason) from exc
        if pending.lease is not None:
            self._next = pending.lease

    def _promote(self) -> None:
        """Under the lock: the prefetched lease takes over once the current one is used up
        (it continues the same streak)."""
        nxt, cur = self._next, self._lease
        if nxt is not None and (cur is None or cur.left == 0):
            if cur is not None:
                nxt.streak = cur.streak
            self._lease, self._next = nxt, None

    def _settle_finished(self) -> None:
        """Under ``_lock`` alone: :meth:`_settle` a prefetch that finished; one in flight
        (or not begun) is left alone, as waiting for it would need ``_txn``."""
        pending = self._pending
        if pending is not None and pending.done.is_set():
            self._settle()

    def _maybe_prefetch(self, lease: leases.Lease) -> None:
        """Under the lock, after ``lease`` handed out steps: start the background commit
        of the streak's next lease when due (one at a time)."""
        if (self._prefetch and self._pending is None and self._next is None
                and leases.prefetch_due(self._lease_cap, lease.streak, lease.left)):
            # An interrupt before its thread starts leaves a prefetch that never begins
            # nor finishes: nothing waits for it (a transaction cancels it; a fork takes
            # _txn, which waits only for a thread that holds it: task hl)
            self._pending = pending = Prefetch(lease)
            pending.start(self._txn, self._prefetch_commit)

    def _prefetch_commit(self, pending: Prefetch) -> leases.Lease | None:
        """The background thread's transaction, under ``_txn`` (the state lock ``_lock``
        only for the look at the state before it, so leased steps go on meanwhile;
        docs/theory.md §13 "Prefetch"): the next lease of
        the current lease's key, through the decision and the sizing a lease taken when
        needed goes through (:meth:`_grown`), sized with the current remainder as one
        lease (Proposition 2 of docs/theory.md §13 unchanged). None: nothing committed
        (refused, no room, or the state moved on); its steps are handed out only after
        this returned (the commit)."""
        cur: leases.Lease = pending.after
        # While it is in flight _next stays None (one prefetch at a time, begun with none),
        # and whatever else changes _lease or _held takes _txn, which this thread holds.
        with self._lock:
            if (self._broken is not None or self._held is not None or self._lease is not cur
                    or self._next is not None or cur.pid != os.getpid()):
                return None
        # Sized when it was due: the remainder held now is at most pending.left, so the
        # remainder plus this lease stays fewer than the bound at pending.released.
        held = pending.left
        n = leases.prefetch_size(self._lease_cap, pending.released, held)
        if n < 1:
            return None
        mechanism, label, pid = cur.mechanism, cur.label, cur.pid
        with self._synced(write=True, background=True) as txn:
            verdict = self._acc.decide(mechanism, label, pid, 1)
            if not verdict.admitted:
                return None  # refused: the step that needs it takes today's path
            verdict = self._grown(mechanism, label, pid, verdict, n, held, held)
            if verdict is None or _deviation.closes_part_a(verdict):
                return None  # part A closes in the foreground, with its warning
            # Memory changes (apply) before the store's write: any exception between them
            # breaks the ledger at once, as on the caller's path (review rsl; task hl: here
            # the store rolled back and memory stayed one lease ahead, the ledger unbroken
            # and the current lease handing out steps until the prefetch was settled)
            txn.wrote = True
            changes = self._acc.apply(verdict, label, time.time(), pid)
            txn.write(self._acc, changes)
            run = changes[-1].run
            assert run is not None
            lease = leases.Lease(run.mechanism, label, pid, verdict.times,
                                 run.start + run.count - verdict.times, cur.streak)
        return lease

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _synced(self, write: bool, background: bool = False) -> Iterator[Any]:
        """Both locks, and a store transaction in which the accounting is up to date.
        ``background`` (a prefetch's transaction): ``_txn`` only, and ``_lock`` for the
        checks before it.

        A failure of the store (sync, write or commit) breaks the ledger: it
        then refuses everything (fail closed). So does a LedgerStateError of the
        body, which reads the store (a journal read back whole that fails its
        chain); the body's other errors (BudgetExhausted, InvalidArgumentError)
        do not.

        A prefetch (docs/theory.md §13, "Prefetch") is settled first: under ``_txn`` it
        has finished (its lease is then seen whole) or not begun (it is cancelled), so
        two reads with no charge between them see the same state.
        """
        with self._txn, (contextlib.nullcontext() if background else self._lock):
            with self._lock:
                if self._broken is not None:
                    raise LedgerStateError("ledger is unusable and refuses charges and "
                                           f"reads: {self._broken}")
                if self._held is not None:
                    raise LedgerStateError("ledger refuses reads and charges for now: "
                                           f"{self._held}")
                if self._pending is not None and not self._pending.mine():
                    self._settle()
                if write and self._store is not None and self._store.read_only:
                    # refused before the store is touched: the ledger stays readable
                    raise LedgerStateError(f"{self._store.path} was opened read-only: it "
                                           "cannot be charged")
            transaction = self._backend.transaction(self._acc, write)
            txn = self._guard(transaction.__enter__)
            guarded = _GuardedTxn(self, txn)
            try:
                yield guarded
            except BaseException as exc:
                if isinstance(exc, LedgerStateError):
                    self._break(str(exc))
                elif guarded.wrote:  # e.g. an interrupt after the write: the store rolls
                    # back what this ledger's memory already holds (fail closed)
                    self._break(f"a write transaction was interrupted ({type(exc).__name__})"
                                "; reopen the ledger")
                # the store rolls back; an error of its own while doing so breaks the ledger
                if not self._guard(lambda: transaction.__exit__(*sys.exc_info()), write):
                    raise
            else:
                # The commit. ANY failure of a write transaction here (a disk error, an
                # interrupt, SystemExit) leaves its outcome unknown to this ledger, whose
                # memory already holds the changes: it breaks the ledger (fail closed;
                # docs/theory.md §13 Lemma 1).
                self._guard(lambda: transaction.__exit__(None, None, None), write)

    def _guard(self, fn: Callable[[], Any], any_error: bool = False) -> Any:
        """``fn()``; a LedgerStateError (with ``any_error``: any exception at all, an
        interrupt included) breaks the ledger before it propagates."""
        try:
            return fn()
        except LedgerStateError as exc:
            self._break(str(exc))
            raise
        except BaseException as exc:
            if any_error:
                self._break(f"a write transaction did not complete ({type(exc).__name__}: "
                            f"{exc}); its outcome is unknown: reopen the ledger")
            raise

    def _hold(self, reason: str) -> bool:
        """Refuse every read and charge until :meth:`_unhold` (for a client such as a tuner
        whose trials must not touch this ledger); ``False`` if it is already held or broken.
        A prefetch in flight commits first (``_txn``); one not begun then commits nothing.
        """
        with self._txn, self._lock:
            # held only through another handle of its store: its own hold outlasts that one
            if self._broken is not None or (self._held is not None
                                            and not isinstance(self._held, _handles.Through)):
                return False
            self._held = reason
        # and every other handle of the same file or server ledger in this process: a
        # candidate's Ledger.open(path) charged the journal once per candidate (task adv2)
        try:
            _handles.hold_others(self, reason)
        except BaseException:  # an interrupt part-way: the caller never releases this
            # hold, and a held ledger refuses close() (task lo6): it stayed held and
            # unclosable for good (review rlo6)
            _handles.release(self)
            raise
        return True

    def _unhold(self) -> None:
        """End a hold; a ledger broken meanwhile stays broken (fail closed)."""
        # and what it set on every other handle of its store; another handle's hold still
        # in force is this one's from now on (set under the registry's lock: review radv2)
        _handles.release(self)

    def _break(self, reason: str) -> None:
        """Refuse everything from now on (fail closed); the first cause is the one reported."""
        with self._lock:  # a prefetch's thread breaks it too (it holds _txn: lock order kept)
            if self._broken is None:
                self._broken = reason

    # ------------------------------------------------------------- charging
    def charge(self, mechanism: Mechanism, label: str | None = None, *,
               times: int = 1) -> ChargeRecord:
        """Charge one run of ``mechanism``; refuse before recording if it would overspend.

        With ``times`` = k, charge k identical runs at once, all or nothing,
        in one transaction: exactly what k single charges would record (one
        run of the journal, the same spent curve, the same filter decision as
        the k-th single charge). Beside a lease of another label, k ≥ 2 ends
        the lease, as the second of k single charges does (its remainder is
        recorded unused; README "Leases"). With leases, k single charges may
        lease a different number of steps ahead (spent, not released) than
        one charge of k.

        Returns:
            The :class:`ChargeRecord` appended to the journal (the last one).

        Raises:
            BudgetExhausted: the filter refuses; nothing was recorded.
            InvalidArgumentError: ``mechanism`` or ``label`` is invalid.
            LedgerStateError: the ledger's state is unusable (fail closed).
        """
        # (times' type first: an array's == is not a bool)
        if type(times) is int and times == 1 and self.repeat_lane:
            # The repeat lane. In memory: another charge of the current run that the fast
            # path already admits, decided and applied under the lock in O(1). A file or
            # server ledger: a step of this process's lease, through the same checks as
            # below (_from_lease: the file's identity at every step). Anything else (a
            # refusal included) takes the ordinary path below.
            if self._store is None:
                with self._lock:
                    record = None if (self._broken is not None or self._held is not None
                                      or self._lease is not None or self._lease_cap > 1) \
                        else self._acc.repeat(mechanism, label, os.getpid(), time.time)
            else:
                lease, pid = self._lease, os.getpid()
                # a label equal to the lease's (checked) one, of type str: a valid label
                # (lease.covers without its count: _from_lease checks that under the lock)
                record = None if lease is None or not (label is None or type(label) is str) \
                    or not lease.same_key(mechanism, label, pid) \
                    else self._from_lease(lease, mechanism, label, pid, 1)
            if record is not None:
                if self._listeners:
                    self._notify(LedgerEvent("charge", self, mechanism, label, record))
                return record
        label = check_label(label)
        times = check.positive_int("times", times, maximum=check.MAX_STEPS)
        pid = os.getpid()
        lease = self._lease
        if lease is not None and lease.covers(mechanism, label, pid, times):
            record = self._from_lease(lease, mechanism, label, pid, times)
            if record is not None:
                self._notify(LedgerEvent("charge", self, mechanism, label, record))
                return record
        if isinstance(mechanism, Mechanism):
            # A new mechanism's curve can take milliseconds: compute it (pure, cached)
            # before taking the store's lock, which other processes are waiting for.
            self._acc.curve(mechanism)
        with self._txn, self._lock:  # across the transaction and the lease's installation
            # A prefetch finished (or is cancelled: it never begins), and its lease takes
            # over once the current one is used up.
            self._settle()
            self._promote()
            # A thread that found no lease above may find one now (another thread took it
            # meanwhile): steps it covers come from it, never from a lease on top of it.
            lease = self._lease
            leased = None if lease is None or not lease.covers(mechanism, label, pid, times) \
                else self._from_lease(lease, mechanism, label, pid, times)
            if leased is None and self._next is not None:
                leased = self._from_both(mechanism, label, pid, times)
            refused = _Refused()
            if leased is None:
                with refused, self._synced(write=True) as txn:
                    txn.accepts(label)  # one the store cannot keep: refused, nothing decided
                    verdict, carry, abandon, streak, beside = self._decide_leased(
                        mechanism, label, pid, times)
                    if not verdict.admitted:
                        remaining = self._remaining(mechanism)
                        raise refused.hold(BudgetExhausted(
                            f"charge {'' if label is None else repr(label) + ' '}of {mechanism!r} "
                            "refused: it would exceed the "
                            f"{self._acc.config.describe()}; nothing was recorded ({remaining})",
                            requested=mechanism, label=label, remaining=remaining))
                    deviation, closing = None, _deviation.closes_part_a(verdict)
                    if closing:  # part A closes (once per ledger): say what it cost
                        step = _deviation.plan_step(self._acc, verdict)
                        before = self._acc.repeats(step, None, pid)
                    now, pre = time.time(), []
                    # Memory changes from here on (replay_event, apply) before the store's
                    # write: an interrupt between them breaks the ledger as one during the
                    # write does (review rsl: it left memory one charge ahead of the store,
                    # read back as spent and history, and the lease live)
                    txn.wrote = True
                    if abandon is not None and self._logs_unused():  # it stays spent either way
                        body = leases.unused_event(abandon, "mechanism change", now)
                        self._acc.replay_event(body)
                        pre = [Change("event", body=body)]
                    nxt = None if beside else self._next  # a prefetch the lease did not reach:
                    if nxt is not None and nxt.left and self._logs_unused():  # abandoned
                        body = leases.unused_event(nxt, "prefetch unused" if abandon is None
                                                   else "mechanism change", now)
                        self._acc.replay_event(body)
                        pre.append(Change("event", body=body))
                    if not beside:
                        self._lease = self._next = None
                    changes = pre + self._acc.apply(verdict, label, now, pid)
                    txn.write(self._acc, changes)  # durable at commit, before the caller acts
                    if closing:  # committed: nothing here may raise into the transaction
                        deviation = _deviation.message(
                            verdict.filter, mechanism, label, step, before,
                            _deviation.repeats_or_nan(self._acc, step, pid))
                    run = changes[-1].run
                    assert run is not None
                    spare = verdict.times - (times - carry)  # admitted beyond this charge: leased
                    record = run._record(run.count - 1 - spare)
                    new_lease = None if self._lease_cap <= 1 or beside else leases.Lease(
                        run.mechanism, label, pid, spare, run.start + run.count - spare,
                        streak + times)
                # Installed only after the commit returned (theory §13 Lemma 1): an interrupt
                # before or during the COMMIT leaves no lease in memory (and breaks the ledger).
                if refused.exc is None and beside:
                    self._side = (label, mechanism)  # the lease stays live
                elif refused.exc is None:
                    self._lease, self._side = new_lease, None
                    if new_lease is not None:
                        self._maybe_prefetch(new_lease)
        if refused.exc is not None:
            # Told once the refused transaction rolled back and the lock is free (review rl):
            # a listener that charges this ledger then commits its own transaction. Told
            # inside it, its charge and its lease were written into the refused transaction
            # and erased by its ROLLBACK while this ledger handed the steps out.
            self._notify(LedgerEvent("refused", self, mechanism, label, None))
            raise refused.exc
        if leased is not None:
            self._notify(LedgerEvent("charge", self, mechanism, label, leased))
            return leased
        assert record is not None  # the durable path's record
        self._notify(LedgerEvent("charge", self, mechanism, label, record))
        if deviation is not None:
            warnings.warn(deviation, _deviation.PlanDeviationWarning, stacklevel=2)
            self._notify(LedgerEvent("deviation", self, mechanism, label, record))
        return record

    repeat_lane = True  # the in-memory repeat lane of charge() (tests compare against False)

    def can_afford(self, mechanism: Mechanism) -> bool:
        """Whether :meth:`charge` would admit ``mechanism`` now (same code path; records
        nothing). A step this process holds leased (already spent) is affordable."""
        pid = os.getpid()
        with self._lock:  # a prefetch in flight is left to finish (it needs no answer here)
            if self._broken is None and self._held is None:
                self._settle_finished()
                self._promote()
                lease = self._lease
                if lease is not None and lease.covers(mechanism, lease.label, pid, 1) \
                        and self._file_unchanged():  # the check a leased step makes
                    return True
        with self._synced(write=False):  # (the file changed: the sync verifies it)
            self._promote()  # a prefetch that was in flight above is settled now
            lease = self._lease
            if lease is not None and lease.covers(mechanism, lease.label, pid, 1):
                return True
            return self._acc.decide(mechanism, None, pid).admitted

    def _from_lease(self, lease: leases.Lease, mechanism: Mechanism, label: str | None,
                    pid: int, times: int) -> ChargeRecord | None:
        """``times`` steps handed out from this process's lease (already admitted and
        spent in the journal: no I/O, no grid arithmetic); None if the lease is gone.

        Under ``_lock`` alone, so a prefetch's transaction in flight (``_txn``) never
        delays it; only when the file changed since the store's last transaction (another
        writer, a checkpoint, or the prefetch's own commit not yet recorded as seen) does
        it let ``_lock`` go and sync in a read transaction (both locks, in order: it waits
        for a prefetch in flight), which verifies the journal, before the step."""
        with self._lock:
            if not self._lease_open(lease, times):
                return None
            if self._file_unchanged():
                return self._take(lease, label, pid, times)
        with self._synced(write=False):
            return self._take(lease, label, pid, times) if self._lease_open(lease, times) \
                else None

    def _lease_open(self, lease: leases.Lease, times: int) -> bool:
        """Under ``_lock``: whether ``lease`` is the current lease and hands out ``times``
        steps. A held ledger refuses (the ordinary path raises), as a broken one; the
        lease's key never changes, and every caller checked it (covers, or same_key on the
        repeat lane) for this charge."""
        return (self._broken is None and self._held is None and self._lease is lease
                and lease.left >= times)

    def _take(self, lease: leases.Lease, label: str | None, pid: int, times: int
              ) -> ChargeRecord:
        """Under ``_lock``, the lease checked: ``times`` steps of it handed out."""
        index = lease.take(times)
        # the time the journal shows for it (review rlo7: the clock's at hand-out, which
        # history never shows: a run keeps its first and last time, None between)
        record = ChargeRecord(index, label, lease.mechanism, self._acc.journal.time_at(index),
                              pid)
        self._handed_out(lease)
        return record

    def _handed_out(self, lease: leases.Lease) -> None:
        """Under ``_lock``, after ``lease`` handed out steps: the lease's key charged again,
        so a later charge of another label is the first beside it (task sl; review rsl), and
        the streak's next lease is prefetched when due."""
        self._side = None
        if self._prefetch:
            self._maybe_prefetch(lease)

    def _from_both(self, mechanism: Mechanism, label: str | None, pid: int, times: int
                   ) -> ChargeRecord | None:
        """Under both locks: ``times`` steps handed out from the rest of the current lease and
        then the prefetched one (same key, both spent in the journal), when the current one
        alone is too short (a charge of ``times`` > 1). Review rpf: the prefetched lease was
        recorded unused at every such charge instead, up to B(r) − 1 steps each time, so a
        loop of ``charge(times=5)`` over-counted 762 of 1,200 steps (Proposition 2 counts one
        abandonment a streak). None: not applicable (the caller goes on as before)."""
        cur, nxt = self._lease, self._next
        if (cur is None or nxt is None or not 0 < cur.left < times
                or cur.left + nxt.left < times or not cur.same_key(mechanism, label, pid)
                or not nxt.same_key(mechanism, label, pid)
                or self._broken is not None or self._held is not None):
            return None
        if not self._lease_stands(cur) or self._lease is not cur or self._next is not nxt:
            return None
        first = cur.left
        cur.take(first)
        self._promote()  # the prefetched lease continues the streak
        index = nxt.take(times - first)
        record = ChargeRecord(index, label, nxt.mechanism, self._acc.journal.time_at(index), pid)
        self._handed_out(nxt)
        return record

    def _file_unchanged(self) -> bool:
        """The check a leased step makes, with no transaction: the file's identity at
        every leased step, as at every transaction: replaced or deleted breaks the ledger
        (LedgerStateError); False when it changed since the store's last transaction
        (another writer, a checkpoint, or rolled back in place): the caller syncs."""
        check = self._check_lease
        return check is None or bool(self._guard(check))

    def _lease_stands(self, lease: leases.Lease) -> bool:
        """Under both locks: whether ``lease`` is still this ledger's after the check a
        leased step makes (:meth:`_file_unchanged`; changed: a sync first, which
        verifies the journal)."""
        if not self._file_unchanged():
            with self._synced(write=False):
                pass
        return self._lease is lease

    def _decide_leased(self, mechanism: Mechanism, label: str | None, pid: int, times: int
                       ) -> tuple[Any, int, leases.Lease | None, int, bool]:
        """The verdict for ``times`` steps, with a lease when this ledger takes leases.

        Returns (verdict, carry, abandon, streak, beside): ``carry`` steps come from this
        process's lease of the same key (fewer than ``times``), the verdict admits the rest plus a
        lease, through the decision ``charge(times=n)`` takes (the filter admits the whole
        lease before its first step); ``abandon`` is a lease of another key whose
        remainder is to be recorded as unused; ``streak`` the steps the key released so far;
        ``beside``: the charge is made beside the live lease, which stays (task sl).
        When the lease cannot be admitted whole it
        shrinks to the largest count admitted; when the steps needed are refused, the
        verdict is that refusal, exactly as without leases (docs/theory.md §13).
        """
        acc, cap, old = self._acc, self._lease_cap, self._lease
        if old is not None and old.pid != pid:
            old = self._lease = None  # a forked child: the parent's lease is not ours
        if self._beside(old, mechanism, label, pid, times):
            # One charge of another label (a noisy evaluation between training steps):
            # charged alone, exactly `times` steps and no lease, beside the live lease,
            # which stays live and spent (task sl; docs/theory.md §13, "Charges beside a
            # lease"). The same charge again next ends the lease below, as before.
            return acc.decide(mechanism, label, pid, times), 0, None, 0, True
        same = old is not None and old.same_key(mechanism, label, pid)
        carry = old.left if same and old is not None else 0
        abandon = old if old is not None and not same and old.left else None
        streak = old.streak if same and old is not None else 0
        need = times - carry
        verdict = acc.decide(mechanism, label, pid, need)
        if cap <= 1 or not verdict.admitted or self._store is None:
            return verdict, carry, abandon, streak, False
        grown = self._grown(mechanism, label, pid, verdict, leases.target_size(cap, streak, need),
                            need)
        assert grown is not None  # floor = need: never below it
        return grown, carry, abandon, streak, False

    def _beside(self, old: leases.Lease | None, mechanism: Mechanism, label: str | None,
                pid: int, times: int) -> bool:
        """Under both locks: whether this charge is made beside the live lease ``old``
        (of this process, with steps left) rather than ending it: it has another label, and
        the last charge made beside the lease was not this same one (a second charge in a
        row of another label's mechanism starts that label's own streak, as before).
        ``times`` > 1 is never beside: it records what ``times`` single charges would, and
        the second of those ends the lease (task lo: ``times=2`` kept the lease live).
        Not a mechanism: False (review rsl: the ordinary path refuses it as invalid; an
        array compared with ``_side`` by == raised the truth value's ValueError)."""
        return (times == 1 and isinstance(mechanism, Mechanism) and old is not None
                and old.pid == pid and old.left > 0 and label != old.label
                and self._side != (label, mechanism))

    def _grown(self, mechanism: Mechanism, label: str | None, pid: int, verdict: Any, n: int,
               floor: int, held: int = 0) -> Any:
        """``verdict`` (admitting ``verdict.times`` = need steps) grown to a lease of up to
        ``n`` steps: capped by the T_A rule and the meter, then shrunk to the largest count
        the filter admits (docs/theory.md §13). ``held``: steps of the key leased and
        unused (a prefetch): the caps size ``held`` + ``n`` as one lease, never below
        ``floor``. None when the caps leave fewer than need steps (a prefetch only: a
        lease taken when needed has ``floor`` = need)."""
        acc, need = self._acc, verdict.times
        flt = acc.filter
        if flt is not None and held + n > floor:
            spent, curve = acc.spent(), acc.curve(mechanism)
            m = leases.hybrid_room(flt, mechanism, floor, held + n, held)
            n = leases.meter_room(flt, spent, curve, floor, m, held) - held
            if held and n > 0:  # and, alone, at most FRACTION of what is left now (§13)
                n = leases.meter_room(flt, spent, curve, 0,
                                      leases.hybrid_room(flt, mechanism, 0, n))
        if n < need:
            return None
        if n > need:
            bigger = acc.decide(mechanism, label, pid, n)
            if not bigger.admitted:  # shrink to the largest admitted count (monotone in n)
                lo, hi = need, n
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if acc.decide(mechanism, label, pid, mid).admitted \
                        else (lo, mid)
                bigger = verdict if lo == need else acc.decide(mechanism, label, pid, lo)
            verdict = bigger
        return verdict

    def child(self, budget: Any, *, delta: float | None = None) -> Ledger:
        """A strict, in-memory sub-ledger for one tuning candidate.

        It refuses any charge that would exceed ``budget`` (a mechanism, an
        :class:`RDPCurve` or per-order values) at ANY order, so the candidate
        stays within the per-candidate curve a tuning theorem assumed. The
        parent is not charged by the child: the caller charges the parent the
        tuning bound, which covers every candidate.

        Example:
            >>> from privguard import Ledger, mechanisms as M
            >>> parent = Ledger(epsilon=8.0, delta=1e-5)
            >>> kid = parent.child(M.SubsampledGaussian(1.0, 0.01, steps=50))
            >>> for _ in range(50):
            ...     _ = kid.charge(M.SubsampledGaussian(1.0, 0.01))
            >>> kid.can_afford(M.SubsampledGaussian(1.0, 0.01))
            False
        """
        if budget is None:  # Ledger(rdp_budget=None) is report-only: a child that never refuses
            raise InvalidArgumentError("budget", budget, "must be a mechanism, an RDPCurve or "
                                       "per-order values (a child is strict)")
        cfg = self._acc.config
        mode = cfg.odometer if cfg.odometer in _config.NEW_ODOMETER_MODES else None
        try:
            return Ledger(orders=self.orders, rdp_budget=budget, delta=delta, odometer=mode)
        except InvalidArgumentError as exc:  # named as the caller passed it (review bd)
            if exc.argument != "rdp_budget":
                raise
            raise InvalidArgumentError("budget", exc.value, exc.requirement) from None

    def __repr__(self) -> str:
        cfg = self._acc.config
        parts = [f"{cfg.orders.size} orders", cfg.describe()]
        # the δ the odometer is stated at: after a retarget the one the ledger was created
        # with (docs/theory.md §4; task adv9: it named the retargeted δ)
        stated = stated_delta(self._acc)
        if stated is not None:
            parts.append(f"odometer={cfg.odometer!r} at δ={exact(stated)}"
                         + (" (fixed before the first output)" if stated != cfg.delta else ""))
        elif cfg.delta is not None:
            parts.append(f"odometer={cfg.odometer!r} with no δ fixed before the first output")
        parts.append(f"{self._acc.journal.charges} charges")
        return f"Ledger({', '.join(parts)})"
