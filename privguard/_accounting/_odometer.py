"""Privacy odometers: a running ε valid at any adaptively chosen stopping time.

Three modes; every one reports a TAIL bound on the privacy loss, the form of
seed 001 Theorem 2: with probability ≥ 1 − δ over the whole interaction
(adaptive choices and an adaptive stopping time included), the privacy loss
L_t of everything released so far is at most the reported ε_t, at every t at
once. A tail bound also gives (ε_t, δ)-DP of the stopped interaction.

``"mixture"`` (default; docs/theory.md §3, formulas.md §3b). S_t(α) is the
spent RDP at order α, each step's curve chosen before its output. For each
order, M_t(α) = exp((α−1)(L_t − S_t(α))) is a non-negative supermartingale
under the first dataset with M_0 = 1, because E[exp((α−1)ℓ_t) | past] =
exp((α−1)D_α) ≤ exp((α−1)ε_t(α)) (Mironov 2017; seed 001 §4). For weights
w_α ≥ 0 fixed before any output with Σ w_α ≤ 1, Σ_α w_α M_t(α) is one too,
and Ville's inequality (Ville 1939; Howard et al. 2020, arXiv 1808.03204;
Whitehouse et al. 2023, arXiv 2203.05481) gives
P(∃t: Σ_α w_α M_t(α) ≥ 1/δ) ≤ δ. If L_t > ε_t, where ε_t is at least the
root of

    Σ_α w_α exp((α−1)(ε − S_t(α))) = 1/δ,

then Σ_α w_α M_t(α) > 1/δ; so P(∃t: L_t > ε_t) ≤ δ. The root lies between
the single-order Chernoff bound min_α S_t(α) + log(1/δ)/(α−1) and the union
form min_α S_t(α) + log(1/(w_α δ))/(α−1). The improved (Balle et al. 2020 /
Canonne–Kamath–Steinke 2020) conversion bounds a hockey-stick divergence, not
P(L > ε), and is never used here.

``"paper"`` — exactly seed 001 Alg. 2, Cor. 2, Thm 2, eq. 5 with the §4.5
schedule (formulas.md §3): fix, for every order α, filter sizes
ε^f(α) = 2^(f−1)·log(2|Λ|/δ)/(α−1) and weights w_{α,f} = 1/(|Λ|·2f²); with
f(α) the smallest f with spent(α) ≤ ε^f(α),

    |Loss| ≤ min_α [ ε^{f(α)}(α) + log(1/(w_{α,f(α)}·δ)) / (α−1) ].

Its weights sum to π²/12 ≈ 0.822, not 1.

``"tight"`` (legacy; files and states written with it keep it) — the paper's
family unchanged plus a finer family on the unused mass 1 − π²/12: sizes
0.2·ε^1(α)·√2^(g−1), weights (1 − π²/12)·6/(π²g²)/|Λ|, g ≥ 1. Valid by the
same partition argument (docs/theory.md §3.9). Its total weight on each order
is 1/|Λ|, so the uniform mixture is never above it, for any spent curve
(§3.2); new ledgers do not offer it (:data:`NEW_MODES`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting._plan import Plan, as_plan
from privguard._errors import InvalidArgumentError

MIXTURE = "mixture"
PAPER = "paper"
TIGHT = "tight"
MODES = (MIXTURE, PAPER, TIGHT)
"""Every mode an :class:`Odometer` computes (``"tight"`` only to keep old ledgers)."""
NEW_MODES = (MIXTURE, PAPER)
"""The modes a new ledger may choose."""

# ---------------------------------------------------------------------------
# "paper" and "tight": families of (order, filter size, weight) members.
# As they were, raised by a rounding slack (task lo3): a ledger written with them reports
# what it did before or an ulp-scale more (never less), and never below the formula.


_ULP = float(np.finfo(np.float64).eps)


class _Family:
    """Members (α, size_f(α), weight_f/|Λ|) for f = 1, 2, ...: geometric sizes."""

    def __init__(self, scale: float, ratio: float, log_inv_weight) -> None:
        self.scale = scale  # first size, relative to log(2|Λ|/δ)/(α−1)
        self.ratio = ratio
        self.log_inv_weight = log_inv_weight  # f -> log(1/weight_f)

    def bound(self, spent: np.ndarray, orders: np.ndarray, delta: float,
              log_mass: float = 0.0) -> np.ndarray:
        """Per order: size of the smallest eligible member + its penalty, never below the
        formula (seed 001 eq. 5) evaluated exactly, at δ/W where ``log_mass`` >= log W and
        W is the exact total weight of the mode's members (:data:`_LOG_MASS`).

        The float evaluation is within :func:`_slack` of the exact one, relatively (every
        term is positive). A member counts as eligible only where ``spent`` is at most its
        size lowered by that slack (so it is eligible exactly, too), and its size +
        penalty is raised by it: before (task lo3), the value could be an ulp below the
        formula, and a member whose exact size lay just below ``spent`` could be taken."""
        n = orders.size
        first = self.scale * math.log(2 * n / delta) / (orders - 1)
        log_r = math.log(self.ratio)

        def size_of(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            slack = _slack((f - 1) * log_r)
            return first * np.exp((f - 1) * log_r), slack

        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # smallest f >= 1 with spent <= first * ratio^(f-1), fixed up for rounding
            f = 1.0 + np.maximum(0.0, np.ceil(np.log(np.maximum(spent / first, 1e-300)) / log_r))
            f = np.where(np.isfinite(spent), f, 1.0)
            size, slack = size_of(f)
            under = spent > size * (1.0 - slack)
            f = np.where(under, f + 1, f)
            size, slack = size_of(f)
            lower, lower_slack = size_of(f - 1)
            over = (f > 1) & (spent <= lower * (1.0 - lower_slack))
            f = np.where(over, f - 1, f)
            size = np.where(over, lower, size)
            slack = np.where(over, lower_slack, slack)
            penalty = (math.log(n) + self.log_inv_weight(f) + math.log(1 / delta)
                       + log_mass) / (orders - 1)
            out = np.nextafter((size + penalty) * (1.0 + slack), np.inf)
        return np.where(np.isfinite(spent), out, np.inf)


def _slack(exponent: np.ndarray) -> np.ndarray:
    """A relative bound on the rounding of :meth:`_Family.bound`'s size and penalty: a
    few ulps for each log, product, quotient and sum (32: generous), and exp(x)'s error
    from x's, |x|·4 ulps (x = (f − 1)·log r: log r = log √2 errs by about 2.5 ulps, its
    rounded √2 included, and the product by half an ulp more). The size's own rounding needs
    at most about 11 of the 32 ulps (4 each for the log and the exp, half of one for each of
    five more operations), so the eligibility test ``spent ≤ size·(1 − slack)`` also holds
    for a spent value up to 2.2u (1.1 ulps) below the exact curve, as a Gaussian's
    α/fl(2σ²) or a zCDP's fl(ρα) rounded to nearest is (privguard's before checkpoint curves
    version 8, task adv8; review radv8, tests/test_radv8_curve_rounding_margins.py)."""
    return (32.0 + 4.0 * np.abs(exponent)) * _ULP


_PAPER_MASS = math.pi**2 / 12  # Σ_f 1/(2f²)
# seed 001 §4.5 and eq. 5: sizes 2^(f−1)·log(2|Λ|/δ)/(α−1), weights 1/(2f²).
_PAPER_FAMILY = _Family(1.0, 2.0, lambda f: np.log(2.0 * f * f))
# The finer family on the mass the paper leaves unused: weights
# (1 − π²/12)·6/(π²g²), which sum to exactly 1 − π²/12 over g >= 1.
_FINE_FAMILY = _Family(
    0.2, math.sqrt(2.0),
    lambda g: np.log(math.pi**2 * g * g / 6.0) - math.log(1.0 - _PAPER_MASS),
)
_FAMILIES = {PAPER: (_PAPER_FAMILY,), TIGHT: (_PAPER_FAMILY, _FINE_FAMILY)}
_LOG_MASS = {PAPER: 0.0, TIGHT: 2.0 ** -54}
"""A bound on log W, W the exact total weight of a mode's members as the code defines them
(its float constants ``math.pi`` and ``_PAPER_MASS`` taken as exact), added to every
member's log(1/(w_m δ)): the partition argument (docs/theory.md §3.9) gives
P(Loss > ε̂) <= δ·W, so each member is taken at w_m·δ/W and the union is at δ.
``"paper"``: W = π²/12 < 1 (its weights 1/(|Λ|·2f²) need no constant), so 0 (an
over-count). ``"tight"``: W = π²/12 + (1 − _PAPER_MASS)·π²/math.pi² = 1 + 2.9·10⁻¹⁷
(math.pi is below π), and log W < 2⁻⁵⁴. Before (task fp) the excess was covered only by
the rounding slack (:func:`_slack`, >= 32 ulps of a value whose (α−1)-multiple is >= log 2,
far above it); the term makes the argument exact rather than leaning on that slack. Added
to a penalty's sum (in units of 1/(α−1)) of 1 or more it changes no float; below 1
(|Λ| = 1 and δ > 0.7) it may raise one by an ulp. It never lowers a reported ε.
``tests/test_leftovers_fp.py`` checks W and the bound in 60 digits."""

# ---------------------------------------------------------------------------
# "mixture": the root of Σ_α w_α exp((α−1)(ε − S(α))) = 1/δ, rounded up.

_MAX_EVALS = 60  # Newton from above needs ~5-7 evaluations; this is only a cap
_RTOL = 1e-13  # stop when the next Newton step is below this (relative)
_FLOOR = -700.0  # exponents below the largest by more than this are raised to it (see below)


def _offsets(spent: np.ndarray, log_w: np.ndarray, am1: np.ndarray, delta: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """c_α = S(α) + log(1/(w_α δ))/(α−1) (+inf where S = inf or w = 0) and the
    union form min_α c_α, row by row."""
    with np.errstate(divide="ignore", over="ignore"):
        c = spent + (-math.log(delta) - log_w) / am1
    return c, c.min(axis=-1)


_SUM_EXCESS = 2.0 ** -52
"""What the stopping test f >= err adds for weights whose exact sum exceeds 1. Ville's
inequality bounds the mixture supermartingale's crossing of 1/δ by δ·Σ_α w_α (its value at
the start), so the bound holds at δ where the exact left side is >= Σ_α w_α/δ: f >= log Σ w_α,
and log Σ w_α <= log(1 + 2⁻⁵³) < 2⁻⁵² (:func:`_at_most_one`: the weights' correctly rounded
sum is <= 1; review rlo3)."""


def _error_bound(f, top, eps, slope, mean_abs_z, n: int):
    """A bound on the floating-point error of the computed f (see :func:`_mixture_epsilon_1d`).

    Works on floats and, element-wise, on arrays. Twice the rounding bound, so half of it,
    8u·(2|ε|·slope + mean|z| + |top| + ...) with u = 2⁻⁵³, is spare. That half also covers a
    spent curve up to 2.2u (relative) below the exact one (a Gaussian's α/fl(2σ²) or a
    zCDP's fl(ρα) rounded to nearest, as privguard's were before checkpoint curves version
    8, task adv8; a caller's spent array may still be): since (α−1)S(α) = (α−1)ε − x_α − log(1/(w_α δ)) ≤ (α−1)|ε| + |z_α| + |top|,
    each exact exponent lies below the computed one by at most 2.2u times that, and f by
    their softmax-weighted mean, ≤ 2.2u·(|ε|·slope + mean|z| + |top|) (review radv8,
    tests/test_radv8_curve_rounding_margins.py).
    """
    return 8.0 * _ULP * (2.0 * np.abs(eps) * slope + mean_abs_z + np.abs(top) + np.abs(f) + n)


def _mixture_epsilon_1d(spent: np.ndarray, log_w: np.ndarray, am1: np.ndarray,
                        delta: float) -> float:
    """The mixture bound for one spent curve; the same iteration as :func:`_mixture_epsilon`.

    With c_α = S(α) + log(1/(w_α δ))/(α−1) the equation reads f(ε) = 0 for
    f(ε) = log Σ_α exp(x_α), x_α = (α−1)(ε − c_α). f is increasing and
    convex (a log-sum-exp of increasing affine functions), f(min_α c_α) >= 0
    (the union form: one term equals 1), and f < 0 below the single-order
    Chernoff bound. Newton's method started at the union form decreases
    monotonically to the root without crossing it (each tangent lies below
    the convex f).

    Rounding is handled explicitly: an iterate is accepted only if the
    computed f is at least ``err``, a bound on the floating-point error of the
    computed f, so the exact equation's left side is >= 1/δ at every accepted
    value: the value returned is never below the true root. ``err``: each
    exponent's error is at most 4·ulp·(|x_α| + (α−1)|ε|) (c_α, the difference
    and the product are each rounded, and (α−1)c_α = (α−1)ε − x_α); f moves
    by the softmax-weighted mean of those, plus a few ulp of |f| and of each
    of the n terms of the sum for exp, log and the additions; ``err`` doubles
    all that. Exponents more than 700 below the largest are raised to it
    before exp (this keeps subnormals out, which are slow): that can only
    raise the computed sum, by at most n·e^−700 relative, far below ``err``.
    An iterate that fails the check is pushed up and checked again. Orders
    with S = +inf or w = 0 contribute nothing (up to that e^−700).
    """
    c, union = _offsets(spent, log_w, am1, delta)
    if not math.isfinite(union):
        return math.inf
    n = c.size
    eps, best = float(union), math.inf
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(_MAX_EVALS):
            x = am1 * (eps - c)
            top = float(x.max())
            z = np.maximum(x - top, _FLOOR)
            e = np.exp(z)
            total = float(e.sum())
            slope = float(e @ am1) / total
            f = top + math.log(total)
            err = float(_error_bound(f, top, eps, slope, -float(e @ z) / total, n)) \
                + _SUM_EXCESS
            if f >= err:  # verified: the exact left side is >= 1/δ at eps
                best = eps
                step = (f - err) / slope
                if step <= _RTOL * max(1.0, abs(eps)):
                    break
                eps -= step
            else:  # rounding left eps (just) below the root: push it up
                eps += max(2.0 * (err - f) / slope, 4.0 * _ULP * max(1.0, abs(eps)))
    return best


def _mixture_epsilon(spent: np.ndarray, log_w: np.ndarray, am1: np.ndarray,
                     delta: float) -> np.ndarray:
    """:func:`_mixture_epsilon_1d` for each row of ``spent`` (shape (m, |Λ|)), vectorised.

    ``log_w`` may describe weights summing to more than 1; only tests do
    that, to show what such a construction breaks.
    """
    c, union = _offsets(spent, log_w, am1, delta)
    n = c.shape[1]
    best = np.full(spent.shape[0], np.inf)
    active = np.flatnonzero(np.isfinite(union))
    eps = union.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(_MAX_EVALS):
            if active.size == 0:
                break
            ea = eps[active]
            x = am1 * (ea[:, None] - c[active])
            top = x.max(axis=1)
            z = np.maximum(x - top[:, None], _FLOOR)
            e = np.exp(z)
            total = e.sum(axis=1)
            slope = (e @ am1) / total
            f = top + np.log(total)
            mean_abs_z = -np.einsum("ij,ij->i", e, z) / total
            err = _error_bound(f, top, ea, slope, mean_abs_z, n) + _SUM_EXCESS
            ok = f >= err
            best[active[ok]] = ea[ok]
            step = np.where(ok, (f - err) / slope, 0.0)
            done = ok & (step <= _RTOL * np.maximum(1.0, np.abs(ea)))
            push = np.maximum(2.0 * (err - f) / slope, 4.0 * _ULP * np.maximum(1.0, np.abs(ea)))
            eps[active] = np.where(ok, ea - step, ea + push)
            active = active[~done]
    return best


# ---------------------------------------------------------------------------
# Weights from the declared plan (data-independent by construction).

PLAN_SHARE = 0.9
"""Declared horizon: this share of the mass goes to the planned reads, the rest is uniform."""
OPEN_SHARE = 0.5
"""Horizon unknown: at most this share is concentrated, so every w_α >= 1/(2|Λ|)."""
OPEN_READS = 11
"""Horizon unknown: the default read schedule is every·2^k for k = 0, ..., OPEN_READS − 1."""
SMOOTHING = 1.0
"""Width of the smoothing kernel on log(α−1), in units of 1/sqrt(2·log(1/δ))."""


def _read_targets(curve: np.ndarray, am1: np.ndarray, times, count: int,
                  log_inv: float) -> dict[int, int]:
    """How many of the ``count`` reads (times(k), k = 1..count, non-decreasing) pick each order.

    A read at t picks argmin_α t·curve(α) + log_inv/(α−1): the order at
    which the plan's spent curve after t steps gives the smallest bound with
    that read's share of the mass. The argmin is non-increasing in t (RDP
    curves are non-decreasing in α), so equal picks at both ends of a range of
    reads hold throughout it: divide and conquer, O(#picks · log count)
    evaluations even for millions of reads.
    """
    def pick(k: int) -> int:
        with np.errstate(invalid="ignore", over="ignore"):
            obj = times(k) * curve + log_inv / am1
        obj = np.where(np.isnan(obj), np.inf, obj)
        return int(np.argmin(obj)) if np.isfinite(obj).any() else -1

    counts: dict[int, int] = {}
    memo: dict[int, int] = {}

    def at(k: int) -> int:
        if k not in memo:
            memo[k] = pick(k)
        return memo[k]

    stack = [(1, count)]
    while stack:
        lo, hi = stack.pop()
        if at(lo) == at(hi):
            counts[at(lo)] = counts.get(at(lo), 0) + hi - lo + 1
        elif hi - lo == 1:
            counts[at(lo)] = counts.get(at(lo), 0) + 1
            counts[at(hi)] = counts.get(at(hi), 0) + 1
        else:
            mid = (lo + hi) // 2
            stack += [(lo, mid), (mid + 1, hi)]
    return counts


def _at_most_one(w: np.ndarray) -> np.ndarray:
    """``w`` scaled down (by a few ulp at most when it is meant to sum to 1) so that
    ``math.fsum(w)`` (Σ w correctly rounded) is <= 1: the exact Σ w is then <= 1 + 2⁻⁵³
    (a sum above 1 + 2⁻⁵³ rounds above 1), and the odometer accounts for that excess in
    its stopping test (:data:`_SUM_EXCESS`).

    Review rlo3 found the exact sum above 1 (157 weights fl(1/157): 1 + 5.0e-17) and
    scaled the weights down to an exact sum <= 1; that changed the weights a ledger
    fixes, so every checkpoint written before no longer matched today's derivation and
    was replayed from the genesis (docs/theory.md §7, "Resuming from an older
    checkpoint"). The weights are as they were; the excess is in the test instead."""
    total = math.fsum(w.tolist())
    if total > 1.0:
        w = w / total
    while math.fsum(w.tolist()) > 1.0:
        w = w * (1.0 - 2 * _ULP)
    return w


def mixture_weights(orders: Any, plan: Plan | Any | None, delta: float) -> np.ndarray:
    """Mixture weights w_α >= 0, Σ w_α <= 1, from the declared plan only (never from outputs).

    * ``plan`` is None: uniform, w_α = 1/|Λ|.
    * ``plan.steps`` is None (this step, horizon unknown): half the mass
      uniform, half on the default reads every·2^k, k = 0..10 (one read to
      1,024 reads of the cadence). Every w_α >= 1/(2|Λ|), so the bound is
      never above ``"paper"`` for any spent curve (docs/theory.md §3).
    * a declared horizon: 0.1 of the mass uniform, 0.9 split evenly over the
      planned reads (every ``plan.read_every`` steps up to ``plan.steps``, and
      at ``plan.steps``). Then the bound is at most :func:`paper_excess_bound`
      (about 1.04 at δ = 1e-6 on the default grid) times ``"paper"``, for any
      spent curve, however far the run leaves its plan.

    Each read's share sits on the order minimising the plan's bound at that
    read, S_t(α) + log(1/(share·δ))/(α−1), smoothed by a Gaussian kernel on
    log(α−1) of width SMOOTHING/sqrt(2·log(1/δ)) — the width of the mixture
    integrand exp((α−1)(ε − S_t(α))) around its peak for a Gaussian curve —
    so nearby orders, which a run drifting off its plan needs, share it.

    A bare mechanism is accepted as ``plan`` (= ``Plan(mechanism)``).

    Args:
        orders: the grid Λ (strictly increasing orders > 1).
        plan: a :class:`~privguard.Plan`, a mechanism, or None.
        delta: the δ the odometer will mostly be read at (shapes the weights only).

    Returns:
        A new float array, one weight per order.

    Raises:
        InvalidArgumentError: a bad grid, plan or δ.

    Example:
        >>> from privguard import DEFAULT_ORDERS, Plan, mechanisms as M
        >>> step = M.SubsampledGaussian(1.0, 512 / 50_000)
        >>> w = mixture_weights(DEFAULT_ORDERS, Plan(step, steps=98 * 50), 1e-6)
        >>> float(w.sum()) <= 1.0, float(w.min()) >= 0.1 / len(DEFAULT_ORDERS) * (1 - 1e-12)
        (True, True)
    """
    grid = check.orders("orders", orders)
    delta = check.delta("delta", delta)
    return _weights(grid, as_plan(plan), delta, PLAN_SHARE, OPEN_SHARE, OPEN_READS, SMOOTHING)


def _weights(grid: np.ndarray, plan: Plan | None, delta: float, plan_share: float,
             open_share: float, open_reads: int, smoothing: float) -> np.ndarray:
    """:func:`mixture_weights` with its constants as arguments (benchmarks vary them)."""
    n = grid.size
    if plan is None:
        return _at_most_one(np.full(n, 1.0 / n))
    am1 = grid - 1.0
    curve = np.asarray(plan.step.rdp(grid), dtype=float)
    every = plan.read_every
    if plan.steps is None:
        share, count = open_share, open_reads
        times = lambda k: float(every) * 2.0 ** (k - 1)
    else:
        steps = plan.steps
        share, count = plan_share, -(-steps // every)  # reads at every, 2·every, ..., steps
        times = lambda k: float(min(k * every, steps))
    per_read = share / count
    targets = _read_targets(curve, am1, times, count, -math.log(per_read * delta))
    log_am1 = np.log(am1)
    width = smoothing / math.sqrt(2.0 * -math.log(delta))
    w = np.full(n, (1.0 - share) / n)
    for j, k in sorted(targets.items()):
        if j < 0:  # the plan's curve is infinite everywhere: this read's share goes uniform
            w += per_read * k / n
            continue
        if width > 0:
            kernel = np.exp(-0.5 * ((log_am1 - log_am1[j]) / width) ** 2)
        else:
            kernel = (np.arange(n) == j).astype(float)
        w += per_read * k * kernel / kernel.sum()
    return _at_most_one(w)


def paper_excess_bound(weights: Any, delta: float) -> float:
    """A factor c >= 1 with mixture(w) <= c · paper for EVERY spent curve (same grid, δ).

    With u = |Λ|·min_α w_α and K_α = log(2|Λ|/δ)/(α−1): let α* attain the
    paper's bound P (seed 001 eq. 5). Its filter size is >= S(α*) and >= K_α*,
    and its penalty is >= K_α*, so P >= S(α*) + K_α* and P >= 2K_α*. The
    mixture is at most its union form at α*:
    S(α*) + log(|Λ|/(u·δ))/(α*−1) = S(α*) + K_α* + log(1/(2u))/(α*−1)
    <= P + (P/2)·log(1/(2u))/log(2|Λ|/δ). Hence
    c = 1 + max(0, log(1/(2u))) / (2·log(2|Λ|/δ)); c = 1 when every
    w_α >= 1/(2|Λ|).

    Example:
        >>> import numpy as np
        >>> round(paper_excess_bound(np.full(157, 0.1 / 157), 1e-6), 4)
        1.0411
    """
    w = np.asarray(weights, dtype=float)
    delta = check.delta("delta", delta)
    n = w.size
    u = n * float(w.min())
    if u <= 0:
        return math.inf
    return 1.0 + max(0.0, -math.log(2.0 * u)) / (2.0 * math.log(2.0 * n / delta))


# ---------------------------------------------------------------------------


def _checked_weights(weights: Any, n: int) -> np.ndarray:
    try:
        w = np.array(weights, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float64
        raise InvalidArgumentError("weights", check.short(weights), "must be a sequence of numbers") from None
    if w.ndim != 1 or w.size != n:
        raise InvalidArgumentError("weights", check.short(weights), f"must be 1-D with one weight per order ({n})")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InvalidArgumentError("weights", check.short(weights), "must be finite and >= 0")
    total = math.fsum(w.tolist())
    if not total > 0:
        raise InvalidArgumentError("weights", check.short(weights), "must have a positive entry")
    if total > 1.0 + 1e-9:
        raise InvalidArgumentError("weights", check.short(weights), f"must sum to at most 1 (sum {total!r})")
    w = _at_most_one(w)  # a sum over 1 by rounding only: scaled down, never up
    w.setflags(write=False)
    return w


def _holds_non_numbers(value: Any) -> bool:
    """Whether a string, bytes or bool is among the elements of ``value`` (a list, a tuple
    or an object array: numpy reads ``[Fraction(1, 10), "0.1"]`` or ``[True, 0.2]`` as
    numbers, where an array of strings or bools alone is refused; review rbs)."""
    leaves = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
    if leaves.dtype.kind != "O":
        return leaves.dtype.kind in "bSU"
    return any(issubclass(t, (str, bytes, bool, np.bool_)) for t in set(map(type, leaves.flat)))


class Odometer:
    """A running (ε, δ) tail bound for adaptive sequences; pure, no state of its own.

    The bound is a function of the spent curve only (and of the grid, mode,
    weights and δ, all fixed before any output), so it can be evaluated for a
    whole batch of spent curves at once (:meth:`epsilon_batch`).

    In ``"mixture"`` mode the reported ε_t is the root, rounded up, of
    Σ_α w_α exp((α−1)(ε − S_t(α))) = 1/δ. Proof sketch (docs/theory.md §3):
    each M_t(α) = exp((α−1)(L_t − S_t(α))) is a non-negative supermartingale
    with M_0 = 1 when each step's curve is chosen before its output, so
    Σ_α w_α M_t(α) is one with initial value <= 1, and Ville's inequality
    (Ville 1939; Howard et al. 2020; Whitehouse et al. 2023; seed 001 §4)
    gives P(∃t: L_t > ε_t) <= δ. The guarantee therefore holds WHENEVER ε is
    read — after every step, every epoch, or at a moment picked from the
    outputs — and whatever was charged. The plan behind the weights, and its
    ``every`` in particular, only shapes the weights (where the bound is
    tightest); it is never a condition of validity.

    Args:
        orders: the grid Λ.
        mode: ``"mixture"`` (default), ``"paper"`` (seed 001 §4.5 exactly) or
            ``"tight"`` (legacy, for ledgers written with it).
        weights: mixture weights (one per order, >= 0, sum <= 1), e.g. from
            :func:`mixture_weights`; default uniform. Ignored by the other modes.

    Example:
        >>> import numpy as np
        >>> orders = np.array([2.0, 4.0, 8.0])
        >>> spent = orders * 0.05   # a Gaussian, rho = 0.05
        >>> round(Odometer(orders, "paper").epsilon(spent, delta=1e-5), 3)
        3.801
        >>> round(Odometer(orders).epsilon(spent, delta=1e-5), 3)   # uniform mixture
        2.201
    """

    def __init__(self, orders: Any, mode: str = MIXTURE, weights: Any = None) -> None:
        if not isinstance(mode, str) or mode not in MODES:  # an array's `in` raised (bd)
            raise InvalidArgumentError("mode", mode, f"must be one of {MODES}")
        self.orders = check.orders("orders", orders)
        self.mode = mode
        self.weights: np.ndarray | None = None
        if mode == MIXTURE:
            n = self.orders.size
            self.weights = _checked_weights(np.full(n, 1.0 / n) if weights is None else weights, n)
            with np.errstate(divide="ignore"):
                self._log_w = np.log(self.weights)
            self._am1 = self.orders - 1.0

    def _spent(self, spent: Any) -> np.ndarray:
        try:  # strings and bools are not numbers; 10**400 overflows a float (task bs)
            raw = np.asarray(spent)
            exact = isinstance(spent, np.ndarray) and raw.dtype.kind != "O"  # nothing to read
            if raw.dtype.kind not in "iufO" or (not exact and _holds_non_numbers(spent)):
                raise TypeError(raw.dtype)
            arr = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError, OverflowError, RecursionError, RuntimeError):
            # RuntimeError: a torch tensor that requires grad (review rbs)
            raise InvalidArgumentError("spent", check.short(spent),
                                       "must be an array of numbers") from None
        if arr.ndim == 0 or arr.shape[-1] != self.orders.size:
            raise InvalidArgumentError("spent", check.short(spent),
                                       f"must have one value per order ({self.orders.size}) "
                                       "in its last axis")
        if np.isnan(arr).any() or (arr < 0).any():
            raise InvalidArgumentError("spent", check.short(spent), "spent RDP must be >= 0 (+inf allowed), not NaN")
        return arr

    def _legacy(self, spent: np.ndarray, delta: float) -> np.ndarray:
        per_order = np.minimum.reduce(
            [fam.bound(spent, self.orders, delta, _LOG_MASS[self.mode])
             for fam in _FAMILIES[self.mode]])
        return np.min(per_order, axis=-1)

    def epsilon_batch(self, spent: Any, delta: float) -> np.ndarray:
        """The bound for each row of ``spent`` (shape (..., |Λ|)).

        Raises:
            InvalidArgumentError: a bad ``spent`` array or ``delta``.
        """
        arr = self._spent(spent)
        delta = check.delta("delta", delta)
        if self.mode != MIXTURE:
            return self._legacy(arr, delta)
        flat = arr.reshape(-1, self.orders.size)
        return _mixture_epsilon(flat, self._log_w, self._am1, delta).reshape(arr.shape[:-1])

    def epsilon(self, spent: Any, delta: float) -> float:
        """The running ε at ``delta`` for one spent curve (shape (|Λ|,)).

        Raises:
            InvalidArgumentError: a bad ``spent`` curve or ``delta``.
        """
        arr = self._spent(spent)
        if arr.ndim != 1:
            raise InvalidArgumentError("spent", check.short(spent), "must be one curve (1-D)")
        delta = check.delta("delta", delta)
        if self.mode == MIXTURE:
            return _mixture_epsilon_1d(arr, self._log_w, self._am1, delta)
        return float(self._legacy(arr[None, :], delta)[0])
