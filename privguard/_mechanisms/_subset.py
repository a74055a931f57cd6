"""Tuning on a Poisson-subsampled subset, then training the final model (seed 000).

Koskela & Kulkarni (2023), formulas.md §1 and §5. X₁ ⊂ X is drawn by Poisson
sampling with rate q; the tuning mechanism runs on X₁; the final model trains
on X ∖ X₁ (variant 1) or on X (variant 2). Both bounds hold at integer orders
α ≥ 2; privguard evaluates them at the integers 2..N, N = min(⌈max order⌉,
256), and extends them to any grid by monotonicity of RDP in α:
ε(α) ≤ ε(⌈α⌉), ε(α) ≤ ε(2) for α < 2, and +inf above N.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy.special import gammaln, logsumexp, xlogy

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism, mechanism_from_dict, take

MAX_INTEGER_ORDER = 256


def _log_binom(n, k):
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def _mul(coef, eps):
    """coef·ε with 0·inf = 0 (a term with a zero coefficient does not depend on ε)."""
    with np.errstate(invalid="ignore"):
        return np.where(coef == 0, 0.0, coef * eps)


def _on_integers(curve_at: np.ndarray) -> np.ndarray:
    """ε indexed by integer order 0..N (entries 0 and 1 unused but set to 0)."""
    return np.concatenate([[0.0, 0.0], curve_at])


_MARGIN = 1e-12
"""Relative margin on each log-sum's terms (their float error is a few ulps of their size)."""


def _log_expm1(x):
    """log(e^x − 1) for x ≥ 0 without cancellation: −inf at 0, x + log1p(−e^(−x)) above."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x + np.log(-np.expm1(-np.where(x > 0, x, 1.0))), -np.inf)


def _weighted(log_weight: np.ndarray, log_excess: np.ndarray) -> np.ndarray:
    """log(w·(e^x − 1)) as log w + log(e^x − 1), with 0·∞ = 0: a term of weight 0 (q ∈ {0, 1})
    does not depend on ε (as :func:`_mul`), where −inf + inf would be NaN."""
    with np.errstate(invalid="ignore"):
        return np.where(log_weight == -np.inf, -np.inf, log_weight + log_excess)


def _log1p_sum(terms: np.ndarray, order: int) -> float:
    """log(1 + Σ e^(terms))/(α−1), rounded up (review al).

    Each theorem's sum is 1 plus non-negative terms: the binomial weights sum to 1. Summed
    as written, 1 emerged from terms such as (1−γ)^(α−1)(αγ−γ+1) and the excess, of order
    γ², was lost to cancellation (SubsetTuning(Gaussian(3), Gaussian(1e6), 1e-6,
    variant=2) at α = 2: 1e-4 (relative) below the theorem). Here the excess is summed
    alone, its log-terms raised by _MARGIN × their size, then log1p; the result × (1 + 2⁻⁴⁸).
    """
    if np.all(terms == -np.inf):
        return 0.0
    finite = terms[np.isfinite(terms)]
    scale = 1.0 + (float(np.max(np.abs(finite))) if finite.size else 0.0)
    log_excess = float(logsumexp(terms)) + _MARGIN * scale
    return float(np.logaddexp(0.0, log_excess)) / (order - 1) * (1.0 + 2.0**-48)


def _log_weights(n: int, j: np.ndarray, p: float) -> np.ndarray:
    """log C(n, j) p^j (1−p)^(n−j), the (1−p) factor as log1p(−p) (no rounding of 1 − p)."""
    with np.errstate(divide="ignore"):
        return _log_binom(n, j) + xlogy(j, p) + _mul(n - j, np.log1p(-p) if p < 1 else -np.inf)


def zhu_wang_subsampled(eps: np.ndarray, gamma: float) -> np.ndarray:
    """RDP of (M ∘ Poisson subsampling(γ)) at integer orders 2..N (seed 000 Thm 4; Zhu & Wang 2019).

    ``eps[a]`` is M's RDP at integer order a (a = 2..N). Returns an array
    indexed like ``eps`` (entries 0 and 1 are 0).

    ε'(α) = 1/(α−1)·log( (1−γ)^(α−1)(αγ−γ+1) + C(α,2)γ²(1−γ)^(α−2)e^(ε(2))
                         + 3 Σ_{j=3..α} C(α,j) γ^j (1−γ)^(α−j) e^((j−1)ε(j)) ),
    evaluated as log(1 + C(α,2)γ²(1−γ)^(α−2)(e^(ε(2)) − 1)
                      + Σ_{j≥3} C(α,j)γ^j(1−γ)^(α−j)(3e^((j−1)ε(j)) − 1))/(α−1):
    the same number, since (1−γ)^(α−1)(αγ−γ+1) holds the binomial terms j = 0, 1 and the
    binomial terms sum to 1 (:func:`_log1p_sum`).
    """
    n = eps.size - 1
    out = np.zeros(n + 1)
    for a in range(2, n + 1):
        j = np.arange(2, a + 1)
        w = _log_weights(a, j, gamma)
        x = _mul(j - 1, eps[j])  # (j−1)ε(j); j = 2: ε(2)
        # j = 2: e^x − 1; j ≥ 3: 3e^x − 1 = 2 + 3(e^x − 1), as log(2 + 3·expm1(x))
        excess = np.where(j == 2, _log_expm1(x), np.logaddexp(math.log(2), math.log(3) + _log_expm1(x)))
        out[a] = _log1p_sum(_weighted(w, excess), a)
    return out


def koskela_kulkarni_variant1(eps_t: np.ndarray, eps_b: np.ndarray, q: float) -> np.ndarray:
    """Seed 000 Theorem 6: RDP at integer orders 2..N of tuning on X₁ ~ Poisson(q)
    and training the final model on X ∖ X₁; the maximum of ε₁ (eq. 3.6) and ε₂ (eq. 3.7).

    ε₁(α) = 1/(α−1) log( q^α e^((α−1)ε_t(α)) + (1−q)^α e^((α−1)ε_b(α))
              + Σ_{j=1}^{α−1} C(α,j) q^(α−j)(1−q)^j e^((α−j−1)ε_t(α−j)) e^((j−1)ε_b(j)) )
    ε₂(α) = 1/(α−1) log( (1−q)^(α−1) e^((α−1)ε_b(α))
              + Σ_{j=1}^{α−1} C(α−1,j) q^j (1−q)^(α−1−j) e^(j·ε_t(j+1)) e^((α−j−1)ε_b(α−j)) )
    Terms (j−1)ε(j) at j = 1 are 0. Both are needed: ε₁ covers one direction
    of the neighbouring relation, ε₂ the other. Each sum is Σ_j w_j e^(x_j) with binomial
    weights w_j (j = 0..α, resp. 0..α−1) that sum to 1, so it is evaluated as
    log(1 + Σ_j w_j (e^(x_j) − 1)) (:func:`_log1p_sum`).
    """
    n = eps_t.size - 1
    out = np.zeros(n + 1)
    for a in range(2, n + 1):
        j = np.arange(0, a + 1)  # ε₁: j draws of the base's side, α − j of the tuning's
        x1 = _mul(a - j - 1, eps_t[np.maximum(a - j, 1)]) + _mul(j - 1, eps_b[np.maximum(j, 1)])
        x1 = np.where(j == 0, _mul(a - 1, eps_t[a]), x1)  # q^α e^((α−1)ε_t(α))
        t1 = _weighted(_log_weights_pair(a, j, q), _log_expm1(x1))
        j = np.arange(0, a)  # ε₂
        x2 = _mul(j, eps_t[j + 1]) + _mul(a - j - 1, eps_b[a - j])
        t2 = _weighted(_log_weights(a - 1, j, q), _log_expm1(x2))
        out[a] = max(_log1p_sum(t1, a), _log1p_sum(t2, a))
    return out


def _log_weights_pair(n: int, j: np.ndarray, q: float) -> np.ndarray:
    """log C(n, j) q^(n−j) (1−q)^j (ε₁'s weights: j counts the (1−q) factors)."""
    with np.errstate(divide="ignore"):
        return _log_binom(n, j) + xlogy(n - j, q) + _mul(j, np.log1p(-q) if q < 1 else -np.inf)


def _extend(orders: np.ndarray, integer_curve: np.ndarray) -> np.ndarray:
    """From integer orders 2..N to any grid by monotonicity (value at ⌈α⌉, inf above N):
    the Rényi divergence is non-decreasing in the order (van Erven & Harremoës 2014,
    Theorem 3), so the value at ⌈α⌉ bounds the one at α.

    ⌈α⌉ exactly: an order a rounding error above an integer k takes the value at k + 1,
    an over-count. (It took k's before, ⌈α − 1e-12⌉: ε(k) < ε(α) may hold there, an
    under-count; task lo3.)"""
    n = integer_curve.size - 1
    idx = np.maximum(np.ceil(orders).astype(int), 2)
    return np.where(idx <= n, integer_curve[np.minimum(idx, n)], np.inf)


@dataclasses.dataclass(frozen=True)
class SubsetTuning(Mechanism):
    """Tune with ``tuning`` on a Poisson(q) subset X₁, then train ``final``.

    ``tuning`` is the tuner's cost on the subset (e.g. a ``RepeatAndSelect``),
    ``final`` the final training's mechanism (a uniform bound over every
    candidate the tuning can select). ``variant=1``: the final model trains on
    X ∖ X₁, bounded by seed 000 Theorem 6 (max of ε₁ and ε₂). ``variant=2``:
    on X, bounded by Theorem 4 (Zhu & Wang) applied to the tuning, composed
    with the final training. Initialising the final model from the tuned one
    (Remark 8) is covered by both.

    Example:
        >>> from privguard import mechanisms as M
        >>> from privguard.tuning import Poisson
        >>> run = M.SubsampledGaussian(1.0, 0.01, steps=1000)
        >>> plan = M.SubsetTuning(M.RepeatAndSelect(run, Poisson(15.0)), run, q=0.1, variant=1)
        >>> c = plan.rdp([2.0, 8.0, 32.0])
        >>> bool((c > run.rdp([2.0, 8.0, 32.0])).all())
        True
    """

    tuning: Mechanism
    final: Mechanism
    q: float
    variant: int = 1

    def __post_init__(self) -> None:
        for name in ("tuning", "final"):
            if not isinstance(getattr(self, name), Mechanism):
                raise InvalidArgumentError(name, check.short(getattr(self, name)),
                                           "must be a privguard mechanism")
        q = check._as_float("q", self.q)
        if not 0.0 <= q <= 1.0:  # also rejects NaN
            raise InvalidArgumentError("q", self.q, "must lie in [0, 1]")
        object.__setattr__(self, "q", q)
        if isinstance(self.variant, bool) or not isinstance(self.variant, (int, np.integer)) or \
                check._as_int("variant", self.variant) not in (1, 2):
            raise InvalidArgumentError("variant", check.short(self.variant), "must be 1 or 2")
        object.__setattr__(self, "variant", check._as_int("variant", self.variant))
        object.__setattr__(self, "_nesting", check.nesting("tuning", (self.tuning, self.final)))

    def integer_curve(self, n: int) -> np.ndarray:
        """The bound at integer orders 0..n, 2 <= n <= 256 (entries 0 and 1 unused)."""
        n = check.positive_int("n", n, maximum=MAX_INTEGER_ORDER)
        if n < 2:
            raise InvalidArgumentError("n", n, "must be an integer >= 2")
        ints = np.arange(2, n + 1, dtype=float)
        ints.setflags(write=False)
        eps_t = _on_integers(self.tuning._rdp_checked(ints))
        eps_b = _on_integers(self.final._rdp_checked(ints))
        if self.variant == 1:
            return koskela_kulkarni_variant1(eps_t, eps_b, self.q)
        # composed with the final training; the float sum rounded up (review al)
        return (zhu_wang_subsampled(eps_t, self.q) + eps_b) * (1.0 + 2.0**-48)

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        n = int(min(math.ceil(orders.max()), MAX_INTEGER_ORDER))
        n = max(n, 2)
        curve = _extend(orders, self.integer_curve(n))
        # A bound at a larger order also bounds every smaller one (formulas.md
        # §1): the theorems' bounds need not be monotone themselves.
        return np.minimum.accumulate(curve[::-1])[::-1]

    def _params(self) -> dict[str, Any]:
        return {"tuning": self.tuning.to_dict(), "final": self.final.to_dict(), "q": self.q,
                "variant": self.variant}

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> SubsetTuning:
        tuning, final, q, variant = take(params, "SubsetTuning", ("tuning", "final", "q", "variant"))
        return cls(mechanism_from_dict(tuning), mechanism_from_dict(final), q, variant)
