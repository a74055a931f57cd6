"""The Ledger: the object users hold; every private computation is charged to it.

A thin façade. :mod:`privguard._accounting` decides and applies (pure),
:mod:`privguard._stores` persist and share the journal, :mod:`privguard._state`
serialises. The ledger adds one lock around decide-and-apply, listeners, and
queries; a ledger whose state proved unusable refuses everything (fail closed).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from privguard import _config
from privguard import _validation as check
from privguard._accounting import Accounting, check_label
from privguard._base import Mechanism
from privguard._curve import RDPCurve
from privguard._errors import BudgetExhausted, InvalidArgumentError, LedgerStateError
from privguard._journal import ChargeRecord, History, Run
from privguard._ledger_state import LedgerState
from privguard._plan import Plan
from privguard._results import Guarantee, LedgerEvent, Remaining, guarantee_of
from privguard._stores import MemoryStore, open_store


class _GuardedTxn:
    """A store transaction whose write failure breaks the ledger (memory ran ahead of it)."""

    def __init__(self, ledger: Ledger, txn: Any) -> None:
        self._ledger, self._txn = ledger, txn

    def write(self, acc: Accounting, changes: list[Any]) -> None:
        self._ledger._guard(lambda: self._txn.write(acc, changes))


class Ledger(LedgerState):
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
                 path: str | os.PathLike[str] | None = None, retarget: str | None = None
                 ) -> None:
        config = _config.build(epsilon, delta, orders=orders, shares=shares, plan=plan,
                               rdp_budget=rdp_budget, odometer=odometer, filter=filter)
        if retarget is not None:
            if path is None:
                raise InvalidArgumentError("retarget", retarget, "only applies with path=")
            if not isinstance(retarget, str) or not retarget.strip():
                raise InvalidArgumentError("retarget", retarget,
                                           "must be a non-empty reason (it is logged)")
        self._setup(listeners, None if path is None else open_store(path))
        if self._store is None:
            self._acc = Accounting(config)
        else:
            self._acc = self._store.open(config, Accounting(config), retarget)
            self._store.live = True

    def _setup(self, listeners: Any, store: Any) -> None:
        self._lock = threading.RLock()
        self._broken: str | None = None
        self._listeners: list[Callable[[LedgerEvent], None]] = []
        if isinstance(listeners, (str, bytes)) or not hasattr(listeners, "__iter__"):
            raise InvalidArgumentError("listeners", listeners, "must be an iterable of callables")
        for fn in listeners:
            self.add_listener(fn)
        self._store = store
        self._backend = store or MemoryStore()

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, listeners: Any = (),
             read_only: bool = False) -> Ledger:
        """Open an existing ledger file with the configuration stored in it.

        With ``read_only=True`` the file is opened for reading only (for
        inspecting a ledger you may not write); charging it raises.

        Raises:
            LedgerStateError: no such file, or it is unreadable, inconsistent or edited.
        """
        self = cls.__new__(cls)
        self._setup(listeners, open_store(path, read_only=read_only))
        self._acc = self._store.open(None, None, None)
        self._store.live = True
        return self

    def close(self) -> None:
        """Close the ledger's file (if any). The ledger can no longer be charged."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._broken = "closed"

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _synced(self, write: bool) -> Iterator[Any]:
        """The lock, and a store transaction in which the accounting is up to date.

        A failure of the store (sync, write or commit) breaks the ledger: it
        then refuses everything (fail closed). Errors of the body do not.
        """
        with self._lock:
            if self._broken is not None:
                raise LedgerStateError(f"ledger is unusable and refuses charges: {self._broken}")
            transaction = self._backend.transaction(self._acc, write)
            txn = self._guard(transaction.__enter__)
            try:
                yield _GuardedTxn(self, txn)
            except BaseException:
                if not transaction.__exit__(*sys.exc_info()):
                    raise
            else:
                self._guard(lambda: transaction.__exit__(None, None, None))

    def _guard(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except LedgerStateError as exc:
            self._broken = str(exc)
            raise

    # ------------------------------------------------------------- charging
    def charge(self, mechanism: Mechanism, label: str | None = None, *,
               times: int = 1) -> ChargeRecord:
        """Charge one run of ``mechanism``; refuse before recording if it would overspend.

        With ``times`` = k, charge k identical runs at once, all or nothing,
        in one transaction: exactly what k single charges would record (one
        run of the journal, the same spent curve, the same filter decision as
        the k-th single charge).

        Returns:
            The :class:`ChargeRecord` appended to the journal (the last one).

        Raises:
            BudgetExhausted: the filter refuses; nothing was recorded.
            InvalidArgumentError: ``mechanism`` or ``label`` is invalid.
            LedgerStateError: the ledger's state is unusable (fail closed).
        """
        label = check_label(label)
        times = check.positive_int("times", times)
        pid = os.getpid()
        if isinstance(mechanism, Mechanism):
            # A new mechanism's curve can take milliseconds: compute it (pure, cached)
            # before taking the store's lock, which other processes are waiting for.
            self._acc.curve(mechanism)
        with self._synced(write=True) as txn:
            verdict = self._acc.decide(mechanism, label, pid, times)
            if not verdict.admitted:
                remaining = self._remaining(mechanism)
                self._notify(LedgerEvent("refused", self, mechanism, label, None))
                raise BudgetExhausted(
                    f"charge {label!r} of {mechanism!r} refused: it would exceed the "
                    f"{self._acc.config.describe()}; nothing was recorded ({remaining})",
                    requested=mechanism, label=label, remaining=remaining)
            changes = self._acc.apply(verdict, label, time.time(), pid)
            txn.write(self._acc, changes)  # durable at commit, before the caller acts
        run = changes[-1].run
        assert run is not None
        record = run.record(run.count - 1)
        self._notify(LedgerEvent("charge", self, mechanism, label, record))
        return record

    def can_afford(self, mechanism: Mechanism) -> bool:
        """Whether :meth:`charge` would admit ``mechanism`` now (same code path; records nothing)."""
        with self._synced(write=False):
            return self._acc.decide(mechanism, None, os.getpid()).admitted

    def _notify(self, event: LedgerEvent) -> None:
        for fn in list(self._listeners):
            fn(event)

    # --------------------------------------------------------------- queries
    def epsilon(self, delta: float | None = None) -> float:
        """The running ε: a bound on the privacy loss valid at any stopping time.

        With probability ≥ 1 − δ, the privacy loss of everything charged so far
        is at most this value, whatever was chosen adaptively (noise, batch
        size, which mechanism next) and whenever you stop (docs/theory.md §3).
        It is a tail bound at exactly ``delta`` (default: the ledger's δ).

        A filter's guarantee is a separate statement: the whole interaction is
        (ε_target, δ)-DP (:attr:`target`). This value is not capped by the
        target: the smaller of two statements that each hold at δ holds only
        at 2δ (docs/theory.md §4). Returns 0.0 before any charge.

        Raises:
            InvalidArgumentError: no ``delta`` given and the ledger has none.
        """
        with self._synced(write=False):
            return self._acc.epsilon(self._query_delta(delta))

    def guarantee(self) -> Guarantee:
        """The one statement to report for this ledger, chosen by its configuration.

        With an (ε, δ) filter whose target was fixed before the first charge,
        it is the filter's: the whole interaction is (ε_target, δ)-DP, however
        it went. Otherwise it is the odometer's tail bound at the ledger's δ.
        The choice depends on the configuration only, never on the outcome,
        so the statement holds at δ; picking the smaller of the two after
        seeing both would hold only at 2δ (docs/theory.md §4).

        Raises:
            InvalidArgumentError: the ledger has no δ.

        Example:
            >>> from privguard import Ledger, mechanisms as M
            >>> ledger = Ledger(epsilon=3.0, delta=1e-5)
            >>> _ = ledger.charge(M.Gaussian(10.0))
            >>> g = ledger.guarantee()
            >>> g.kind, g.epsilon, g.delta
            ('filter', 3.0, 1e-05)
        """
        with self._synced(write=False):
            return guarantee_of(self._acc)

    def nonadaptive_epsilon(self, delta: float | None = None) -> float:
        """ε of the spent curve by the improved conversion (what Opacus' RDP accountant reports).

        NOT a guarantee when noise, batch size or stopping were chosen
        adaptively: it is valid only for a sequence fixed in advance. Use
        :meth:`epsilon` for a number you may report.
        """
        with self._synced(write=False):
            return self._acc.nonadaptive_epsilon(self._query_delta(delta))

    def remaining(self, mechanism: Mechanism | None = None) -> Remaining:
        """What is left; with ``mechanism``, how many more of it would be admitted."""
        if mechanism is not None and not isinstance(mechanism, Mechanism):
            raise InvalidArgumentError("mechanism", mechanism, "must be a privguard mechanism")
        with self._synced(write=False):
            return self._remaining(mechanism)

    def _remaining(self, mechanism: Mechanism | None) -> Remaining:
        acc, delta = self._acc, self._acc.config.delta
        return Remaining(
            epsilon_target=acc.config.epsilon,
            delta=delta,
            epsilon_spent=None if delta is None else acc.epsilon(delta),
            headroom=acc.headroom(mechanism or (acc.journal.last.mechanism
                                                if acc.journal.last else None)),
            repeats=None if mechanism is None else acc.repeats(mechanism, None, os.getpid()),
        )

    def _query_delta(self, delta: float | None) -> float:
        if delta is None:
            if self._acc.config.delta is None:
                raise InvalidArgumentError("delta", None, "this ledger has no δ; pass delta=...")
            return self._acc.config.delta
        return check.delta("delta", delta)

    @property
    def orders(self) -> np.ndarray:
        """The grid of Rényi orders (a read-only numpy array)."""
        return self._acc.orders

    @property
    def spent(self) -> np.ndarray:
        """The composed RDP curve of everything charged, on :attr:`orders` (a new array)."""
        with self._synced(write=False):
            return np.array(self._acc.spent())

    @property
    def spent_curve(self) -> RDPCurve:
        """:attr:`spent` as an :class:`RDPCurve`."""
        return RDPCurve._trusted(self.orders, self.spent)

    @property
    def delta(self) -> float | None:
        """The ledger's δ (filter and odometer), or None."""
        return self._acc.config.delta

    @property
    def target(self) -> tuple[float, float] | None:
        """The filter's (ε, δ), or None without an (ε, δ) filter."""
        cfg = self._acc.config
        return None if cfg.epsilon is None or cfg.delta is None else (cfg.epsilon, cfg.delta)

    @property
    def plan(self) -> Plan | None:
        """The plan in force: declared, or fixed from the first charge (None before it)."""
        with self._synced(write=False):
            return self._acc.plan

    @property
    def path(self) -> str | None:
        """The ledger's file, or None for an in-memory ledger."""
        return None if self._store is None else self._store.path

    @property
    def events(self) -> tuple[dict[str, Any], ...]:
        """Explicit, logged actions recorded in the journal (retargets, migrations)."""
        with self._synced(write=False):
            return tuple(self._acc.events)

    @property
    def runs(self) -> tuple[Run, ...]:
        """The journal as runs of identical consecutive charges (compact)."""
        with self._synced(write=False):
            return tuple(self._acc.journal.runs())

    @property
    def history(self) -> History:
        """Every admitted charge, one :class:`ChargeRecord` each, expanded from :attr:`runs`."""
        return History(self.runs)

    def add_listener(self, fn: Callable[[LedgerEvent], None]) -> None:
        """Call ``fn(event)`` after every admitted charge and every refusal.

        The event is delivered after the journal is updated; an exception
        raised by ``fn`` propagates to the caller of ``charge``.
        """
        if not callable(fn):
            raise InvalidArgumentError("listener", fn, "must be callable")
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[LedgerEvent], None]) -> None:
        """Stop calling ``fn``.

        Raises:
            InvalidArgumentError: ``fn`` is not a listener of this ledger.
        """
        if fn not in self._listeners:
            raise InvalidArgumentError("listener", fn, "is not a listener of this ledger")
        self._listeners.remove(fn)

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
        cfg = self._acc.config
        mode = cfg.odometer if cfg.odometer in _config.NEW_ODOMETER_MODES else None
        return Ledger(orders=self.orders, rdp_budget=budget, delta=delta, odometer=mode)

    def __repr__(self) -> str:
        cfg = self._acc.config
        parts = [f"{cfg.orders.size} orders", cfg.describe()]
        if cfg.delta is not None:
            parts.append(f"odometer={cfg.odometer!r} at δ={cfg.delta:g}")
        parts.append(f"{self._acc.journal.charges} charges")
        return f"Ledger({', '.join(parts)})"
