"""The add direction of random allocation, bounded through the Laplace transform (docs/theory.md §15).

With the notation of ``privguard._mechanisms._allocation`` (one epoch of ``t`` Gaussian
steps, s = 1/σ), the add direction is D_α(Q‖P) = (1/β)·log E_Q[L^(−β)] with
β = α − 1 and L = (1/t) Σ_i X_i, where the X_i = exp(s·Z_i − s²/2) are
independent log-normal variables of mean 1 under Q. For every L > 0 and
β > 0, L^(−β) = (1/Γ(β)) ∫_0^∞ u^(β−1) e^(−uL) du, so by Tonelli

    E_Q[L^(−β)] = (1/Γ(β)) ∫_0^∞ u^(β−1) ψ(u) du,   ψ(u) = φ(u/t)^t,   φ(v) = E[e^(−vX)].

Everything below is an upper bound, never an estimate:

1. φ(v) at a grid point is bounded five ways, and the smallest is kept:
   (a) 1 − v + v²·E[X²]/2 + E[r(vX)] with r(y) = e^(−y) − 1 + y − y²/2 ≤ 0,
       r decreasing in y; E[r(vX)] is bounded above by a left-endpoint sum
       over a grid of z (r∘x is decreasing in z) with the mass outside the
       grid dropped (r ≤ 0 there);
   (a') the same with one more exact term, −v³E[X³]/6, and
       r3(y) = e^(−y) − 1 + y − y²/2 + y³/6 ≥ 0, which is increasing and convex
       in z: on each cell below its chord (closed-form weights against the
       normal density), the mass outside the grid bounded as in the code;
   (b) E[e^(−vX)] as a left-endpoint sum over the same grid (the integrand
       decreases in z), the mass left of the grid counted as 1, right of it at
       the last point's value;
   (c) for any γ > 0, e^(−y) ≤ (γ/e)^γ·y^(−γ), so φ(v) ≤ (γ/e)^γ v^(−γ) E[X^(−γ)]
       with E[X^(−γ)] = exp(γ(γ+1)s²/2), minimised over a set of γ;
   (d) 1, and every bound at a smaller v (φ decreases).
2. log ψ is convex in u (Hölder: log of a Laplace transform), so between two
   grid points it lies below the chord through their upper bounds; the
   integral of u^(β−1)·exp(chord) over a cell is an incomplete gamma function.
3. Beyond the last grid point U, bound (c) raised to the t-th power gives
   ∫_U^∞ u^(β−1) ψ(u) du ≤ e^(t(γ log γ − γ + γ(γ+1)s²/2)) t^g U^(β−g)/(g − β), g = γt > β.

Rounding is covered by a relative margin on each cell (``_MARGIN``) that is
many times the error of the float operations involved.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammainc, gammaincc, gammaln, ndtr

MAX_ORDER = 65
"""The bound is computed for orders ≤ 65 (β ≤ 64); above, the AM–GM bound is used alone."""

_MARGIN = 1e-12  # relative, per cell and per φ value: far above the float error of each
_Z_CELLS = 600
_GAMMAS = np.geomspace(1e-3, 64.0, 48)


def _log_phi_upper(v: np.ndarray, s: float) -> np.ndarray:
    """Upper bounds on log φ(v) at increasing v ≥ 0 (module docstring, item 1)."""
    s2 = s * s
    z = np.linspace(-9.0, 9.0 + 2.0 * s, _Z_CELLS + 1)
    # Φ(z_{k+1}) − Φ(z_k), from the tail that keeps its digits
    cdf, sf = ndtr(z), ndtr(-z)
    mass = np.where(z[:-1] >= 0, sf[:-1] - sf[1:], cdf[1:] - cdf[:-1])
    mass = np.maximum(mass, 0.0)
    mass_up = mass * (1 + _MARGIN) + 1e-300  # weights of a sum of positive terms: rounded up
    mass_down = mass * (1 - _MARGIN)  # weights of a sum of terms ≤ 0: rounded down
    x = np.exp(s * z[:-1] - s2 / 2)  # left endpoints: X at the cell's smallest z
    x_nodes = np.exp(s * z - s2 / 2)  # every grid point
    # ∫ over cell k of the chord through (z_k, f_k), (z_k+1, f_k+1) against the normal density
    # is w_left·f_k + w_right·f_k+1; weights rounded up (they multiply values ≥ 0 below)
    pdf = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    first = pdf[:-1] - pdf[1:]  # ∫_cell z φ(z) dz
    width = z[1:] - z[:-1]
    w_left = np.maximum((z[1:] * mass - first) / width, 0.0) * (1 + 1e-9) + 1e-13 * mass
    w_right = np.maximum((first - z[:-1] * mass) / width, 0.0) * (1 + 1e-9) + 1e-13 * mass
    with np.errstate(over="ignore"):
        m2 = math.exp(s2) if s2 < 700 else math.inf
        m3 = math.exp(3 * s2) if s2 < 230 else math.inf  # E[X³]
        tail4 = math.exp(6 * s2) * float(ndtr(4 * s - z[-1])) if s2 < 110 else math.inf  # E[X⁴; Z > z_K]
    log_best = np.zeros(v.size)  # log 1
    use_taylor = v * v * m2 <= 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        if use_taylor.any():  # (a') or, where its moments overflow, (a)
            vt = v[use_taylor]
            quad = vt * vt * m2 / 2
            if math.isfinite(m3 * tail4):
                # (a'): one more exact term, φ − 1 ≤ −v + v²E[X²]/2 − v³E[X³]/6 + E[r3(vX)] with
                # r3(y) = e^(−y) − 1 + y − y²/2 + y³/6 ≥ 0, increasing, and convex in z
                # (d²/dz² = s²(r3''(y)y² + r3'(y)y) ≥ 0): on each cell below its chord; the mass
                # left of the grid at the first point's value, right of it by r3(y) ≤ y⁴/24
                y3 = vt[:, None] * x_nodes[None, :]
                small3 = y3 < 0.1
                ys3 = np.where(small3, y3, 0.0)
                series3 = ys3**4 * (1 / 24 + ys3 * (-1 / 120 + ys3 * (1 / 720 + ys3 * (-1 / 5040
                                                                                   + ys3 / 40320))))
                r3 = np.where(small3, series3, np.expm1(-y3) + y3 - y3 * y3 / 2 + y3**3 / 6
                              + 1e-15 * (1 + y3 + y3 * y3 + y3**3))
                r3 = np.maximum(r3, 0.0)
                cubic = vt**3 * m3 / 6
                tail3 = ((w_left[None, :] * r3[:, :-1] + w_right[None, :] * r3[:, 1:]).sum(axis=1)
                         + cdf[0] * r3[:, 0] + vt**4 * tail4 * (1 + _MARGIN) / 24)
                # φ − 1, kept apart from the 1 so that log1p sees its digits, plus a bound on
                # its rounding: a few ulps of each part (of the 600 terms' sum for tail3)
                excess = -vt + quad - cubic + tail3
                excess = excess + 1e-15 * (vt + quad + cubic) + 2e-13 * tail3 + 1e-300
            else:
                y = vt[:, None] * x[None, :]
                small = y < 0.1
                ys = np.where(small, y, 0.0)
                # r's alternating series, ending on a positive term: an upper bound for 0 ≤ y < 1
                series = ys**3 * (-1 / 6 + ys * (1 / 24 + ys * (-1 / 120 + ys * (1 / 720 + ys * (-1 / 5040
                                                                                                + ys / 40320)))))
                # the direct formula, plus a bound on its rounding (a few ulps of its largest part)
                r = np.where(small, series, np.expm1(-y) + y - y * y / 2 + 1e-15 * (1 + y + y * y))
                # φ − 1 ≤ −v + v²E[X²]/2 + S, with its rounding bounded as in (a')
                tail = (mass_down[None, :] * np.minimum(r, 0.0)).sum(axis=1)
                excess = -vt + quad + tail
                excess = excess + 1e-15 * (vt + quad) + 2e-13 * np.abs(tail) + 1e-300
            log_best[use_taylor] = np.log1p(np.minimum(excess, 0.0))
        rest = ~use_taylor
        if rest.any():  # (b): the direct upper sum
            vr = v[rest]
            last = np.exp(-vr * np.exp(s * z[-1] - s2 / 2))
            direct = ((mass_up[None, :] * np.exp(-vr[:, None] * x[None, :])).sum(axis=1)
                      + cdf[0] + sf[-1] * last)
            direct = np.where(np.isfinite(direct), direct, 1.0)
            log_best[rest] = np.log(np.minimum(direct * (1 + _MARGIN) + 1e-300, 1.0))
        # (c): power bounds
        g = _GAMMAS[None, :]
        log_v = np.log(np.where(v > 0, v, 1.0))[:, None]  # v = 0 is set to log φ = 0 below
        log_pow = (g * np.log(g) - g - g * log_v + g * (g + 1) * s2 / 2).min(axis=1)
        log_pow = log_pow + 1e-12 * np.abs(log_pow)
    log_best = np.where(np.isnan(log_best), 0.0, log_best)
    log_best = np.minimum(log_best, log_pow)
    log_best[v == 0] = 0.0
    return np.minimum.accumulate(log_best)  # (d): φ is decreasing


def _grid(beta_max: float) -> np.ndarray:
    """Cell edges in u: fine near 0, then cells about 3% wide, then geometric far out."""
    u1 = beta_max + 12 * math.sqrt(beta_max) + 40.0
    near = np.linspace(0.0, 2.0, 21)
    mid = np.geomspace(2.0, u1, int(math.log(u1 / 2.0) / math.log(1.03)) + 2)[1:]
    far = np.geomspace(u1, u1 * 1e4, 61)[1:]
    return np.concatenate([near, mid, far])


def log_moment_upper(betas: np.ndarray, sigma: float, steps: int) -> np.ndarray:
    """Upper bounds on log E_Q[L^(−β)] for each β in ``betas`` (0 < β ≤ 64)."""
    s = 1.0 / sigma
    t = float(steps)
    u = _grid(float(np.max(betas)))
    b = t * _log_phi_upper(u / t, s)  # upper bounds on log ψ(u_j), non-increasing
    lo, hi, b0, b1 = u[:-1], u[1:], b[:-1], b[1:]
    lam = np.maximum((b0 - b1) / (hi - lo), 0.0)  # minus the chord's slope
    terms = _cells(betas[:, None], lo[None, :], hi[None, :], b0[None, :], lam[None, :])
    tails = _tails(betas, float(u[-1]), s, t)
    return np.logaddexp(np.logaddexp.reduce(terms, axis=1), tails)


def _cells(beta: np.ndarray, lo: np.ndarray, hi: np.ndarray, b0: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log of (1/Γ(β)) ∫_lo^hi u^(β−1) exp(b0 − lam·(u − lo)) du, rounded up by the margin.

    Every cell first gets the flat bound (exp(chord) ≤ e^(b0), and
    ∫ u^(β−1) = (hi^β − lo^β)/β); the cells that can matter (within e^-45 of
    the largest in their row) then get the exact chord integral, an
    incomplete gamma function, if it is smaller.
    """
    shape = np.broadcast_shapes(beta.shape, lo.shape)
    beta, lo, hi, b0, lam = (np.broadcast_to(x, shape) for x in (beta, lo, hi, b0, lam))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        terms = b0 + beta * np.log(hi) + np.log1p(-np.exp(beta * (np.log(lo) - np.log(hi)))) - gammaln(beta + 1)
    terms = np.where(np.isnan(terms), np.inf, terms)  # never let a NaN hide a cell
    refine = (terms > terms.max(axis=1, keepdims=True) - 45.0) & (lam * (hi - lo) >= 1e-9)
    bb, ll, hh, b00, la = (x[refine] for x in (beta, lo, hi, b0, lam))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a, c = la * ll, la * hh
        upper_half = a > bb
        diff = np.where(upper_half, gammaincc(bb, a) - gammaincc(bb, c), gammainc(bb, c) - gammainc(bb, a))
        top = np.where(upper_half, gammaincc(bb, a), gammainc(bb, c))
        diff = diff + 1e-12 * top  # the difference of two rounded values, upwards
        exact = b00 + la * ll - bb * np.log(la) + np.log(diff)
    exact = np.where(np.isnan(exact), np.inf, exact)
    terms = terms.copy()
    terms[refine] = np.minimum(terms[refine], exact)  # both are upper bounds
    return terms + math.log1p(_MARGIN)


def _tails(betas: np.ndarray, upper: float, s: float, t: float) -> np.ndarray:
    """log of the bound on (1/Γ(β)) ∫_U^∞ u^(β−1) ψ(u) du for each β (module docstring, item 3)."""
    g = betas[:, None] + np.geomspace(0.5, 4 * betas + 64, 64, axis=1)
    gamma = g / t
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        val = (t * (gamma * np.log(gamma) - gamma + gamma * (gamma + 1) * s * s / 2) + g * math.log(t)
               + (betas[:, None] - g) * math.log(upper) - np.log(g - betas[:, None]) - gammaln(betas)[:, None])
    val = np.where(np.isnan(val), np.inf, val)
    return val.min(axis=1) + math.log1p(_MARGIN)


def add_bound(orders: np.ndarray, sigma: float, steps: int) -> np.ndarray:
    """Upper bounds on D_α(Q‖P) at each order (+inf where not computed: use another bound there).

    Computed at the integers 2..⌈α⌉ ≤ 65 only; between integers (and between
    1 and 2, where log E_Q[L^0] = 0) the chord of log E_Q[L^(1−α)], which is
    convex in α (Hölder), bounds it.
    """
    out = np.full(orders.size, np.inf)
    if steps < 2 or not (0.2 <= sigma <= 1e4):
        return out
    alphas = orders.tolist()
    top = max((math.ceil(a) for a in alphas if math.ceil(a) <= MAX_ORDER), default=0)
    if top < 2:
        return out
    log_m = np.zeros(top + 1)  # index n: upper bound on log E_Q[L^(1−n)]; n = 1 gives 0
    log_m[2:] = log_moment_upper(np.arange(1.0, top), sigma, steps)
    for idx, a in enumerate(alphas):
        hi = math.ceil(a)
        if hi > top:
            continue
        lo = hi if float(a).is_integer() else hi - 1
        w = a - lo
        out[idx] = ((1.0 - w) * log_m[lo] + w * log_m[hi]) / (a - 1.0)
    return np.where(np.isnan(out), np.inf, np.maximum(out, 0.0))
