"""Task adv8: the Gaussian and zCDP curves were rounded to nearest, not up.

``Gaussian(σ)`` charged fl(α / fl(2σ²)) (Mironov 2017, Prop. 7, as Opacus computes it) and
``ZCDP(ρ)`` charged fl(ρ·α) (Bun & Steinke 2016, Def. 1.1): each value could lie an ulp or
two below the exact value of its formula at the float inputs (about half of the values of a
grid did). Review radv8 fixed it (checkpoint curves version 8: each raised to the smallest
float at or above the exact value where it was below; a fix entry derived before is
re-derived with the older curves, ``_legacy.pre_gaussian_up``,
tests/test_radv8_gaussian_up_legacy.py). The filter's admission was sound regardless: the
conversion's slack (32 u of the RDP value, ~3 u used by its own rounding) covers a curve
value 2 u low, which the second test checks at the budget's edge (a ledger written before
version 8 still holds such totals). Exact values in mpmath (50 digits).
"""

from __future__ import annotations

import struct

import mpmath as mp
import numpy as np
import pytest

from privguard import mechanisms as M
from privguard._curves import _conversion as conv

mp.mp.dps = 50
ORDERS = np.array([1.5, 2.0, 3.0, 8.0, 32.0, 256.0, 1e4])


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


def test_gaussian_and_zcdp_curves_are_not_below_their_exact_formulas():
    low = []
    for sigma in [0.3, 0.7, 1.1, 3.0, 1e3]:
        curve = M.Gaussian(sigma).rdp(ORDERS)
        low += [(sigma, a) for a, v in zip(ORDERS.tolist(), curve.tolist())
                if mp.mpf(v) < mp.mpf(a) / (2 * mp.mpf(sigma) ** 2)]
    for rho in [1e-10, 0.1, 0.3]:
        curve = M.ZCDP(rho).rdp(ORDERS)
        low += [(rho, a) for a, v in zip(ORDERS.tolist(), curve.tolist())
                if mp.mpf(v) < mp.mpf(rho) * mp.mpf(a)]
    assert not low, low


@pytest.mark.parametrize("alpha", [1.5, 2.0, 8.0, 256.0])
def test_filter_edge_gaussian_is_within_target_at_the_exact_curve(alpha):
    # The smallest float σ whose Gaussian the filter's rounded-up comparison admits (all of δ
    # on one order): the improved conversion (Canonne, Kamath & Steinke 2020, Prop. 12) of the
    # EXACT α/(2σ²), not of its float, is still at most the target.
    delta = 1e-5
    orders = np.array([alpha])
    terms = conv.improved_terms(orders, delta)
    a = mp.mpf(alpha)
    floor = float(conv.improved_upper(np.zeros(1), terms)[0])  # ε of a zero curve
    for eps in [floor + 0.05 + 0.61 * k for k in range(12)]:
        def admitted(sigma: float) -> bool:
            return bool(conv.improved_upper(M.Gaussian(sigma).rdp(orders), terms)[0] <= eps)
        lo, hi = _bits(1e-2), _bits(1e4)
        assert admitted(_float(hi)) and not admitted(_float(lo))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if admitted(_float(mid)) else (mid, hi)
        sigma = _float(hi)
        tau = a / (2 * mp.mpf(sigma) ** 2)
        exact = tau - (mp.log(mp.mpf(delta)) + mp.log(a)) / (a - 1) + mp.log((a - 1) / a)
        assert exact <= eps, (alpha, eps, sigma)
