"""The "paper" and "tight" odometers' bound (docs/theory.md §3.9) in high precision."""

from __future__ import annotations

from typing import Any


def family_bound(families: Any, orders: Any, spent: Any, delta: float) -> Any:
    """At mpmath's working precision: for each order and family (scale, ratio,
    log_inv_weight), the smallest member f whose exact size scale·log(2|Λ|/δ)/(α − 1)·
    ratio^(f − 1) is at least ``spent``, its size + (log|Λ| + log_inv_weight(f) +
    log(1/δ))/(α − 1); the minimum over all."""
    import mpmath as mp

    n, d = len(orders), mp.mpf(delta)
    best = mp.inf
    for a, s in zip(orders, spent):
        a, s = mp.mpf(float(a)), mp.mpf(float(s))
        for scale, ratio, log_inv_weight in families:
            first = scale * mp.log(2 * n / d) / (a - 1)
            f = 1
            while first * ratio ** (f - 1) < s:
                f += 1
            best = min(best, first * ratio ** (f - 1)
                       + (mp.log(n) + log_inv_weight(f) + mp.log(1 / d)) / (a - 1))
    return best
