"""Sums and multiples of RDP curves rounded up: never below the exact (rational) value.

Curve entries are ≥ 0 or +inf. Round to nearest puts ``fl(x)`` within half an ulp of the
exact ``x``, on either side. Where ``fl(x) < x``, no float lies strictly between them, so
the next float up is ≥ ``x``. Each operation here computes ``fl(x)`` and its exact error
``x − fl(x)`` (error-free transformations: Dekker's Fast2Sum and TwoProduct, exact in
round-to-nearest binary64 without overflow or underflow), and takes the next float up
exactly where that error is > 0; where it is 0 or below, ``fl(x)`` is kept (it is then
≥ x). Where the transformation's conditions may fail (a product or factor outside
[2⁻⁹⁰⁰, 2⁹⁰⁰], a count ≥ 2⁵³), the next float up is taken whenever the result is > 0
(for a product of a count below 2⁵³, whenever it is a normal float: below, it is exact): an
over-count by an ulp. 0 stays 0 (an exact 0: a product n·c with n ≥ 1 is 0 only if c = 0,
a sum of values ≥ 0 only if both are). docs/theory.md §6, "Rounding up".
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from privguard._floats import float_above

_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's splitting constant for binary64
_TINY, _HUGE = 2.0 ** -900, 2.0 ** 900  # where Dekker's products cannot under- or overflow
_NORMAL = 2.0 ** -1022  # the smallest normal float


def _raise_where(x: np.ndarray, low: np.ndarray) -> np.ndarray:
    """``x`` with the entries where ``low`` holds raised to the next float (the largest
    float to +inf: callers ignore the overflow where it can arise)."""
    return np.nextafter(x, np.where(low, np.inf, x))


def _sum_up(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    s = a + b
    err = np.minimum(a, b) - (s - np.maximum(a, b))  # NaN or -inf where s or hi is +inf
    return _raise_where(s, err > 0)


def sum_up(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An upper bound on the exact ``a + b`` (entries ≥ 0 or +inf): the rounded sum, raised
    to the next float where it lies below the exact sum. Fast2Sum (Dekker 1971): with
    hi ≥ lo ≥ 0, s = fl(hi + lo), the error lo − (s − hi) is computed exactly and equals
    (hi + lo) − s when s is finite. +inf stays +inf (past the float range too)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _sum_up(a, b)


def _times_up(n: int, c: np.ndarray) -> np.ndarray:
    p = n * c
    if n >= 2 ** 53:  # n may not be a float: a float ≥ n, and every positive entry raised
        p = math.nextafter(float(n), math.inf) * c
        return _raise_where(p, p > 0)
    nh = float((n >> 26) << 26)
    nl = float(n) - nh
    t = _SPLIT * c
    ch = t - (t - c)
    cl = c - ch
    err = ((nh * ch - p) + nh * cl + nl * ch) + nl * cl  # n·c − p, exactly
    # Where Dekker's conditions may fail, err is not used: the next float up wherever p is
    # a positive finite normal float (an over-count of at most 2u relative). A p below the
    # normal range (2⁻¹⁰²²) is exact: c is then subnormal (c normal and n ≥ 2 give
    # p ≥ 2⁻¹⁰²¹), n·c a multiple of 2⁻¹⁰⁷⁴ below 2⁻¹⁰²², a float. Raising it too was an
    # over-count of up to 100% there, which a later product multiplied (review rsr: the
    # re-read fallback's bound, below_nearest_sums, then lay above main's sums).
    unsure = (c < _TINY) | (c > _HUGE)
    return _raise_where(p, np.where(unsure, (p >= _NORMAL) & (p < np.inf), err > 0))


def times_up(n: int, curve: np.ndarray) -> np.ndarray:
    """An upper bound on the exact ``n × curve`` (an integer n ≥ 1, entries ≥ 0 or +inf):
    the curve itself for n = 1, else the rounded product, raised to the next float where it
    lies below the exact product (Dekker's TwoProduct: n and each entry split into halves of
    at most 27 and 26 bits, whose products are exact). +inf past the float range. The
    composition of n copies of a mechanism (Mironov 2017, Prop. 1) and the journal's
    ``n × curve`` (:func:`privguard._accounting._journal.scaled_sum`) are both this, the
    same floats, so a child ledger whose budget is a declared n-step run admits exactly n
    steps (docs/theory.md §6)."""
    c = np.array(curve, dtype=float)
    if n == 1:
        return c
    with np.errstate(over="ignore", invalid="ignore"):
        return _times_up(n, c)


def scaled_sum_up(base: np.ndarray | None, n: int, curve: np.ndarray, finite: bool
                  ) -> np.ndarray:
    """``sum_up(base, times_up(n, curve))`` (n ≥ 1), or ``times_up(n, curve)`` alone for
    ``base`` None (a base of zeros: the sum is exact). ``finite``: the caller knows every entry of base and n × curve
    is below 1e300, so no operation here overflows or meets an inf, and numpy's error
    state need not be set (it costs more than the arithmetic on a grid of 157 orders)."""
    if not finite:
        part = times_up(n, curve)
        return part if base is None else sum_up(base, part)
    part = curve.copy() if n == 1 else _times_up(n, curve)
    return part if base is None else _sum_up(base, part)


def scaled_up(values: np.ndarray, orders: np.ndarray, factor: Fraction) -> np.ndarray:
    """``values`` (round-to-nearest evaluations of α·``factor`` at each of ``orders``, ≥ 0 or
    +inf) raised, where below the exact rational α·factor, to the smallest float at or above
    it (:func:`privguard._floats.float_above`); values at or above it are kept bit for bit.
    The comparison is exact (Python integers): αF > v ⇔ n_α·n_F·d_v > n_v·d_α·d_F, each
    float n/d with d a power of 2. The Gaussian's α/(2σ²) (F = 1/(2σ²)) and zCDP's ρα
    (F = ρ), task adv8 / review radv8, checkpoint curves version 8."""
    out = np.array(values, dtype=float)
    n_f, d_f = factor.numerator, factor.denominator
    for i, (v, a) in enumerate(zip(out.tolist(), np.asarray(orders, dtype=float).tolist())):
        if not (math.isfinite(v) and math.isfinite(a)):  # +inf is above; NaN stays (a bug)
            continue
        n_a, d_a = a.as_integer_ratio()
        n_v, d_v = v.as_integer_ratio()
        if n_a * n_f * d_v > n_v * d_a * d_f:
            out[i] = float_above(Fraction(n_a * n_f, d_a * d_f))
    return out


def below_nearest_sums(spent: np.ndarray, ops: int) -> np.ndarray:
    """A curve nowhere above the round-to-nearest evaluation of the sums that
    evaluated rounding up (:func:`scaled_sum_up`) to ``spent``, given at most ``ops`` operations (each a product or
    a sum, on curves each at most an ulp apart): what privguard before task sr computed for
    the same charges, for re-read charges only (``Accounting._readmit``; docs/theory.md §6,
    "Journals written before"). With u = 2⁻⁵³ and K = ops < 2⁴⁹: round to nearest gives
    ≥ x(1 − u) − 2⁻¹⁰⁷⁵ and rounding up ≤ x(1 + 2u) + 2⁻¹⁰⁷⁴ per operation, so the older
    value is ≥ spent·(1 − 3Ku) − 2K·2⁻¹⁰⁷⁴; this returns max(0, pred(pred(spent·f) − c))
    with f = 1 − 4(K + 1)u and c = (2K + 2)·2⁻¹⁰⁷⁴, each pred (the next float toward 0)
    undoing the rounding of the operation before it."""
    k = min(int(ops), 2 ** 48)
    factor = 1.0 - 4 * (k + 1) * 2.0 ** -53  # exact: a multiple of 2⁻⁵³ in [1/2, 1]
    shift = (2 * k + 2) * 2.0 ** -1074  # exact: a multiple of the smallest subnormal
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.nextafter(np.asarray(spent, dtype=float) * factor, 0.0)
        low = np.nextafter(scaled - shift, -np.inf)
    return np.maximum(low, 0.0)


__all__ = ["below_nearest_sums", "scaled_sum_up", "scaled_up", "sum_up", "times_up"]
