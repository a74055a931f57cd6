"""Random allocation ("each example once per epoch"): its RDP curve, certified in both directions.

One epoch of random allocation runs ``t`` Gaussian steps (noise multiplier σ,
sensitivity 1); each example is used in exactly one of them, chosen uniformly
and independently of the other examples (balls-in-bins; Feldman & Shenfeld,
"Privacy amplification by random allocation", arXiv 2502.08202). For one
example the pair of output distributions is, in units of the clipping norm,

    P = (1/t) Σ_i N(e_i, σ² I_t)    (the example present, in a uniform step i)
    Q = N(0, σ² I_t)                (the example absent)

with likelihood ratio L(y) = P/Q = (1/t) Σ_i exp((2 y_i − 1)/(2σ²)).
The curve charged at order α is max(remove(α), add(α)), where (docs/theory.md §15):

* remove(α) ≥ D_α(P‖Q). At an integer α ≥ 2 it is exact:
  E_Q[L^α] = α!·t^(−α)·[z^α] F(z)^t with F(z) = Σ_k exp(k(k−1)/(2σ²)) z^k / k!
  (multinomial expansion; E_Q[e^(k(2y−1)/(2σ²))] = e^((k²−k)/(2σ²)) per coordinate).
  The coefficients are positive and are computed in log space as sums of
  positive terms only (:func:`log_moments`). Between integers n < α < n + 1,
  log E_Q[L^α] is convex in α (Hölder), so the chord through n and n + 1 bounds it.
* add(α) ≥ D_α(Q‖P) = (1/(α−1))·log E_Q[L^(1−α)]. By the AM–GM inequality
  L ≥ exp(mean_i (2y_i − 1)/(2σ²)), and the mean of the y_i is N(0, σ²/t)
  under Q, so E_Q[L^(1−α)] ≤ exp((α−1)/(2σ²) + (α−1)²/(2tσ²)), i.e.
  add(α) = (1 + (α−1)/t)/(2σ²). This is valid but loose: it never falls
  below 1/(2σ²) per epoch. At orders ≤ 65 (σ in [0.2, 10^4]) the smaller
  of it and the Laplace-transform bound of ``privguard._mechanisms._allocation_add``
  (an upper bound with every approximation rounded up, close to the exact
  value: within 5% of mpmath at t = 2 and 3% of a quadrature at t ≥ 50) is used.

Both are capped by the Gaussian curve α/(2σ²) (no amplification), which is
valid in both directions by joint convexity of exp((α−1)D_α) (van Erven &
Harremoës 2014, Thm. 13 for the quasi-convexity; Mironov 2017, Prop. 7).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy.special import gammaln

from privguard import _validation as check
from privguard._curves import _sgm
from privguard._curves._upward import times_up
from privguard._mechanisms import _allocation_add
from privguard._mechanisms._base import Mechanism

EXACT_MAX_ORDER = 256
"""Largest integer order whose remove-direction moment is expanded exactly.

Orders above it are charged the Gaussian curve α/(2σ²) (valid, no
amplification): the expansion costs O(N²) in the largest order N, and orders
above 256 only matter for ε well below 0.1 per run.
"""


def _log_series(n_max: int, s2: float) -> np.ndarray:
    """log of F's coefficients f_k = exp(k(k−1)·s2/2)/k!, k = 0..n_max (s2 = 1/σ²)."""
    k = np.arange(n_max + 1, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        quad = np.where(k < 2, 0.0, k * (k - 1) * (s2 / 2))
    return quad - gammaln(k + 1)


def _log_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log-coefficients of the product of two series (truncated to len(a)): positive terms only."""
    idx, valid = _product_indices(a.size)
    with np.errstate(invalid="ignore"):
        terms = np.where(valid, a[None, :] + b[idx], -np.inf)
    return _logsumexp_rows(terms)


@functools.lru_cache(maxsize=8)
def _product_indices(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row m, column i: the index m − i of b (clipped at 0) and whether it is ≥ 0."""
    diff = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.clip(diff, 0, None), diff >= 0


def _logsumexp_rows(terms: np.ndarray) -> np.ndarray:
    """log Σ exp along the last axis (as scipy's logsumexp, without its per-call overhead)."""
    top = np.max(terms, axis=-1, keepdims=True)
    finite_top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.log(np.sum(np.exp(terms - finite_top), axis=-1)) + finite_top[..., 0]
    # a row whose largest term is +inf sums to +inf; one of only −inf terms to −inf
    return np.where(np.isposinf(top[..., 0]), np.inf, out)


def log_moments(n_max: int, sigma: float, steps: int) -> np.ndarray:
    """log E_Q[L^n] for n = 0..n_max (exact up to rounding; index n).

    E_Q[L^n] = n!·t^(−n)·g_n where g = F^t (module docstring). When
    t + 1 ≥ n_max, g comes from J. C. P. Miller's recurrence for powers of a
    series, n·f_0·g_n = Σ_{k=1}^{n} ((t+1)k − n)·f_k·g_(n−k), whose weights
    (t+1)k − n are then all positive; otherwise (t < n_max − 1) from binary
    powering F^t, products of positive series. Either way every sum adds
    positive terms in log space, so nothing cancels.
    """
    s2 = _inv_var(sigma)
    log_f = _log_series(n_max, s2)
    t = steps
    if t + 1 >= n_max:
        log_g = np.full(n_max + 1, -np.inf)
        log_g[0] = 0.0  # f_0 = 1
        k_all = np.arange(1, n_max + 1, dtype=np.float64)
        n_all = np.arange(1, n_max + 1, dtype=np.float64)[:, None]
        # weights (t+1)k − n ≥ t + 1 − n ≥ 0 (a zero weight is a zero term: log 0 = −inf),
        # all rows at once (row n − 1; only its first n entries are used)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_w = np.log((t + 1.0) * k_all[None, :] - n_all) + log_f[None, 1:]
        for n in range(1, n_max + 1):
            terms = log_w[n - 1, :n] + log_g[n - 1::-1]
            # the k = n term, log(t·n) + log f_n + log g_0, is finite: so is the largest
            top = terms.max()
            log_g[n] = math.log(np.exp(terms - top).sum()) + top - math.log(n)
    else:
        log_g = None  # the series 1
        base, e = log_f, t
        while e:
            if e & 1:
                log_g = base if log_g is None else _log_mul(log_g, base)
            e >>= 1
            if e:
                base = _log_mul(base, base)
    powers = np.arange(n_max + 1, dtype=np.float64)
    return gammaln(powers + 1) - powers * math.log(t) + log_g


def _inv_var(sigma: float) -> float:
    try:
        return 1.0 / (sigma * sigma)
    except (OverflowError, ZeroDivisionError):
        return math.inf


def add_bound(orders: np.ndarray, sigma: float, steps: int) -> np.ndarray:
    """(1 + (α−1)/t)/(2σ²) ≥ D_α(Q‖P): the AM–GM bound of the module docstring."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return _sgm.gaussian_bound(1.0 + (orders - 1.0) / steps, sigma)


def remove_bound(orders: np.ndarray, sigma: float, steps: int) -> np.ndarray:
    """≥ D_α(P‖Q) at each order: exact at integers ≤ EXACT_MAX_ORDER, Hölder chords between."""
    gauss = _sgm.gaussian_bound(orders, sigma)
    if not math.isfinite(_inv_var(sigma)):
        return gauss
    alphas = orders.tolist()
    needed = [math.ceil(a) for a in alphas if math.ceil(a) <= EXACT_MAX_ORDER]
    if not needed:
        return gauss
    log_a = log_moments(max(needed), sigma, steps)  # log_a[1] = log E_Q[L] = 0 (up to rounding)
    log_a[:2] = 0.0
    out = np.empty(len(alphas))
    for idx, a in enumerate(alphas):
        hi = math.ceil(a)
        if hi > EXACT_MAX_ORDER:
            out[idx] = gauss[idx]
            continue
        lo = hi if float(a).is_integer() else hi - 1
        # log E_Q[L^α] is convex in α (Hölder), so on [lo, hi] it lies below the chord.
        w = a - lo
        log_moment = (1.0 - w) * log_a[lo] + w * log_a[hi] if hi != lo else log_a[lo]
        out[idx] = log_moment / (a - 1.0)
    out = np.where(np.isnan(out), gauss, out)
    return np.maximum(out, 0.0)


def epoch_curve(sigma: float, steps: int, orders: np.ndarray) -> np.ndarray:
    """One epoch's curve on ``orders`` (validated: finite, > 1, increasing); see the module."""
    gauss = _sgm.gaussian_bound(orders, sigma)
    if steps == 1:  # one step holding every example: the Gaussian mechanism, exactly
        return gauss
    add = np.minimum(add_bound(orders, sigma, steps), _allocation_add.add_bound(orders, sigma, steps))
    both = np.maximum(remove_bound(orders, sigma, steps), add)
    # Each part is ≤ the Gaussian curve mathematically; the minimum only trims rounding.
    return np.maximum.accumulate(np.minimum(both, gauss))


@dataclasses.dataclass(frozen=True)
class RandomAllocation(Mechanism):
    """``epochs`` epochs of random allocation: each example in exactly one of ``steps`` steps.

    In every epoch each example is placed in one of the ``steps`` steps,
    uniformly and independently of the other examples (balls-in-bins; use
    :class:`privguard.integrations.RandomAllocationSampler` to draw the
    batches), and every step adds Gaussian noise with multiplier
    ``noise_multiplier`` to the clipped sum. The curve is a certified upper
    bound in both neighbouring directions (``privguard._mechanisms._allocation``,
    docs/theory.md §15): exact at integer orders ≤ 256 in the remove
    direction; in the add direction a Laplace-transform bound at orders ≤ 65
    (every approximation rounded up) and the AM–GM bound (1 + (α−1)/t)/(2σ²)
    above; never above the Gaussian curve α/(2σ²) per epoch. Epochs
    compose: the curve of ``epochs = E`` is E times one epoch's.
    ``steps`` and ``epochs`` are at most 2^53.

    Example:
        >>> from privguard import mechanisms as M
        >>> epoch = M.RandomAllocation(noise_multiplier=1.0, steps=100)
        >>> c = epoch.rdp([2.0, 8.0])
        >>> bool((c < M.Gaussian(1.0).rdp([2.0, 8.0])).all())
        True
        >>> bool((M.RandomAllocation(1.0, 100, epochs=3).rdp([2.0, 8.0]) == 3 * c).all())
        True
    """

    noise_multiplier: float
    steps: int
    epochs: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier",
                           check.positive_finite("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "steps",
                           check.positive_int("steps", self.steps, maximum=check.MAX_STEPS))
        object.__setattr__(self, "epochs",
                           check.positive_int("epochs", self.epochs, maximum=check.MAX_STEPS))

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # docs/theory.md §15: max(remove, add) per epoch, capped by α/(2σ²)
        # (Mironov 2017, Prop. 7); epochs compose additively (Mironov 2017, Prop. 1).
        with np.errstate(over="ignore"):
            # e epochs: e × one epoch (Mironov 2017, Prop. 1), rounded up for e ≥ 2
            # (docs/theory.md §6, as a journal sums e charges of one epoch)
            return times_up(self.epochs, epoch_curve(self.noise_multiplier, self.steps,
                                                     orders))
