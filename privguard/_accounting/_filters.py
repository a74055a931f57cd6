"""Privacy filters: admit or refuse a charge before anything is released.

Pure accounting rules with no I/O. Every filter has the same small protocol,
which the ledger drives in the one code path that both checks and applies
(so ``can_afford`` and ``charge`` cannot disagree):

* ``fix(plan_curve)`` fixes, once and before any output, what the filter
  derives from the plan (e.g. δ shares); ``fixed()`` / ``load_fixed(d)``
  serialise that choice, which the journal records;
* ``decide(spent_after, mechanism, times) -> (admitted, state)`` is pure;
* ``apply(state)`` commits the state a decision returned (a filter whose
  only state is the spent curve returns None);
* ``state()`` / ``load_state(d)`` for checkpoints; ``config()`` for the
  ledger's configuration.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting._results import exact
from privguard._accounting._shares import DeltaShares
from privguard._curves import _conversion as conv
from privguard._errors import LedgerStateError


class DPFilter:
    """An (ε, δ)-DP filter over the whole grid (formulas.md §2, docs/theory.md §2).

    Each order α gets a share w_α of δ (Σ w_α ≤ 1), fixed before any output
    is seen. A charge is admitted while at least one order α keeps the
    improved conversion of its spent RDP, at δ_α = w_α·δ, within ε:

        ∃α: spent(α) + new(α) − (log δ_α + log α)/(α−1) + log((α−1)/α) ≤ ε.

    On the views where α survives, the interaction is the single-order filter
    of seed 001 Theorem 1 at budget b(α), hence (ε, δ_α)-DP; partitioning the
    views by a surviving order gives (ε, Σ δ_α)-DP. The comparison is made in
    ε space with Opacus' own expression rounded up by the bound on its rounding
    (task ul, :func:`conv.improved_upper`), so with all of δ on one order the
    filter admits the steps Opacus' accountant would, except those within a few
    10⁻¹⁵ (relative) of the target, where the exact value may overspend.
    """

    kind = "dp"

    def __init__(self, epsilon: float, delta: float, shares: DeltaShares,
                 orders: np.ndarray, weights: np.ndarray | None = None, *,
                 shape_delta: float | None = None) -> None:
        self.epsilon = check.positive_finite("epsilon", epsilon)
        self.delta = check.delta("delta", delta, minimum=0.0)  # a ledger's, or its δ_B
        # The δ the shares are chosen at and a re-read journal is held to: ``delta``, or for
        # a hybrid's part B the δ_B before task fp, up to an ulp above ``delta``. Shares
        # are any data-independent choice, so choosing them there is sound; and a journal
        # re-read admits what the code that wrote it admitted (it ran under that budget).
        self.shape_delta = self.delta if shape_delta is None else float(shape_delta)
        self.shares = shares
        self.orders = orders
        self.weights = weights  # fixed at the first admitted charge
        self._terms_for: np.ndarray | None = None

    def resolve_weights(self, plan: np.ndarray | None) -> np.ndarray:
        """The weights in force, or the ones ``plan`` would fix (fixes nothing)."""
        if self.weights is not None:
            return self.weights
        w = np.asarray(self.shares.weights(self.orders, self.epsilon, self.shape_delta, plan),
                       dtype=float)
        return _valid_weights(w, self.orders, f"delta shares {self.shares}")

    # -- the filter protocol --------------------------------------------------
    def fix(self, plan_curve: np.ndarray | None) -> None:
        """Fix the δ shares from the planned step's curve (once; later calls keep them)."""
        self.weights = self.resolve_weights(plan_curve)

    def fixed(self) -> dict[str, Any]:
        return {"weights": None if self.weights is None else self.weights.tolist()}

    def load_fixed(self, data: dict[str, Any]) -> None:
        self.weights = _valid_weights(np.array(data["weights"], dtype=float), self.orders,
                                      "recorded delta shares")

    def decide(self, spent_after: np.ndarray, mechanism: Any, times: int) -> tuple[bool, None]:
        return self.admits(spent_after, self.resolve_weights(None)), None

    def apply(self, state: None) -> None:
        pass

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def terms(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The improved conversion's (a, b) and slack s at these weights, as :meth:`admits`
        compares (cached once the weights are fixed; the budget meter reads the same arrays)."""
        if weights is not self._terms_for:
            self._terms = conv.improved_terms(self.orders, delta_parts(weights, self.delta))
            self._terms_for = weights
        return self._terms

    def admits(self, spent_after: np.ndarray, weights: np.ndarray) -> bool:
        """Whether some order's improved ε, rounded up (:func:`conv.improved_upper`), is
        ≤ ε: then its exact value at these floats is too (task ul; before, the
        round-to-nearest value was compared, and a charge whose exact ε lay within ulps
        above the budget could be admitted). Monotone in ``spent_after``."""
        # a is finite or -inf (zero share), so no inf - inf can arise here.
        return bool((conv.improved_upper(spent_after, self.terms(weights))
                     <= self.epsilon).any())

    def admitted_at_weighted_deltas(self, spent_after: np.ndarray, weights: np.ndarray) -> bool:
        """Whether the rule before the exact δ split (review lo3) admitted this: δ_α converted at the products
        w_α·δ, which may sum a few ulps above δ (:func:`delta_parts` lowers them since).
        For journals re-read only (``Accounting._readmit``): a charge admitted then within
        ulps of the budget is refused by :meth:`admits` now, and its ledger would no longer
        open (review rlo3). Never for a new charge. At :attr:`shape_delta`: a hybrid's
        δ_B before task fp, up to an ulp above today's. Round to nearest, without the
        slack :meth:`admits` adds since task ul: its products are at least the δ_α main
        converted at, so this also admits every charge main's rule (:func:`delta_parts`,
        no slack) admitted, and a journal main wrote still opens."""
        a, b, _ = conv.improved_terms(self.orders,
                                      np.asarray(weights, dtype=float) * self.shape_delta)
        return bool(((spent_after - a) + b <= self.epsilon).any())

    def headroom(self, spent: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per-order RDP budget left (negative where an order is exhausted), rounded down
        (:func:`conv.rdp_budget_below`)."""
        return conv.rdp_budget_below(self.orders, self.epsilon, self.terms(weights)) - spent

    def describe(self) -> str:
        # the target as stated, never rounded (review lo2)
        return f"(ε={exact(self.epsilon)}, δ={exact(self.delta)}) filter"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "epsilon": self.epsilon, "delta": self.delta,
                "shares": self.shares.to_dict()}

    def state(self) -> dict[str, Any]:
        return {}


def delta_parts(weights: np.ndarray, delta: float) -> np.ndarray:
    """The δ_α = w_α·δ the filter converts at, with Σ δ_α ≤ δ exactly (docs/theory.md §2:
    the filter is (ε, Σ δ_α)-DP).

    The weights' float sum may exceed 1 (ten weights 0.1 sum to 1 + 5.6e-17; ``Explicit``
    accepts a sum up to 1 + 1e-12 for typed decimals), and each product w_α·δ is rounded:
    the δ_α as computed could sum above δ, spending more δ than the budget (task lo3).
    Where their exact sum exceeds δ, they are scaled by δ/Σ and then lowered an ulp at a
    time until it does not: a smaller δ_α converts to a larger ε, an over-count. A sum
    within δ is returned unchanged."""
    parts = np.asarray(weights, dtype=float) * delta
    if not _exceeds(parts, delta):
        return parts
    parts = parts * (delta / math.fsum(parts.tolist()))
    while _exceeds(parts, delta):
        parts = np.nextafter(parts, 0.0)
    return parts


def _exceeds(parts: np.ndarray, delta: float) -> bool:
    """Whether Σ parts > δ exactly. ``math.fsum`` rounds the exact sum of its floats
    correctly, and Σ parts − δ, a sum of floats, is 0 or at least the smallest subnormal
    in magnitude, so its rounded value has its sign (``math.fsum(parts)`` alone returns
    1.0 for ten weights 0.1: the rounded sum, not the exact one)."""
    return math.fsum([*parts.tolist(), -delta]) > 0.0


def _valid_weights(w: np.ndarray, orders: np.ndarray, what: str) -> np.ndarray:
    if w.shape != orders.shape or not np.all(np.isfinite(w)) or np.any(w < 0) \
            or w.sum() > 1 + 1e-12:
        raise LedgerStateError(f"{what} gave invalid weights {w}")
    w = np.array(w, dtype=float)
    w.setflags(write=False)
    return w


class StrictFilter:
    """An RDP filter that refuses if ANY order would exceed its budget.

    By seed 001 Theorem 1 applied at each order (the proof only needs every
    admitted sequence to stay within budget at that order, with refusals
    decided from past outputs), the interaction is (α, budget(α))-RDP at
    every order of the grid simultaneously. This is what a tuning theorem
    assuming a uniform per-candidate curve needs.
    """

    kind = "strict"

    def __init__(self, budget: np.ndarray, orders: np.ndarray) -> None:
        self.budget = check.rdp_values("rdp_budget", budget, orders.size)
        self.orders = orders
        self.weights = None

    def resolve_weights(self, plan: np.ndarray | None) -> None:
        return None

    def admits(self, spent_after: np.ndarray, weights: Any) -> bool:
        return bool((spent_after <= self.budget).all())

    def headroom(self, spent: np.ndarray, weights: Any) -> np.ndarray:
        return self.budget - spent

    # -- the filter protocol (nothing to fix, no state) -----------------------
    def fix(self, plan_curve: np.ndarray | None) -> None:
        pass

    def fixed(self) -> dict[str, Any]:
        return {}

    def load_fixed(self, data: dict[str, Any]) -> None:
        pass

    def decide(self, spent_after: np.ndarray, mechanism: Any, times: int) -> tuple[bool, None]:
        return self.admits(spent_after, None), None

    def apply(self, state: None) -> None:
        pass

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def describe(self) -> str:
        return "strict per-order RDP filter"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "budget": self.budget.tolist()}

    def state(self) -> dict[str, Any]:
        return {}
