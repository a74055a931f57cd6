"""Random-K tuning with K ~ Poisson(μ) in 50 digits at a float base curve (task lo4):
seed 002 Theorem 6 with K = 0 counted and the joint-convexity bound (docs/theory.md §7),
ε̂ = log(1 + 1/(λ−1)) exactly and δ̂ the exact minimum, over the grid, of the improved
conversion and the Bretagnolle–Huber term; then the monotone envelope. The test and
scripts/lo4_poisson_sweep.py compare the charged curve with it."""

from __future__ import annotations

import mpmath as mp
import numpy as np


def _exact_log_delta_hat(a: list, b: list, lam, near: np.ndarray, kl) -> mp.mpf:
    """The exact log δ̂ at λ over the orders ``near`` marks (the conversion's float minimum
    and every order within 10⁻⁶ of it: float errors are far below that)."""
    eh = mp.log1p(1 / (lam - 1))
    conv = [(x - 1) * (y - eh) - mp.log(x) + (x - 1) * mp.log1p(-1 / x)
            for x, y, keep in zip(a, b, near) if keep]
    return min([*conv, kl])


def exact_poisson_curve(orders: np.ndarray, base: np.ndarray, mu: float) -> list:
    """The exact charged curve (before the pure-DP corollary, which a Poisson law has none
    of), one mpf per order."""
    with mp.workdps(50):
        a = [mp.mpf(float(x)) for x in orders]
        b = [mp.mpf(float(x)) for x in base]
        kl = min(mp.log(-mp.expm1(-x)) / 2 if x > 0 else -mp.inf for x in b)
        m, out = mp.mpf(mu), []
        with np.errstate(all="ignore"):
            eh = np.log1p(1 / (orders - 1))
            approx = ((orders[None, :] - 1) * (base[None, :] - eh[:, None]) - np.log(orders)
                      + (orders - 1) * np.log1p(-1 / orders))
            approx = np.where(np.isnan(approx), np.inf, approx)
        for i, (lam, eps) in enumerate(zip(a, b)):
            low = np.min(approx[i])
            near = np.isfinite(approx[i]) & (approx[i] <= low + 1e-6 * (1 + abs(low)))
            log_d = _exact_log_delta_hat(a, b, lam, near, kl)
            poisson = mp.log(mp.exp(-m) + m * mp.exp((lam - 1) * (eps + m * mp.exp(log_d))))
            out.append(min(poisson, m * mp.expm1((lam - 1) * eps)) / (lam - 1))
        return [min(out[i:]) for i in range(len(out))]
