"""The lease sizing's meter cap as it was before branch lc (frozen, for comparison only):
one ``rdp_meter`` per count, m0 recomputed, a plain bisection. The code in
privguard/_accounting/_lease.py must give the same answer bit for bit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privguard._accounting._filters import DPFilter
from privguard._accounting._lease import FRACTION


def old_rdp_meter(flt: DPFilter, spent: np.ndarray) -> float:
    weights = flt.resolve_weights(None)
    flt.admits(spent, weights)
    a, b = flt._terms
    with np.errstate(invalid="ignore"):
        eps = (spent - a) + b
    if eps.size == 0:
        return math.inf
    low = float(np.min(np.where(np.isnan(eps), np.inf, eps)))
    return max(0.0, low)


def old_meter_room(flt: Any, spent: np.ndarray, curve: np.ndarray, times: int, n: int,
                   held: int = 0) -> int:
    if held:
        spent = spent - held * curve
    if getattr(flt, "kind", None) == "hybrid" and flt.a_alive:
        return n
    if getattr(flt, "kind", None) == "strict" and n > times:
        charged = (curve > 0) & np.isfinite(flt.budget)
        if not charged.any():
            return n
        most = float(np.min(FRACTION * (flt.budget[charged] - spent[charged]) / curve[charged]))
        return n if not np.isfinite(most) else max(times, min(n, int(max(most, 0.0))))
    dp = flt if isinstance(flt, DPFilter) else getattr(flt, "fallback", None)
    if not isinstance(dp, DPFilter) or dp.weights is None or n <= times:
        return n
    m0 = old_rdp_meter(dp, spent)
    room = FRACTION * (dp.epsilon - m0)

    def fits(m: int) -> bool:
        return old_rdp_meter(dp, spent + m * curve) - m0 <= room

    if fits(n):
        return n
    lo, hi = times, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
