"""Cross-check RandomAllocation against Feldman & Shenfeld's ``random-allocation`` package.

The package pins numpy<2.2 and is never a dependency of privguard, so this runs in two steps:

    python -m venv /tmp/ra_venv && /tmp/ra_venv/bin/pip install random-allocation==1.0.5 pandas matplotlib
    /tmp/ra_venv/bin/python scripts/random_allocation_crosscheck.py dump > /tmp/ra.json
    .venv/bin/python scripts/random_allocation_crosscheck.py compare /tmp/ra.json

``dump`` evaluates the package (its exact remove-direction RDP, the RDP add bound of
Dong, Chen & Özgür it ships, and its one-epoch ε lower bound); ``compare`` prints
privguard's values next to them (docs/theory.md §15 records the output).
"""

from __future__ import annotations

import json
import sys


def dump() -> None:
    from random_allocation.comparisons.definitions import Direction, PrivacyParams, SchemeConfig
    from random_allocation.random_allocation_scheme.direct import allocation_RDP_remove
    from random_allocation.random_allocation_scheme.lower_bound import (
        allocation_epsilon_lower_bound,
    )
    from random_allocation.random_allocation_scheme.RDP_DCO import allocation_RDP_DCO_add
    out = {"remove": [], "dco_add": [], "lower": []}
    for sigma in (0.8, 1.0, 2.0):
        for t in (2, 3, 10, 100, 1000):
            for a in range(2, 13):
                out["remove"].append([sigma, t, a, allocation_RDP_remove(alpha=a, sigma=sigma, num_steps=t)])
                out["dco_add"].append([sigma, t, a, float(allocation_RDP_DCO_add(sigma, t, 1, float(a)))])
    for sigma, t, delta in [(1.0, 10, 1e-5), (1.0, 100, 1e-5), (2.0, 100, 1e-5), (0.8, 1000, 1e-5)]:
        p = PrivacyParams(sigma=sigma, num_steps=t, num_selected=1, num_epochs=1, delta=delta)
        try:
            lb = allocation_epsilon_lower_bound(p, SchemeConfig(), Direction.BOTH)
        except Exception as e:
            lb = repr(e)
        out["lower"].append([sigma, t, delta, lb])
    json.dump(out, sys.stdout)


def compare(path: str) -> None:
    import numpy as np

    from privguard import DEFAULT_ORDERS, RDPCurve
    from privguard import mechanisms as M
    from privguard._mechanisms import _allocation as A
    from privguard._mechanisms import _allocation_add as B

    with open(path) as fh:
        d = json.load(fh)
    worst = 0.0
    for sigma, t, a, v in d["remove"]:
        ours = A.remove_bound(np.array([float(a)]), sigma, t)[0]
        worst = max(worst, abs(ours - v) / abs(v))
    print(f"remove: max relative difference from allocation_RDP_remove over {len(d['remove'])} points: {worst:.2e}")
    ratios = []
    for sigma, t, a, v in d["dco_add"]:
        orders = np.array([float(a)])
        ours = min(B.add_bound(orders, sigma, t)[0], A.add_bound(orders, sigma, t)[0])
        ratios.append(ours / v)
    print(f"add: ours / DCO25 RDP add bound: min {min(ratios):.3f} median {np.median(ratios):.3f} "
          f"max {max(ratios):.3f}")
    # the DCO25 bound against the exact add divergence at t = 2 (mpmath: L = e^(z̄)·cosh((z1 − z2)/2),
    # z̄ ~ N(−s²/2, s²/2) independent of z1 − z2 ~ N(0, 2s²)); below 1 means it is not an upper bound
    import mpmath as mp

    below = []
    for sigma, t, a, v in d["dco_add"]:
        if t == 2:
            s2, b = mp.mpf(1) / sigma**2, mp.mpf(1 - a)
            sd = mp.sqrt(2 * s2)
            f = lambda x, b=b, sd=sd: mp.npdf(x, 0, sd) * mp.cosh(x / 2) ** b
            exact = float((-b * s2 / 2 + b * b * s2 / 4 + mp.log(mp.quad(f, [-mp.inf, 0, mp.inf])))
                          / (a - 1))
            below.append(v / exact)
    print(f"t=2: DCO25 add bound / exact add divergence: min {min(below):.4f} max {max(below):.4f}")
    grid = np.array(DEFAULT_ORDERS)
    for sigma, t, delta, lb in d["lower"]:
        eps = RDPCurve(grid, M.RandomAllocation(sigma, t).rdp(grid)).epsilon(delta)
        print(f"one epoch sigma={sigma} t={t} delta={delta}: ours {eps:.4f} >= lower bound {lb:.4f}: {eps >= lb}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"]:
        dump()
    else:
        compare(sys.argv[2])
