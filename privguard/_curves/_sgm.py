"""The Poisson-subsampled Gaussian's RDP curve at any order, always a valid bound.

privguard charges the subsampled Gaussian with Opacus' own analysis
(``compute_rdp``, Mironov, Talwar & Zhang 2019, §3.3) so that a ledger agrees
with Opacus' ``RDPAccountant`` bit for bit. That code has three failure modes
outside the usual range (measured on Opacus 1.6 by
``.venv/bin/python scripts/sgm_limits.py``; the tests in
tests/test_mechanisms.py check each):

* integer orders from 1030 on: ``special.binom`` overflows and the result is
  NaN, for every σ and q (and the loop takes O(α) Python steps);
* fractional orders: the series loop stops at the first term below e^-30,
  which (a) may take very long to come (q = 1/2, α = 1.1: 86,561 terms for
  σ = 10^4, more than 10^5 from σ = 10^5 on; a NaN term never passes the
  test), and (b) may come before the terms that matter (large σ and
  α·log(1/(1−q)) > 30, e.g. σ = 8, q = 0.3, α = 100.5): the value is then
  garbage, in 53 of the script's 448 (σ, q, α), down to −0.70 at
  (10^4, 0.5, 63.5);
* σ² overflowing or underflowing in Python floats: OverflowError or
  ZeroDivisionError.

:func:`curve` therefore keeps Opacus' value exactly where it is reliable and
replaces it by a valid upper bound elsewhere; every value is an upper bound
on the true RDP (up to floating-point rounding of a correct formula), never a
NaN turned into a smaller number:

1. q = 1, or σ² not representable: the Gaussian curve α/(2σ²) (Mironov 2017,
   Prop. 7), which bounds every q (Poisson subsampling is a mixture, and
   Rényi divergence is jointly quasi-convex: van Erven & Harremoës 2014,
   Thm. 13). It is the smallest positive float when σ² overflows (never 0, below the
   truth) and +inf when it underflows.
2. Integer α ≤ :data:`OPACUS_MAX_ORDER`: Opacus (a finite sum of positive
   terms). Integer α above it: the same sum (Mironov et al. 2019, §3.3),
   A_α = Σ_k C(α,k)(1−q)^(α−k) q^k e^((k²−k)/(2σ²)), evaluated here in log
   space with ``gammaln`` and ``logsumexp``.
2b. (issue z27) Both lose A_α − 1 to rounding when it is tiny (tiny q, large
   σ: ε(2) = 0 at σ = 3, q = 1e-13; q = 0.01, σ = 1e3, α = 56: 9.2e-10 low). Each
   integer value below (1 − :data:`RELIABLE_RTOL`) times the cancellation-free upper
   bound of :mod:`privguard._curves._sgm_upper` (never below the exact value, with a
   proven rounding margin) is replaced by that bound. RELIABLE_RTOL is 1e-12 (task sg;
   1e-9 before): every integer value is at least (1 − 1e-12) times the exact one, proven.
3. Fractional α < :data:`OPACUS_MAX_ORDER`: Opacus, if its series stops within
   :data:`MAX_SERIES_TERMS` terms (predicted before calling it, since the loop
   cannot be interrupted) and the value lies between the integer neighbours
   ε(⌊α⌋) and ε(⌈α⌉), as monotonicity in α requires (within
   :data:`privguard._validation.RDP_RTOL`/``RDP_ATOL``). Otherwise ε(⌈α⌉),
   a valid bound by monotonicity (formulas.md §1).
3b. (issue z27) A fractional value kept by step 3 whose integer neighbour was
   replaced in step 2b, or which lies below (1 − :data:`FRACTIONAL_RTOL`) (5e-13 since
   review rsg: 1e-12 in task sg) times the stable estimate
   :func:`privguard._curves._sgm_upper.fractional_estimate`, becomes the larger of it
   and the estimate raised by :data:`ESTIMATE_RAISE` (1e-9), capped by the chord of the
   integer values ((α−1)ε(α) is convex) and, below order 2, the Taylor bound
   :func:`privguard._curves._sgm_upper.below_two`. At fractional orders the guarantee
   is measured, not proven: a kept value is at least (1 − 5e-13) times the estimate, so
   within 1e-12 of the exact one wherever the estimate is within 5e-13 of it (measured
   ~1e-14 near the kept values closest to that limit; docs/theory.md §1.1 gives 1e-11
   as the largest error tested), a
   raised one above it.
4. A value above the Gaussian bound becomes the Gaussian bound; a negative
   value within the tolerance of 0 (round-off of a value ≈ 0) becomes 0, one
   below that (garbage) the Gaussian bound.
5. The monotone envelope over the grid (each value raised to the largest
   value at a smaller order; values only ever go up): the curve is a supremum
   of Rényi divergences, each non-decreasing in α.

Wherever Opacus' values are shown within 1e-12 of the truth and non-decreasing on the
grid, the result equals Opacus' ``compute_rdp`` bit for bit (tests/test_mechanisms.py
checks every value that differs: above Opacus', within 1e-8 of an mpmath quadrature).
Since task sg more values differ at ordinary (σ, q): fractional orders where Opacus'
series is 1e-12 to 1e-9 low, and integer orders at σ ≳ 2 where its sum is (or where the
bound's rounding margin exceeds 1e-12); each by at most 2e-9 relative above main's value
(``python scripts/sgm_opacus_agreement.py`` prints the counts, ``python
scripts/sgm_against_main.py CHECKOUT`` those against main; docs/theory.md §1.2). No value
is below main's (task sgr): the bound's rounding margin is main's (task sg's weighted one
lowered values at σ ≥ 100 by up to 2.5e-11), and steps 2b to 5 run with today's
tolerances and with those of before task sg, the larger value kept (both rules give valid
bounds; a step-3b cap below a value the older rule kept would otherwise lower it). Near
α = 1, Opacus' own values can decrease by round-off (up to 1.8e-11 in the script's scan):
step 5 raises them by that much.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy.special import binom, gammaln, log_ndtr, logsumexp

from privguard._curves import _legacy, _opacus_rdp, _sgm_upper, _upward
from privguard._validation import RDP_RTOL, rdp_tolerance

OPACUS_MAX_ORDER = 1024
"""Largest order passed to Opacus: its binomials overflow (NaN) from about 1030."""

MAX_SERIES_TERMS = 100_000
"""Most terms of Opacus' fractional-order series privguard lets it sum (about 0.3 s)."""

_STOP = -30.0  # Opacus' stopping rule: both log-terms below this

_TINY = math.ulp(0.0)  # the smallest positive float: a curve that underflows is this, never 0

RELIABLE_RTOL = 1e-12
"""How far (relative) an integer order's Opacus value may lie below the cancellation-free
upper bound and still be kept bit for bit (step 2b). The bound is never below the exact
value (:func:`privguard._curves._sgm_upper.log_moment_upper`), so a kept value is at least
(1 − 1e-12) times the exact one: the rounding of a correct formula, not Opacus'
cancellation. It was 1e-9 (``RDP_RTOL``) until task sg, which kept values up to 9.2e-10
below the truth (q = 0.01, σ = 1e3, α = 56; docs/theory.md §1.2); loading a fix entry
derived then uses that tolerance (:func:`privguard._curves._legacy.pre_sg`)."""

FRACTIONAL_RTOL = 5e-13
"""How far (relative) a fractional order's Opacus value may lie below the estimate of
:func:`privguard._curves._sgm_upper.fractional_estimate` and still be kept (step 3b).
Half of RELIABLE_RTOL (review rsg): the estimate is not a bound, and with 1e-12 here a kept
value lay up to 1.009e-12 below the exact one where the estimate was 1.4e-14 low (σ = 0.6,
q = 0.4, α = 1.14; tests/test_adv_cv_curves.py::
test_sgm_kept_fractional_opacus_value_not_below_exact); the other half is room for the
estimate's error (measured at most 1.4e-14 at the kept values closest to that limit).
Opacus' fractional series is less accurate than its integer sum: measured against the
estimate (itself within 1e-11 of mpmath), up to 1.5e-8 below the truth at σ = 1.1,
q = 0.004 and 1.1e-5 at σ = 1, q = 1e-5 (orders 1.1–10.9; docs/theory.md §1.1). It
was 1e-4 until 2026-11-26 (review rv), 1e-9 until task sg; records written with the older
values still load (privguard/_stores/_revision.py, :mod:`privguard._curves._legacy`)."""

ESTIMATE_RAISE = RDP_RTOL
"""The factor 1 + 1e-9 by which step 3b raises the fractional estimate where it replaces
Opacus' value: 100 times the estimate's largest error measured against mpmath (1e-11;
docs/theory.md §1.1), so the replacement stays above the exact value. Not a proof: the
estimate's error is measured, not bounded (tests/test_sgm_tiny_q.py,
tests/test_adv_cv_curves.py)."""


def gaussian_bound(orders: np.ndarray, sigma: float) -> np.ndarray:
    """α/(2σ²) (Mironov 2017, Prop. 7), never below its exact value at the float σ and α:
    Opacus' q = 1 expression α/fl(2σ²), raised where it lies below (task adv8: up to about
    2u, u = 2⁻⁵³, for about half the values of a grid) to the smallest float at or above
    the exact value (:func:`privguard._curves._upward.scaled_up`, exact integer comparison;
    review radv8, checkpoint curves version 8). Opacus' value, bit for bit, wherever it is
    at or above the exact one. Without raising."""
    try:
        two_var = 2 * sigma**2  # the same float expression as Opacus'
    except OverflowError:
        two_var = math.inf
    with np.errstate(divide="ignore", over="ignore"):
        # σ² overflowing gives α/inf = 0, below the true α/(2σ²) > 0: at least the smallest
        # positive float (as PureDP and Laplace floor; review acc), and above it the exact
        # value rounded up (a subnormal up to σ ≈ 10¹⁶¹√α: the smallest float alone was
        # below it there). A σ² that underflows gives +inf, above the truth.
        nearest = np.maximum(orders / two_var, _TINY)
    if _legacy.nearest_curves():  # re-deriving a fix entry of before version 8
        return nearest
    return _upward.scaled_up(nearest, orders, 1 / (2 * Fraction(sigma) ** 2))


def _opacus_can_run(sigma: float) -> bool:
    try:
        return 2 * sigma**2 > 0.0
    except OverflowError:
        return False


def integer_order(q: float, sigma: float, alpha: int) -> float:
    """log(A_α)/(α−1) at an integer order α ≥ 2, in log space (Mironov et al. 2019, §3.3).

    A_α = Σ_{k=0}^{α} C(α,k) (1−q)^(α−k) q^k exp((k²−k)/(2σ²)), with 0 < q < 1.
    """
    k = np.arange(alpha + 1, dtype=np.float64)
    try:
        two_var = 2 * sigma**2
    except OverflowError:
        two_var = math.inf
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        quad = np.where(k < 2, 0.0, (k * k - k) / two_var)  # 0 for k = 0, 1 even if σ² = 0
        log_terms = (gammaln(alpha + 1.0) - gammaln(k + 1) - gammaln(alpha - k + 1)
                     + k * math.log(q) + (alpha - k) * math.log1p(-q) + quad)
    if np.isposinf(log_terms).any():
        return math.inf
    return float(logsumexp(log_terms)) / (alpha - 1)


def series_terms(q: float, sigma: float, alpha: float, cap: int = MAX_SERIES_TERMS) -> int | None:
    """How many terms Opacus' fractional-order series sums before it stops, or None if > cap.

    The series for fractional α (Mironov et al. 2019, §3.3) splits A_α at
    z0 = σ²·log(1/q − 1) + 1/2 into two sums whose i-th log-terms are
    log s0 = log|C(α,i)| + i·log q + (α−i)·log(1−q) + (i²−i)/(2σ²) + log(erfc((i−z0)/(√2σ))/2)
    and log s1 likewise with i and j = α − i swapped (erfc((z0−j)/(√2σ))/2).
    Opacus stops after the first i at which both are below −30. This
    evaluates the same terms in numpy, chunk by chunk, and requires them below
    −30 by a margin (1e-9 relative to the terms' parts) so that Opacus'
    scalar arithmetic stops no later (tests/test_mechanisms.py checks the
    count against Opacus' own). A NaN term never stops: None.
    """
    try:
        var = sigma**2
    except OverflowError:
        return None
    z0 = var * math.log(1 / q - 1) + 0.5
    log_q, log_1mq, root2s = math.log(q), math.log(1 - q), math.sqrt(2) * sigma
    start, size = 0, 64
    with np.errstate(all="ignore"):
        while start < cap:
            i = np.arange(start, min(start + size, cap), dtype=np.float64)
            j = alpha - i
            log_coef = np.log(np.abs(binom(alpha, i)))
            quad0, quad1 = (i * i - i) / (2 * var), (j * j - j) / (2 * var)
            e0 = math.log(0.5) + math.log(2) + log_ndtr(-(i - z0) / root2s * 2**0.5)
            e1 = math.log(0.5) + math.log(2) + log_ndtr(-(z0 - j) / root2s * 2**0.5)
            s0 = log_coef + i * log_q + j * log_1mq + quad0 + e0
            s1 = log_coef + j * log_q + i * log_1mq + quad1 + e1
            scale = (np.abs(log_coef) + np.abs(i * log_q) + np.abs(j * log_1mq)
                     + np.abs(j * log_q) + np.abs(i * log_1mq) + np.abs(quad0) + np.abs(quad1)
                     + np.abs(e0) + np.abs(e1))
            stop = np.maximum(s0, s1) < _STOP - (1e-9 * scale + 1e-9)
            if stop.any():
                return start + int(np.argmax(stop)) + 1
            start += size
            size *= 2
    return None


def curve(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """One step's RDP curve on ``orders`` (validated: finite, > 1, increasing); see the module."""
    bound = gaussian_bound(orders, sigma)
    # steps 2b/3b's tolerances: today's, or 1e-9 inside _legacy.pre_sg()/pre_flat() and 1e-4
    # (fractional) inside _legacy.pre_revision() (loading a fix entry derived before task sg
    # or e08c1f5; never cached, never seen by other contexts)
    keep_rtol = _legacy.keep_rtol(RELIABLE_RTOL)
    fractional_rtol = _legacy.fractional_rtol(_legacy.keep_rtol(FRACTIONAL_RTOL))
    if q == 1.0 or not _opacus_can_run(sigma):
        return bound
    alphas = orders.tolist()
    fractional = {a for a in alphas if not float(a).is_integer()}
    trusted = {a for a in fractional if a < OPACUS_MAX_ORDER
               and series_terms(q, sigma, a) is not None}
    integers = {int(a) for a in alphas if a not in fractional}
    for a in fractional:
        integers.add(math.ceil(a))
        if a >= 2:
            integers.add(math.floor(a))
    opacus_orders = sorted(trusted | {float(n) for n in integers if n <= OPACUS_MAX_ORDER})
    values = _opacus_values(q, sigma, opacus_orders)
    for n in integers:
        if n > OPACUS_MAX_ORDER:
            values[float(n)] = integer_order(q, sigma, n)
    upper = _integer_upper(q, sigma, integers)
    # Opacus' fractional values to check against the estimate: where log A_α < 1 (above, an
    # absolute error of its series of ~1e-13 is below 1e-12 of the value), and where
    # the estimate's nodes stay few (α/σ < 360: up to 2,200 of them)
    checked = sorted(a for a in trusted if (a - 1.0) * values[a] < 1.0 and a / sigma < 360.0)
    estimate = dict(zip(checked, _sgm_upper.fractional_estimate(q, sigma, np.array(checked))
                        .tolist())) if checked else {}
    out = _assemble(q, sigma, alphas, fractional, dict(values), upper, estimate, bound,
                    keep_rtol, fractional_rtol)
    if not _legacy.active():
        # task sgr: never below the curve of before task sg (tolerances 1e-9), whatever the
        # chord or Taylor cap of step 3b does where only today's tolerances replace a value
        # (the older value was a valid bound by the older rule: the larger one is too)
        older = _legacy.LEGACY_KEEP_RTOL
        out = np.maximum(out, _assemble(q, sigma, alphas, fractional, values, upper, estimate,
                                        bound, older, older))
    return out


def _assemble(q: float, sigma: float, alphas: list[float], fractional: set[float],
              values: dict[float, float], upper: dict[int, float],
              estimate: dict[float, float], bound: np.ndarray, keep_rtol: float,
              fractional_rtol: float) -> np.ndarray:
    """Steps 2b to 5 on Opacus' ``values`` (changed in place) with the given tolerances."""
    replaced = _raise_to_upper_bound(values, upper, keep_rtol)
    out = np.empty(len(alphas))
    for idx, a in enumerate(alphas):
        v = values.get(a, math.nan)
        if a in fractional:
            lo = values[float(math.floor(a))] if a >= 2 else 0.0
            hi = values[float(math.ceil(a))]
            est = estimate.get(a, math.nan)
            if not (lo - rdp_tolerance(lo) <= v <= hi + rdp_tolerance(hi)):  # also NaN
                v = hi
            elif ((math.floor(a) in replaced or math.ceil(a) in replaced)
                  and (a - 1.0) * v < 1.0) or v < (1.0 - fractional_rtol) * est:
                # Opacus' series lost digits (the same cancellation, or its own: σ = 20,
                # q = 6e-5, α = 1.1 was 1.1% below the truth; a neighbour's replacement
                # matters only where log A_α < 1: above, Opacus' absolute error of ~1e-13 is
                # below the tolerance): the larger of Opacus' value and the estimate raised
                # by ESTIMATE_RAISE (100 times its largest error measured against mpmath),
                # capped by two rigorous bounds (loose away from tiny q); so a value only
                # goes down to a rigorous bound
                cap = _chord(values, a)
                if a < 2:
                    cap = min(cap, float(_sgm_upper.below_two(q, sigma, np.array([a]))[0]))
                v = min(cap, max(v, est * (1.0 + ESTIMATE_RAISE))) if math.isfinite(est) else cap
        if math.isnan(v):
            v = bound[idx]
        elif v < 0:
            v = 0.0 if v >= -rdp_tolerance(0.0) else bound[idx]
        out[idx] = min(v, bound[idx])
    return np.maximum.accumulate(out)


def _integer_upper(q: float, sigma: float, integers: set[int]) -> dict[int, float]:
    """The cancellation-free upper bound :func:`privguard._curves._sgm_upper.upper` at each
    integer order (step 2b)."""
    ints = sorted(integers)
    return dict(zip(ints, _sgm_upper.upper(q, sigma, np.array(ints, dtype=np.float64)).tolist()))


def _raise_to_upper_bound(values: dict[float, float], upper: dict[int, float],
                          rtol: float = RELIABLE_RTOL) -> set[int]:
    """Step 2b (issue z27): replace each integer order's value that lies below the
    cancellation-free upper bound :func:`privguard._curves._sgm_upper.upper` by more than
    ``rtol`` (relative; :data:`RELIABLE_RTOL`) by that bound, in place; return the orders
    replaced.

    Opacus' log-space sum loses A_α − 1 to rounding when it is tiny (tiny q, large σ), and
    its ``math.log(1 - q)`` loses q's low digits: ``SubsampledGaussian(3.0, 1e-13)`` had
    ε(2) = 0 against 1.2e-27; σ = 20, q = 6.015e-5 was 7.9e-6 relative low; q = 0.01,
    σ = 1e3, α = 56 was 9.2e-10 low. The bound is never below the exact value, so a value
    kept (at least (1 − rtol) times the bound) is at least (1 − rtol) times the exact one:
    proven, whatever Opacus' error. Kept values equal Opacus' ``RDPAccountant`` bit for bit;
    at σ ≤ 2 nearly all are (docs/theory.md §1.2 lists where not). A value above the bound
    is kept too (it is then above the truth: at q = 8.3e-12, σ = 20 Opacus' ε(2) is 5.6e-17
    against a true 1.7e-25), so values only go up.
    """
    replaced = set()
    for n, u in upper.items():
        if not values[float(n)] >= (1.0 - rtol) * u:  # also NaN
            values[float(n)] = u
            replaced.add(n)
    return replaced


def _chord(values: dict[float, float], a: float) -> float:
    """ε(α) at a fractional α ∈ (n, n+1) from the (upper-bound) values at n and n+1.

    g(α) = (α−1)·ε(α) = log A_α is convex in α (a log-moment: Hölder's inequality), and
    g(1) = 0, so g(α) ≤ (n+1−α)·g(n) + (α−n)·g(n+1): an upper bound on ε(α) whenever the
    integer values are (formulas.md §1 for monotonicity; docs/theory.md §14.2 uses the same
    chord). The last factor rounds the float evaluation up (a few operations of 2⁻⁵³ each).
    """
    n = math.floor(a)
    g_n = (n - 1) * values[float(n)] if n >= 2 else 0.0
    g_next = n * values[float(n + 1)]
    return ((n + 1 - a) * g_n + (a - n) * g_next) / (a - 1) * (1.0 + 2.0**-48)


def _opacus_values(q: float, sigma: float, orders: list[float]) -> dict[float, float]:
    """Opacus' one-step values at ``orders`` (NaN where it raises), one batch call if it can."""
    if not orders:
        return {}
    compute = _opacus_rdp.compute_rdp()
    try:
        batch = np.asarray(compute(q=q, noise_multiplier=sigma, steps=1, orders=orders),
                           dtype=np.float64)
        return {a: float(v) for a, v in zip(orders, batch)}
    except (ArithmeticError, ValueError):
        pass
    values = {}
    for a in orders:
        try:
            one = compute(q=q, noise_multiplier=sigma, steps=1, orders=[a])
            values[a] = float(np.asarray(one, dtype=np.float64)[0])
        except (ArithmeticError, ValueError):
            values[a] = math.nan
    return values
