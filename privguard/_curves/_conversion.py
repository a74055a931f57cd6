"""Conversions between RDP curves and (ε, δ)-DP, order by order.

All functions are vectorised over a grid of orders; ``delta`` may be a scalar
or one value per order (a filter's per-order share of δ). A share of 0 gives
ε = +inf at that order (the order is unusable), never an exception.

Every ε and δ these functions return is rounded up (task ul): the formula is
evaluated in round-to-nearest floats, as Opacus writes it, and then raised by
a proven bound on that evaluation's error (:data:`SLACK`, docs/theory.md §1.2), so
the value is never below the exact value of its formula at the float inputs.
"""

from __future__ import annotations

import numpy as np

IMPROVED = "improved"
CLASSIC = "classic"
METHODS = (IMPROVED, CLASSIC)

#: Relative rounding slack of a conversion (task ul): 2⁻⁴⁸ = 32 u (u = 2⁻⁵³) times the
#: sum of the magnitudes of the terms (and 1). Error analysis (docs/theory.md §1.2,
#: "Conversions"): with each log, log1p and exp within 4 ulps (8 u relative; glibc and
#: numpy's SIMD loops are within 4) and each +, −, ×, ÷ within half an ulp (u), the
#: improved ε = (τ − a) + b errs by at most 14.2 u·A + 2.1 u·τ + 9.2 u·|b| + 2.2 u, with
#: A = (|log δ| + |log α|)/(α−1) ≥ |a| (a's log δ, log α, sum and quotient: 12 u·A) and
#: b = log((α−1)/α) (the quotient's u twice, 2.1 u absolute, and log's 8 u·|b|); the
#: classic one by 11 u·|log δ|/(α−1) + u·τ. 16 u covers each; the other 16 u cover the
#: rounding of the slack itself and of the final addition (at most u of the sum).
#: The SLACK·τ part needs at most 2.1 u·τ + u·τ (the final addition's share), so it also
#: covers a τ up to 2.2 u (relative) below the exact curve, as a Gaussian's α/fl(2σ²) or a
#: zCDP's fl(ρα) rounded to nearest is (privguard's before checkpoint curves version 8,
#: task adv8; a caller's RDPCurve may still be): ε moves by at most 2.2 u·τ, and δ's exponent by
#: 2.2 u·(α−1)·τ of :func:`log_delta_per_order`'s 32 u·(α−1)·τ (review radv8,
#: tests/test_radv8_curve_rounding_margins.py, tests/test_adv8_gaussian_rounding.py).
SLACK = 2.0**-48


def improved_terms(orders: np.ndarray, delta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-order terms of the improved conversion, ε = (ε(α) − a) + b, and its slack.

    a = (log δ + log α)/(α−1) and b = log((α−1)/α), as Opacus writes them, and
    s = SLACK·((|log δ| + |log α|)/(α−1) + |b| + 1), the part of the rounding bound that
    does not depend on ε(α) (:func:`improved_upper` adds SLACK·ε(α)). A filter caches
    them once its δ shares are fixed. A zero share gives a = −inf and s = +inf, hence
    ε = +inf at that order.
    """
    with np.errstate(divide="ignore"):
        log_d, log_a = np.log(delta), np.log(orders)
        a = (log_d + log_a) / (orders - 1)
        b = np.log((orders - 1) / orders)
        s = SLACK * (((np.abs(log_d) + np.abs(log_a)) / (orders - 1) + np.abs(b)) + 1.0)
    return a, b, s


def improved_upper(rdp: np.ndarray, terms: tuple[np.ndarray, np.ndarray, np.ndarray]
                   ) -> np.ndarray:
    """The improved ε of each order's RDP value ``rdp`` (≥ 0), rounded up: Opacus'
    expression (rdp − a) + b plus the slack s + SLACK·rdp (:data:`SLACK`). Monotone in
    ``rdp`` (every operation rounds monotonically): the fast path relies on it
    (privguard/_accounting/_fastpath.py). NaN only where rdp = +inf meets a = −inf."""
    a, b, s = terms
    with np.errstate(over="ignore"):  # a value near the largest float: +inf, refused
        return ((rdp - a) + b) + (s + SLACK * rdp)


def epsilon_per_order(orders: np.ndarray, rdp: np.ndarray, delta, method: str = IMPROVED
                      ) -> np.ndarray:
    """ε at which each order's RDP value gives (ε, δ)-DP, rounded up (:data:`SLACK`).

    improved (Canonne, Kamath & Steinke 2020, Prop. 12 / Balle et al. 2020,
    Thm. 21; formulas.md §1; what Opacus' ``get_privacy_spent`` uses):
        ε = ε(α) − (log δ + log α)/(α−1) + log((α−1)/α)
    written with the same operations, in the same order, as Opacus, then raised by
    the bound on their rounding: at most a few 10⁻¹⁵ (relative to the terms) above
    Opacus' value, never below the exact one.

    classic (Mironov 2017, Prop. 3; formulas.md §1; seed 001 eq. 2):
        ε = ε(α) + log(1/δ)/(α−1)
    This one is also a tail bound on the privacy loss,
    P(Loss > ε) ≤ δ, which is the form the odometer needs (seed 001 Thm 2).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if method == IMPROVED:
            eps = improved_upper(np.abs(rdp), improved_terms(orders, delta))
        elif method == CLASSIC:
            c = np.log(delta) / (orders - 1)
            eps = (rdp - c) + ((SLACK * np.abs(rdp) + SLACK * np.abs(c)) + SLACK)
        else:  # pragma: no cover - guarded by callers
            raise ValueError(method)
    # inf - inf can only arise from rdp = inf with delta = 0: unusable either way.
    return np.where(np.isnan(eps), np.inf, eps)


def log_delta_per_order(orders: np.ndarray, rdp: np.ndarray, epsilon: float | np.ndarray,
                        method: str = IMPROVED) -> np.ndarray:
    """log δ at which each order's RDP value gives (ε, δ)-DP, rounded up (:data:`SLACK`).

    ``epsilon`` may be an array broadcast against ``orders`` (random-K tuning's ε̂ per
    order, privguard/_mechanisms/_repeat_select.py): the bound holds element by element.

    improved (the inverse of the above; formulas.md §1):
        δ = exp((α−1)(ε(α) − ε)) / α · (1 − 1/α)^(α−1)
    classic (Mironov 2017, Prop. 3): δ = exp((α−1)(ε(α) − ε)).
    The slack: (α−1)(ε(α) − ε) errs by at most 3.1 u·(α−1)(|ε(α)| + |ε|), log α by
    8 u·|log α|, (α−1)·log1p(−1/α) by u (1/α's rounding, scaled by the derivative
    α/(α−1) and by α−1) plus 9 u of its value, so SLACK times their sum and 1 covers
    them and the sums (docs/theory.md §1.2). A further SLACK is added for the exp a
    caller takes (:func:`delta_from_log`).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        am1 = orders - 1
        log_d = am1 * (rdp - epsilon)
        size = am1 * (np.abs(rdp) + abs(epsilon))
        if method == IMPROVED:
            log_a, tail = np.log(orders), am1 * np.log1p(-1 / orders)
            log_d = (log_d - log_a) + tail
            size = (size + np.abs(log_a)) + np.abs(tail)
        log_d = log_d + SLACK * (size + 2.0)
    return np.where(np.isnan(log_d), np.inf, log_d)


def delta_from_log(log_delta: float) -> float:
    """δ = exp(log δ), capped at 1, rounded up: exp errs by at most 4 ulps relative,
    which the SLACK already in ``log_delta`` (:func:`log_delta_per_order`) covers
    (e^(32 u) − 1 > 16 u); one step up covers a subnormal result's absolute rounding."""
    with np.errstate(over="ignore", under="ignore"):
        value = float(np.nextafter(np.exp(log_delta), np.inf))
    return min(1.0, value)


def rdp_budget_per_order(orders: np.ndarray, epsilon: float, delta) -> np.ndarray:
    """The RDP level at each order that converts to (ε, δ) (improved), round to nearest.

    The inverse of the improved conversion in ``rdp``, as a choice (δ shares, a step
    count's starting guess): within ulps of the exact level, either side. A run's
    admission is decided by the filter with :func:`improved_upper`, never by this.
    """
    a, b, _ = improved_terms(orders, delta)
    return _level(epsilon, a, b)


def _level(epsilon: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(ε + a) − b, round to nearest: the improved conversion solved for ε(α), from its
    terms (:func:`improved_terms`). NaN (ε = +inf meets a = −inf at a zero share) is
    −inf: the order admits nothing."""
    with np.errstate(invalid="ignore", over="ignore"):
        budget = (epsilon + a) - b
    return np.where(np.isnan(budget), -np.inf, budget)


def rdp_budget_below(orders: np.ndarray, epsilon: float, terms) -> np.ndarray:
    """The RDP level at each order below which the improved ε stays ≤ ``epsilon``
    exactly, rounded down: (ε + a) − b, lowered by the slack s + SLACK·(ε + its value)
    (:data:`SLACK`; the same terms :func:`improved_upper` adds, and the rounding of
    this expression's two sums)."""
    a, b, s = terms
    budget = _level(epsilon, a, b)  # −inf stays −inf below
    with np.errstate(invalid="ignore", over="ignore"):
        budget = budget - ((s + SLACK * abs(epsilon)) + SLACK * np.abs(budget))
    return np.where(np.isnan(budget), -np.inf, budget)


def best(orders: np.ndarray, eps: np.ndarray) -> tuple[float, float]:
    """The smallest ε over the grid, clamped at 0, and the order achieving it."""
    if eps.size == 0 or np.all(np.isinf(eps) & (eps > 0)):
        return float("inf"), float("nan")
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(orders[i])
