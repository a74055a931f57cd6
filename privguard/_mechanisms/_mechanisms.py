"""Concrete mechanisms: frozen, documented value objects with an RDP curve.

Each curve sits next to the theorem it comes from. All use the add/remove-one
neighbouring relation and sensitivity 1 (noise is expressed relative to it).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves import (
    _legacy,
    _opacus_rdp,  # noqa: F401  (tests/test_ledger.py patches it here)
    _sgm,
    _stable,
)
from privguard._curves._upward import scaled_up, sum_up, times_up
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism, mechanism_from_dict, take

#: The smallest positive float: a curve that underflows is this, never 0 (below the truth).
_TINY = math.ulp(0.0)


@dataclasses.dataclass(frozen=True)
class Gaussian(Mechanism):
    """The Gaussian mechanism with noise multiplier σ (noise std / L2 sensitivity).

    Example:
        >>> from privguard import mechanisms as M
        >>> M.Gaussian(noise_multiplier=2.0).rdp([2.0, 3.0]).tolist()
        [0.25, 0.375]
    """

    noise_multiplier: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier",
                           check.positive_finite("noise_multiplier", self.noise_multiplier))

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # Mironov 2017, Prop. 7 (formulas.md §1): ε(α) = α / (2σ²), rounded
        # as floats round it, +inf when σ² underflows; the smallest positive float
        # (never 0, below the truth) when it overflows.
        return _sgm.gaussian_bound(orders, self.noise_multiplier)


@dataclasses.dataclass(frozen=True)
class SubsampledGaussian(Mechanism):
    """``steps`` steps of the Poisson-subsampled Gaussian mechanism (DP-SGD).

    Each step samples every example independently with probability
    ``sample_rate`` and adds Gaussian noise with multiplier
    ``noise_multiplier`` to the clipped sum. The curve is Opacus' own analysis
    (``opacus.accountants.analysis.rdp.compute_rdp``) for one step, wherever Opacus'
    value is shown within 1e-12 (relative) of the truth; k steps are k × one step
    rounded up (docs/theory.md §6: at most an ulp above Opacus', as a ledger's sums);
    elsewhere (Opacus' rounding
    or cancellation below that, integer orders above 1024, fractional
    orders whose series Opacus cannot sum, extreme σ) it is a valid upper
    bound instead of Opacus' NaN, garbage or endless loop (see
    ``privguard._curves._sgm``). ``steps`` is at most 2^53.

    Example:
        >>> from privguard import mechanisms as M
        >>> step = M.SubsampledGaussian(noise_multiplier=1.1, sample_rate=0.01)
        >>> run = M.SubsampledGaussian(1.1, 0.01, steps=1000)
        >>> from privguard._curves._upward import times_up
        >>> bool((run.rdp([2.0, 8.0]) == times_up(1000, step.rdp([2.0, 8.0]))).all())
        True
        >>> bool((run.rdp([2.0, 8.0]) >= 1000 * step.rdp([2.0, 8.0])).all())  # rounded up
        True
    """

    noise_multiplier: float
    sample_rate: float
    steps: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier",
                           check.positive_finite("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check.sample_rate("sample_rate", self.sample_rate))
        object.__setattr__(self, "steps",
                           check.positive_int("steps", self.steps, maximum=check.MAX_STEPS))

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # Mironov, Talwar & Zhang 2019, §3.3 (formulas.md §1): Opacus' value
        # where it is reliable, a valid upper bound elsewhere (privguard._curves._sgm).
        # k-fold composition is k × one step (Mironov 2017, Prop. 1), the product rounded
        # up for k ≥ 2 (docs/theory.md §6: an ulp above compute_rdp(steps=k)'s where that
        # rounds; the same floats as k charges of one step in a journal).
        with np.errstate(over="ignore"):
            return times_up(self.steps, _sgm.curve(self.sample_rate, self.noise_multiplier,
                                                   orders))


@dataclasses.dataclass(frozen=True)
class Laplace(Mechanism):
    """The Laplace mechanism with scale b (relative to L1 sensitivity 1).

    Example:
        >>> from privguard import mechanisms as M
        >>> round(float(M.Laplace(scale=1.0).rdp([2.0])[0]), 6)
        0.619124
    """

    scale: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check.positive_finite("scale", self.scale))

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # Mironov 2017, Prop. 6 (formulas.md §1):
        # ε(α) = 1/(α−1) · log( α/(2α−1)·e^((α−1)/b) + (α−1)/(2α−1)·e^(−α/b) ),
        # evaluated in log space.
        # Where (α−1)/b ≤ 1 the log-space form loses S − 1 to rounding (Laplace(1e6) was
        # 2.8e−5 low at α = 2): there the stable form of privguard._curves._stable (issue 24).
        # Either form is then moved up by a relative MARGIN, and a curve that underflows
        # is the smallest positive float: never below the truth.
        a, b = orders, self.scale
        with np.errstate(over="ignore"):  # (α−1)/b = inf for tiny b: the curve is inf
            t = 1.0 / b
            log_terms = np.logaddexp(np.log(a / (2 * a - 1)) + (a - 1) / b,
                                     np.log((a - 1) / (2 * a - 1)) - a / b)
            small = (a - 1) * t <= 1.0
            stable = _stable.laplace_rdp_small(t if math.isfinite(t) else 0.0,
                                               np.where(small, a, 2.0))
            val = np.where(small, stable, log_terms / (a - 1)) * (1.0 + _stable.MARGIN)
        return np.maximum(val, _TINY)


@dataclasses.dataclass(frozen=True)
class PureDP(Mechanism):
    """Any ε₀-DP mechanism, with the tight RDP curve (randomized response).

    Example:
        >>> from privguard import mechanisms as M
        >>> c = M.PureDP(epsilon=0.5).rdp([2.0, 1024.0])
        >>> bool(c[0] < 2 * 0.5**2 / 2 and c[1] < 0.5)
        True
    """

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check.positive_finite("epsilon", self.epsilon))

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # Randomized response is the worst case among ε₀-DP mechanisms
        # (formulas.md §1; Mironov 2017, Prop. 5 gives the RR curve):
        # ε(α) = 1/(α−1) · log( (e^(αε₀) + e^(−(α−1)ε₀)) / (1 + e^(ε₀)) ),
        # which is ≤ min(ε₀, αε₀²/2). Evaluated in log space.
        # ε₀·α overflowing gives inf − inf = NaN: ε₀ itself bounds the curve there.
        # The form above lost everything for tiny ε₀ (PureDP(1e-8).rdp([1.1, 2]) was
        # [0, 0]); privguard._curves._stable evaluates it without cancellation (issue 24), then it
        # is moved up by a relative MARGIN and floored at the smallest positive float.
        # From ε₀ = PURE_DP_FLAT on, the curve is ε₀ itself (task cv): there the stable form
        # subtracts log sinh(αε₀/2) ≈ αε₀/2 and log cosh(ε₀/2) ≈ ε₀/2 to leave (α−1)ε₀, and
        # near α = 1 lost up to 6.3e-12 (relative, beyond MARGIN) to rounding:
        # PureDP(1e20).rdp([1.00001]) was below the truth. ε₀ is within 1.1e-14 (relative) above
        # the truth there (_stable.PURE_DP_FLAT; docs/theory.md §1.2). Not while a load
        # re-derives a fix entry of before task cv (_legacy.pre_flat). Near the smallest
        # normal float an absolute PURE_DP_ABS covers what MARGIN does not (task ul).
        e, a = self.epsilon, orders
        if e >= _stable.PURE_DP_FLAT and _legacy.pure_dp_flat():
            return np.full_like(a, e)
        with np.errstate(invalid="ignore", over="ignore"):
            val = _stable.pure_dp_rdp(e, a) * (1.0 + _stable.MARGIN) + _stable.PURE_DP_ABS
        return np.clip(np.where(np.isnan(val), e, val), min(_TINY, e), e)


@dataclasses.dataclass(frozen=True)
class ZCDP(Mechanism):
    """A ρ-zCDP mechanism: ε(α) = ρα (Bun & Steinke 2016, Def. 1.1), rounded up: the float
    0.1 is 0.1000000000000000055…, so ρα at α = 10 is just above 1.

    Example:
        >>> from privguard import mechanisms as M
        >>> M.ZCDP(rho=0.1).rdp([2.0, 10.0]).tolist()
        [0.2, 1.0000000000000002]
    """

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check.positive_finite("rho", self.rho))

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):  # ρα beyond the float range: +inf
            nearest = self.rho * orders
        if _legacy.nearest_curves():  # re-deriving a fix entry of before version 8
            return nearest
        # fl(ρα) is up to u below the exact ρα for about half the values (task adv8): the
        # smallest float at or above it there (review radv8, checkpoint curves version 8)
        return scaled_up(nearest, orders, Fraction(self.rho))


@dataclasses.dataclass(frozen=True)
class Composed(Mechanism):
    """Several mechanisms run one after the other: their curves add, each sum rounded up
    as the journal sums charges (docs/theory.md §6, "Rounding up"): never below the exact
    sum of the parts' curves, the floats of charging the parts one after the other.

    Example:
        >>> from privguard import mechanisms as M
        >>> M.Composed((M.ZCDP(0.1), M.Gaussian(1.0))).rdp([2.0]).tolist()
        [1.2000000000000002]
    """

    mechanisms: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        parts = tuple(self.mechanisms) if isinstance(self.mechanisms, (list, tuple)) else None
        if not parts or not all(isinstance(m, Mechanism) for m in parts):
            raise InvalidArgumentError("mechanisms", check.short(self.mechanisms),
                                       "must be a non-empty sequence of mechanisms")
        object.__setattr__(self, "_nesting", check.nesting("mechanisms", parts))
        object.__setattr__(self, "mechanisms", parts)

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # RDP composition (Mironov 2017, Prop. 1): curves add, each sum rounded up (review
        # rsr: numpy's sum rounds to nearest, up to an ulp per part below the exact sum).
        # The max with numpy's sum keeps it nowhere below the floats of before (whose
        # order of additions numpy chooses), so a journal re-read never shows less.
        curves = [m._rdp_checked(orders) for m in self.mechanisms]
        if _legacy.nearest_sums():  # re-deriving a fix entry of before 4fcbec5 (task lo6)
            return np.sum(curves, axis=0)
        total = curves[0]
        for curve in curves[1:]:
            total = sum_up(total, curve)
        with np.errstate(over="ignore"):
            return np.maximum(total, np.sum(curves, axis=0))

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> Composed:
        (parts,) = take(params, "Composed", ("mechanisms",))
        if not isinstance(parts, list):
            raise InvalidArgumentError("mechanisms", check.short(parts),
                                       "must be a list of mechanism dicts")
        return cls(tuple(mechanism_from_dict(m) for m in parts))
