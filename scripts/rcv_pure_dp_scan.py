"""Review rcv: PureDP's curve against mpmath (docs/theory.md §1.2).

Prints (1) below ε₀ = 40: every value below the exact one, the smallest relative margin
among values in the normal range, and rows not monotone in α, over 400 ε₀ from 1e-300 to
40 (plus points near 20 and 40) by the orders from 1 + 1e-5 to 1e6 below; (2) monotone in
ε₀ across 40; (3) main's form (``_legacy.pre_flat``) on the default grid from ε₀ = 40 to
1e308 (25,000 values): how many values lie below ε₀. Run: python scripts/rcv_pure_dp_scan.py
"""

from __future__ import annotations

import time

import mpmath as mp
import numpy as np

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M
from privguard._curves import _legacy, _stable

mp.mp.dps = 50
NORMAL = mp.mpf("2.2250738585072014e-308")


def exact(e: float, a: float) -> mp.mpf:
    """Mironov 2017, Prop. 5 via cosh A − cosh B = 2 sinh((A+B)/2) sinh((A−B)/2): no
    cancellation at 50 digits."""
    e, a = mp.mpf(e), mp.mpf(a)
    return mp.log1p(2 * mp.sinh(a * e / 2) * mp.sinh((a - 1) * e / 2) / mp.cosh(e / 2)) / (a - 1)


def main() -> None:
    t0 = time.time()
    eps = sorted({float(x) for x in np.logspace(-300, np.log10(39.999999), 400)}
                 | {39.0, 39.9, 39.99999, 39.9999999999, float(np.nextafter(40.0, 0)),
                    20.0, 19.99999, 20.00001, 1.0, 10.0, 30.0})
    orders = sorted({1 + 1e-5, 1 + 1.5e-5, 1 + 1e-4, 1.001, 1.01, 1.1, 1.5, 2.0, 2.5, 3.0, 7.5,
                     10.0, 33.3, 64.0, 100.0, 256.0, 1000.0, 1024.0, 1e4, 12345.6, 1e5, 5e5,
                     1e6} | {float(x) for x in np.logspace(-5, 6, 60) + 1.0})
    al = np.array([a for a in orders if a <= 1e6])
    worst, below, sub_below, nonmono = (1.0, None), [], 0, []
    for e in eps:
        v = M.PureDP(e).rdp(al)
        if np.any(np.diff(v) < 0):
            nonmono.append((e, float(v.max())))
        for a, x in zip(al.tolist(), v.tolist()):
            ex = exact(e, a)
            if ex < NORMAL:
                sub_below += bool(x < ex)
                continue
            rel = float((mp.mpf(x) - ex) / ex)
            if rel < 0:
                below.append((rel, e, a, x, float(ex)))
            elif rel < worst[0]:
                worst = (rel, (e, a))
    print(f"(1) {len(eps)} eps0 x {len(al)} orders: normal-range values below exact: {below}")
    print(f"    subnormal-range values below exact: {sub_below}; smallest margin elsewhere "
          f"{worst[0]:.3g} at {worst[1]} (MARGIN {_stable.MARGIN:.3g})")
    print(f"    rows not monotone in alpha: {len(nonmono)}, largest value in them "
          f"{max((m for _, m in nonmono), default=0):.3g}")
    es = [39.0, 39.9, 39.999, float(np.nextafter(40.0, 0)), 40.0,
          float(np.nextafter(40.0, 50)), 41.0, 1e3, 1e20]
    table = np.array([M.PureDP(e).rdp(al) for e in es])
    print(f"(2) monotone in eps0 across 40: {bool(np.all(np.diff(table, axis=0) >= 0))}")
    grid = np.array(DEFAULT_ORDERS)
    big = np.concatenate([np.logspace(np.log10(40), 308, 20000), np.linspace(40, 1000, 5000)])
    with _legacy.pre_flat():
        low = sum(bool(np.any(M.PureDP(float(e)).rdp(grid) < e)) for e in big)
    print(f"(3) main's form on the default grid, {len(big)} eps0 in [40, 1e308]: "
          f"{low} with a value below eps0")
    print(f"time {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
