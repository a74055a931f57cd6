"""Euclidean projection onto S_{C,c} = {f : c·π₀ ≤ f ≤ C·π₀, Σ f = 1} (seed 003 eq. 3.1, App. D).

The KKT conditions of  min ||f − p||²  s.t.  l ≤ f ≤ u, Σ f = 1  give
f_i = clip(p_i − ν, l_i, u_i) for one scalar ν, and g(ν) = Σ_i f_i is
continuous, non-increasing and piecewise linear with breakpoints p_i − u_i
and p_i − l_i. Sorting the breakpoints and binary-searching the one where g
crosses 1 fixes which coordinates sit at a bound; ν then solves a linear
equation exactly. O(n log n), no general-purpose solver.
"""

from __future__ import annotations

import numpy as np

from privguard._errors import InvalidArgumentError


def project_bounded_simplex(p, lower, upper) -> np.ndarray:
    """argmin_f ||f − p||₂ subject to lower ≤ f ≤ upper and Σ f = 1.

    Raises:
        InvalidArgumentError: shapes differ, lower > upper somewhere, or the
            set is empty (Σ lower > 1 or Σ upper < 1).
    """
    p, lo, hi = (np.asarray(a, dtype=float) for a in (p, lower, upper))
    if not (p.shape == lo.shape == hi.shape) or p.ndim != 1 or p.size == 0:
        raise InvalidArgumentError("p", p.shape, "p, lower and upper need one common 1-D shape")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise InvalidArgumentError("p", p, "values must be finite")
    if np.any(lo > hi):
        raise InvalidArgumentError("lower", lo, "must not exceed upper")
    if lo.sum() > 1 + 1e-12 or hi.sum() < 1 - 1e-12:
        raise InvalidArgumentError("bounds", (lo.sum(), hi.sum()), "need sum(lower) <= 1 <= sum(upper)")

    def g(nu: float) -> float:
        return float(np.clip(p - nu, lo, hi).sum())

    bps = np.unique(np.concatenate([p - hi, p - lo]))
    # g(bps[0]) = Σ upper >= 1 and g(bps[-1]) = Σ lower <= 1: find the last bp with g >= 1.
    left, right = 0, bps.size - 1
    while right - left > 1:
        mid = (left + right) // 2
        left, right = (mid, right) if g(bps[mid]) >= 1 else (left, mid)
    a, b = bps[left], bps[right] if bps.size > 1 else bps[left]
    probe = (a + b) / 2
    at_upper = p - probe >= hi
    at_lower = p - probe <= lo
    free = ~(at_upper | at_lower)
    if free.any():
        nu = (p[free].sum() + hi[at_upper].sum() + lo[at_lower].sum() - 1.0) / free.sum()
    else:  # g is flat on (a, b): every coordinate at a bound; any ν there works
        nu = probe
    return np.clip(p - nu, lo, hi)


def project_density(p, prior, C: float, c: float) -> np.ndarray:
    """Project a density ``p`` on a finite grid onto S_{C,c}(prior)."""
    prior = np.asarray(prior, dtype=float)
    return project_bounded_simplex(p, c * prior, C * prior)
