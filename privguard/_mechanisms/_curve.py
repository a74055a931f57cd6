"""An immutable RDP curve on a fixed grid of orders.

:class:`RDPCurve` is both the value the ledger computes with (composition,
k-fold composition, order-wise maximum, conversions) and a mechanism in its
own right: a raw curve that can be charged.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves import _conversion as conv
from privguard._curves._upward import sum_up, times_up
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism


class RDPCurve(Mechanism):
    """An RDP curve ε(α) on a grid of orders; immutable and hashable.

    Charged as a mechanism on another grid, the curve is extended by
    monotonicity of Rényi divergence in α (formulas.md §1): the value at α is
    the value at the smallest own order ≥ α, and +inf above the largest own
    order. That is an upper bound, never an interpolation.

    Rényi divergence is non-decreasing in the order, so a curve that
    decreases is refused: each value must be at least the largest value at a
    smaller order minus the round-off tolerance ``1e-9 × that value + 1e-9``
    (``_validation.RDP_RTOL`` relative plus ``RDP_ATOL`` absolute; it
    absorbs the last-bit noise of curves computed in floating point, and is
    checked against the running maximum so that small decreases cannot
    accumulate). The same check applies to every mechanism's computed curve.

    Args:
        orders: strictly increasing orders in [1 + 10^-5, 10^6], as numbers
            (Python or numpy ints and floats; bools and strings are refused).
        epsilons: one RDP value per order, >= 0 (``inf`` allowed, NaN not),
            non-decreasing in the order up to the tolerance above.

    Raises:
        InvalidArgumentError: an argument breaks one of these rules; the
            message names it, its value and the rule.

    Example:
        >>> from privguard import RDPCurve
        >>> c = RDPCurve([2.0, 4.0], [0.5, 1.0])
        >>> (3 * c + c).epsilons
        (2.0, 4.0)
        >>> round(c.epsilon(delta=1e-5), 3)
        4.088
    """

    type_name = "RDPCurve"
    __slots__ = ("_hash", "_orders", "_values")
    _orders: np.ndarray
    _values: np.ndarray
    _hash: int

    def __init__(self, orders, epsilons) -> None:
        grid = check.orders("orders", orders)
        values = check.rdp_values("epsilons", epsilons, grid.size)
        check.non_decreasing("epsilons", epsilons, grid, values)
        object.__setattr__(self, "_orders", grid)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_hash", hash((grid.tobytes(), values.tobytes())))

    @classmethod
    def _trusted(cls, grid: np.ndarray, values: np.ndarray) -> RDPCurve:
        """Build from arrays already validated (internal fast path)."""
        self = object.__new__(cls)
        values = np.array(values, dtype=np.float64)
        values.setflags(write=False)
        object.__setattr__(self, "_orders", grid)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_hash", hash((grid.tobytes(), values.tobytes())))
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("RDPCurve is immutable")

    # -- value semantics --------------------------------------------------
    @property
    def orders(self) -> tuple[float, ...]:
        """The grid, as a tuple of floats."""
        return tuple(self._orders.tolist())

    @property
    def epsilons(self) -> tuple[float, ...]:
        """The RDP values, one per order, as a tuple of floats."""
        return tuple(self._values.tolist())

    def as_array(self) -> np.ndarray:
        """The RDP values as a new numpy array."""
        return np.array(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RDPCurve):
            return NotImplemented
        return bool(np.array_equal(self._orders, other._orders)
                    and np.array_equal(self._values, other._values))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        n = self._orders.size
        if n <= 4:
            return f"RDPCurve(orders={self.orders}, epsilons={self.epsilons})"
        return (f"RDPCurve({n} orders {self._orders[0]:g}..{self._orders[-1]:g}, "
                f"epsilons {self._values[0]:.4g}..{self._values[-1]:.4g})")

    def __reduce__(self):
        return (RDPCurve, (self.orders, self.epsilons))

    # -- composition ------------------------------------------------------
    def _same_grid(self, other: RDPCurve, op: str) -> None:
        if not isinstance(other, RDPCurve):
            raise InvalidArgumentError("other", other, f"{op} needs an RDPCurve")
        if not np.array_equal(self._orders, other._orders):
            raise InvalidArgumentError(
                "other.orders", other.orders,
                f"{op} needs curves on the same grid (got {self._orders.size} "
                f"and {other._orders.size} orders that differ)")

    def __add__(self, other: RDPCurve) -> RDPCurve:
        """Composition (adaptive too, with fixed parameters): curves add (the sum rounded
        up, never below the exact one: docs/theory.md §6)."""
        if isinstance(other, numbers.Number) and other == 0:
            return self
        self._same_grid(other, "composition")
        return RDPCurve._trusted(self._orders, sum_up(self._values, other._values))

    __radd__ = __add__  # so that sum([...]) works

    def __mul__(self, k: int) -> RDPCurve:
        """k-fold composition: k × the curve (k an integer, 0 <= k <= 2^53), rounded up as a
        journal sums k charges (docs/theory.md §6)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise InvalidArgumentError("k", check.short(k), "k-fold composition needs an integer k >= 0")
        n = check._as_int("k", k)
        if not 0 <= n <= check.MAX_STEPS:
            raise InvalidArgumentError("k", k, f"k-fold composition needs 0 <= k <= {check.MAX_STEPS}")
        return RDPCurve._trusted(self._orders, np.zeros_like(self._values) if n == 0
                                 else times_up(n, self._values))

    __rmul__ = __mul__

    def maximum(self, other: RDPCurve) -> RDPCurve:
        """Order-wise maximum: the uniform bound over two candidates (seed 000 Lemma 9)."""
        self._same_grid(other, "maximum")
        return RDPCurve._trusted(self._orders, np.maximum(self._values, other._values))

    # -- conversions ------------------------------------------------------
    def epsilon_and_order(self, delta: float, method: str = conv.IMPROVED
                          ) -> tuple[float, float]:
        """The smallest ε over the grid with (ε, δ)-DP, and the order achieving it.

        Valid for a sequence whose parameters were fixed in advance (or under
        a filter); for an adaptively chosen, adaptively stopped sequence use a
        ledger's odometer instead.
        """
        d = check.delta("delta", delta)
        _check_method(method)
        return conv.best(self._orders, conv.epsilon_per_order(self._orders, self._values, d, method))

    def epsilon(self, delta: float, method: str = conv.IMPROVED) -> float:
        """The smallest ε with (ε, δ)-DP (see :meth:`epsilon_and_order`)."""
        return self.epsilon_and_order(delta, method)[0]

    def optimal_order(self, delta: float, method: str = conv.IMPROVED) -> float:
        """The order at which the conversion to (ε, δ) is tightest."""
        return self.epsilon_and_order(delta, method)[1]

    def delta(self, epsilon: float, method: str = conv.IMPROVED) -> float:
        """The smallest δ with (ε, δ)-DP over the grid (capped at 1)."""
        e = check.non_negative_finite("epsilon", epsilon)
        _check_method(method)
        log_d = conv.log_delta_per_order(self._orders, self._values, e, method)
        return conv.delta_from_log(float(np.min(log_d)))  # rounded up (task ul)

    # -- as a mechanism ---------------------------------------------------
    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        if orders.size == self._orders.size and np.array_equal(orders, self._orders):
            return np.array(self._values)
        # Monotone extension: value at the smallest own order >= alpha.
        idx = np.searchsorted(self._orders, orders, side="left")
        ext = np.append(self._values, np.inf)
        return ext[idx]

    def _params(self) -> dict[str, Any]:
        return {"orders": list(self.orders), "epsilons": list(self.epsilons)}


def _check_method(method: str) -> None:
    # a str first: an array compared element-wise (ValueError, review fs)
    if not isinstance(method, str) or method not in conv.METHODS:
        raise InvalidArgumentError("method", method, f"must be one of {conv.METHODS}")
