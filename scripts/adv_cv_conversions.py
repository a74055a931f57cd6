"""Task cv: the numbers of docs/theory.md §1.2 that are not the subsampled-Gaussian scan.

* the RDP → (ε, δ) conversions against mpmath at 2,000 random (α, τ) (seed 0) and one δ;
* a DP-SGD run's ε on the same orders by privguard, Opacus and dp-accounting;
* PureDP(1e20) at order 1.00001 on this branch and as main computed it (the stable form).

    python scripts/adv_cv_conversions.py
"""

from __future__ import annotations

import logging

import mpmath as mp
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as dpa
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from privguard import DEFAULT_ORDERS, RDPCurve
from privguard import mechanisms as M
from privguard._curves import _conversion, _stable


def conversions() -> None:
    mp.mp.dps = 40
    rng = np.random.default_rng(0)
    orders = np.sort(1 + np.expm1(np.exp(rng.uniform(np.log(np.log(1.00001)),
                                                     np.log(np.log(1e6)), 2000))))
    rdp = np.exp(rng.uniform(-20, 8, 2000))
    delta = float(np.exp(rng.uniform(-300 * 2.3, -1)))
    for method in _conversion.METHODS:
        eps = _conversion.epsilon_per_order(orders, rdp, delta, method)
        worst, below = 0.0, 0
        for a, t, e in zip(orders.tolist(), rdp.tolist(), eps.tolist()):
            am, d = mp.mpf(a), mp.mpf(delta)
            exact = (t - (mp.log(d) + mp.log(am)) / (am - 1) + mp.log((am - 1) / am)
                     if method == _conversion.IMPROVED else t - mp.log(d) / (am - 1))
            rel = float((mp.mpf(e) - exact) / abs(exact))
            below += rel < 0
            worst = min(worst, rel)
        print(f"{method}: delta {delta:.3g}, {below} of 2000 below the exact ε, "
              f"worst relative {worst:.3g}")


def dpsgd() -> None:
    logging.disable(logging.WARNING)  # dp-accounting's fractional-order warnings
    for sigma, q, steps, delta in [(1.1, 0.01, 1000, 1e-5), (0.5, 1e-3, 100_000, 1e-8)]:
        mech = M.SubsampledGaussian(sigma, q, steps=steps)
        for orders in (list(DEFAULT_ORDERS), [float(a) for a in range(2, 65)]):
            ours = RDPCurve(orders, mech.rdp(orders)).epsilon(delta)
            opacus = get_privacy_spent(orders=orders, delta=delta, rdp=compute_rdp(
                q=q, noise_multiplier=sigma, steps=steps, orders=orders))[0]
            acc = dpa.RdpAccountant(orders)
            acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
            print(f"σ={sigma} q={q} steps={steps} δ={delta} orders={len(orders)}: privguard "
                  f"{ours!r} opacus {float(opacus)!r} dp-accounting {acc.get_epsilon(delta)!r}")


def pure_dp() -> None:
    with mp.workdps(80):
        a, e = mp.mpf(1.00001), mp.mpf(1e20)
        exact = e - (mp.log1p(mp.exp(-e)) - mp.log1p(mp.exp(-(2 * a - 1) * e))) / (a - 1)
    old = float(_stable.pure_dp_rdp(1e20, np.array([1.00001]))[0] * (1 + _stable.MARGIN))
    new = float(M.PureDP(1e20).rdp([1.00001])[0])
    print(f"PureDP(1e20) at 1.00001: main's form {old!r} ({float((old - exact) / exact):.3g} "
          f"relative to the exact), now {new!r} ({float((new - exact) / exact):.3g})")


if __name__ == "__main__":
    conversions()
    dpsgd()
    pure_dp()
