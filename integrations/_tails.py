"""The exact tails the witnesses test with (private): χ² and binomial, from scipy's special functions.

Shared by :mod:`privguard.integrations._witnesses` and
:mod:`privguard.integrations._inclusion` (its own module, so neither imports the other).

Example:
    >>> round(binomial_tail_upper(3, 4, 0.5), 4)  # P(X ≥ 3), X ~ Binomial(4, 1/2) = 5/16
    0.3125
"""

from __future__ import annotations

from scipy import special

CONFIDENCE = 0.95
"""Confidence of the interval reported with a mismatch."""


def chi2_lower_tail(x: float, d: int) -> float:
    """P(χ²_d ≤ x), exactly: the regularised lower incomplete gamma P(d/2, x/2)."""
    return float(special.gammainc(d / 2.0, x / 2.0))


def chi2_quantile(p: float, d: int) -> float:
    """The p-quantile of χ²_d: 2·P⁻¹(d/2, p) (the inverse regularised incomplete gamma)."""
    return 2.0 * float(special.gammaincinv(d / 2.0, p))


def binomial_tail_lower(k: int, n: int, q: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, q) = I_{1−q}(n−k, k+1) (the incomplete beta identity)."""
    return 1.0 if k >= n else float(special.betainc(n - k, k + 1, 1.0 - q))


def binomial_tail_upper(k: int, n: int, q: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, q) = I_q(k, n−k+1); 0 for k > n.

    Review lr: for k > n (more records than draws: impossible under the charge) scipy's
    I_q(k, n−k+1) is NaN, and the witnesses' ``min(lower, upper) > α/2`` (Python's ``min``
    keeps 1.0 over a NaN) passed the step.
    """
    if k > n:
        return 0.0
    return 1.0 if k <= 0 else float(special.betainc(k, n - k + 1, q))


def binomial_tails(k: int, n: int, q: float) -> tuple[float, float]:
    """(P(X ≤ k), P(X ≥ k)) for X ~ Binomial(n, q), by the incomplete beta identity."""
    return binomial_tail_lower(k, n, q), binomial_tail_upper(k, n, q)


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided interval for a binomial rate, k of n."""
    a = (1.0 - confidence) / 2.0
    k = min(max(k, 0), n)  # a count outside [0, n] (impossible under the charge): its bound
    lo = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, a))
    hi = 1.0 if k >= n else float(special.betaincinv(k + 1, n - k, 1.0 - a))
    return lo, hi
