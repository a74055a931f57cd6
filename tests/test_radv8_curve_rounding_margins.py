"""Review radv8: the reported numbers of Gaussian or zCDP curves are not below their exact
values, even from the curves rounded to nearest that privguard computed before checkpoint
curves version 8 (task adv8: α/fl(2σ²) and fl(ρα), up to about 2u relative below α/(2σ²)
and ρα, u = 2⁻⁵³), as a caller's own curve (an ``RDPCurve``, a spent array given to an
``Odometer``) may still be.

Each output has an upward rounding margin with room for that input error (the argument is
beside each margin): the mixture odometer's stopping test (``_odometer._error_bound``, twice
its rounding bound), the paper odometer's eligibility slack (``_odometer._slack``), the
conversions' ``SLACK`` (nonadaptive ε, ``RDPCurve.epsilon`` and ``delta``, the filter and
budget meter, tests/test_adv8_gaussian_rounding.py). Each test below takes the curve to nearest at
the float parameter, the spent value at an output's edge where one decides, and compares
the output with its formula evaluated in mpmath at the EXACT curve α/(2σ²) or ρα. Each fails
with its margin set to 0 (``_error_bound`` returning 0 and ``_SUM_EXCESS = 0``: the 10
mixture tests on those curves fail; ``_slack`` returning 0: the 8 paper tests; ``SLACK = 0``:
the 10 conversion tests; review radv8).
"""

from __future__ import annotations

import struct

import mpmath as mp
import numpy as np
import pytest

from privguard import Ledger, Odometer, RDPCurve
from privguard import mechanisms as M

mp.mp.dps = 50


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


def _exact_curve(kind: str, param: float, alpha: float) -> mp.mpf:
    a = mp.mpf(alpha)
    return a / (2 * mp.mpf(param) ** 2) if kind == "gaussian" else mp.mpf(param) * a


def _mechanism(kind: str, param: float) -> M.Mechanism:
    return M.Gaussian(param) if kind == "gaussian" else M.ZCDP(param)


def _nearest(kind: str, param: float, orders) -> np.ndarray:
    """The curve as privguard computed it before checkpoint curves version 8: α/fl(2σ²) and
    fl(ρα), to nearest (about half the values up to 2.2u below the exact ones)."""
    grid = np.asarray(orders, dtype=float)
    return grid / (2 * param**2) if kind == "gaussian" else param * grid


def _params(kind: str, count: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return [float(s) for s in 10 ** rng.uniform(-1.5, 1.5, count)]
    return [float(r) for r in 10 ** rng.uniform(-4, 1, count)]


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
@pytest.mark.parametrize("orders", [[1.5], [2.0], [8.0], [256.0], [1.5, 8.0, 64.0]])
def test_mixture_epsilon_is_not_below_the_exact_root(kind, orders):
    # ε reported is verified: Σ_α w_α exp((α−1)(ε − S(α))) ≥ Σ_α w_α / δ at the exact S (the
    # mixture's Ville bound at δ, docs/theory.md §3). One order: the root is S + log(1/(wδ))/(α−1)
    # and the float curve's error moves it one for one.
    grid = np.array(orders)
    odo = Odometer(grid)
    w = [mp.mpf(float(x)) for x in odo.weights]
    for delta in (1e-5, 1e-10):
        for param in _params(kind, 40, len(orders) + int(orders[0])):
            eps = odo.epsilon(_nearest(kind, param, grid), delta)
            exact = [_exact_curve(kind, param, a) for a in orders]
            left = mp.fsum(wi * mp.exp((mp.mpf(a) - 1) * (mp.mpf(eps) - s))
                           for wi, a, s in zip(w, orders, exact))
            assert left >= mp.fsum(w) / mp.mpf(delta), (kind, orders, delta, param, eps)


def test_ledger_epsilon_one_order_gaussian():
    # through a ledger (the mixture odometer with the plan's weights, one order; today's
    # curve, rounded up)
    delta, alpha, sigma = 1e-6, 8.0, 0.9
    ledger = Ledger(delta=delta, orders=[alpha])
    ledger.charge(M.Gaussian(sigma))
    w = mp.mpf(float(ledger._acc.odometer(delta).weights[0]))
    a = mp.mpf(alpha)
    root = _exact_curve("gaussian", sigma, alpha) + mp.log(1 / (w * mp.mpf(delta))) / (a - 1)
    assert mp.mpf(ledger.epsilon()) >= root


def _edge(member_used, lo: float, hi: float) -> float:
    """The float x in [lo, hi] at which ``member_used`` holds and at one of whose neighbours
    it does not (it holds at one end of [lo, hi] only, and is monotone between)."""
    i, j = _bits(lo), _bits(hi)
    at_lo = member_used(_float(i))
    assert member_used(_float(j)) != at_lo
    while j - i > 1:
        mid = (i + j) // 2
        i, j = (mid, j) if member_used(_float(mid)) == at_lo else (i, mid)
    return _float(i if at_lo else j)


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
@pytest.mark.parametrize("alpha", [1.5, 3.0, 8.0, 1e4])
def test_paper_epsilon_at_a_filter_size_edge_is_not_below_the_exact_formula(kind, alpha):
    # seed 001 eq. 5: ε = size_f + log(1/(w_f δ))/(α−1) with f the smallest member whose size
    # 2^(f−1)·log(2|Λ|/δ)/(α−1) is ≥ S. At the largest float spent S for which the odometer
    # uses member f, the exact curve (above S by up to 2u) must still fit member f.
    odo = Odometer(np.array([alpha]), "paper")
    a = mp.mpf(alpha)
    for delta in (1e-5, 1e-12, 0.3):
        d = mp.mpf(delta)
        size = mp.log(2 / d) / (a - 1)

        def formula(f: int) -> mp.mpf:
            return 2 ** (f - 1) * size + (mp.log(2 * f * f) + mp.log(1 / d)) / (a - 1)

        for f in (1, 2, 3, 5, 9):
            limit = float(formula(f) * (1 + mp.mpf(2) ** -40))

            def uses_f(x: float, limit=limit) -> bool:
                return odo.epsilon(_nearest(kind, x, [alpha]), delta) <= limit

            x = _edge(uses_f, 1e-4, 1e6) if kind == "gaussian" else _edge(uses_f, 1e-14, 1e6)
            eps = odo.epsilon(_nearest(kind, x, [alpha]), delta)
            exact_spent, g = _exact_curve(kind, x, alpha), 1
            while exact_spent > 2 ** (g - 1) * size:
                g += 1
            assert mp.mpf(eps) >= formula(g), (kind, alpha, delta, f, g, x, eps)


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
@pytest.mark.parametrize("alpha", [1.5, 2.0, 8.0, 64.0, 256.0])
def test_nonadaptive_epsilon_is_not_below_the_exact_conversion(kind, alpha):
    # improved conversion (Canonne, Kamath & Steinke 2020, Prop. 12) of the exact curve, as
    # nonadaptive_epsilon and RDPCurve.epsilon compute it (conv.epsilon_per_order); and
    # RDPCurve's classic ε (Mironov 2017, Prop. 3) and δ (its inverse) of the same curve
    a = mp.mpf(alpha)
    for delta in (1e-5, 1e-9):
        d = mp.mpf(delta)
        for param in _params(kind, 30, int(alpha)):
            tau = _exact_curve(kind, param, alpha)
            improved = tau - (mp.log(d) + mp.log(a)) / (a - 1) + mp.log((a - 1) / a)
            curve = RDPCurve([alpha], _nearest(kind, param, [alpha]))
            assert mp.mpf(curve.epsilon(delta)) >= improved, (kind, alpha, param)
            ledger = Ledger(delta=delta, orders=[alpha])  # today's curve, rounded up
            ledger.charge(_mechanism(kind, param))
            assert mp.mpf(ledger.nonadaptive_epsilon()) >= improved, (kind, alpha, param)
            classic = tau + mp.log(1 / d) / (a - 1)
            assert mp.mpf(curve.epsilon(delta, method="classic")) >= classic
            eps = float(improved) + 0.5
            exact_delta = (mp.exp((a - 1) * (tau - mp.mpf(eps))) / a
                           * (1 - 1 / a) ** (a - 1))
            assert mp.mpf(curve.delta(eps)) >= min(exact_delta, 1)
