"""Gradient accumulation: k Poisson micro-batches, one noise draw (docs/theory.md §14).

One optimizer step of a loop that accumulates ``k`` micro-batches draws each
micro-batch by Poisson sampling at rate q, clips every example's gradient in
every micro-batch it is drawn into, sums all of them and adds one Gaussian
noise draw N(0, σ²C²). An example drawn into micro-batches i moves the sum by
Σ_{i: I_i=1} c_i, ‖c_i‖ ≤ C. The c_i may differ (per-draw randomness:
dropout in train mode, augmentation drawn per micro-batch); only a mechanism
built with ``aligned=True`` asserts that they are one vector c, so that the
sum moves by J·c with J ~ Binomial(k, q). By translation,
rotation and post-processing (theory §14, Lemma 14.1) the step's Rényi
divergence in each direction is then at most the one-dimensional

    remove: D_α(P ‖ Q),  add: D_α(Q ‖ P),
    P = Σ_j b_j N(j, σ²),  Q = N(0, σ²),  b_j = C(k, j) q^j (1−q)^(k−j)

(sensitivity 1, as every curve in privguard). This module bounds both
(which pieces hold for any vectors c_i is said for each; ``aligned=False``,
the default, uses only those: theory §14, Lemma 14.5):

* remove, integer α ≤ :data:`EXACT_MAX_ORDER`: exactly (aligned), and an
  upper bound for any vectors c_i (Lemma 14.5). With w = e^{z/σ²},
  P/Q = f(w) = Σ_j b_j e^{−j²/(2σ²)} w^j, a polynomial with positive
  coefficients, and E_Q[w^m] = e^{m²/(2σ²)}; so E_Q[(P/Q)^α] =
  Σ_m c_m^{(α)} e^{m²/(2σ²)} with c^{(α)} the coefficients of f^α, computed
  by repeated convolution in log space (:func:`_log_poly_powers`);
* remove, fractional α ≤ :data:`EXACT_MAX_ORDER`: the chord of the convex
  function (α−1)·D_α between the integer neighbours (theory §14, Lemma 14.2;
  any vectors); below α = 3 also the remove quadrature (aligned only);
* add, α ≤ :data:`EXACT_MAX_ORDER`, aligned only: an upper Riemann sum of
  the monotone integrand f^{−(α−1)} against the Gaussian measure, with both
  tails bounded (theory §14, Lemma 14.3): a proven upper bound whatever the
  step size; for any vectors, the cap −k·log(1−q) (D_∞, P ≥ b_0·Q) and a
  split of the mixture with a second-order bound (Lemma 14.6);
* remove, fractional α, any vectors: a term-by-term tangent/subadditivity
  bound (Lemma 14.7), and the lower convex hull of all these bounds;
* every order: k-fold composition of the subsampled Gaussian at rate q and
  noise multiplier σ/√k (theory §14, Lemma 14.4), valid in both directions;
  the curve is the smaller of this and the two bounds above (each a bound),
  and the only one used beyond :data:`EXACT_MAX_ORDER` or beyond
  :data:`EXACT_MAX_MICRO_BATCHES` micro-batches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp

from privguard import _validation as check
from privguard._curves import _sgm
from privguard._curves._upward import times_up
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism
from privguard._mechanisms._mechanisms import SubsampledGaussian

EXACT_MAX_ORDER = 64
"""Largest order bounded by the expansion and the quadrature (above: composition)."""

EXACT_MAX_MICRO_BATCHES = 32
"""Most micro-batches for the expansion and the quadrature (above: composition only)."""

MAX_MICRO_BATCHES = 2**20
"""The most micro-batches one step may accumulate."""

_TAIL = 40.0  # the quadrature covers u in [-40, 40]; Φ(-40) < 1e-348
_MAX_POINTS = 40_001
_MARGIN = 1e-12
_DIRECT_BELOW = 3.0  # fractional orders below this also get the remove-direction quadrature  # relative floating-point margin on the quadrature's log-moment


def _log_weights(q: float, k: int) -> np.ndarray:
    """log b_j = log C(k, j) + j log q + (k−j) log(1−q), j = 0..k (0 < q < 1)."""
    j = np.arange(k + 1, dtype=np.float64)
    return (gammaln(k + 1.0) - gammaln(j + 1) - gammaln(k - j + 1)
            + j * math.log(q) + (k - j) * math.log1p(-q))


def composition_bound(q: float, sigma: float, k: int, orders: np.ndarray) -> np.ndarray:
    """k · ε_SGM(q, σ/√k)(⌈α⌉): the k micro-batches released separately (Lemma 14.4).

    At integer orders the subsampled Gaussian's exact sum (``_sgm.integer_order``,
    Mironov et al. 2019 §3.3), at a fractional order its value at ⌈α⌉
    (RDP is non-decreasing in α), capped by the Gaussian bound k·α/(2σ²/k).
    """
    s = sigma / math.sqrt(k)
    with np.errstate(over="ignore"):
        # Where the all-micro-batches term dominates (large α; q = 1) this bound equals
        # the aligned truth to 20 digits and its floating-point value can fall an ulp
        # below it: the relative margin of the log-moments (_MARGIN) is added here too
        # (tests/test_accumulation_review.py::test_large_orders_are_not_below_the_truth_by_rounding)
        gauss = _sgm.gaussian_bound(orders, s) * k * (1.0 + _MARGIN)
    if q == 1.0 or not (1e-150 < s < 1e150):
        return gauss
    needed = np.maximum(2, np.ceil(orders)).astype(np.int64)
    small = np.unique(needed[needed <= EXACT_MAX_ORDER])
    values = {int(n): v for n, v in zip(small, _sgm_integer_orders(q, s, small))}
    for n in set(needed.tolist()) - set(values):
        values[n] = _sgm.integer_order(q, s, n)
    # Each log-term of the sum carries an absolute error of a few ulps of its size, at
    # most gammaln(n+1) + n·(|log q| + |log(1−q)|) + (n²−n)/(2s²); at a tiny q the terms
    # of 0 and 1 draws cancel (−n·q against +n·q) and that error exceeded the sum (q =
    # 1e-13: 0.86× the exact D_2, or negative). The margin of remove_integer, 1e-12 of
    # that size, is added to the log-moment (tests/test_accumulation_review.py).
    log_q, log_p = abs(math.log(q)), abs(math.log1p(-q))
    with np.errstate(over="ignore"):
        out = np.array([k * (values[n] + _MARGIN * (1.0 + float(gammaln(n + 1.0)) + n * (log_q + log_p)
                                                    + (n * n - n) / (2.0 * s * s)) / (n - 1))
                        for n in needed.tolist()]) * (1.0 + _MARGIN)
    return np.maximum.accumulate(np.minimum(out, gauss))


def _sgm_integer_orders(q: float, s: float, ns: np.ndarray) -> np.ndarray:
    """``_sgm.integer_order(q, s, n)`` for several small n at once (the same sum)."""
    if ns.size == 0:
        return np.empty(0)
    n = ns.astype(np.float64)[:, None]
    i = np.arange(int(ns.max()) + 1, dtype=np.float64)[None, :]
    with np.errstate(invalid="ignore"):
        log_terms = (gammaln(n + 1.0) - gammaln(i + 1) - gammaln(np.maximum(n - i, 0) + 1)
                     + i * math.log(q) + (n - i) * math.log1p(-q)
                     + np.where(i < 2, 0.0, (i * i - i) / (2 * s * s)))
    log_terms = np.where(i <= n, log_terms, -np.inf)
    return np.asarray(logsumexp(log_terms, axis=1)) / (ns - 1.0)


def _log_poly_powers(log_coef: np.ndarray, top: int) -> list[np.ndarray]:
    """log-coefficients of f^a for a = 1..top, f given by its log-coefficients."""
    out = [log_coef]
    cur = log_coef
    taps = log_coef.size
    rev = log_coef[::-1]
    for _ in range(top - 1):
        padded = np.concatenate((np.full(taps - 1, -np.inf), cur, np.full(taps - 1, -np.inf)))
        # row m holds cur[m−j] + log_coef[j], j = taps−1..0: the terms of coefficient m
        window = np.lib.stride_tricks.sliding_window_view(padded, taps) + rev
        top_term = window.max(axis=1)
        cur = top_term + np.log(np.exp(window - top_term[:, None]).sum(axis=1))
        out.append(cur)
    return out


def remove_integer(q: float, sigma: float, k: int, top: int) -> np.ndarray:
    """(α−1)·D_α(P‖Q) for α = 2..top (index α−2): exact, plus a 1e-12 rounding margin."""
    two_var = 2.0 * sigma * sigma
    j = np.arange(k + 1, dtype=np.float64)
    log_f = _log_weights(q, k) - j * j / two_var
    values = np.empty(top - 1)
    for a, log_c in enumerate(_log_poly_powers(log_f, top)[1:], start=2):
        m = np.arange(log_c.size, dtype=np.float64)
        terms = log_c + m * m / two_var
        # a relative margin of 1e-12 on the log-moment covers the sum's rounding
        scale = 1.0 + float(np.max(np.abs(terms[np.isfinite(terms)])))
        values[a - 2] = max(float(logsumexp(terms)) + _MARGIN * scale, 0.0)
    return values


def add_quadrature(q: float, sigma: float, k: int, orders: np.ndarray) -> np.ndarray:
    """An upper bound on D_α(Q‖P) at each order (Lemma 14.3: upper Riemann sum)."""
    log_b = _log_weights(q, k)
    j = np.arange(k + 1, dtype=np.float64)
    # Any range and step give an upper bound (Lemma 14.3); these only make it tight:
    # the left tail's bound b_0^{−(α−1)}·Φ(−L) is below e^{−40}, and log f moves by
    # at most k·Δ/σ per step (Δ ≤ 0.005: the sum exceeds the integral by ≤ 0.2% of h's range).
    worst = float(np.max(orders) - 1.0) * -log_b[0]
    tail = min(_TAIL, math.sqrt(2.0 * (worst + 40.0)))
    step = min(0.005, sigma / (8.0 * k))
    n = min(_MAX_POINTS, 2 * math.ceil(tail / step) + 1)
    u = np.linspace(-tail, tail, n)  # u = z/σ ~ N(0, 1); 0 is a grid point (n odd)
    # log f(u) = logsumexp_j(log b_j + j·u/σ − j²/(2σ²)), non-decreasing in u.
    log_f = logsumexp(log_b[:, None] + (j[:, None] * u[None, :] - j[:, None] ** 2 / (2 * sigma))
                      / sigma, axis=0)
    log_mass = _log_interval_mass(u)
    scale = 1.0 + np.max(np.abs(log_f))
    e = orders[:, None] - 1.0
    log_tail = float(log_ndtr(-tail))
    inner = -e * log_f[None, :-1] + log_mass[None, :]  # [u_i, u_{i+1}]: h ≤ h(u_i)
    edges = np.concatenate((-e * log_b[0] + log_tail,       # (−∞, u_0]: f ≥ b_0
                            -e * log_f[-1] + log_tail), axis=1)  # [u_N, ∞): h ≤ h(u_N)
    terms = np.concatenate((inner, edges), axis=1)
    top = terms.max(axis=1)
    log_m = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
    e = e[:, 0]
    return np.maximum(log_m + _MARGIN * e * scale, 0.0) / e


def remove_quadrature(q: float, sigma: float, k: int, orders: np.ndarray) -> np.ndarray:
    """An upper bound on D_α(P‖Q) at each order (Lemma 14.3, the increasing case).

    h(u) = f(u)^α is non-decreasing: on [u_i, u_{i+1}] h ≤ h(u_{i+1}); on
    (−∞, u_0] h ≤ h(u_0); on [u_N, ∞) f(u) ≤ f(u_N)·e^{k(u−u_N)/σ} (no term
    grows faster), so that tail is at most
    f(u_N)^α · e^{−t·u_N + t²/2} · Φ̄(u_N − t), t = αk/σ.
    """
    log_b = _log_weights(q, k)
    j = np.arange(k + 1, dtype=np.float64)
    t = orders * k / sigma
    low, high = -12.0, min(400.0, max(12.0, float(t.max()) + 12.0))
    n = 2 * (_MAX_POINTS // 4) + 1
    u = np.linspace(low, high, n)
    log_f = logsumexp(log_b[:, None] + (j[:, None] * u[None, :] - j[:, None] ** 2 / (2 * sigma))
                      / sigma, axis=0)
    log_mass = _log_interval_mass(u)
    scale = 1.0 + np.max(np.abs(log_f)) * float(orders.max()) + float(t.max()) * high
    a = orders[:, None]
    inner = a * log_f[None, 1:] + log_mass[None, :]
    left = a * log_f[0] + float(log_ndtr(low))
    right = (a[:, 0] * log_f[-1] - t * high + t * t / 2 + log_ndtr(t - high))[:, None]
    terms = np.concatenate((inner, left, right), axis=1)
    top = terms.max(axis=1)
    log_m = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
    return np.maximum(log_m + _MARGIN * scale, 0.0) / (orders - 1.0)


def _log_interval_mass(u: np.ndarray) -> np.ndarray:
    """log(Φ(u_{i+1}) − Φ(u_i)), by the side of 0 each interval lies on (no cancellation)."""
    lo, hi = u[:-1], u[1:]
    left = hi <= 0
    a = np.where(left, log_ndtr(hi), log_ndtr(-lo))
    b = np.where(left, log_ndtr(lo), log_ndtr(-hi))
    with np.errstate(divide="ignore"):
        return a + np.log(-np.expm1(b - a))


def add_any_directions(q: float, sigma: float, k: int, orders: np.ndarray) -> np.ndarray:
    """An upper bound on D_α(Q‖P_c) for ANY vectors c_i, ‖c_i‖ ≤ 1 (theory §14, Lemma 14.6).

    Split P_c = λ·P_A + (1−λ)·P_B: P_A holds ν_A of the no-draw mass b_0 and the
    draws of 1..m micro-batches, P_B the rest (ν_B = b_0 − ν_A and more than m
    micro-batches). Φ(P) = E_Q[(P/Q)^{−(α−1)}] is convex in P, so
    Φ(P_c) ≤ λ·Φ(P_A) + (1−λ)·Φ(P_B), with Φ(P_B) ≤ ((1−λ)/ν_B)^{α−1}
    (P_B ≥ ν_B/(1−λ)·Q) and, by a second-order Taylor bound of (1+x)^{−(α−1)}
    on x ≥ −γ_A (γ_A = 1 − ν_A/λ), Φ(P_A) ≤ 1 + [(1−γ_A)^{−(α−1)} − 1 −
    (α−1)γ_A]·χ²(R_A‖Q), where γ_A²·χ² ≤ Σ_{j,j'≤m} b_j b_j' (e^{jj'/σ²} − 1)/λ²
    (⟨S, S'⟩ ≤ J·J'). Every (m, ν_B) gives a bound; the smallest over a fixed
    set is returned, with a relative margin for rounding.
    """
    log_b = _log_weights(q, k)
    b = np.exp(log_b)
    if not b[0] > 0.0:  # the no-draw mass underflows: no bound here (the caller has others)
        return np.full(orders.size, np.inf)
    j = np.arange(k + 1, dtype=np.float64)
    beta = orders - 1.0
    best = np.full(orders.size, np.inf)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for m in range(1, k + 1):
            log_s = float(logsumexp(log_b[1:m + 1]))
            prod = np.outer(j[1:m + 1], j[1:m + 1]) / (sigma * sigma)
            log_d = float(logsumexp(log_b[1:m + 1, None] + log_b[None, 1:m + 1]
                                    + np.log(np.expm1(prod))))
            tail = float(b[m + 1:].sum())
            # ν_B = 0 only when nothing is left for P_B (m = k); a positive ν_B otherwise
            # (a mass that underflows is not dropped: that m is skipped)
            nus = [0.0] if m == k else sorted({v for e in range(-3, 13)
                                               if (v := min(0.5 * b[0], tail * 2.0**e)) > 0.0})
            for nu_b in nus:
                nu_a = b[0] - nu_b
                lam = nu_a + math.exp(log_s)
                gamma = math.exp(log_s) / lam
                # −(α−1)·log(1 − γ_A) = (α−1)·log1p(S_m/ν_A), to a relative error of a few
                # ulps: κ below is second order in γ_A, and log(λ/ν_A) (an absolute error
                # of an ulp) lost all of it once k·q ≲ 1e-8 (tests/test_accumulation_review.py)
                x = beta * math.log1p(math.exp(log_s) / nu_a)
                # (1−γ)^{−β} − 1 − βγ, plus a bound on its floating-point error
                coef = np.expm1(x) - beta * gamma + 4e-16 * ((1.0 + x) * np.exp(x) + beta * gamma)
                terms = [math.log(lam) + np.log(np.maximum(coef, 0.0)) + log_d - 2.0 * log_s]
                if nu_b > 0.0:
                    rest = nu_b + tail  # 1 − λ
                    terms.append(math.log(rest) + np.log(np.expm1(beta * math.log(rest / nu_b))))
                log_excess = terms[0] if len(terms) == 1 else np.logaddexp(terms[0], terms[1])
                best = np.minimum(best, np.logaddexp(0.0, log_excess) / beta)
    best = best * (1.0 + 1e-9)
    return np.where(np.isfinite(best), best, np.inf)


def remove_fractional_any_directions(q: float, sigma: float, k: int,
                                     orders: np.ndarray) -> np.ndarray:
    """An upper bound on (α−1)·D_α(P_c‖Q), fractional α, ANY vectors (theory §14, Lemma 14.7).

    With α = n + t (0 < t < 1) and P_c/Q = L = b_0 + Σ_{θ≠∅} b_θ ℓ_θ (θ the set of
    micro-batches that draw the example): L^α = L^n·L^t and, term by term,
    either the tangent (b_0 + y)^t ≤ b_0^t + t·b_0^{t−1}·y or the
    subadditivity (Σ y)^t ≤ Σ y^t, so E_Q[L^α] is at most
    b_0^t·E[L^n] + Σ_{j≥1} min(t·b_0^{t−1}·b_j·W_j, C(k, j)·(q^j(1−q)^{k−j})^t·V_j),
    W_j, V_j the Gaussian integrals E_Q[L^n ℓ_θ] and E_Q[L^n ℓ_θ^t] for |θ| = j,
    each at most its aligned value (every inner product ≤ the product of the
    draw counts, and the term (t² − t)‖m_θ‖² ≤ 0 dropped).
    """
    two_var = 2.0 * sigma * sigma
    j = np.arange(k + 1, dtype=np.float64)
    log_b = _log_weights(q, k)
    whole = np.floor(orders).astype(int)
    powers = _log_poly_powers(log_b - j * j / two_var, max(1, int(whole.max())))
    log_choose = gammaln(k + 1.0) - gammaln(j + 1) - gammaln(k - j + 1)
    log_theta = j * math.log(q) + (k - j) * math.log1p(-q)  # log b_θ for |θ| = j
    out = np.empty(orders.size)
    for n in np.unique(whole).tolist():  # the orders that share n share F^n
        at = np.flatnonzero(whole == n)
        t = (orders[at] - n)[:, None]  # one row per order
        log_c = powers[n - 1]  # coefficients of F^n: the law of J_1 + … + J_n, weighted
        mm = np.arange(log_c.size, dtype=np.float64)
        base = log_c[None, :] + mm[None, :] ** 2 / two_var
        shift = j[:, None] * mm[None, :] / (sigma * sigma)
        log_w = logsumexp(base + shift, axis=1)  # W_j, j = 0..k
        log_v = logsumexp(base[None] + t[:, :, None] * shift[None], axis=2)  # V_j per order
        sub = log_choose[None, :] + t * log_theta[None, :] + log_v
        tangent = np.log(t) + (t - 1.0) * log_b[0] + log_b[None, :] + log_w[None, :]
        terms = np.concatenate((t * log_b[0] + log_v[:, :1], np.minimum(sub, tangent)[:, 1:]),
                               axis=1)
        scale = 1.0 + float(np.max(np.abs(base[np.isfinite(base)])))
        out[at] = np.maximum(logsumexp(terms, axis=1) + _MARGIN * scale, 0.0)
    return out


def _lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The lower convex hull of the points (x_i, y_i) (x increasing), at each x_i."""
    hull: list[tuple[float, float]] = []
    for point in zip(x.tolist(), y.tolist()):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (point[0] - x1) >= (point[1] - y1) * (x2 - x1):
                hull.pop()  # the middle point is on or above the chord
            else:
                break
        hull.append(point)
    hx, hy = np.array(hull).T
    return np.minimum(y, np.interp(x, hx, hy))


def _chords(q: float, sigma: float, k: int, small: np.ndarray
            ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(g, top, g_α, t) on the orders ``small`` (≤ EXACT_MAX_ORDER): g[a] = (a−1)·D_a of
    the remove direction at the integers a ≤ top (exact for aligned vectors, an upper bound
    for any: theory §14, Lemma 14.5), and its chord g_α at each order, t = α − ⌊α⌋."""
    top = max(2, math.ceil(float(small.max())))
    g = np.concatenate(([0.0, 0.0], remove_integer(q, sigma, k, top)))  # g[a] = (a−1)·D_a
    n = np.floor(small).astype(int)
    frac = small - n
    upper = np.minimum(n + 1, top)
    # Lemma 14.2: (α−1)·D_α ≤ (1−t)·g(n) + t·g(n+1), t = α − n; g(1) = 0; exact at t = 0.
    g_alpha = np.where(frac == 0.0, g[n], (1.0 - frac) * g[n] + frac * g[upper])
    return g, top, g_alpha, frac


def _curve_any_directions(q: float, sigma: float, k: int, orders: np.ndarray,
                          bound: np.ndarray) -> np.ndarray:
    """The curve for any vectors c_i (``aligned=False``; theory §14, Lemma 14.5–14.7)."""
    low = orders <= EXACT_MAX_ORDER
    small = orders[low]
    g, top, g_alpha, frac = _chords(q, sigma, k, small)
    part = frac > 0.0
    if part.any():
        g_alpha[part] = np.minimum(g_alpha[part],
                                   remove_fractional_any_directions(q, sigma, k, small[part]))
    # (α−1)·D_α is convex in α (Lemma 14.2): the lower convex hull of these upper bounds,
    # the integer ones and g(1) = 0, bounds it as well
    xs = np.concatenate(([1.0], small, np.arange(2.0, top + 1.0)))
    ys = np.concatenate(([0.0], g_alpha, g[2:top + 1]))
    idx = np.lexsort((ys, xs))
    xs, ys = xs[idx], ys[idx]
    first = np.concatenate(([True], np.diff(xs) > 0))  # the smallest bound at each order
    xs, ys = xs[first], ys[first]
    remove = np.interp(small, xs, _lower_hull(xs, ys)) / (small - 1.0)
    # add: the cap −k·log(1−q) (P ≥ b_0·Q) and Lemma 14.6
    add = np.minimum(-k * math.log1p(-q), add_any_directions(q, sigma, k, small))
    out = bound.copy()
    both = np.maximum(remove, add)
    out[low] = np.where(bound[low] < both * (1.0 - 1e-9), bound[low], both)
    # D_α is non-decreasing in α: a bound at α' ≥ α bounds D_α too (values only lowered
    # to a bound proved at a larger order)
    return np.minimum.accumulate(out[::-1])[::-1]


def curve(q: float, sigma: float, k: int, orders: np.ndarray, aligned: bool = True) -> np.ndarray:
    """One accumulated step's curve on a validated grid (k ≥ 2); see the module.

    ``aligned=False`` keeps only the bounds that hold whatever the example's
    clipped gradients in the k micro-batches (docs/theory.md §14, Lemmas
    14.5–14.7): the remove direction's integer-order expansion, its chords and
    :func:`remove_fractional_any_directions`; the add direction's cap
    −k·log(1−q) and :func:`add_any_directions`; the composition bound.
    """
    bound = composition_bound(q, sigma, k, orders)
    two_var = 2.0 * sigma * sigma
    # below 1e-290, j²/(2σ²) overflows (inf − inf: NaN): the composition bound alone
    # (huge, or +inf once σ/√k ≤ 1e-150, as for the subsampled Gaussian)
    if q == 1.0 or k > EXACT_MAX_MICRO_BATCHES or not (1e-290 < two_var < 1e300):
        return bound
    low = orders <= EXACT_MAX_ORDER
    if not low.any():
        return bound
    if not aligned:
        return _curve_any_directions(q, sigma, k, orders, bound)
    small = orders[low]
    _, _, g_alpha, frac = _chords(q, sigma, k, small)
    remove = g_alpha / (small - 1.0)
    direct = (frac > 0.0) & (small < _DIRECT_BELOW)
    # below α = 3 the chord is loose (from g(1) = 0): integrate as well, but the
    # quadrature is of the one-dimensional aligned pair (Lemma 14.1): aligned only
    if direct.any():
        remove[direct] = np.minimum(remove[direct], remove_quadrature(q, sigma, k, small[direct]))
    # add ≤ −log b_0 = −k·log(1−q) at every order (P ≥ b_0·Q whatever the vectors, the
    # term of no draw; theory §14, Lemmas 14.3 and 14.5): the quadrature is needed only
    # where that cap is above the remove bound
    add = np.full(small.size, -k * math.log1p(-q))
    need = remove < add  # the quadrature assumes aligned vectors (Lemma 14.1)
    if need.any():
        add[need] = np.minimum(add[need], add_quadrature(q, sigma, k, small[need]))
    out = bound.copy()
    both = np.maximum(remove, add)
    # the composition bound replaces them only where clearly smaller: where the two
    # agree (the all-micro-batches term dominates) the margined expansion is kept
    out[low] = np.where(bound[low] < both * (1.0 - 1e-9), bound[low], both)
    return np.maximum.accumulate(out)


@dataclasses.dataclass(frozen=True)
class AccumulatedSubsampledGaussian(Mechanism):
    """``steps`` DP-SGD steps that each accumulate ``micro_batches`` Poisson micro-batches.

    Each step draws ``micro_batches`` (k) independent Poisson micro-batches at
    rate ``sample_rate`` (q), clips every example's gradient in each
    micro-batch it is drawn into, sums them all and adds one Gaussian noise
    draw with multiplier ``noise_multiplier`` (σ): the loop of Opacus with
    two or more ``backward()`` per ``optimizer.step()``, or Hugging Face's
    ``gradient_accumulation_steps``. An example lands in J ~ Binomial(k, q)
    micro-batches and moves the sum by up to J·C, so this costs much more
    than ``SubsampledGaussian(σ, k·q)`` (docs/theory.md §14). ``k = 1`` is
    :class:`SubsampledGaussian` itself, bit for bit. ``micro_batches`` is at
    most 2^20 and ``steps`` at most 2^53.

    ``aligned`` (default False) is an assertion about the training loop, not
    a tuning knob. With False the curve holds whatever an example's clipped
    gradients in the k micro-batches are: dropout in train mode or data
    augmentation drawn per micro-batch give the same example different
    gradients, and that case is only proved for the remove direction and the
    composition of the k micro-batches (§14, Lemma 14.5), so the add
    direction is charged at min(−k·log(1−q), that composition): often far
    more. ``aligned=True`` asserts that the clipped gradient of an example is
    the same vector in every micro-batch of a step (no randomness in the
    forward pass or the data pipeline between draws: no dropout in train
    mode, no per-draw augmentation) and charges the tighter aligned curve
    (§14, Lemmas 14.1–14.4) and makes the step eligible for the hybrid
    filter's envelope (§2b.1). privguard's integrations never set it: they
    cannot see functional dropout or augmentation. With one micro-batch it is
    always True (one draw is trivially aligned). Journals written before the
    field existed (no ``aligned`` key) were charged the aligned curve and
    load as ``aligned=True``.

    Example:
        >>> from privguard import mechanisms as M
        >>> step = M.AccumulatedSubsampledGaussian(1.0, 0.125, micro_batches=2)
        >>> round(float(step.rdp([4.0])[0]), 2)
        2.51
        >>> bool(step.rdp([4.0])[0] > M.SubsampledGaussian(1.0, 0.25).rdp([4.0])[0])
        True
        >>> robust = M.AccumulatedSubsampledGaussian(1.0, 0.004, 8)
        >>> aligned = M.AccumulatedSubsampledGaussian(1.0, 0.004, 8, aligned=True)
        >>> bool(robust.rdp([1.5])[0] > aligned.rdp([1.5])[0])
        True
    """

    noise_multiplier: float
    sample_rate: float
    micro_batches: int
    steps: int = 1
    aligned: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier",
                           check.positive_finite("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check.sample_rate("sample_rate", self.sample_rate))
        object.__setattr__(self, "micro_batches",
                           check.positive_int("micro_batches", self.micro_batches,
                                              maximum=MAX_MICRO_BATCHES))
        object.__setattr__(self, "steps",
                           check.positive_int("steps", self.steps, maximum=check.MAX_STEPS))
        check.flag("aligned", self.aligned)  # an assertion: True or False, nothing truthy
        if self.micro_batches == 1:  # one draw a step: trivially the same vector
            object.__setattr__(self, "aligned", True)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A pickle written before the field existed was charged the aligned curve.
        self.__dict__.update({"aligned": True, **state})

    def _params(self) -> dict[str, Any]:
        # aligned=True is written without the key: the bytes every journal had before the
        # field existed, with the meaning they had (the stability contract of _base).
        params = super()._params()
        if self.aligned:
            del params["aligned"]
        return params

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> Mechanism:
        if params.get("aligned", False) is True:  # the default key is never written
            raise InvalidArgumentError("params", check.short(params),
                                       "aligned=True is written without the key")
        return cls(**{"aligned": True, **params})

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        if self.micro_batches == 1:  # one micro-batch: the subsampled Gaussian, bit for bit
            return SubsampledGaussian(self.noise_multiplier, self.sample_rate,
                                      self.steps)._rdp(orders)
        # docs/theory.md §14 (Lemmas 14.1–14.5): max of both directions, each bounded;
        # k-fold composition is k × one step (Mironov 2017, Prop. 1), rounded up for k ≥ 2
        # (docs/theory.md §6, as a journal sums k charges of one step).
        with np.errstate(over="ignore"):
            return times_up(self.steps, curve(self.sample_rate, self.noise_multiplier,
                                              self.micro_batches, orders, self.aligned))
