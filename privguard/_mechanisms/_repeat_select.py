"""The privacy cost of random-K tuning: run the base algorithm K times, release the best.

Seed 002 (Papernot & Steinke 2022), formulas.md §4. The base algorithm Q is
one tuning candidate: a random draw of hyperparameters, training, and the
score, all of it private; its curve must bound every candidate that can be
drawn (the order-wise maximum over them, seed 000 Lemma 9).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves import _conversion as conv
from privguard._curves._conversion import SLACK
from privguard._errors import InvalidArgumentError
from privguard._floats import float_above
from privguard._mechanisms._base import Mechanism, mechanism_from_dict, take
from privguard._mechanisms._mechanisms import PureDP
from privguard._mechanisms._runs import (
    Poisson,
    RunsDistribution,
    TruncatedNegativeBinomial,
    runs_from_dict,
)


def _monotone_envelope(orders: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """ε(α) ≤ ε(α') for α ≤ α' (Rényi divergence is non-decreasing in α):
    a bound at a larger order also bounds every smaller one."""
    return np.minimum.accumulate(curve[::-1])[::-1]


def _log_delta_hat(orders: np.ndarray, base: np.ndarray, eps_hat: np.ndarray) -> np.ndarray:
    """log δ̂ at each ε̂: the smallest δ for which the base curve gives (ε̂, δ̂)-DP, rounded
    up (task lo4; docs/theory.md §7, "Rounding of δ̂").

    Per base order, the improved RDP conversion (formulas.md §1), and
    δ ≤ TV ≤ sqrt(1 − e^(−KL)) (Bretagnolle–Huber) with KL ≤ ε(α) for every
    α > 1; minimised over the grid. The conversion is
    :func:`~privguard._curves._conversion.log_delta_per_order` (Opacus' operations, raised
    by SLACK·(size + 2): its proof, docs/theory.md §1.2, holds order by order for each ε̂).
    The KL term is ½·log(−expm1(−ε(α))): 1 − e^(−ε) is formed by expm1 to 4 ulps relative
    (1 − exp(−ε) lost all but ~ε/u of its digits for small ε: up to 2·10⁻¹¹ relative in
    the charge, tests/test_leftovers_lo4.py), log adds 4 ulps of its value, so the term
    errs by at most 4.1 u + 8.1 u·|value|; SLACK·(|value| + 2) covers that and the exp a
    caller takes (:func:`_delta_hat`), as in the conversion. ε(α) = 0 gives −∞ exactly.

    Review rlo4: and never below the value before task lo4, ½·log1p(−exp(−ε(α))), which lost
    digits either way (1 − e^(−ε) to within u/2 absolute, so ~u/ε(α) of the term): where it
    was above the exact value, the rounded-up term alone put δ̂ and the charge below main's (by up to
    2.5·10⁻⁵ relative at Poisson(10⁴), 2.2·10⁻⁸ at Poisson(3)), and a ledger main wrote
    with such a charge failed to load ("does not replay to the recorded spent totals": a
    stored total may lie below today's curve, never above it,
    privguard/_stores/_revision.py). Every other step rounds monotonically and is at or
    above main's (ε̂ lowered, the conversion's slack, the exp one step up), so δ̂ and the
    curve are at or above main's everywhere (tests/test_review_rlo4.py).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kl = 0.5 * np.log(-np.expm1(-base))  # per order; -inf where base = 0
        kl = np.where(kl == -np.inf, -np.inf, kl + SLACK * (np.abs(kl) + 2.0))
        kl = np.maximum(kl, 0.5 * np.log1p(-np.exp(-base)))  # main's: never below it (rlo4)
        kl_best = np.min(np.where(np.isnan(kl), np.inf, kl))
        log_d = conv.log_delta_per_order(orders[None, :], base[None, :], eps_hat[:, None])
    return np.minimum(np.min(log_d, axis=1), kl_best)


def _delta_hat(orders: np.ndarray, base: np.ndarray) -> np.ndarray:
    """δ̂ of seed 002 Theorem 6 at each order λ, rounded up (task lo4; docs/theory.md §7).

    The theorem needs e^ε̂ ≤ 1 + 1/(λ−1); ε̂ = log1p(1/(λ−1)) in floats errs by at most
    10.1 u relative (λ − 1 and the quotient an ulp each, relative condition of log1p ≤ 1,
    log1p within 4 ulps), so ε̂·(1 − SLACK) (32 u, then rounded: 31 u below) is below the
    exact value: a smaller ε̂ satisfies the condition, with a larger δ̂. δ̂ = exp(log δ̂)
    one step up (an exp's subnormal result, as :func:`~privguard._curves._conversion.
    delta_from_log`) and at most 1, which every pair of laws satisfies."""
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        eps_hat = np.log1p(1 / (orders - 1)) * (1.0 - SLACK)
        delta = np.nextafter(np.exp(_log_delta_hat(orders, base, eps_hat)), np.inf)
    return np.minimum(delta, 1.0)


def _tnb_bound(orders: np.ndarray, base: np.ndarray, runs: TruncatedNegativeBinomial,
               log_ratio: float = 0.0) -> np.ndarray:
    """Seed 003 Theorem 1 (seed 002 Theorem 2 when log_ratio = log(C/c) = 0):
    ε' = ε + (1+θ)(1 − 1/λ̂)ε̂ + (λ/(λ−1) + 1 + θ)·log(C/c) + (1+θ)·log(1/γ)/λ̂
         + log(E[T])/(λ−1), the auxiliary order λ̂ minimised over the grid.

    Every term is ≥ 0 (E[T] ≥ 1, γ < 1, C ≥ c), and the float evaluation is rounded up
    (review al): log(1/γ) as −log γ (1/γ rounded first lost up to 1.1e-14 of it, relative,
    for γ near 1); log E[T] plus 2⁻⁴⁴ (E[T] carries a few ulps, relative, and log E[T] →
    0 as E[T] → 1: 1.4e-14 relative below at E[T] = 1.01); log(C/c) plus 2⁻⁵⁰ (C/c
    rounded: an ulp, absolute); then the sum × (1 + 2⁻⁴⁸), as the Poisson bound. Before,
    the value was up to 1.3e-14 (relative) below the theorem's on the grid
    (tests/test_adv_al_mechanisms.py).
    """
    theta = runs.eta
    aux = np.min((1 - 1 / orders) * base - math.log(runs.gamma) / orders)
    out = base + (1 + theta) * aux + (math.log(runs.mean) + 2.0**-44) / (orders - 1)
    if log_ratio:
        out = out + (orders / (orders - 1) + 1 + theta) * (log_ratio + 2.0**-50)
    return out * (1.0 + 2.0**-48)


def _poisson_bound(orders: np.ndarray, base: np.ndarray, mean: float,
                   delta_hat: np.ndarray) -> np.ndarray:
    """Seed 002 Theorem 6 with the outcome of K = 0 counted (docs/theory.md §7, "K = 0").

    Lemma 7's proof (App. B.1) assumes P[K = 0] = 0. Write the tuner's output as
    ⊥ (K = 0, probability e^(−μ), the same on both inputs) or the best of K ~ (K | K ≥ 1),
    whose generating function is g = (f − e^(−μ))/(1 − e^(−μ)). ⊥ adds e^(−μ) to
    Σ P^λ P'^(1−λ); Lemma 7 bounds the rest by (1 − e^(−μ))·e^((λ−1)ε)·max g'^λ g'^(1−λ) =
    e^((λ−1)ε)·max f'^λ f'^(1−λ) ≤ e^((λ−1)ε)·μ·e^((λ−1)μδ̂) (Theorem 6's own step). So
    ε' = log(e^(−μ) + μ·e^((λ−1)(ε + μδ̂)))/(λ−1). Without the e^(−μ) term the bound is
    broken for μ < 1 (tests/test_review_tb.py: Poisson(0.5) charged 0 at λ = 5.2 where the
    released winner's Rényi divergence is 0.07); for μ ≥ 1 the term adds at most
    e^(−μ)/(μ(λ−1)). The last factor rounds the float evaluation up: without it the value
    was below the exact one at most orders, by up to 3.2e-16 relative (review rpo; the
    value is ≥ 0, e^(−μ) + μ ≥ 1).
    """
    out = np.logaddexp(-mean, math.log(mean) + (orders - 1) * (base + mean * delta_hat)) / (orders - 1)
    return out * (1.0 + 2.0**-48)


def _poisson_convex_bound(orders: np.ndarray, base: np.ndarray, mean: float) -> np.ndarray:
    """A second bound for K ~ Poisson(μ), valid at every μ, by joint convexity (docs/theory.md §7).

    Theorem 6 as stated fails for μ < 1 (review acc: a randomized-response base with ε₀ = 1
    and μ = 0.5 has D₂ = 0.391 against its 0.139). This bound is the tighter one where
    (λ−1)ε(λ) is small, and tends to 0 with ε(λ), which _poisson_bound does not: the output
    law is the mixture
    Σ_k P[K=k]·(best of k runs), the same weights under both datasets; (p, q) ↦ p^λ q^(1−λ)
    is jointly convex for λ > 1, and best-of-k is a post-processing of k runs, which are
    (λ, kε(λ))-RDP (Mironov 2017, Prop. 1). So
    e^((λ−1)D_λ) ≤ E[e^((λ−1)Kε(λ))] = exp(μ(e^((λ−1)ε(λ)) − 1)) (Poisson's pgf), i.e.
    D_λ ≤ μ·expm1((λ−1)ε(λ))/(λ−1); the last factor rounds the float evaluation up.
    """
    return mean * np.expm1((orders - 1) * base) / (orders - 1) * (1.0 + 2.0**-48)


def _product_above(eta: float, epsilon: Fraction | float) -> float:
    """(2 + η)·ε as the smallest float at or above its exact value (task ul): the pure-ε
    corollaries (seed 002 Corollary 3, seed 003 Theorem 2) in floats rounded twice, to
    nearest, and their values could lie an ulp or two below the theorems' (covered before
    only by PureDP's relative MARGIN on the curve, not on :attr:`pure_epsilon`)."""
    return float_above((2 + Fraction(eta)) * Fraction(epsilon))


def _finish(orders: np.ndarray, out: np.ndarray, pure_epsilon: float | None) -> np.ndarray:
    """NaN → inf, the pure-DP corollary if any, then the monotone envelope."""
    out = np.where(np.isnan(out), np.inf, out)
    if pure_epsilon is not None:
        out = np.minimum(out, PureDP(pure_epsilon)._rdp(orders))
    return np.maximum(_monotone_envelope(orders, out), 0.0)


@dataclasses.dataclass(frozen=True)
class RepeatAndSelect(Mechanism):
    """Run ``base`` K times, K ~ ``runs``, and release only the best run.

    Its curve is the tuning bound:

    * ``runs`` = TruncatedNegativeBinomial(η, γ) — seed 002 Theorem 2: if the
      base is (λ, ε)- and (λ̂, ε̂)-RDP, the tuner is (λ, ε')-RDP with
      ε' = ε + (1+η)(1 − 1/λ̂)ε̂ + (1+η)·log(1/γ)/λ̂ + log(E[K])/(λ−1),
      minimised over λ̂ on the grid. If the base is pure ε₀-DP, Corollary 3
      also gives (2+η)ε₀-DP; the curve is the smaller of the two.
    * ``runs`` = Poisson(μ) — seed 002 Theorem 6: if the base is (λ, ε)-RDP
      and (ε̂, δ̂)-DP with e^ε̂ ≤ 1 + 1/(λ−1), the tuner is (λ, ε')-RDP with
      ε' = ε + μ·δ̂ + log(μ)/(λ−1), taking ε̂ = log(1 + 1/(λ−1)) and δ̂ from the
      base curve — with the outcome of K = 0 counted, which the theorem's proof
      leaves out: ε' = log(e^(−μ) + μ·e^((λ−1)(ε + μδ̂)))/(λ−1); and at each order
      the smaller of that and μ·expm1((λ−1)ε(λ))/(λ−1), by joint convexity
      (docs/theory.md §7), which is the tighter one for small (λ−1)ε(λ).

    Both are then made non-decreasing in λ (a bound at a larger order holds
    at every smaller one), as dp-accounting does.

    Example:
        >>> from privguard import mechanisms as M
        >>> from privguard.tuning import Geometric
        >>> t = M.RepeatAndSelect(M.PureDP(0.1), Geometric(mean=10.0))
        >>> round(t.pure_epsilon, 6)   # Corollary 3 with η = 1: 3ε (Liu & Talwar)
        0.3
    """

    base: Mechanism
    runs: RunsDistribution

    def __post_init__(self) -> None:
        if not isinstance(self.base, Mechanism):
            raise InvalidArgumentError("base", check.short(self.base), "must be a privguard mechanism")
        if not isinstance(self.runs, (Poisson, TruncatedNegativeBinomial)):
            raise InvalidArgumentError("runs", check.short(self.runs),
                                       "must be Poisson(...) or TruncatedNegativeBinomial(...)")
        object.__setattr__(self, "_nesting", check.nesting("base", (self.base,)))

    @property
    def pure_epsilon(self) -> float | None:
        """(2+η)ε₀ when the base is ε₀-DP and K ~ D_{η,γ} (seed 002 Corollary 3), else None."""
        if isinstance(self.base, PureDP) and isinstance(self.runs, TruncatedNegativeBinomial):
            return _product_above(self.runs.eta, self.base.epsilon)
        return None

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        base = self.base._rdp_checked(orders)
        runs = self.runs
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if isinstance(runs, TruncatedNegativeBinomial):
                out = _tnb_bound(orders, base, runs)
            else:
                # Theorem 6 with ε̂ = log(1 + 1/(λ−1)), plus the mass e^(−μ) of K = 0
                # (docs/theory.md §7, "K = 0"): e^((λ−1)ε') = e^(−μ) + μ·e^((λ−1)(ε + μδ̂));
                # and the joint-convexity bound (§7, review acc); both hold at every μ,
                # so the smaller one does (a NaN in either becomes ∞ in _finish)
                delta_hat = _delta_hat(orders, base)  # rounded up (task lo4)
                mean = runs.mean  # type: ignore[attr-defined]  # every distribution has one
                out = np.minimum(_poisson_bound(orders, base, mean, delta_hat),
                                 _poisson_convex_bound(orders, base, mean))
        return _finish(orders, out, self.pure_epsilon)

    def _params(self) -> dict[str, Any]:
        return {"base": self.base.to_dict(), "runs": self.runs.to_dict()}

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> RepeatAndSelect:
        base, runs = take(params, "RepeatAndSelect", ("base", "runs"))
        return cls(mechanism_from_dict(base), runs_from_dict(runs))


@dataclasses.dataclass(frozen=True)
class DPHyPO(Mechanism):
    """Adaptive tuning whose sampling densities stay within [c, C] × the prior (seed 003).

    T ~ ``runs`` (a TruncatedNegativeBinomial D_{θ,γ}; the theorem covers
    only this family) candidates are drawn from densities π⁽ʲ⁾ updated from
    past results, each within c·π⁽⁰⁾ ≤ π⁽ʲ⁾ ≤ C·π⁽⁰⁾; the best is released.
    The curve is seed 003 Theorem 1 (auxiliary order minimised over the grid),
    and for a pure ε-DP base also Theorem 2, ((2+θ)(ε + log(C/c)), 0)-DP; then
    the monotone envelope. With C = c = 1 it is exactly
    :class:`RepeatAndSelect` (the same code path).

    Example:
        >>> from privguard import mechanisms as M
        >>> from privguard.tuning import Geometric
        >>> t = M.DPHyPO(M.PureDP(0.1), Geometric(mean=10.0), C=2.0, c=0.75)
        >>> round(t.pure_epsilon, 6)   # (2 + 1)(0.1 + log(2/0.75))
        3.242488
    """

    base: Mechanism
    runs: TruncatedNegativeBinomial
    C: float
    c: float

    def __post_init__(self) -> None:
        if not isinstance(self.base, Mechanism):
            raise InvalidArgumentError("base", check.short(self.base), "must be a privguard mechanism")
        if not isinstance(self.runs, TruncatedNegativeBinomial):
            raise InvalidArgumentError(
                "runs", check.short(self.runs), "must be a TruncatedNegativeBinomial: seed 003's "
                "theorem covers that family only (docs/theory.md §9)")
        big, small = check._as_float("C", self.C), check._as_float("c", self.c)
        if not (math.isfinite(big) and big >= 1):
            raise InvalidArgumentError("C", self.C, "must be finite and >= 1")
        if not (0 < small <= 1):  # also rejects NaN
            raise InvalidArgumentError("c", self.c, "must lie in (0, 1]")
        object.__setattr__(self, "C", big)
        object.__setattr__(self, "c", small)
        object.__setattr__(self, "_nesting", check.nesting("base", (self.base,)))

    @property
    def log_ratio(self) -> float:
        return math.log(self.C / self.c)

    @property
    def pure_epsilon(self) -> float | None:
        """(2+θ)(ε + log(C/c)) for a pure ε-DP base (seed 003 Theorem 2), else None; rounded
        up (task ul): log(C/c) is raised by 2⁻⁵⁰·(1 + log(C/c)) (C/c rounded: an ulp,
        absolute, in its log; math.log: within an ulp of its value, 2⁻⁵² relative) and the
        rest is exact (:func:`_product_above`). No margin where log(C/c) is 0: C/c rounds
        to 1 only for C = c = 1 (C ≥ 1 ≥ c), whose log is exactly 0, as :func:`_tnb_bound`
        has it; the pure-ε value is then RepeatAndSelect's, as the curve is (review rul)."""
        if isinstance(self.base, PureDP):
            if not math.isfinite(self.log_ratio):  # C/c past the float range
                return math.inf
            ratio = Fraction(self.log_ratio)
            margin = Fraction(2.0**-50) * (1 + ratio) if ratio else Fraction(0)
            return _product_above(self.runs.eta, Fraction(self.base.epsilon) + ratio + margin)
        return None

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        base = self.base._rdp_checked(orders)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = _tnb_bound(orders, base, self.runs, self.log_ratio)
        return _finish(orders, out, self.pure_epsilon)

    def _params(self) -> dict[str, Any]:
        return {"base": self.base.to_dict(), "runs": self.runs.to_dict(), "C": self.C, "c": self.c}

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> DPHyPO:
        base, runs, big, small = take(params, "DPHyPO", ("base", "runs", "C", "c"))
        tnb = runs_from_dict(runs)
        if not isinstance(tnb, TruncatedNegativeBinomial):
            raise InvalidArgumentError("runs", runs, "DP-HyPO needs a TruncatedNegativeBinomial")
        return cls(mechanism_from_dict(base), tnb, big, small)
