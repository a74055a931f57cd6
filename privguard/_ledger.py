"""The Ledger: the object users hold; every private computation is charged to it.

A ledger accounts on one grid of Rényi orders. It holds an optional filter
(a hard budget, checked before anything is recorded), an odometer (a running
ε valid at any adaptively chosen stopping time) when it knows δ, the journal
of charges, and listeners. Deciding and applying a charge happen in one code
path under one lock, so ``can_afford`` and ``charge`` cannot disagree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from privguard import _conversion as conv
from privguard import _validation as check
from privguard._base import Mechanism, mechanism_from_dict
from privguard._curve import RDPCurve
from privguard._errors import (
    BudgetExhausted,
    InvalidArgumentError,
    LedgerStateError,
    PrivguardError,
)
from privguard._filters import DPFilter, StrictFilter
from privguard._odometer import MODES, TIGHT, Odometer
from privguard._orders import DEFAULT_ORDERS
from privguard._shares import Concentrated, DeltaShares, shares_from_dict
from privguard._sqlite import SQLiteStore

STATE_FORMAT = "privguard.Ledger"
STATE_VERSION = 1
_CACHE_LIMIT = 4096


@dataclasses.dataclass(frozen=True)
class ChargeRecord:
    """One admitted charge: what was charged, when, and under which label."""

    index: int
    label: str | None
    mechanism: Mechanism
    time: float
    pid: int

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "mechanism": self.mechanism.to_dict(),
                "time": self.time, "pid": self.pid}


@dataclasses.dataclass(frozen=True)
class Remaining:
    """What is left of a ledger's budget, in forms a user can act on.

    Attributes:
        epsilon_target: the filter's ε (None without a (ε, δ) filter).
        delta: the ledger's δ (None if it has none).
        epsilon_spent: the running ε (odometer, capped by the target); None
            without δ.
        headroom: per-order RDP budget left (negative where an order is
            exhausted); None without a filter.
        repeats: how many more times the queried mechanism would be admitted
            (``math.inf`` if the ledger has no filter); None if no mechanism
            was given.
    """

    epsilon_target: float | None
    delta: float | None
    epsilon_spent: float | None
    headroom: np.ndarray | None
    repeats: float | None

    def __str__(self) -> str:
        parts = []
        if self.epsilon_spent is not None:
            parts.append(f"running ε = {self.epsilon_spent:.4g} at δ = {self.delta:g}")
        if self.epsilon_target is not None:
            parts.append(f"target ε = {self.epsilon_target:g}")
        if self.repeats is not None:
            parts.append(f"{self.repeats:g} more of the queried mechanism fit")
        return "; ".join(parts) or "no budget configured"


@dataclasses.dataclass(frozen=True)
class LedgerEvent:
    """What listeners receive: ``kind`` is ``"charge"`` or ``"refused"``."""

    kind: str
    ledger: Ledger
    mechanism: Mechanism
    label: str | None
    record: ChargeRecord | None


class _hybridmethod:
    """``Ledger.load_state_dict(sd)`` builds a ledger; ``ledger.load_state_dict(sd)`` loads in place."""

    def __init__(self, cls_func: Callable, inst_func: Callable) -> None:
        self.cls_func, self.inst_func = cls_func, inst_func
        self.__doc__ = inst_func.__doc__

    def __get__(self, obj, cls):
        if obj is None:
            return self.cls_func.__get__(None, cls)
        return self.inst_func.__get__(obj, cls)


class Ledger:
    """The privacy ledger: filters, odometer, journal and listeners over a grid of orders.

    Args:
        epsilon: target ε of a hard (ε, δ)-DP budget (a filter). Needs ``delta``.
        delta: δ of the filter and of the running odometer. Without ``epsilon``
            the ledger only reports (odometer, no refusals).
        orders: the grid of Rényi orders (default :data:`DEFAULT_ORDERS`).
        shares: how the (ε, δ) filter splits δ over orders (default
            ``Concentrated(0.9)``: 90% on the order optimal for ``plan``).
        plan: the mechanism the run intends to repeat (e.g. one DP-SGD step);
            fixes the order that gets most of δ. Default: the first charged
            mechanism, which is chosen before any output exists.
        rdp_budget: instead of (ε, δ), a per-order RDP budget (a mechanism,
            an :class:`RDPCurve` or one value per order), enforced strictly:
            refuse if ANY order would exceed.
        odometer: ``"tight"`` (default) or ``"paper"`` (seed 001 §4.5 exactly).
        listeners: callables receiving a :class:`LedgerEvent` per charge and
            per refusal.
        path: keep the journal in this SQLite file (created if missing).
            Reopening the same path resumes the same ledger; several processes
            may share it. The file's configuration must equal this one
            (use :meth:`Ledger.open` to adopt the stored configuration).
        retarget: with ``path``, a reason for opening an existing file with
            another (ε, δ) target or budget. The change is logged in the file;
            from then on the target no longer caps :meth:`epsilon`, since it
            was not fixed before the outputs were seen.

    Raises:
        InvalidArgumentError: any argument out of its domain.
        LedgerStateError: the file at ``path`` is unreadable, inconsistent,
            of a newer schema or of another configuration.

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

    def __init__(
        self,
        epsilon: float | None = None,
        delta: float | None = None,
        *,
        orders=None,
        shares: DeltaShares | None = None,
        plan: Mechanism | None = None,
        rdp_budget: Any = None,
        odometer: str = TIGHT,
        listeners=(),
        path: str | os.PathLike | None = None,
        retarget: str | None = None,
    ) -> None:
        self._orders = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        if odometer not in MODES:
            raise InvalidArgumentError("odometer", odometer, f"must be one of {MODES}")
        self._delta = None if delta is None else check.delta("delta", delta)
        if plan is not None and not isinstance(plan, Mechanism):
            raise InvalidArgumentError("plan", plan, "must be a privguard mechanism")
        if shares is not None and not isinstance(shares, DeltaShares):
            raise InvalidArgumentError("shares", shares, "must be Uniform(), Concentrated(...) or Explicit(...)")
        self._plan = plan
        self._odometer_mode = odometer
        self._filter: DPFilter | StrictFilter | None = None
        if epsilon is not None and rdp_budget is not None:
            raise InvalidArgumentError("rdp_budget", rdp_budget, "give either (epsilon, delta) or rdp_budget, not both")
        if epsilon is not None:
            eps = check.positive_finite("epsilon", epsilon)
            if self._delta is None:
                raise InvalidArgumentError("delta", delta, "an (ε, δ) budget needs delta in (0, 1)")
            self._filter = DPFilter(eps, self._delta, shares or Concentrated(), self._orders)
            if not self._filter.shares.needs_plan:  # fixed now, checked now
                self._filter.weights = self._filter.resolve_weights(None)
        elif rdp_budget is not None:
            self._filter = StrictFilter(self._budget_values(rdp_budget), self._orders)
        elif shares is not None:
            raise InvalidArgumentError("shares", shares, "only applies to an (epsilon, delta) budget")
        self._odometer = Odometer(self._orders, odometer)
        self._listeners: list[Callable[[LedgerEvent], None]] = []
        for fn in listeners:
            self.add_listener(fn)
        self._lock = threading.RLock()
        self._curves: dict[Mechanism, np.ndarray] = {}
        self._reset_journal()
        self._store: SQLiteStore | None = None
        self._txn_depth = 0
        self._events: list[dict[str, Any]] = []
        if retarget is not None and path is None:
            raise InvalidArgumentError("retarget", retarget, "only applies with path=")
        if path is not None:
            self._store = SQLiteStore(path)
            _, self._events = self._store.initialise_or_check(self._config(), retarget)
            with self._lock, self._transaction(write=False):
                pass  # replay and verify the journal now: fail at open, not at first charge

    @classmethod
    def open(cls, path: str | os.PathLike, *, listeners=()) -> Ledger:
        """Open an existing ledger file with the configuration stored in it.

        Raises:
            LedgerStateError: no such file, or it is unreadable or inconsistent.
        """
        config, _ = SQLiteStore(path).read_config()
        return cls(**_init_kwargs(config), listeners=listeners, path=path)

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

    @property
    def path(self) -> str | None:
        """The ledger's file, or None for an in-memory ledger."""
        return None if self._store is None else self._store.path

    @property
    def events(self) -> tuple[dict[str, Any], ...]:
        """Explicit, logged actions recorded in the ledger's file (e.g. retargets)."""
        return tuple(self._events)

    @property
    def _retargeted(self) -> bool:
        return any(e.get("event") == "retarget" for e in self._events)

    @contextlib.contextmanager
    def _transaction(self, write: bool):
        """Sync with the file (replaying other processes' charges) inside a transaction.

        Reentrant: nested uses share the outer transaction. Yields the
        connection, or None for an in-memory ledger. Any inconsistency marks
        the ledger broken (it then refuses everything) and raises.
        """
        if self._store is None or self._txn_depth > 0:
            yield None if self._store is None else self._conn
            return
        self._fail_if_broken()
        with self._store.transaction(write) as conn:
            self._txn_depth, self._conn = 1, conn
            try:
                self._sync(conn)
                yield conn
            finally:
                self._txn_depth, self._conn = 0, None

    def _sync(self, conn) -> None:
        store = self._store
        try:
            store.verify_config(conn)
            for idx, t, label, mdict, curve, pid in store.rows_after(conn, len(self._records)):
                if curve.shape != self._orders.shape:
                    raise LedgerStateError(f"journal row {idx}: curve is not on the ledger's grid")
                self._replay(mechanism_from_dict(mdict), label, t, pid, f"journal row {idx}",
                             curve=curve)
            store.accept_rows()
            count, spent, digest = store.totals(conn)
            if (count != len(self._records) or digest != store.last_digest
                    or not np.array_equal(spent, self._spent_locked())):
                raise LedgerStateError(
                    f"{store.path}: the journal does not replay to the recorded totals "
                    f"({len(self._records)} rows replayed, totals say {count})")
        except LedgerStateError as exc:
            self._broken = str(exc)
            raise
        except PrivguardError as exc:
            self._broken = f"{store.path}: journal unreadable ({exc})"
            raise LedgerStateError(self._broken) from exc

    # ------------------------------------------------------------------ state
    def _reset_journal(self) -> None:
        self._records: list[ChargeRecord] = []
        # spent = base + run_count * run_curve: T identical consecutive charges
        # add up as T × curve, exactly as Opacus' compute_rdp(steps=T).
        self._base = np.zeros(self._orders.size)
        self._run_key: Mechanism | None = None
        self._run_curve = np.zeros(self._orders.size)
        self._run_count = 0
        self._broken: str | None = None

    def _budget_values(self, budget: Any) -> np.ndarray:
        if isinstance(budget, Mechanism):
            return budget._rdp_checked(self._orders)
        return check.rdp_values("rdp_budget", budget, self._orders.size)

    def _curve(self, mechanism: Mechanism) -> np.ndarray:
        curve = self._curves.get(mechanism)
        if curve is None:
            curve = mechanism._rdp_checked(self._orders)
            if len(self._curves) >= _CACHE_LIMIT:
                self._curves.clear()
            self._curves[mechanism] = curve
        return curve

    def _spent_after(self, mechanism: Mechanism, curve: np.ndarray, times: int) -> np.ndarray:
        if mechanism == self._run_key:
            return self._base + (self._run_count + times) * self._run_curve
        return (self._base + self._run_count * self._run_curve) + times * curve

    def _fail_if_broken(self) -> None:
        if self._broken is not None:
            raise LedgerStateError(f"ledger is unusable and refuses charges: {self._broken}")

    # ------------------------------------------------ the one decision path
    def _decide(self, mechanism: Any, label: Any, times: int = 1, curve: np.ndarray | None = None):
        """Check a charge; return (admitted, spent_after, weights, curve). Records nothing."""
        if not isinstance(mechanism, Mechanism):
            raise InvalidArgumentError("mechanism", mechanism, "must be a privguard mechanism")
        if label is not None and not isinstance(label, str):
            raise InvalidArgumentError("label", label, "must be a string or None")
        if curve is None:
            self._fail_if_broken()
            curve = self._curve(mechanism)
        spent_after = self._spent_after(mechanism, curve, times)
        if self._filter is None:
            return True, spent_after, None, curve
        plan = self._curve(self._plan) if self._plan is not None else curve
        weights = self._filter.resolve_weights(plan)
        return self._filter.admits(spent_after, weights), spent_after, weights, curve

    def _check_and_apply(self, mechanism: Any, label: Any, apply: bool):
        with self._lock:
            with self._transaction(write=apply) as conn:
                admitted, spent_after, weights, curve = self._decide(mechanism, label)
                if not apply:
                    return admitted
                if not admitted:
                    remaining = self._remaining_locked(mechanism)
                    self._notify(LedgerEvent("refused", self, mechanism, label, None))
                    raise BudgetExhausted(
                        f"charge {label!r} of {mechanism!r} refused: it would exceed the "
                        f"{self._filter.describe()}; nothing was recorded ({remaining})",
                        requested=mechanism, label=label, remaining=remaining)
                t, pid = time.time(), os.getpid()
                if conn is not None:
                    digest = self._store.append(conn, len(self._records), t, label,
                                                mechanism.to_dict(), curve, pid, spent_after)
            # Committed (durable) before anything in memory changes or the caller acts.
            if conn is not None:
                self._store.last_digest = digest
            record = self._apply(mechanism, curve, label, weights, t, pid)
            self._notify(LedgerEvent("charge", self, mechanism, label, record))
            return record

    def _replay(self, mechanism: Mechanism, label: str | None, t: float, pid: int, where: str,
                curve: np.ndarray | None = None) -> ChargeRecord:
        """Re-admit a recorded charge through the decision path; refusal = inconsistent state."""
        admitted, _, weights, curve = self._decide(mechanism, label, curve=curve)
        if not admitted:
            raise LedgerStateError(f"{where} ({label!r}) would be refused by the recorded budget")
        return self._apply(mechanism, curve, label, weights, t, pid)

    def _apply(self, mechanism: Mechanism, curve: np.ndarray, label: str | None,
               weights: np.ndarray | None, t: float, pid: int) -> ChargeRecord:
        """Record an admitted charge in memory (the one place state changes)."""
        if weights is not None and self._filter.weights is None:
            self._filter.weights = weights  # fixed at the first admitted charge
        if mechanism == self._run_key:
            self._run_count += 1
        else:
            self._base = self._base + self._run_count * self._run_curve
            self._run_key, self._run_curve, self._run_count = mechanism, curve, 1
        record = ChargeRecord(len(self._records), label, mechanism, t, pid)
        self._records.append(record)
        return record

    def _notify(self, event: LedgerEvent) -> None:
        for fn in list(self._listeners):
            fn(event)

    # ------------------------------------------------------------ public API
    def charge(self, mechanism: Mechanism, label: str | None = None) -> ChargeRecord:
        """Charge one run of ``mechanism``; refuse before recording if it would overspend.

        Returns:
            The :class:`ChargeRecord` appended to the journal.

        Raises:
            BudgetExhausted: the filter refuses; nothing was recorded.
            InvalidArgumentError: ``mechanism`` or ``label`` is invalid.
            LedgerStateError: the ledger's state is unusable (fail closed).
        """
        return self._check_and_apply(mechanism, label, apply=True)

    def can_afford(self, mechanism: Mechanism) -> bool:
        """Whether :meth:`charge` would admit ``mechanism`` now (same code path; records nothing)."""
        return self._check_and_apply(mechanism, None, apply=False)

    def epsilon(self, delta: float | None = None) -> float:
        """The running ε: valid whatever was adapted and whenever you stop.

        It is the odometer's bound (seed 001 Thm 2 and eq. 5, in the mode
        chosen at construction): with probability ≥ 1 − δ the privacy loss of
        everything charged so far is at most this value, even though noise,
        batch size and stopping were chosen adaptively. With an (ε, δ)
        filter and ``delta`` ≥ its δ, the value is capped at the filter's
        target, which the filter guarantees for the whole interaction. Each
        of those two statements holds at δ on its own; a report that takes
        the smaller one after the fact is covered at 2δ by a union bound
        (docs/theory.md §4). Returns 0.0 before any charge.

        Raises:
            InvalidArgumentError: no ``delta`` given and the ledger has none.
        """
        with self._lock, self._transaction(write=False):
            d = self._query_delta(delta)
            if not self._records:
                return 0.0
            eps = self._odometer.epsilon(self._spent_locked(), d)
            if (isinstance(self._filter, DPFilter) and d >= self._filter.delta
                    and not self._retargeted):
                eps = min(eps, self._filter.epsilon)
            return eps

    def nonadaptive_epsilon(self, delta: float | None = None) -> float:
        """ε of the spent curve by the improved conversion (what Opacus reports).

        NOT a guarantee when noise, batch size or stopping were chosen
        adaptively: it is valid only for a sequence fixed in advance. Use
        :meth:`epsilon` for a number you may report.
        """
        with self._lock, self._transaction(write=False):
            d = self._query_delta(delta)
            return conv.best(self._orders, conv.epsilon_per_order(self._orders, self._spent_locked(), d))[0]

    def remaining(self, mechanism: Mechanism | None = None) -> Remaining:
        """What is left; with ``mechanism``, how many more of it would be admitted."""
        with self._lock, self._transaction(write=False):
            return self._remaining_locked(mechanism)

    def _remaining_locked(self, mechanism: Mechanism | None) -> Remaining:
        f = self._filter
        headroom = None
        if isinstance(f, StrictFilter):
            headroom = f.headroom(self._spent_locked(), None)
        elif f is not None:
            plan = self._plan or mechanism or self._run_key
            if f.weights is not None or plan is not None:
                weights = f.resolve_weights(None if plan is None else self._curve(plan))
                headroom = f.headroom(self._spent_locked(), weights)
        repeats = None if mechanism is None else self._repeats(mechanism)
        return Remaining(
            epsilon_target=f.epsilon if isinstance(f, DPFilter) else None,
            delta=self._delta,
            epsilon_spent=self.epsilon() if self._delta is not None else None,
            headroom=headroom,
            repeats=repeats,
        )

    def _repeats(self, mechanism: Mechanism) -> float:
        """Largest k such that k more charges of ``mechanism`` would each be admitted."""
        if self._filter is None:
            return math.inf
        fits = lambda k: self._decide(mechanism, None, times=k)[0]
        if not fits(1):
            return 0
        lo, hi = 1, 2
        while fits(hi):
            lo, hi = hi, hi * 2
            if hi > 2**62:
                return math.inf
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def _query_delta(self, delta: float | None) -> float:
        if delta is None:
            if self._delta is None:
                raise InvalidArgumentError("delta", None, "this ledger has no δ; pass delta=...")
            return self._delta
        return check.delta("delta", delta)

    def _spent_locked(self) -> np.ndarray:
        return self._base + self._run_count * self._run_curve

    @property
    def orders(self) -> np.ndarray:
        """The grid of Rényi orders (a read-only numpy array)."""
        return self._orders

    @property
    def spent(self) -> np.ndarray:
        """The composed RDP curve of everything charged, on :attr:`orders` (a new array)."""
        with self._lock, self._transaction(write=False):
            return np.array(self._spent_locked())

    @property
    def spent_curve(self) -> RDPCurve:
        """:attr:`spent` as an :class:`RDPCurve`."""
        return RDPCurve._trusted(self._orders, self.spent)

    @property
    def delta(self) -> float | None:
        """The ledger's δ (filter and odometer), or None."""
        return self._delta

    @property
    def target(self) -> tuple[float, float] | None:
        """The filter's (ε, δ), or None without an (ε, δ) filter."""
        return (self._filter.epsilon, self._filter.delta) if isinstance(self._filter, DPFilter) else None

    @property
    def history(self) -> tuple[ChargeRecord, ...]:
        """The journal: one :class:`ChargeRecord` per admitted charge, in order."""
        with self._lock, self._transaction(write=False):
            return tuple(self._records)

    def add_listener(self, fn: Callable[[LedgerEvent], None]) -> None:
        """Call ``fn(event)`` after every admitted charge and every refusal.

        The event is delivered after the journal is updated; an exception
        raised by ``fn`` propagates to the caller of ``charge``.
        """
        if not callable(fn):
            raise InvalidArgumentError("listener", fn, "must be callable")
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[LedgerEvent], None]) -> None:
        self._listeners.remove(fn)

    def child(self, budget: Any, *, delta: float | None = None) -> Ledger:
        """A strict sub-ledger for one tuning candidate.

        It refuses any charge that would exceed ``budget`` (a mechanism, an
        :class:`RDPCurve` or per-order values) at ANY order, so the candidate
        stays within the per-candidate curve a tuning theorem assumed. The
        parent is not charged by the child: the caller charges the parent the
        tuning bound, which covers every candidate. A candidate that spends
        exactly its declared run (T charges of one step declared as a T-step
        mechanism) is admitted: T identical charges add up as T × curve.

        Example:
            >>> from privguard import Ledger, mechanisms as M
            >>> parent = Ledger(epsilon=8.0, delta=1e-5)
            >>> run = M.SubsampledGaussian(1.0, 0.01, steps=50)
            >>> kid = parent.child(run)
            >>> for _ in range(50):
            ...     _ = kid.charge(M.SubsampledGaussian(1.0, 0.01))
            >>> kid.can_afford(M.SubsampledGaussian(1.0, 0.01))
            False
        """
        return Ledger(orders=self._orders, rdp_budget=self._budget_values(budget),
                      delta=delta, odometer=self._odometer_mode)

    # ------------------------------------------------------- serialisation
    def _config(self) -> dict[str, Any]:
        return {
            "orders": self._orders.tolist(),
            "delta": self._delta,
            "odometer": self._odometer_mode,
            "filter": None if self._filter is None else self._filter.config(),
            "plan": None if self._plan is None else self._plan.to_dict(),
        }

    def state_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot: configuration, journal, totals and a checksum."""
        with self._lock, self._transaction(write=False):
            body = {
                "format": STATE_FORMAT,
                "version": STATE_VERSION,
                "config": self._config(),
                "filter_state": {} if self._filter is None else self._filter.state(),
                "records": [r.to_dict() for r in self._records],
                "spent": self._spent_locked().tolist(),
            }
            body["checksum"] = _checksum(body)
            return body

    @classmethod
    def _from_state_dict(cls, state: Any) -> Ledger:
        """Build a ledger from :meth:`state_dict` output, validating everything first."""
        if not isinstance(state, dict):
            raise LedgerStateError(f"state must be a dict, got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise LedgerStateError(f"not a privguard ledger state (format={state.get('format')!r})")
        version = state.get("version")
        if not isinstance(version, int) or version > STATE_VERSION or version < 1:
            raise LedgerStateError(
                f"state version {version!r} is not supported by this privguard "
                f"(supports up to {STATE_VERSION}); refusing to load")
        body = {k: v for k, v in state.items() if k != "checksum"}
        if state.get("checksum") != _checksum(body):
            raise LedgerStateError("state checksum mismatch: the state was modified or corrupted")
        try:
            self = cls(**_init_kwargs(state["config"]))
            orders = self._orders
            records = [(r["label"], mechanism_from_dict(r["mechanism"]), r["time"], r["pid"])
                       for r in state["records"]]
            recorded_weights = state["filter_state"].get("weights")
            recorded_spent = np.array(state["spent"], dtype=float)
        except PrivguardError as exc:
            raise LedgerStateError(f"state does not load: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise LedgerStateError(f"state is malformed: {exc!r}") from exc
        # Replay the journal through the same decision path.
        for label, mechanism, t, pid in records:
            self._replay(mechanism, label, t, pid,
                         f"journal does not replay: charge {len(self._records)}")
        if recorded_weights is not None and (
                self._filter is None or self._filter.weights is None
                or not np.array_equal(np.array(recorded_weights), self._filter.weights)):
            raise LedgerStateError("recorded filter weights do not match the journal's replay")
        if recorded_spent.shape != orders.shape or not np.array_equal(recorded_spent, self._spent_locked()):
            raise LedgerStateError("journal does not replay to the recorded spent totals")
        return self

    def _load_state_dict_inplace(self, state: Any) -> Ledger:
        """Bring this ledger forward to ``state`` after validating it fully.

        The state must have this ledger's configuration (grid, δ, budget,
        odometer) and its journal must extend this ledger's journal (a
        checkpoint written later by this ledger, say): a ledger never goes
        backwards. A file-backed ledger accepts only a state its file already
        holds. Anything else raises :class:`LedgerStateError` and leaves this
        ledger unchanged. ``Ledger.load_state_dict(state)``, called on the
        class, builds a separate ledger from any valid state instead.
        """
        loaded = Ledger._from_state_dict(state)
        with self._lock, self._transaction(write=False):
            if self._store is not None:
                # The file is the journal: accept a state only if the file already holds it.
                mine = [(r.label, r.mechanism) for r in self._records[:len(loaded._records)]]
                theirs = [(r.label, r.mechanism) for r in loaded._records]
                if loaded._config() != self._config() or mine != theirs:
                    raise LedgerStateError(
                        f"{self._store.path}: the state to load is not a prefix of this "
                        "file's journal; a file-backed ledger never replaces its journal")
                return self
            if loaded._config() != self._config():
                raise LedgerStateError(
                    "state was written by a ledger with another configuration "
                    f"(grid, δ, budget or odometer): {loaded._config()} != {self._config()}")
            mine = [r.to_dict() for r in self._records]
            theirs = [r.to_dict() for r in loaded._records[:len(mine)]]
            if mine != theirs:
                raise LedgerStateError(
                    f"the state to load ({len(loaded._records)} charges) does not extend this "
                    f"ledger's journal ({len(mine)} charges): loading it would rewind or "
                    "rewrite spent budget. A ledger never goes backwards; build a separate "
                    "ledger with Ledger.load_state_dict(state) if that is what you mean")
            for name in ("_records", "_base", "_run_key", "_run_curve", "_run_count"):
                setattr(self, name, getattr(loaded, name))
            if self._filter is not None:
                self._filter.weights = loaded._filter.weights
            self._broken = None
        return self

    load_state_dict = _hybridmethod(_from_state_dict, _load_state_dict_inplace)

    # -------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """An in-memory ledger pickles as its verified state; a file-backed one as
        a reference to its file, reopened and verified on load. Listeners are
        not pickled (register them again)."""
        if self._store is not None:
            return {"path": self._store.path}
        return {"state": self.state_dict()}

    def __setstate__(self, data: dict[str, Any]) -> None:
        if "path" in data:
            other = Ledger.open(data["path"])
        else:
            other = Ledger._from_state_dict(data["state"])
        self.__dict__.update(other.__dict__)

    def __repr__(self) -> str:
        parts = [f"{self._orders.size} orders"]
        if self._filter is not None:
            parts.append(self._filter.describe())
        if self._delta is not None:
            parts.append(f"odometer={self._odometer_mode!r} at δ={self._delta:g}")
        parts.append(f"{len(self._records)} charges")
        return f"Ledger({', '.join(parts)})"


def _init_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """Ledger constructor arguments that reproduce a stored configuration."""
    kwargs = {"orders": config["orders"], "delta": config["delta"],
              "odometer": config["odometer"],
              "plan": None if config["plan"] is None else mechanism_from_dict(config["plan"])}
    budget = config["filter"]
    if budget is None:
        return kwargs
    if budget.get("kind") == "dp" and budget.get("delta") == config["delta"]:
        kwargs.update(epsilon=budget["epsilon"], shares=shares_from_dict(budget["shares"]))
    elif budget.get("kind") == "strict":
        kwargs["rdp_budget"] = budget["budget"]
    else:
        raise LedgerStateError(f"unknown budget configuration {budget!r}")
    return kwargs


def _checksum(body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()
