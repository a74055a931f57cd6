"""Privacy odometers: a running ε valid at any adaptively chosen stopping time.

Construction (seed 001 Alg. 2, Cor. 2, Thm 2, eq. 5; formulas.md §3): fix in
advance, for every order α of the grid Λ, a schedule of filter sizes
ε^1(α) < ε^2(α) < ... and weights w_{α,f} > 0 with Σ_{α,f} w_{α,f} ≤ 1. After
each charge, f(α) is the smallest f with spent(α) ≤ ε^f(α). Then with
probability ≥ 1 − δ over the whole (adaptive, adaptively stopped)
interaction,

    |Loss| ≤ min_α [ ε^{f(α)}(α) + log(1/(w_{α,f(α)}·δ)) / (α−1) ].

Proof: partition the views by (α, f); on each part the interaction equals the
truncated odometer, a filter of size ε^f(α) (Cor. 2, from Thm 1), whose
privacy loss exceeds ε^f(α) + log(1/δ')/(α−1) with probability ≤ δ' by the
RDP tail bound (seed 001 eq. 2; Mironov 2017 Prop. 3). Summing δ' = w·δ over
the parts gives δ. The reported bound is a TAIL bound on the privacy loss,
the form Theorem 2 states, which also implies (ε, δ)-DP of the stopped
interaction for that ε. The naive conversion of the spent curve is not such
a bound under adaptivity.

Any countable family of (α, size, weight) members fixed in advance, with
total weight ≤ 1, is valid by the same partition argument; the bound is then
the minimum over the members whose size is ≥ spent(α). Two families:

* ``"paper"`` — exactly seed 001 §4.5 / eq. 5: sizes
  ε^f(α) = 2^(f−1)·log(2|Λ|/δ)/(α−1), weights 1/(|Λ|·2f²), f ≥ 1. Its
  weights sum to π²/12 ≈ 0.822, not 1.
* ``"tight"`` (default) — the paper's family unchanged, plus a finer family
  on the unused mass 1 − π²/12: sizes 0.2·ε^1(α)·√2^(g−1), weights
  (1 − π²/12)·6/(π²g²)/|Λ|, g ≥ 1. Because the paper's members are all still
  there with the same weights, it never reports more than ``"paper"``; the
  finer sizes help when the spend is far below the paper's first filter
  (typical for DP-SGD at its optimal order). docs/theory.md §3 has the
  argument and the measured gain.
"""

from __future__ import annotations

import math

import numpy as np

from privguard._errors import InvalidArgumentError

PAPER = "paper"
TIGHT = "tight"
MODES = (TIGHT, PAPER)


class _Family:
    """Members (α, size_f(α), weight_f/|Λ|) for f = 1, 2, ...: geometric sizes."""

    def __init__(self, scale: float, ratio: float, log_inv_weight) -> None:
        self.scale = scale  # first size, relative to log(2|Λ|/δ)/(α−1)
        self.ratio = ratio
        self.log_inv_weight = log_inv_weight  # f -> log(1/weight_f)

    def bound(self, spent: np.ndarray, orders: np.ndarray, delta: float) -> np.ndarray:
        """Per order: size of the smallest eligible member + its penalty."""
        n = orders.size
        first = self.scale * math.log(2 * n / delta) / (orders - 1)
        log_r = math.log(self.ratio)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # smallest f >= 1 with spent <= first * ratio^(f-1), fixed up for rounding
            f = 1.0 + np.maximum(0.0, np.ceil(np.log(np.maximum(spent / first, 1e-300)) / log_r))
            f = np.where(np.isfinite(spent), f, 1.0)
            size = first * np.exp((f - 1) * log_r)
            under = spent > size
            f = np.where(under, f + 1, f)
            size = np.where(under, first * np.exp((f - 1) * log_r), size)
            lower = first * np.exp((f - 2) * log_r)
            over = (f > 1) & (spent <= lower)
            f = np.where(over, f - 1, f)
            size = np.where(over, lower, size)
            penalty = (math.log(n) + self.log_inv_weight(f) + math.log(1 / delta)) / (orders - 1)
            out = size + penalty
        return np.where(np.isfinite(spent), out, np.inf)


_PAPER_MASS = math.pi**2 / 12  # Σ_f 1/(2f²)
# seed 001 §4.5 and eq. 5: sizes 2^(f−1)·log(2|Λ|/δ)/(α−1), weights 1/(2f²).
_PAPER_FAMILY = _Family(1.0, 2.0, lambda f: np.log(2.0 * f * f))
# The finer family on the mass the paper leaves unused: weights
# (1 − π²/12)·6/(π²g²), which sum to exactly 1 − π²/12 over g >= 1.
_FINE_FAMILY = _Family(
    0.2, math.sqrt(2.0),
    lambda g: np.log(math.pi**2 * g * g / 6.0) - math.log(1.0 - _PAPER_MASS),
)
_FAMILIES = {PAPER: (_PAPER_FAMILY,), TIGHT: (_PAPER_FAMILY, _FINE_FAMILY)}


class Odometer:
    """A running (ε, δ) bound for adaptive sequences; pure, no state of its own.

    The bound is a function of the spent curve only (and of the grid, mode
    and δ, all fixed in advance), so it can be evaluated for a whole batch of
    spent curves at once (:meth:`epsilon_batch`).

    Example:
        >>> import numpy as np
        >>> odo = Odometer(np.array([2.0, 4.0, 8.0]), "paper")
        >>> spent = np.array([2.0, 4.0, 8.0]) * 0.05   # a Gaussian, rho = 0.05
        >>> round(odo.epsilon(spent, delta=1e-5), 3)
        3.801
    """

    def __init__(self, orders: np.ndarray, mode: str = TIGHT) -> None:
        if mode not in MODES:
            raise InvalidArgumentError("odometer", mode, f"must be one of {MODES}")
        self.orders = orders
        self.mode = mode

    def epsilon_batch(self, spent: np.ndarray, delta: float) -> np.ndarray:
        """The bound for each row of ``spent`` (shape (..., |Λ|))."""
        spent = np.asarray(spent, dtype=float)
        per_order = np.minimum.reduce(
            [fam.bound(spent, self.orders, delta) for fam in _FAMILIES[self.mode]])
        return np.min(per_order, axis=-1)

    def epsilon(self, spent: np.ndarray, delta: float) -> float:
        """The running ε at ``delta`` for one spent curve."""
        return float(self.epsilon_batch(np.asarray(spent, dtype=float)[None, :], delta)[0])
