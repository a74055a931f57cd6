"""A charge that sets a share of δ aside: the witnesses' false alarms (issue 28).

A witnessed run refuses a step when a statistical witness alarms; under a
correct pipeline that happens with probability at most ``a``, and the run is
then (ε, δ + (1+e^ε)·a)-DP where the run without witnesses is (ε, δ)
(docs/theory.md §16.2). The ledger's conversions use δ only through
``−log δ_α/(α−1)`` at each order α (both the improved and the classic
conversion, privguard/_curves/_conversion.py), so adding ``K ≥ −log(1−r)/(α−1)`` to
the curve at every order of the grid certifies the run without witnesses at
``δ·(1−r)`` wherever the ledger certifies it at δ; the freed ``r·δ`` pays for
the alarms (docs/theory.md §16.2, Proposition 16.4). On a grid whose smallest
order is α₀, the smallest non-decreasing such curve is the constant
``−log(1−r)/(α₀−1)``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism


@dataclasses.dataclass(frozen=True)
class DeltaReserve(Mechanism):
    """Bookkeeping that frees the share ``share`` of the ledger's δ (for the witnesses).

    The curve is the constant ``−log(1 − share)/(min_order − 1)`` at every
    order ≥ ``min_order`` (docs/theory.md §16.2, Proposition 16.4); below
    ``min_order`` it is not defined (+inf there, which no ledger can charge:
    charge it only on a grid whose smallest order is ``min_order``).

    Args:
        share: r in (0, 1): the fraction of δ set aside.
        min_order: the smallest order of the grid it is charged on (> 1).

    Example:
        >>> r = DeltaReserve(share=1e-3, min_order=1.1)
        >>> round(float(r.rdp([1.1, 64.0])[1]), 6)
        0.010005
    """

    share: float
    min_order: float

    def __post_init__(self) -> None:
        share = check.fraction("share", self.share)
        if share >= 1.0:
            raise InvalidArgumentError("share", self.share, "must lie in the open interval (0, 1)")
        low = check.positive_finite("min_order", self.min_order)
        if low <= 1.0:
            raise InvalidArgumentError("min_order", self.min_order, "must be > 1")
        object.__setattr__(self, "share", share)
        object.__setattr__(self, "min_order", low)

    @property
    def level(self) -> float:
        """The constant RDP value ``−log(1−r)/(α₀−1)``, rounded up: log1p, the subtraction and
        the division each round by up to an ulp, and one ``nextafter`` left the value up to
        4.2e-17 (relative) below the exact one (review al); × (1 + 2⁻⁵⁰) is 4 ulps or more.
        Then one ``nextafter``: a subnormal level (r ≲ 1e-302) carries an absolute error the
        product does not lift (it underflowed to 0 where the exact value is positive; review
        ral); one subnormal ulp is above the division's half-ulp there."""
        return math.nextafter(-math.log1p(-self.share) / (self.min_order - 1.0)
                              * (1.0 + 2.0**-50), math.inf)

    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        # K ≥ −log(1−r)/(α−1) for every α ≥ α₀ (docs/theory.md §16.2, Prop. 16.4)
        return np.where(orders >= self.min_order, self.level, np.inf)
