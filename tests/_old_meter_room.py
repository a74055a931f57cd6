"""The lease sizing's meter cap as it was before branch lc (frozen, for comparison only):
one ``rdp_meter`` per count (which computed ``DPFilter.admits``' comparison only to fill
its cache), under its own ``errstate``, NaN orders dropped by ``np.where``. The branches
lc did not touch (the strict filter, part A alive) are the current code's. The code in
privguard/_accounting/_lease.py must give the same answer bit for bit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privguard._accounting._filters import DPFilter
from privguard._accounting._lease import FRACTION, meter_room
from privguard._curves import _conversion as conv


def old_rdp_meter(flt: DPFilter, spent: np.ndarray) -> float:
    weights = flt.resolve_weights(None)
    flt.admits(spent, weights)
    a, b, s = flt._terms
    with np.errstate(invalid="ignore"):
        # task ul's rounding slack (conv.improved_upper), written out: the comparison is
        # of lc's sizing, not of the conversion's rounding
        eps = ((spent - a) + b) + (s + conv.SLACK * spent)
    if eps.size == 0:
        return math.inf
    low = float(np.min(np.where(np.isnan(eps), np.inf, eps)))
    return max(0.0, low)


def old_meter_room(flt: Any, spent: np.ndarray, curve: np.ndarray, times: int, n: int,
                   held: int = 0) -> int:
    dp = flt if isinstance(flt, DPFilter) else getattr(flt, "fallback", None)
    if (getattr(flt, "kind", None) == "strict" or (getattr(flt, "kind", None) == "hybrid"
                                                   and flt.a_alive)
            or not isinstance(dp, DPFilter) or dp.weights is None or n <= times):
        # the strict filter, part A alive, no RDP meter: branches lc left as they were
        return meter_room(flt, spent, curve, times, n, held)
    if held:
        spent = spent - held * curve
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
