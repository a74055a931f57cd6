"""Conversions between RDP curves and (ε, δ)-DP, order by order.

All functions are vectorised over a grid of orders; ``delta`` may be a scalar
or one value per order (a filter's per-order share of δ). A share of 0 gives
ε = +inf at that order (the order is unusable), never an exception.
"""

from __future__ import annotations

import numpy as np

IMPROVED = "improved"
CLASSIC = "classic"
METHODS = (IMPROVED, CLASSIC)


def improved_terms(orders: np.ndarray, delta) -> tuple[np.ndarray, np.ndarray]:
    """The two per-order terms of the improved conversion, ε = (ε(α) − a) + b.

    a = (log δ + log α)/(α−1) and b = log((α−1)/α), as Opacus writes them. A
    filter caches them once its δ shares are fixed. A zero share gives
    a = −inf, hence ε = +inf at that order.
    """
    with np.errstate(divide="ignore"):
        a = (np.log(delta) + np.log(orders)) / (orders - 1)
    return a, np.log((orders - 1) / orders)


def epsilon_per_order(orders: np.ndarray, rdp: np.ndarray, delta, method: str = IMPROVED
                      ) -> np.ndarray:
    """ε at which each order's RDP value gives (ε, δ)-DP.

    improved (Canonne, Kamath & Steinke 2020, Prop. 12 / Balle et al. 2020,
    Thm. 21; formulas.md §1; what Opacus' ``get_privacy_spent`` uses):
        ε = ε(α) − (log δ + log α)/(α−1) + log((α−1)/α)
    written with the same operations, in the same order, as Opacus so the
    two agree bit for bit.

    classic (Mironov 2017, Prop. 3; formulas.md §1; seed 001 eq. 2):
        ε = ε(α) + log(1/δ)/(α−1)
    This one is also a tail bound on the privacy loss,
    P(Loss > ε) ≤ δ, which is the form the odometer needs (seed 001 Thm 2).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        if method == IMPROVED:
            a, b = improved_terms(orders, delta)
            eps = (rdp - a) + b
        elif method == CLASSIC:
            eps = rdp - np.log(delta) / (orders - 1)
        else:  # pragma: no cover - guarded by callers
            raise ValueError(method)
    # inf - inf can only arise from rdp = inf with delta = 0: unusable either way.
    return np.where(np.isnan(eps), np.inf, eps)


def log_delta_per_order(orders: np.ndarray, rdp: np.ndarray, epsilon: float,
                        method: str = IMPROVED) -> np.ndarray:
    """log δ at which each order's RDP value gives (ε, δ)-DP.

    improved (the inverse of the above; formulas.md §1):
        δ = exp((α−1)(ε(α) − ε)) / α · (1 − 1/α)^(α−1)
    classic (Mironov 2017, Prop. 3): δ = exp((α−1)(ε(α) − ε)).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        log_d = (orders - 1) * (rdp - epsilon)
        if method == IMPROVED:
            log_d = log_d - np.log(orders) + (orders - 1) * np.log1p(-1 / orders)
    return np.where(np.isnan(log_d), np.inf, log_d)


def rdp_budget_per_order(orders: np.ndarray, epsilon: float, delta) -> np.ndarray:
    """The RDP level at each order that converts to exactly (ε, δ) (improved).

    The inverse of :func:`epsilon_per_order` in ``rdp``: a run whose RDP at α
    stays at or below this value is (ε, δ)-DP by the improved conversion.
    """
    a, b = improved_terms(orders, delta)
    with np.errstate(invalid="ignore"):
        budget = (epsilon + a) - b
    return np.where(np.isnan(budget), -np.inf, budget)


def best(orders: np.ndarray, eps: np.ndarray) -> tuple[float, float]:
    """The smallest ε over the grid, clamped at 0, and the order achieving it."""
    if eps.size == 0 or np.all(np.isinf(eps) & (eps > 0)):
        return float("inf"), float("nan")
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(orders[i])
