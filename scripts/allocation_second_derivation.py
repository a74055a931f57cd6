"""Print random allocation's add bound against exact values (docs/theory.md §15, "Second derivation").

    PYTHONPATH=. python scripts/allocation_second_derivation.py [t ...]

t = 2 (default first): the exact divergences in both directions by mpmath
through the mean-direction factorisation, E_Q[L^γ] = e^(γ²s²/4 − γs²/2)·E[cosh(s·v/√2)^γ],
v ~ N(0, 1) (one-dimensional). t ≥ 10: the exact add divergence by scipy's
adaptive quadrature of the Laplace representation
E_Q[L^(−β)] = (1/Γ(β)) ∫ u^(β−1) φ(u/t)^t du with φ(v) = E[e^(−vX)] itself a
quadrature (rows whose quadrature error estimate is above 1e-9 are marked
"unresolved" and say nothing). Each row: the package's bound, the exact value,
and their ratio, which must be ≥ 1.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from scipy import integrate
from scipy.special import gammaln

from privguard._mechanisms import _allocation as A
from privguard._mechanisms import _allocation_add as B

SIGMAS = [0.5, 0.8, 1.0, 2.0, 5.0]
ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]


def _two_steps(alpha: float, sigma: float, remove: bool) -> float:
    import mpmath as mp

    mp.mp.dps = 30
    s = mp.mpf(1) / sigma
    g = mp.mpf(alpha) if remove else 1 - mp.mpf(alpha)
    f = lambda v: mp.exp(g * mp.log(mp.cosh(s * v / mp.sqrt(2))) - v * v / 2) / mp.sqrt(2 * mp.pi)
    moment = mp.quad(f, [-mp.inf, -20, -5, 0, 5, 20, mp.inf])
    return float((g * g * s * s / 4 - g * s * s / 2 + mp.log(moment)) / (mp.mpf(alpha) - 1))


def _log_phi(v: float, s: float) -> float:
    f = lambda z: math.exp(-v * math.exp(s * z - s * s / 2) - z * z / 2) / math.sqrt(2 * math.pi)
    mid = (s * s / 2 - math.log(v)) / s if v > 0 else 0.0
    return math.log(integrate.quad(f, -40, 40, points=[0.0, mid], limit=400, epsabs=0, epsrel=1e-12)[0])


def _add_exact(alpha: float, sigma: float, t: int) -> tuple[float, float]:
    s, b = 1.0 / sigma, alpha - 1.0
    g = lambda u: math.exp((b - 1) * math.log(u) + t * _log_phi(u / t, s)) if u > 0 else float(b == 1)
    top = 4 * b * t + 200
    v1, e1 = integrate.quad(g, 0, top, points=[b, 2 * b, 4 * b], limit=800, epsrel=1e-11, epsabs=0)
    v2, e2 = integrate.quad(g, top, np.inf, limit=800, epsrel=1e-11, epsabs=0)
    return (math.log(v1 + v2) - gammaln(b)) / b, (e1 + e2) / (v1 + v2)


def main(steps: list[int]) -> None:
    orders = np.array(ORDERS)
    for t in steps:
        for sigma in SIGMAS:
            add = np.minimum(A.add_bound(orders, sigma, t), B.add_bound(orders, sigma, t))
            remove = A.remove_bound(orders, sigma, t)
            for i, alpha in enumerate(ORDERS):
                if t == 2:
                    for name, ours, exact in (("add", add[i], _two_steps(alpha, sigma, False)),
                                              ("remove", remove[i], _two_steps(alpha, sigma, True))):
                        print(f"t=2 sigma={sigma} alpha={alpha} {name}: bound={ours:.6g} exact={exact:.6g} "
                              f"ratio={ours / exact:.6f}")
                else:
                    exact, err = _add_exact(alpha, sigma, t)
                    note = "" if err < 1e-9 else " unresolved"
                    print(f"t={t} sigma={sigma} alpha={alpha} add: bound={add[i]:.6g} exact={exact:.6g} "
                          f"ratio={add[i] / exact:.6f}{note}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [2, 10, 100, 1000])
