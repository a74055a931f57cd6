"""Numerically stable pieces of the pure-DP and Laplace RDP curves (issue 24, item 4).

The textbook forms of both curves (formulas.md §1) take the logarithm of a
quantity 1 + x with x tiny (small ε₀, large Laplace scale) after x has been
lost to rounding: ``PureDP(1e-8).rdp([1.1, 2.0])`` was [0, 0]. The forms
here never subtract two nearly equal numbers: every term is nonnegative and
each is computed with ``log1p``/``sinh``/a series, so the result has a
relative error of a few units in the last place. :data:`MARGIN` then moves
it up by far more than that, so that a curve is never below the truth
(checked against mpmath over ε₀ ∈ [10⁻¹², 50], orders 1.01–10⁴ in
tests/test_mechanisms.py).
"""

from __future__ import annotations

import math

import numpy as np

#: Upward relative safety margin on a stable curve value: 2⁻⁴² ≈ 2.3·10⁻¹³, about a
#: thousand units in the last place, far above the few the evaluation can lose.
MARGIN = 2.0**-42

#: Absolute upward margin on a pure-DP curve value (task ul), for values near the smallest
#: normal float, where MARGIN (relative) does not cover the rounding: e^L in
#: :func:`pure_dp_rdp` is then subnormal and carries an absolute error up to half its
#: smallest step, 2⁻¹⁰⁷⁵, which log1p keeps and the division by α − 1 ≥ 10⁻⁵ > 2⁻¹⁷
#: (``MIN_ORDER``) raises to 2⁻¹⁰⁵⁸; the product by (1 + MARGIN) and the quotient add half
#: a subnormal step each. 2⁻¹⁰⁵² ≈ 1.1·10⁻³¹⁷ covers 32 times all that. Added to a value
#: above 2⁻⁹⁹⁸ ≈ 10⁻³⁰⁰ it changes no float (below half its ulp), so PureDP(ε₀) with
#: ε₀ ≥ 10⁻¹⁴⁰ (every value ≥ ε₀·tanh(ε₀/2)·(1 − 10⁻⁵) > 10⁻²⁸¹) keeps its curve bit for
#: bit (checkpoint curves version 6, docs/theory.md §1.2, §7).
PURE_DP_ABS = 2.0**-1052

#: From this ε₀ on, the pure-DP curve is ε₀ at every order (task cv). Proof: with
#: D = log1p(e^(−ε₀)) − log1p(e^(−(2α−1)ε₀)) ≥ 0, Mironov 2017, Prop. 5 reads
#: ε(α) = ε₀ − D/(α−1) ≤ ε₀, and ε₀ − ε(α) ≤ e^(−ε₀)/(α−1) ≤ e^(−40)/10⁻⁵ < 4.3·10⁻¹³ on any
#: grid (α ≥ MIN_ORDER = 1 + 10⁻⁵), at most 1.1·10⁻¹⁴ of ε₀: an over-count below MARGIN.
#: Below it :func:`pure_dp_rdp` with MARGIN was at or above the truth at every point of
#: review rcv's scan (scripts/rcv_pure_dp_scan.py: ε₀ from 1e-300 to 40, orders from
#: 1 + 1e-5 to 1e6) except near the smallest normal float (docs/theory.md §1.2: values
#: below ~1e-307 whose e^L is subnormal). Its terms are not all small: log sinh(αε₀/2)
#: reaches 2e7 at α = 1e6, where L is as large and the relative error stays tiny.
PURE_DP_FLAT = 40.0

_LOG2 = math.log(2.0)
#: Above this argument sinh and cosh are e^y/2 to double precision (e^−40 < 2⁻⁵³).
_BIG = 20.0


def log_cosh(y: np.ndarray) -> np.ndarray:
    """log cosh(y) for y ≥ 0: log1p(2 sinh²(y/2)) (cosh y = 1 + 2 sinh²(y/2)) for small y,
    y − log 2 + log1p(e^(−2y)) beyond."""
    small = np.minimum(y, _BIG)
    return np.where(y < _BIG, np.log1p(2.0 * np.sinh(small / 2.0) ** 2),
                    y - _LOG2 + np.log1p(np.exp(-2.0 * y)))


def log_sinh(y: np.ndarray) -> np.ndarray:
    """log sinh(y) for y > 0: log(sinh y) for small y (sinh is accurate there), and
    y − log 2 + log1p(−e^(−2y)) beyond."""
    small = np.minimum(y, _BIG)
    with np.errstate(divide="ignore"):  # sinh(0) = 0: −inf, which the caller absorbs
        return np.where(y < _BIG, np.log(np.sinh(small)), y - _LOG2 + np.log1p(-np.exp(-2.0 * y)))


def exp_m1_m_x(u: np.ndarray) -> np.ndarray:
    """e^u − 1 − u (≥ 0 for every u), without the cancellation of expm1(u) − u near 0:
    the Taylor series Σ_{k≥2} u^k/k! for |u| < 1/2 (24 terms: (1/2)^26/26! < 10⁻²⁴),
    expm1(u) − u beyond (there it keeps all but two bits). u must be ≤ 709."""
    u = np.asarray(u, dtype=float)
    small = np.clip(u, -0.5, 0.5)
    term = small * small / 2.0
    series = term.copy()
    for k in range(3, 27):
        term = term * small / k
        series = series + term
    return np.where(np.abs(u) < 0.5, series, np.expm1(np.where(np.abs(u) < 0.5, 0.0, u)) - u)


def pure_dp_rdp(eps: float, orders: np.ndarray) -> np.ndarray:
    """The tight RDP curve of ε₀-DP (randomized response), stably, before the margin.

    Mironov 2017, Prop. 5 (formulas.md §1):
    ε(α) = log((e^(αε₀) + e^(−(α−1)ε₀)) / (1 + e^ε₀)) / (α−1). Dividing numerator and
    denominator by 2e^(ε₀/2) gives cosh((α−½)ε₀)/cosh(ε₀/2), and cosh A − cosh B =
    2 sinh((A+B)/2) sinh((A−B)/2) gives the ratio as 1 + 2 sinh(αε₀/2) sinh((α−1)ε₀/2) /
    cosh(ε₀/2). So ε(α) = log1p(e^L)/(α−1) with
    L = log 2 + log sinh(αε₀/2) + log sinh((α−1)ε₀/2) − log cosh(ε₀/2), all terms exact.
    """
    a = orders
    big_l = (_LOG2 + log_sinh(a * eps / 2.0) + log_sinh((a - 1.0) * eps / 2.0)
             - log_cosh(np.full_like(a, eps / 2.0)))
    return np.logaddexp(0.0, big_l) / (a - 1.0)  # log1p(e^L), also for L ≪ 0


def laplace_rdp_small(t: float, orders: np.ndarray) -> np.ndarray:
    """The Laplace curve at 1/b = t where (α−1)t ≤ 1, stably, before the margin.

    Mironov 2017, Prop. 6 (formulas.md §1): ε(α) = log(S)/(α−1) with
    S = (α e^((α−1)t) + (α−1) e^(−αt)) / (2α−1). Since α(α−1)t − (α−1)αt = 0,
    S − 1 = (α g((α−1)t) + (α−1) g(−αt)) / (2α−1) with g(u) = e^u − 1 − u ≥ 0: a sum of
    nonnegative terms (the first-order terms, which cancel, are gone), and
    ε(α) = log1p(S − 1)/(α−1).
    """
    a = orders
    s_m1 = (a * exp_m1_m_x((a - 1.0) * t) + (a - 1.0) * exp_m1_m_x(-a * t)) / (2.0 * a - 1.0)
    return np.log1p(s_m1) / (a - 1.0)
