"""Where Opacus' compute_rdp (and closed forms near α = 1) stop being usable.

Prints the measurements behind privguard/_curves/_sgm.py, privguard/_curves/_orders.py and the
round-off tolerance of privguard._validation (RDP_RTOL, RDP_ATOL):

    .venv/bin/python scripts/sgm_limits.py        # about a minute

Nothing here runs a computation that would not return: Opacus' fractional
series is only called where privguard's prediction says it stops.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M
from privguard._curves import _opacus_rdp, _sgm

opacus = _opacus_rdp._module()


def nan_onset() -> None:
    print("1. Integer orders: first order at which Opacus' value is NaN")
    for sigma, q in [(0.5, 0.01), (1.0, 0.004), (10.0, 0.5), (1e4, 0.9)]:
        first = next(a for a in range(1000, 1100) if math.isnan(opacus._compute_rdp(q, sigma, float(a))))
        print(f"   sigma={sigma:g} q={q:g}: NaN from alpha={first}")


def series_lengths() -> None:
    print("2. Fractional orders: terms Opacus sums at alpha = 1.1 (q = 0.5 is the worst q)")
    for sigma in [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e100]:
        n = _sgm.series_terms(0.5, sigma, 1.1)
        if n is None:
            print(f"   sigma={sigma:g}: more than {_sgm.MAX_SERIES_TERMS} terms (not run)")
            continue
        t = time.perf_counter()
        opacus._compute_rdp(0.5, sigma, 1.1)
        print(f"   sigma={sigma:g}: {n} terms, {time.perf_counter() - t:.3f} s")


def garbage() -> None:
    print("3. Fractional orders: Opacus' value below its integer neighbours (garbage)")
    alphas = [2.5, 10.5, 30.5, 63.5, 100.5, 300.25, 500.5, 1000.5]
    sigmas, qs = [1, 2, 5, 8, 10, 20, 100, 1e4], [0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9]
    bad = []
    for sigma, q, a in itertools.product(sigmas, qs, alphas):
        if _sgm.series_terms(q, sigma, a) is None:
            continue
        v = opacus._compute_rdp(q, sigma, a)
        lo = opacus._compute_rdp(q, sigma, float(math.floor(a)))
        if v < lo - 1e-9:
            bad.append((sigma, q, a, v))
    print(f"   {len(bad)} of {len(sigmas) * len(qs) * len(alphas)} (sigma, q, alpha); "
          f"most negative: {min(bad, key=lambda b: b[3])}")


def round_off_near_one() -> None:
    print("4. Opacus' largest round-off decrease in alpha (grid: default + 1.0001, 1.001, 1.01)")
    grid = sorted({1.0001, 1.001, 1.005, 1.01, 1.02, 1.05, *DEFAULT_ORDERS})
    worst = (0.0, None)
    for sigma, q in itertools.product([0.3, 0.5, 0.8, 1, 1.5, 2, 3, 5, 8, 10, 20],
                                      [1e-6, 1e-5, 1e-3, 0.004, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9]):
        r = np.asarray(opacus.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=grid))
        if (r < 0).any():
            continue
        drop = np.maximum.accumulate(r) - r
        i = int(np.argmax(drop))
        if drop[i] > worst[0]:
            worst = (float(drop[i]), (sigma, q, grid[i]))
    print(f"   {worst[0]:.3g} at (sigma, q, alpha) = {worst[1]} (RDP_ATOL is 1e-9)")


def closed_forms_near_one() -> None:
    print("5. Laplace / pure-DP curves that decrease beyond the tolerance, by alpha - 1")
    mechs = ([M.Laplace(b) for b in np.geomspace(1e-5, 1e8, 60)]
             + [M.PureDP(e) for e in np.geomspace(1e-8, 1e5, 60)])
    for gap in [1e-9, 1e-8, 1e-7, 1e-6, 1e-5]:
        grid = 1 + np.unique(np.concatenate([[gap, 1.5 * gap, 2 * gap, 3 * gap],
                                             np.linspace(gap, 1e3 * gap, 300)]))
        failing = 0
        for m in mechs:
            c = m._rdp(grid)
            run = np.maximum.accumulate(c)
            failing += bool((c < run - 1e-9 * run - 1e-9).any())
        print(f"   alpha - 1 from {gap:g}: {failing} of {len(mechs)} curves")


def integer_sum_cost() -> None:
    print("6. Cost of privguard's own integer-order sum (orders above 1024)")
    for a in [2000, 10**4, 10**5, 10**6]:
        t = time.perf_counter()
        _sgm.integer_order(0.01, 1.0, a)
        print(f"   alpha={a}: {time.perf_counter() - t:.3f} s")


if __name__ == "__main__":
    for step in (nan_onset, series_lengths, garbage, round_off_near_one, closed_forms_near_one,
                 integer_sum_cost):
        step()
