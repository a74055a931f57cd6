"""Euclidean projection onto S_{C,c} = {f : c·π₀ ≤ f ≤ C·π₀, Σ f = 1} (seed 003 eq. 3.1, App. D).

The KKT conditions of  min ||f − p||²  s.t.  l ≤ f ≤ u, Σ f = 1  give
f_i = clip(p_i − ν, l_i, u_i) for one scalar ν, and g(ν) = Σ_i f_i is
continuous, non-increasing and piecewise linear with breakpoints p_i − u_i
and p_i − l_i. Sorting the breakpoints and binary-searching the one where g
crosses 1 fixes which coordinates sit at a bound; ν then solves a linear
equation exactly. O(n log n), no general-purpose solver.
"""

from __future__ import annotations

import math

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError

#: How far from 1 the projection's sum may be before it is refused, beyond n·2⁻⁵² (the
#: rounding of a sum of n terms each within the bounds, which an exact projection meets).
SUM_TOLERANCE = 1e-9


def project_bounded_simplex(p, lower, upper) -> np.ndarray:
    """argmin_f ||f − p||₂ subject to lower ≤ f ≤ upper and Σ f = 1.

    Raises:
        InvalidArgumentError: shapes differ, lower > upper somewhere, the
            set is empty (Σ lower > 1 or Σ upper < 1), or p's values span too
            wide a range for the projection to be computed in floating point
            (the result would not sum to 1).
    """
    # 1-D sequences of real numbers, each checked by name (review bd: np.asarray let
    # strings, dicts, huge ints and complex numbers raise built-ins or warn)
    p, lo, hi = (check._real_vector(name, a) for name, a in
                 (("p", p), ("lower", lower), ("upper", upper)))
    if not (p.shape == lo.shape == hi.shape) or p.size == 0:
        raise InvalidArgumentError("p", p.shape, "p, lower and upper need one common 1-D shape")
    for name, a in (("p", p), ("lower", lo), ("upper", hi)):
        if not np.all(np.isfinite(a)):
            raise InvalidArgumentError(name, check.short(a), "values must be finite")
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
    f = np.clip(p - nu, lo, hi)
    # The clip keeps every coordinate within its bounds; Σ f = 1 holds only if p − ν was
    # computed to within the bounds' scale. Values of p spanning ~1e16 times the bounds
    # lose it to cancellation ([-5e299, 5e299, 1] on thirds with C = 2, c = 0.75 gave
    # Σ f = 7/6, and a sampler normalising f then drew below c·π⁽⁰⁾): refused, never
    # returned as a point of S_{C,c} (docs/theory.md §9).
    total = float(f.sum())
    if not abs(total - 1.0) <= SUM_TOLERANCE + p.size * np.finfo(float).eps:
        raise InvalidArgumentError("p", check.short(p), f"cannot be projected in floating "
                                   f"point: the result sums to {total!r}, not 1 (its values "
                                   "span too wide a range for the bounds)")
    return _settled(f, lo, hi)


def _settled(f: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``f`` (within its bounds, Σ f within the tolerance of 1) moved onto Σ f = 1, in bounds.

    A sampler draws from f / Σ f: with Σ f = 1 − 5e-10 (cancellation in p − ν, under the
    tolerance) a coordinate at C·π⁽⁰⁾ was drawn with C·(1 + 5e-10)·π⁽⁰⁾, a density the
    bound does not charge for (review rtl). The residual goes to the coordinates in
    proportion to their room to the bound it moves towards: the total room is at least
    the residual (Σ lower ≤ 1 ≤ Σ upper), so no coordinate passes its bound, and what is
    left of Σ f − 1 is the n·2⁻⁵² rounding of the sum itself.
    """
    residual = 1.0 - float(f.sum())
    room = hi - f if residual > 0 else f - lo
    total = float(room.sum())
    if residual == 0.0 or not total > 0.0:
        return _exactly_one(f, lo, hi)
    return _exactly_one(np.clip(f + residual * (room / total), lo, hi), lo, hi)


def _exactly_one(f: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``f`` with its exact sum moved to within an ulp of 1 (task ul), within its bounds.

    After :func:`_settled`'s spreading the exact Σ f may still be n·2⁻⁵² from 1, and a
    sampler drawing f/Σ f exactly (privguard/tuning/_draw.py) then draws a coordinate at
    C·π⁽⁰⁾ with density up to (1 + n·2⁻⁵²)·C·π⁽⁰⁾, beyond the 2⁻⁵⁰ DP-HyPO's curve adds
    to log(C/c) once n > 4. Here the exact residual r = 1 − Σ f (``math.fsum``, correctly
    rounded) is moved onto the coordinate with the most room, clipped to its bound, until
    an addition no longer changes it (|r| is then at most half an ulp of that coordinate,
    ≤ 2⁻⁵³·max f) or no room is left in r's direction (every coordinate at that bound:
    f/Σ f is then the prior's own shape, to 2⁻⁵³ per coordinate). So the law f/Σ f of every
    draw lies within [c(1 − 2⁻⁵³)², C(1 + 2⁻⁵³)²] × π⁽⁰⁾/Σ π⁽⁰⁾, independently of n
    (docs/theory.md §9)."""
    f = np.array(f, dtype=float)
    for _ in range(2 * f.size + 2):  # each pass fills one coordinate's room or ends
        r = math.fsum([1.0, *(-f).tolist()])
        room = hi - f if r > 0 else f - lo
        k = int(np.argmax(room))
        if r == 0.0 or not room[k] > 0.0:
            break
        new = min(max(f[k] + (r if abs(r) <= room[k] else math.copysign(room[k], r)), lo[k]),
                  hi[k])
        if new == f[k]:
            break
        f[k] = new
    return f


def project_density(p, prior, C: float, c: float) -> np.ndarray:
    """Project a density ``p`` on a finite grid onto S_{C,c}(prior)."""
    prior = check._real_vector("prior", prior)
    C, c = check.non_negative_finite("C", C), check.non_negative_finite("c", c)
    if not np.all(np.isfinite(prior)):
        raise InvalidArgumentError("prior", check.short(prior), "values must be finite")
    with np.errstate(over="ignore"):  # a bound past the float range: inf, refused as such
        lower, upper = c * prior, C * prior
    return project_bounded_simplex(p, lower, upper)
