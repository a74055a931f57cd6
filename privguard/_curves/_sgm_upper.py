"""A cancellation-free upper bound on the subsampled Gaussian's RDP at integer orders (issue z27).

Opacus (and :func:`privguard._curves._sgm.integer_order`) evaluate
log A_α = log Σ_{j=0}^{α} C(α,j) (1−q)^(α−j) q^j e^((j²−j)/(2σ²))
(Mironov, Talwar & Zhang 2019, §3.3) as a log-space sum whose terms of 0 and
1 draws nearly cancel when A_α − 1 is tiny, and Opacus writes
``math.log(1 - q)``, which loses q's digits below 1 − q's rounding. The
absolute error of log A_α is then a few ulps of 1 times α, and the relative
error of ε(α) = log A_α/(α−1) is unbounded: ``SubsampledGaussian(3.0, 1e-13)``
had ε(2) = 0 against 1.2·10⁻²⁷; σ = 20, q = 6.015·10⁻⁵ was 7.9·10⁻⁶ relative low.

The form here has no cancellation. Since Σ_j C(α,j) (1−q)^(α−j) q^j = 1
(binomial theorem),

    A_α − 1 = Σ_{j=2}^{α} C(α,j) (1−q)^(α−j) q^j (e^((j²−j)/(2σ²)) − 1)   (j = 0, 1 vanish)

is a sum of nonnegative terms, each evaluated in log space with ``log1p(−q)``
and log(expm1(·)); then log A_α = log1p(A_α − 1). :func:`log_moment_upper`
adds to it an explicit bound on that evaluation's rounding (documented
there), so :func:`upper` is never below the true ε(α), and is above it by a
relative 10⁻¹⁰ at most for σ ≥ 0.3, α ≤ 64, q ≥ 10⁻¹⁵ (tests/test_sgm_tiny_q.py).

For fractional orders, :func:`below_two` is a rigorous bound below order 2
(Taylor with the Lagrange remainder), and :func:`fractional_estimate` an
accurate estimate (not a bound) that :mod:`privguard._curves._sgm` checks
Opacus' fractional series against (docs/theory.md §1.1).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, gammaln, logsumexp

_U = 2.0**-53  # unit roundoff of binary64

#: Rounding bound per unit of magnitude of a log-term (see :func:`log_moment_upper`).
_PER_MAGNITUDE = 32 * _U

#: The smallest positive float: a bound that underflows is this, never 0 (below the truth).
_TINY = math.ulp(0.0)

_DENSE_MAX = 64  # orders up to this are evaluated together in one (orders × terms) array


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x − 1) for x ≥ 0 (−inf at 0): log(expm1 x) below 30, x + log1p(−e^−x) above
    (no overflow for x up to the float range)."""
    small = np.minimum(x, 30.0)
    with np.errstate(divide="ignore"):
        return np.where(x < 30.0, np.log(np.expm1(small)), x + np.log1p(-np.exp(-x)))


def _log_terms(q: float, two_var: float, n: np.ndarray, j: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """log of C(n,j) (1−q)^(n−j) q^j (e^((j²−j)/(2σ²)) − 1) for 2 ≤ j ≤ n (−inf elsewhere),
    and the sum of the magnitudes of its parts (for the rounding bound)."""
    valid = (j >= 2) & (j <= n)
    jj = np.where(valid, j, 2.0)
    nn = np.where(valid, n, 2.0)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        quad = (jj * jj - jj) / two_var
        parts = (gammaln(nn + 1.0), -gammaln(jj + 1.0), -gammaln(nn - jj + 1.0),
                 jj * math.log(q), (nn - jj) * math.log1p(-q), _log_expm1(quad))
        log_t = parts[0] + parts[1] + parts[2] + parts[3] + parts[4] + parts[5]
        # |log(expm1 x)| ≤ |log x| + x, the magnitudes the last part's rounding scales with
        mag = (np.abs(parts[0]) + np.abs(parts[1]) + np.abs(parts[2]) + np.abs(parts[3])
               + np.abs(parts[4]) + np.abs(np.log(np.maximum(quad, _TINY))) + quad)
    return np.where(valid, log_t, -np.inf), np.where(valid, mag, 0.0)


def log_moment_upper(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """An upper bound on log A_α at integer orders α ≥ 2 (0 < q < 1), never below the truth.

    log A_α = log1p(B), B = Σ_{j≥2} e^(L_j) (module docstring). Each L_j is a sum of six
    parts (log-gammas, j·log q, (α−j)·log1p(−q), log expm1((j²−j)/(2σ²))), each within a
    few ulps of its magnitude, so |L̃_j − L_j| ≤ 32u·M_j with M_j the sum of the parts'
    magnitudes (u = 2⁻⁵³; 12u would do: 6 parts, 6 additions, 2 roundings in j·log q).
    The per-part bound rests on scipy's ``gammaln`` being within a few ulps of its value at
    integer arguments: measured, not proven (3.3u at most for arguments up to 2·10⁵ and at
    2²⁰+1 and 10⁷+1, review rsg). ``logsumexp`` adds a relative error of at most (α+1)·4u,
    plus u·|log B̃| from its final addition of the largest log-term (review rsg:
    |log B| ≤ max_j M_j + log(α+1), so that part is covered by the slack of 32u over the 12u
    the terms need). So B̃ = B(1 + r) with |r| ≤ r̄ = 32u·max_j M_j + 4(α+1)u (the largest
    M_j, whatever the term's share of B: task sg's margin weighted by the shares lowered
    values at σ ≥ 100 and was reverted, task sgr, so that no value goes down), and since
    log1p(B(1+r)) − log1p(B) ≤ r·B/(1+B) (the derivative of log1p is 1/(1+B)) and
    B ≤ B̃/(1 − r̄) ≤ B̃(1 + 2r̄),
    log1p(B̃) + r̄(1 + 2r̄)·B̃/(1+B̃) + 4u·log1p(B̃) bounds log A_α from above (the last
    term covers log1p's own rounding).
    """
    two_var = 2.0 * sigma * sigma  # sigma is in (1e-150, 1e150): no overflow
    n_all = np.asarray(orders, dtype=np.float64)
    out = np.empty(n_all.shape)
    dense = n_all <= _DENSE_MAX
    groups = []
    if dense.any():
        groups.append((np.flatnonzero(dense), n_all[dense][:, None],
                       np.arange(int(n_all[dense].max()) + 1, dtype=np.float64)[None, :]))
    for i in np.flatnonzero(~dense):
        groups.append((np.array([i]), n_all[i:i + 1, None],
                       np.arange(int(n_all[i]) + 1, dtype=np.float64)[None, :]))
    for idx, n, j in groups:
        log_t, mag = _log_terms(q, two_var, n, j)
        out[idx] = _log1p_upper(logsumexp(log_t, axis=1),
                                _PER_MAGNITUDE * mag.max(axis=1) + 4 * (n[:, 0] + 1.0) * _U)
    return out


def _log1p_upper(log_b: np.ndarray, r_bar: np.ndarray) -> np.ndarray:
    """An upper bound on log1p(B) from B̃ = e^(log_b) = B(1 + r), |r| ≤ r̄ (see
    :func:`log_moment_upper`): log1p(B̃)·(1 + 4u) + r̄(1 + 2r̄)·B̃/(1 + B̃)."""
    with np.errstate(over="ignore"):
        log_a = np.logaddexp(0.0, log_b)  # log1p(B), also for B ≪ 1 and B ≫ 1
        return log_a * (1.0 + 4 * _U) + r_bar * (1.0 + 2.0 * r_bar) * expit(log_b)


def below_two(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """An upper bound on ε(α) for fractional 1 < α < 2, without cancellation.

    A_α = E_{z∼N(0,σ²)}[(1 + q(L−1))^α] with L = e^((2z−1)/(2σ²)) (Mironov et al. 2019,
    §3.3), E[L] = 1 and E[L²] = e^(1/σ²). Taylor's theorem with the Lagrange remainder at 0
    for f(x) = (1+x)^α gives f(x) = 1 + αx + f″(ξ)x²/2 with ξ between 0 and x; here
    x = q(L−1) ≥ −q, and f″(ξ) = α(α−1)(1+ξ)^(α−2) is decreasing in ξ for α < 2, so at most
    α(α−1)(1−q)^(α−2). Taking the expectation (E[x] = 0, E[x²] = q²(e^(1/σ²) − 1)):

        A_α − 1 ≤ α(α−1)/2 · (1−q)^(α−2) · q² · (e^(1/σ²) − 1),

    equality at α = 2. One log-term of four parts; rounding as in :func:`log_moment_upper`.
    """
    a = np.asarray(orders, dtype=np.float64)
    two_var = 2.0 * sigma * sigma
    with np.errstate(over="ignore", divide="ignore"):
        quad = 2.0 / two_var
        parts = (np.log(a * (a - 1.0) / 2.0), (a - 2.0) * math.log1p(-q),
                 np.full_like(a, 2.0 * math.log(q)), np.full_like(a, float(_log_expm1(np.array(quad)))))
        log_b = parts[0] + parts[1] + parts[2] + parts[3]
        mag = (np.abs(parts[0]) + np.abs(parts[1]) + np.abs(parts[2])
               + abs(math.log(max(quad, _TINY))) + quad)
        # a·(a−1)/2: two more roundings of the product (covered by the 32u per magnitude ≥ 1)
        bound = _log1p_upper(log_b, _PER_MAGNITUDE * (1.0 + mag)) / (a - 1.0) * (1.0 + 2 * _U)
    return np.maximum(bound, _TINY)


def upper(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """An upper bound on one step's ε(α) = log A_α/(α−1) at integer orders α ≥ 2.

    Never below the true RDP (:func:`log_moment_upper`, then a division rounded up by
    one more relative 2u), and never 0: a value that underflows is the smallest float.
    """
    n = np.asarray(orders, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.maximum(log_moment_upper(q, sigma, n) / (n - 1.0) * (1.0 + 2 * _U), _TINY)




_SERIES_TERMS = 34  # |αx| < 1/4: |C(α,k)x^k| ≤ (1/4)^k/k!, and (1/4)^36/36! < 1e-62


def fractional_estimate(q: float, sigma: float, orders: np.ndarray, step: float = 0.2) -> np.ndarray:
    """An accurate estimate (not a bound) of ε(α) at fractional α, to check Opacus' value.

    A_α − 1 = E_{u~N(0,1)}[(1+x)^α − 1 − αx] with x = q(e^((2σu−1)/(2σ²)) − 1) (Mironov et al.
    2019, §3.3; L = e^((2σu−1)/(2σ²)) is the likelihood ratio, E[L] = 1): the linear term has
    mean 0 exactly, and what is left is nonnegative for α > 1 (convexity), so the trapezoidal
    rule (spectrally accurate for this smooth Gaussian-weighted integrand; step 0.2) sums
    nonnegative terms without cancellation. (1+x)^α − 1 − αx is the binomial series
    Σ_{k≥2} C(α,k)x^k where |αx| < 1/4, and e^(α·log1p x) − 1 − αx beyond (a few digits lost
    at most), in log space where it would overflow. The nodes cover u ∈ [−40, α/σ + 40]:
    the mass sits near u = 0 and u = α/σ (e^(−40²/2) < 1e-347). Measured against an
    mpmath quadrature: within 1e-11 relative, ~1e-13 typically (tests/test_sgm_tiny_q.py).
    """
    a = np.asarray(orders, dtype=np.float64)
    top = float(np.minimum(a / sigma, 1e4).max()) + 40.0
    u = np.arange(-40.0, top + step, step)
    with np.errstate(over="ignore", invalid="ignore"):
        x = q * np.expm1((2.0 * sigma * u - 1.0) / (2.0 * sigma * sigma))
    log_w = -u * u / 2.0 - 0.5 * math.log(2.0 * math.pi) + math.log(step)
    small = np.abs(x)[None, :] * a[:, None] < 0.25  # (orders × nodes)
    xs = np.where(small, x[None, :], 0.0)
    # series part: Σ_k C(α,k) x^k, C(α,k)x^k = C(α,k−1)x^(k−1)·(α−k+1)x/k
    term = a[:, None] * (a[:, None] - 1.0) / 2.0 * xs * xs
    series = term.copy()
    for k in range(3, _SERIES_TERMS + 3):
        term = term * (a[:, None] - k + 1.0) / k * xs
        series = series + term
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        xl = np.where(small, 0.0, x[None, :])
        lp = a[:, None] * np.log1p(xl)
        linear = np.exp(np.minimum(lp, 700.0)) - 1.0 - a[:, None] * xl
        direct = np.where(lp > 700.0, np.exp(lp + log_w[None, :]), linear * np.exp(log_w)[None, :])
        total = np.where(small, series * np.exp(log_w)[None, :], direct).sum(axis=1)
        return np.log1p(total) / (a - 1.0)
