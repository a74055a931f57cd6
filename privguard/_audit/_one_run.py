"""The one-run lower bound on ε (Steinke, Nasr & Jagielski 2023): pure arithmetic.

m canaries, each included independently with probability 1/2; after one run an
auditor makes r guesses (``in``/``out``, abstaining on the rest) and v of them
are right. If the run is (ε, δ)-DP with respect to each canary, then
(SNJ 2023, Theorem 5.2, with its Appendix D arithmetic; docs/theory.md §16)

    P[V ≥ v] ≤ β(ε) + 2mδ · max_{1≤i≤v} P[v−i ≤ B < v] / i,
    β(ε) = P[B ≥ v],  B ~ Binomial(r, e^ε/(1+e^ε)).

:func:`epsilon_lower_bound` inverts this test on a grid fixed in advance,
scanning upward, so that it needs no monotonicity of the p-value in ε;
:func:`guess_and_count` is the one guess rule (ties: canary order).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from scipy import stats

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._floats import float_below

__all__ = ["GRID_STEP", "epsilon_lower_bound", "p_value"]

GRID_STEP = 0.01
"""Resolution of the ε grid the bound is read on (fixed before any run)."""

GRID_MAX = 60.0

P_VALUE_MARGIN = 1e-9
"""A grid ε is rejected only when its p-value is ≤ the level less this relative margin:
room for the floating-point error of scipy's binomial tails, far below the grid's effect."""


def split_level(confidence: float, splits: int = 1) -> float:
    """(1 − confidence)/splits, the level of each of ``splits`` tests, never rounded up.

    Computed on the exact value of the float ``confidence`` (review aud: the round trip
    1 − (1 − (1 − c)/n) gave each of n = 4 pairs a level above (1 − c)/n at c = 0.9, so
    the union bound of Proposition 16.4 summed to more than 1 − c).

    Example:
        >>> split_level(0.9, 4) * 4 <= 1 - 0.9
        True
    """
    return float_below((1 - Fraction(confidence)) / splits)


def _counts(m: int, r: int, v: int) -> tuple[int, int, int]:
    for name, value in (("m", m), ("r", r), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise InvalidArgumentError(name, value, "must be a non-negative integer")
    if not v <= r <= m:
        raise InvalidArgumentError("v", v, f"must satisfy v ≤ r ≤ m (r = {r}, m = {m})")
    return int(m), int(r), int(v)


def _p_values(m: int, r: int, v: int, eps: np.ndarray, delta: float) -> np.ndarray:
    """:func:`p_value` at each ε of ``eps`` (vectorised)."""
    q = 1.0 / (1.0 + np.exp(-eps))  # randomized response's accuracy at ε
    if v == 0:
        return np.ones_like(eps)
    beta = stats.binom.sf(v - 1, r, q)  # P[B ≥ v]
    if delta == 0:
        return np.minimum(1.0, beta)
    # P[v−i ≤ B < v] for i = 1..v, and its largest ratio to i (Thm 5.2's δ term)
    below = np.arange(v - 1, -1, -1)  # v−1, v−2, …, 0
    pmf = stats.binom.pmf(below[None, :], r, q[:, None])
    alpha = np.max(np.cumsum(pmf, axis=1) / np.arange(1, v + 1)[None, :], axis=1)
    return np.minimum(1.0, beta + 2.0 * m * delta * alpha)


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[at least v of r guesses right] under the hypothesis "(ε, δ)-DP" (SNJ 2023, Thm 5.2).

    Example:
        >>> round(p_value(1000, 100, 60, 0.0, 0.0), 4)  # ε = 0: a fair coin per guess
        0.0284
    """
    m, r, v = _counts(m, r, v)
    return float(_p_values(m, r, v, np.array([float(epsilon)]), float(delta))[0])


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95,
                        splits: int = 1) -> float:
    """The largest grid ε such that "(ε', δ)-DP" is rejected at every grid ε' ≤ ε.

    With probability ≥ ``confidence`` over the canaries' inclusion and the
    run, the true ε (at δ) is at least the value returned (docs/theory.md
    §16): if the run is (ε*, δ)-DP, the first grid point g ≥ ε* is rejected
    with probability ≤ 1 − confidence, and a returned value above ε* needs
    that rejection. With ``splits`` = n the test is run at level
    (1 − confidence)/n, one of n bounds of a union (§16.4).

    Example:
        >>> epsilon_lower_bound(1000, 100, 50, 1e-5)  # half right: nothing to show
        0.0
        >>> epsilon_lower_bound(1000, 100, 100, 1e-5) > 2.9  # all right
        True
    """
    m, r, v = _counts(m, r, v)
    delta = check.delta("delta", delta) if delta else 0.0
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0.0 < confidence < 1.0:
        raise InvalidArgumentError("confidence", confidence, "must be in (0, 1)")
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise InvalidArgumentError("splits", splits, "must be an integer >= 1")
    level = split_level(float(confidence), splits) * (1.0 - P_VALUE_MARGIN)
    grid = np.arange(round(GRID_MAX / GRID_STEP) + 1) * GRID_STEP
    chunk = max(1, min(50, 500_000 // max(v, 1)))
    for start in range(0, len(grid), chunk):  # upward, in blocks: stop at the first non-rejection
        kept = _p_values(m, r, v, grid[start:start + chunk], delta) <= level
        if not kept.all():
            first = start + int(np.argmin(kept))
            return 0.0 if first == 0 else float(grid[first - 1])
    return float(grid[-1])


def guess_and_count(scores: np.ndarray, included: np.ndarray, k_in: int,
                    k_out: int) -> tuple[int, int]:
    """(r, v): guess the ``k_in`` top scores "in" and the ``k_out`` bottom "out"; count the right ones.

    Example:
        >>> guess_and_count(np.array([3., 2., 1., 0.]), np.array([1, 0, 1, 0], bool), 1, 1)
        (2, 2)
    """
    # checked (review bd: a scalar, a float count or a numpy uint64 raised built-ins)
    scores = check._real_vector("scores", scores)
    if not (isinstance(included, np.ndarray) and included.dtype == bool
            and included.shape == scores.shape):
        raise InvalidArgumentError("included", check.short(included),
                                   f"must be a boolean array of the scores' length "
                                   f"({scores.size})")
    k_in, k_out = check._as_int("k_in", k_in), check._as_int("k_out", k_out)
    for name, k in (("k_in", k_in), ("k_out", k_out)):
        if not 0 <= k <= scores.size:
            raise InvalidArgumentError(name, k, f"must lie in [0, {scores.size}]")
    if k_in + k_out > scores.size:
        raise InvalidArgumentError("k_out", k_out, f"with k_in={k_in} guesses more than the "
                                   f"{scores.size} scores (a score guessed twice)")
    order = np.argsort(scores, kind="stable")
    top = order[len(order) - k_in:] if k_in else order[:0]
    bottom = order[:k_out]
    return k_in + k_out, int(included[top].sum() + (~included[bottom]).sum())
