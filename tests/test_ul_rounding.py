"""Task ul: every reported ε and δ rounded the safe way, and the filter's admission
conservative (docs/theory.md §1.2 "Conversions", §2). Exact values in mpmath (50 digits)."""

from __future__ import annotations

import struct

import mpmath as mp
import numpy as np
import pytest

from privguard import CLASSIC, DEFAULT_ORDERS, IMPROVED, Ledger, RDPCurve, single_order
from privguard import mechanisms as M
from privguard._curves import _conversion as conv

mp.mp.dps = 50
ORDERS = np.array(DEFAULT_ORDERS)


def _exact_epsilon(alpha: float, tau: float, delta: float, method: str):
    a, t, d = mp.mpf(alpha), mp.mpf(tau), mp.mpf(delta)
    if method == IMPROVED:  # CKS 2020 Prop. 12
        return t - (mp.log(d) + mp.log(a)) / (a - 1) + mp.log((a - 1) / a)
    return t - mp.log(d) / (a - 1)  # Mironov 2017 Prop. 3


def _random_points(seed: int, n: int):
    rng = np.random.default_rng(seed)
    orders = 1 + np.expm1(np.exp(rng.uniform(np.log(np.log(1.00001)), np.log(np.log(1e6)), n)))
    return orders, np.exp(rng.uniform(-20, 8, n))


@pytest.mark.parametrize("method", [IMPROVED, CLASSIC])
@pytest.mark.parametrize("delta", [8.2e-120, 1e-5, 0.3])
def test_every_converted_epsilon_is_at_or_above_the_exact_one(method, delta):
    # main evaluated the formula round-to-nearest: up to 1e-13 (relative) below the exact
    # value of the same floats (theory §1.2); rounded up now, and still within 1e-12 of it
    orders, rdp = _random_points(0, 600)
    eps = conv.epsilon_per_order(orders, rdp, delta, method)
    for alpha, tau, e in zip(orders.tolist(), rdp.tolist(), eps.tolist()):
        exact = _exact_epsilon(alpha, tau, delta, method)
        assert mp.mpf(e) >= exact, (alpha, tau, delta, method)
        assert mp.mpf(e) - exact <= 1e-12 * (abs(exact) + 1), (alpha, tau)


@pytest.mark.parametrize("method", [IMPROVED, CLASSIC])
def test_a_curves_delta_is_at_or_above_the_exact_one(method):
    # RDPCurve.delta: exp of the smallest log δ over the grid, both rounded up
    rng = np.random.default_rng(1)
    for _ in range(150):
        rdp = float(np.exp(rng.uniform(-12, 2))) * ORDERS ** rng.uniform(0.5, 1.5)
        eps = float(np.exp(rng.uniform(-2, 3)))
        got = RDPCurve(ORDERS, rdp).delta(eps, method)
        best = mp.inf
        for alpha, tau in zip(ORDERS.tolist(), rdp.tolist()):
            a, t = mp.mpf(alpha), mp.mpf(tau)
            log_d = (a - 1) * (t - eps)
            if method == IMPROVED:
                log_d += -mp.log(a) + (a - 1) * mp.log1p(-1 / a)
            best = min(best, log_d)
        assert mp.mpf(got) >= min(mp.mpf(1), mp.exp(best)), (rdp, eps)


# ------------------------------------------------------------ the filter's admission
DELTA = 1e-5
_I8 = int(np.flatnonzero(ORDERS == 8.0)[0])


def _tau(sigma: float) -> float:
    return float(M.Gaussian(sigma).rdp(ORDERS)[_I8])


def _main_epsilon(tau: float) -> float:
    # the filter's comparison before task ul, all of δ on order 8: Opacus' expression
    a, b = (np.log(DELTA) + np.log(8.0)) / 7.0, np.log(7.0 / 8.0)
    return float((tau - a) + b)


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _smallest_sigma_admitted_before(eps: float) -> float:
    """The smallest float σ whose Gaussian the rule before task ul admitted at (eps, DELTA)."""
    lo, hi = _bits(0.01), _bits(1000.0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        sigma = struct.unpack("<d", struct.pack("<q", mid))[0]
        lo, hi = (lo, mid) if _main_epsilon(_tau(sigma)) <= eps else (mid, hi)
    return struct.unpack("<d", struct.pack("<q", hi))[0]


def test_a_charge_whose_exact_epsilon_overspends_is_refused_and_decisions_move_by_ulps():
    # At the edge of the budget, main's round-to-nearest comparison admitted σ whose exact
    # improved ε (at the very floats compared) is above the target; the rounded-up
    # comparison refuses them, and admits σ one part in 10¹² larger.
    overspending = 0
    for eps in [1.25 + 0.37 * k for k in range(17)]:
        sigma = _smallest_sigma_admitted_before(eps)
        exact = _exact_epsilon(8.0, _tau(sigma), DELTA, IMPROVED)
        ledger = Ledger(eps, DELTA, shares=single_order(8.0))
        if exact > eps:
            overspending += 1
            assert not ledger.can_afford(M.Gaussian(sigma)), (eps, sigma)
        assert ledger.can_afford(M.Gaussian(sigma * (1 + 1e-12))), (eps, sigma)
    assert overspending >= 3  # the edge is within an ulp: about half the cases


def test_the_meter_is_never_below_the_exact_conversion():
    # Ledger.budget().spent is the filter's own rounded-up expression (theory §12): at the
    # σ of the budget edge above, main's meter read at most the target, below the exact ε
    for eps in [1.25 + 0.37 * k for k in range(8)]:
        sigma = _smallest_sigma_admitted_before(eps)
        ledger = Ledger(eps + 1.0, DELTA, shares=single_order(8.0))
        ledger.charge(M.Gaussian(sigma))
        spent = ledger.budget().spent
        exact = _exact_epsilon(8.0, _tau(sigma), DELTA, IMPROVED)
        assert mp.mpf(spent) >= exact and spent - exact < 1e-13, (eps, sigma)


def test_a_journal_filled_to_the_edge_before_task_ul_still_opens(tmp_path, monkeypatch):
    # A charge the round-to-nearest comparison admitted at the edge is refused now; a
    # journal holding one is re-decided on opening and must still open (Accounting._readmit
    # falls back to the rule without the slack), and admit nothing more.
    from privguard import BudgetExhausted
    from privguard._accounting import _filters

    eps = 1.25 + 0.37
    sigma = _smallest_sigma_admitted_before(eps)
    assert _exact_epsilon(8.0, _tau(sigma), DELTA, IMPROVED) > eps
    path = tmp_path / "edge.db"
    with monkeypatch.context() as m:
        m.setattr(_filters.conv, "improved_upper", lambda r, t: (r - t[0]) + t[1])
        old = Ledger(eps, DELTA, shares=single_order(8.0), path=path)
        old.charge(M.Gaussian(sigma))
        before = old.epsilon()
        old.close()
    ledger = Ledger.open(path)
    assert ledger.epsilon() == before and len(ledger.history) == 1
    with pytest.raises(BudgetExhausted):
        ledger.charge(M.Gaussian(1e6))
    ledger.close()
