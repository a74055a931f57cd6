"""What a ledger answers: the running ε, the guarantee, what is left, its curve and journal.

A mixin of :class:`privguard.Ledger`: every query reads the accounting inside
the ledger's lock, after the store replayed what other writers appended.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from privguard import _validation as check
from privguard._accounting._budget import Budget, budget_from, budget_inputs, budget_of
from privguard._accounting._journal import History, Run
from privguard._accounting._plan import Plan
from privguard._accounting._results import Guarantee, Remaining, guarantee_of, stated_delta
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism
from privguard._mechanisms._curve import RDPCurve

if TYPE_CHECKING:
    from privguard._accounting._accounting import Accounting


class LedgerQueries:
    """Queries of :class:`privguard.Ledger` (see the module docstring)."""

    _acc: Accounting
    _store: Any

    if TYPE_CHECKING:  # provided by the Ledger
        def _synced(self, write: bool) -> AbstractContextManager[Any]: ...
        def _unused_now(self) -> int: ...

    def epsilon(self, delta: float | None = None) -> float:
        """The running ε: a bound on the privacy loss valid at any stopping time.

        With probability ≥ 1 − δ, the privacy loss of everything charged so far
        is at most this value, whatever was chosen adaptively (noise, batch
        size, which mechanism next) and whenever you stop (docs/theory.md §3).
        It is a tail bound at exactly ``delta`` (default: the ledger's δ; after a
        retarget, the δ the ledger was created with, fixed before the first output,
        as :meth:`guarantee` states it: a δ chosen after outputs is not covered).

        A filter's guarantee is a separate statement: the whole interaction is
        (ε_target, δ)-DP (:attr:`target`). This value is not capped by the
        target: the smaller of two statements that each hold at δ holds only
        at 2δ (docs/theory.md §4). Returns 0.0 before any charge.

        For a run with ``attach(..., witnesses=True)`` the tail bound is proven for the
        run without the witnesses' refusals; for the witnessed run, as (ε, δ)-DP where it
        stops before this value passes an ε up to the target (docs/theory.md §16.5).

        Raises:
            InvalidArgumentError: no ``delta`` given and no δ was fixed before the first
                output (the ledger has none, or only one set by a later retarget).
        """
        with self._synced(write=False):
            return self._acc.epsilon(self._query_delta(delta))

    def guarantee(self) -> Guarantee:
        """The one statement to report for this ledger, chosen by its configuration.

        With an (ε, δ) filter whose target was fixed before the first charge,
        it is the filter's: the whole interaction is (ε_target, δ)-DP, however
        it went. Otherwise it is the odometer's tail bound at the ledger's δ;
        after a retarget, at the δ the ledger was created with (fixed before
        the first output; a δ chosen afterwards is not covered).
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

    def budget(self) -> Budget | None:
        """The budget meter: how much of the filter's (ε, δ) target is consumed.

        In ε units, from the quantities the filter decides with (docs/theory.md
        §12): a charge is admitted exactly when the meter after it stays ≤ the
        target, and it never decreases (between retargets). A measure of
        consumption, not a privacy statement: report :meth:`guarantee`. Cheap
        (about the cost of :meth:`epsilon`; a hybrid filter's part A evaluates
        one PLD composition the first time its count reaches a new grid point).

        Returns:
            A :class:`Budget`, or None when the ledger has no (ε, δ) filter
            (an odometer-only ledger, or a child with a per-order RDP budget).

        Example:
            >>> from privguard import Ledger, mechanisms as M
            >>> ledger = Ledger(epsilon=3.0, delta=1e-5)
            >>> ledger.budget().spent, Ledger(delta=1e-5).budget()
            (0.0, None)
        """
        with self._synced(write=False):
            inputs = budget_inputs(self._acc)
        return budget_from(inputs)  # outside the lock: part A's PLD may take a while

    def nonadaptive_epsilon(self, delta: float | None = None) -> float:
        """ε of the spent curve by the improved conversion (what Opacus' RDP accountant reports).

        On the ledger's orders: Opacus' number rounded up by the bound on its rounding
        (2⁻⁴⁸ times the terms' magnitudes and 1; docs/theory.md §1.2) unless an order Opacus'
        default grid lacks does better, and then smaller: 11 (Opacus goes 10.9, 12), or
        64 to 1024 where Opacus' best is its largest, 63. NOT a guarantee when noise, batch size or stopping were chosen
        adaptively: it is valid only for a sequence fixed in advance. Use
        :meth:`epsilon` for a number you may report. Returns 0.0 before any charge, as
        Opacus does for an empty history.
        """
        with self._synced(write=False):
            return self._acc.nonadaptive_epsilon(self._query_delta(delta, stated=False))

    def remaining(self, mechanism: Mechanism | None = None) -> Remaining:
        """What is left; with ``mechanism``, how many more of it would be admitted."""
        if mechanism is not None and not isinstance(mechanism, Mechanism):
            raise InvalidArgumentError("mechanism", mechanism, "must be a privguard mechanism")
        with self._synced(write=False):
            return self._remaining(mechanism)

    def _remaining(self, mechanism: Mechanism | None) -> Remaining:
        acc, delta = self._acc, stated_delta(self._acc)
        return Remaining(
            epsilon_target=acc.config.epsilon,
            delta=delta,
            epsilon_spent=None if delta is None else acc.epsilon(delta),
            headroom=acc.headroom(mechanism or (acc.journal.last.mechanism
                                                if acc.journal.last else None)),
            repeats=None if mechanism is None else acc.repeats(mechanism, None, os.getpid()),
            budget=budget_of(acc),
        )

    def _query_delta(self, delta: float | None, stated: bool = True) -> float:
        """``delta`` checked, or by default the δ a running ε is stated at: the ledger's,
        after a retarget the one it was created with (docs/theory.md §4); with
        ``stated=False`` (a number that claims no adaptive validity) the ledger's δ."""
        if delta is None and not stated and self._acc.config.delta is not None:
            return self._acc.config.delta
        if delta is None:
            fixed = stated_delta(self._acc)
            if fixed is None and self._acc.config.delta is not None:
                raise InvalidArgumentError(
                    "delta", None, f"the ledger's δ = {self._acc.config.delta:g} was set by a "
                    "retarget of a ledger created without δ, after outputs, so it is not "
                    "covered (docs/theory.md §4); pass delta=... fixed in advance")
            if fixed is None and self._acc.config.filter == "strict":
                # Task lo5: a child (Ledger.child without delta=) refused with no reason.
                raise InvalidArgumentError(
                    "delta", None, "this ledger is a strict per-order RDP filter "
                    "(Ledger(rdp_budget=...) or parent.child(...)) created without δ: its "
                    "budget is a curve, not an (ε, δ) target, and a child does not take its "
                    "parent's δ; pass delta=... here, or to child(..., delta=...) or "
                    "Ledger(..., delta=...)")
            if fixed is None:
                raise InvalidArgumentError("delta", None, "this ledger has no δ; pass delta=...")
            return fixed
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
        """Every admitted charge, one :class:`ChargeRecord` each, expanded from :attr:`runs`;
        its :attr:`~History.released` and :attr:`~History.leased_unused` split them into
        the steps released and those leased but never released (all spent)."""
        with self._synced(write=False):
            return History(self._acc.journal.runs(), self._unused_now())
