"""Distributions of the number of tuning runs K (seed 002, Papernot & Steinke 2022).

Frozen value objects: they sample K, give its pmf, mean and probability
generating function, and serialise. The tuning theorems need K random and
drawn independently of the data; ``sample`` takes the generator to use, and
tuners default to one seeded from OS entropy.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import numpy as np
from scipy import optimize

from privguard import _validation as check
from privguard._errors import InvalidArgumentError


class RunsDistribution:
    """Base class of the distributions of the number of runs.

    ``pmf(k)`` takes an integer k, ``pgf(x)`` a real x in [0, 1] and
    ``sample(rng)`` a ``numpy.random.Generator``; anything else raises
    :class:`InvalidArgumentError`.
    """

    def sample(self, rng: np.random.Generator) -> int:
        raise NotImplementedError

    def pmf(self, k: int) -> float:
        raise NotImplementedError

    def check_sampleable(self, name: str = "runs") -> None:
        """Refuse (InvalidArgumentError naming ``name``) a law :meth:`sample` cannot draw
        exactly; a tuner calls it before it charges. Poisson(μ), μ ≤ 10^18: numpy draws it."""

    # Every distribution also has ``mean``, E[K] (a field or a property).

    def pgf(self, x: float) -> float:
        """E[x^K]."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__,
                "params": {f.name: getattr(self, f.name)
                           for f in dataclasses.fields(self)}}  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class Poisson(RunsDistribution):
    """K ~ Poisson(μ); K = 0 is possible (then nothing is selected). Seed 002 Thm 6.

    Example:
        >>> Poisson(10.0).mean
        10.0
    """

    mean: float

    def __post_init__(self) -> None:
        mean = check.positive_finite("mean", self.mean)
        if mean > MAX_POISSON_MEAN:
            raise InvalidArgumentError("mean", self.mean,
                                       f"must be <= {MAX_POISSON_MEAN:g} (numpy's Poisson sampler)")
        object.__setattr__(self, "mean", mean)

    def sample(self, rng: np.random.Generator) -> int:
        return int(_generator(rng).poisson(self.mean))

    def pmf(self, k: int) -> float:
        k = _count(k)
        if k < 0:
            return 0.0
        return math.exp(k * math.log(self.mean) - self.mean - math.lgamma(k + 1))

    def pgf(self, x: float) -> float:
        return math.exp(self.mean * (_unit("x", x) - 1))


MAX_POISSON_MEAN = 1e18
"""The largest Poisson mean: numpy's sampler refuses means above about 9.2e18."""


def _generator(rng: Any) -> np.random.Generator:
    return check.generator("rng", rng)


def _count(k: Any) -> int:
    """``k`` for a pmf: an integer within the float range (its formulas compute in floats:
    10**400 raised OverflowError, review fs)."""
    n = check._as_int("k", k)
    if n > sys.float_info.max:
        raise InvalidArgumentError("k", check.short(k), "must be at most the float range "
                                   f"(k <= {sys.float_info.max:g})")
    return n


def _unit(name: str, x: Any) -> float:
    v = check._as_float(name, x)
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise InvalidArgumentError(name, x, "must lie in [0, 1]")
    return v


def _tnb_mean(eta: float, gamma: float) -> float:
    # formulas.md §4: η ≠ 0: E[K] = η(1−γ)/(γ(1−γ^η)); η = 0: (1/γ − 1)/log(1/γ)
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    x = -eta * math.log(gamma)  # η·log(1/γ)
    if abs(x) < 1e-8:  # η/(1 − γ^η) = (1 + x/2 + O(x²))/log(1/γ): exact to ~1e-17 here
        return (1 / gamma - 1) * (1 + x / 2) / math.log(1 / gamma)
    try:
        return eta * (1 - gamma) / (gamma * -math.expm1(-x))
    except ZeroDivisionError:  # the denominator underflowed: E[K] beyond the float range
        return math.inf


@dataclasses.dataclass(frozen=True)
class TruncatedNegativeBinomial(RunsDistribution):
    """K ~ D_{η,γ}, the truncated negative binomial of seed 002 (support K ≥ 1).

    P[K=k] = (1−γ)^k / (γ^(−η) − 1) · Π_{l<k} (l+η)/(l+1) for η ≠ 0, and the
    logarithmic distribution (1−γ)^k / (k·log(1/γ)) for η = 0; η = 1 is the
    geometric distribution. Give ``gamma``, or ``mean`` (γ is then solved for).

    Example:
        >>> d = TruncatedNegativeBinomial(eta=1.0, mean=10.0)
        >>> round(d.gamma, 6), round(d.mean, 6)
        (0.1, 10.0)
    """

    eta: float
    gamma: float = 0.0  # always set by __init__ (given, or solved from the mean)

    def __init__(self, eta: float, gamma: float | None = None, mean: float | None = None) -> None:
        eta_f = check._as_float("eta", eta)
        if not (math.isfinite(eta_f) and eta_f > -1):
            raise InvalidArgumentError("eta", eta, "must be finite and > -1")
        if (gamma is None) == (mean is None):
            given = gamma is not None  # both given: name gamma; neither: name mean
            raise InvalidArgumentError("gamma" if given else "mean", gamma if given else mean,
                                       "give exactly one of gamma and mean")
        if gamma is not None:
            g = check._as_float("gamma", gamma)
            if not (0 < g < 1):
                raise InvalidArgumentError("gamma", gamma, "must lie in the open interval (0, 1)")
        else:
            m = check.positive_finite("mean", mean)
            if m <= 1:
                raise InvalidArgumentError("mean", mean, "must be > 1 (K >= 1 always)")
            g = _solve_gamma(eta_f, m)
        with np.errstate(all="ignore"):
            m = _tnb_mean(eta_f, g)
        if not (math.isfinite(m) and m >= 1):
            raise InvalidArgumentError("gamma" if mean is None else "mean",
                                       gamma if mean is None else mean,
                                       f"gives E[K] = {m} with eta={eta_f}: not a usable "
                                       f"number of runs")
        object.__setattr__(self, "eta", eta_f)
        object.__setattr__(self, "gamma", g)
        # sample() starts its inverse CDF at pmf(1) = η(1−γ)/(γ^(−η) − 1). With γ^(−η) beyond
        # the float range it raised OverflowError at the first draw, after a tuner had
        # charged its bound (TuningAborted, the bound spent); a subnormal pmf(1) carries too
        # few digits to sample D_{η,γ} exactly (review bx). Refused here, before any charge.
        try:
            first = self.pmf(1)
        except OverflowError:
            first = 0.0
        if not first >= sys.float_info.min:
            raise InvalidArgumentError("gamma" if mean is None else "mean",
                                       gamma if mean is None else mean,
                                       f"with eta={eta_f} gives P[K=1] = {first:g}, below the "
                                       "float range: K cannot be sampled exactly (make "
                                       "eta·log(1/gamma) smaller than about 700)")

    @property
    def mean(self) -> float:
        return _tnb_mean(self.eta, self.gamma)

    def check_sampleable(self, name: str = "runs") -> None:
        """Refuse (InvalidArgumentError naming ``name``) a law :meth:`sample` cannot draw.

        sample() stops its inverse CDF at MAX_RUNS, so it draws min(K, MAX_RUNS): that is K
        only where P[K > MAX_RUNS] is below the resolution of the uniform it inverts
        (MAX_TAIL). A tuner calls this before it charges Theorem 2's bound for D_{η,γ}
        (TNB(3, gamma=1e-102), E[K] = 3e102, ran exactly 10^7 candidates at every draw).
        The law itself stays a valid description for accounting (a journal may hold one).

        Example:
            >>> TruncatedNegativeBinomial(1.0, mean=10.0).check_sampleable()
        """
        tail = _tail_beyond(self.eta, self.gamma, self.pmf(MAX_RUNS + 1))
        if not tail <= MAX_TAIL:
            raise InvalidArgumentError(name, self,
                                       f"has P[K > {MAX_RUNS}] up to {tail:.3g}: K cannot be "
                                       f"sampled exactly (the sampler runs at most {MAX_RUNS} "
                                       "candidates); make E[K] smaller")

    def pmf(self, k: int) -> float:
        k = _count(k)
        if k < 1:
            return 0.0
        g, eta = self.gamma, self.eta
        if eta == 0:
            return math.exp(k * math.log1p(-g)) / (k * math.log(1 / g))
        # Π_{l<k}(l+η)/(l+1) = Γ(k+η)/(Γ(η)·k!); lgamma gives log|Γ(η)|, and for
        # η ∈ (−1, 0) both the product and γ^(−η) − 1 are negative.
        log_prod = math.lgamma(k + eta) - math.lgamma(eta) - math.lgamma(k + 1)
        norm = math.expm1(-eta * math.log(g))  # γ^(−η) − 1, same sign as η
        return math.exp(k * math.log1p(-g) + log_prod) / abs(norm)

    def pgf(self, x: float) -> float:
        x = _unit("x", x)
        g, eta = self.gamma, self.eta
        if eta == 0:
            return math.log1p(-(1 - g) * x) / math.log(g)
        return math.expm1(-eta * math.log1p(-(1 - g) * x)) / math.expm1(-eta * math.log(g))

    def sample(self, rng: np.random.Generator) -> int:
        # Inverse CDF with the recursion pmf(k+1) = pmf(k)·(1−γ)(k+η)/(k+1)
        # (η = 0: pmf(k+1) = pmf(k)·(1−γ)k/(k+1)); valid for every η > −1.
        u = _generator(rng).random()
        k, p = 1, self.pmf(1)
        cdf = p
        while cdf < u and k < MAX_RUNS:  # P[K > MAX_RUNS] <= MAX_TAIL (__init__)
            p *= (1 - self.gamma) * (k + self.eta) / (k + 1)
            k += 1
            cdf += p
        return k

    def to_dict(self) -> dict[str, Any]:
        return {"type": "TruncatedNegativeBinomial", "params": {"eta": self.eta, "gamma": self.gamma}}


#: The most runs :meth:`TruncatedNegativeBinomial.sample` draws (its inverse CDF stops here).
MAX_RUNS = 10_000_000

#: The largest P[K > MAX_RUNS] a TruncatedNegativeBinomial may have: 2^-53, the spacing of
#: the uniform ``Generator.random()`` that sample() inverts, so the truncation changes the
#: law drawn by no more than the uniform's own resolution (the same floating-point caveat
#: as every sampler here; Mironov 2012).
MAX_TAIL = 2.0**-53


def _tail_beyond(eta: float, gamma: float, pmf_next: float) -> float:
    """An upper bound on P[K > MAX_RUNS] for K ~ D_{η,γ}, from ``pmf_next`` = P[K = MAX_RUNS+1].

    The pmf's ratio is pmf(k+1)/pmf(k) = (1−γ)(k+η)/(k+1) (seed 002 §2, as sample()'s
    recursion; η = 0 included). For k ≥ N+1 (N = MAX_RUNS) it is at most
    r = (1−γ)·max(1, (N+1+η)/(N+2)): (k+η)/(k+1) is ≤ 1 for η ≤ 1 and decreasing in k for
    η > 1. So P[K > N] = Σ_{k>N} pmf(k) ≤ pmf(N+1)·Σ_j r^j = pmf(N+1)/(1−r), a geometric
    series; infinite where r ≥ 1. 1 − r is formed without cancellation,
    γ·m − (m − 1) with m − 1 = max(0, η − 1)/(N+2), and the result is rounded up by a
    relative 1e-6, above the error of pmf(N+1) (lgamma of ~10^7 carries an absolute error
    of about 10^-8 in the log).
    """
    n = MAX_RUNS
    m_minus_1 = max(0.0, eta - 1) / (n + 2)
    one_minus_r = gamma * (1 + m_minus_1) - m_minus_1
    if not (one_minus_r > 0 and math.isfinite(pmf_next)):
        return math.inf
    return pmf_next / one_minus_r * (1 + 1e-6)


def _solve_gamma(eta: float, mean: float) -> float:
    """γ with E[K] = mean (E[K] is decreasing in γ)."""
    f = lambda g: _tnb_mean(eta, g) - mean
    lo, hi = 1e-300, 1 - 1e-15
    with np.errstate(all="ignore"):
        f_lo, f_hi = f(lo), f(hi)
    if not (f_hi <= 0 <= f_lo):  # also NaN (E[K] not computable at the ends)
        raise InvalidArgumentError("mean", mean, f"is not reachable with eta={eta}")
    try:
        return float(optimize.brentq(f, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps,
                                     maxiter=500))
    except (RuntimeError, ValueError, ArithmeticError) as exc:
        raise InvalidArgumentError("mean", mean, f"gamma cannot be solved for with eta={eta}: "
                                   f"{exc}") from None


def Logarithmic(gamma: float | None = None, mean: float | None = None) -> TruncatedNegativeBinomial:
    """The logarithmic distribution, D_{0,γ}."""
    return TruncatedNegativeBinomial(0.0, gamma=gamma, mean=mean)


def Geometric(gamma: float | None = None, mean: float | None = None) -> TruncatedNegativeBinomial:
    """The geometric distribution on K ≥ 1, D_{1,γ}."""
    return TruncatedNegativeBinomial(1.0, gamma=gamma, mean=mean)


def runs_from_dict(data: Any) -> RunsDistribution:
    """Inverse of ``RunsDistribution.to_dict``; anything else raises InvalidArgumentError.

    Example:
        >>> runs_from_dict(Poisson(10.0).to_dict())
        Poisson(mean=10.0)
    """
    keys = {"Poisson": ("mean",), "TruncatedNegativeBinomial": ("eta", "gamma")}
    if (not isinstance(data, dict) or set(data) != {"type", "params"}
            or not isinstance(data["type"], str) or data["type"] not in keys
            or not isinstance(data["params"], dict)
            or set(data["params"]) != set(keys[data["type"]])):
        raise InvalidArgumentError(
            "runs", check.short(data),
            "must be {'type': 'Poisson', 'params': {'mean': ...}} or {'type': "
            "'TruncatedNegativeBinomial', 'params': {'eta': ..., 'gamma': ...}}")
    params = data["params"]
    if data["type"] == "Poisson":
        return Poisson(params["mean"])
    return TruncatedNegativeBinomial(params["eta"], gamma=params["gamma"])
