"""The float at or below (above) an exact value: rounding that never overstates a bound.

A budget left, a share of δ, a test's level: each must not exceed its exact value, and
``float(q)`` of an exact rational q rounds to nearest, up to half an ulp above it; an ε a
theorem bounds must not fall below its exact value (:func:`float_above`).
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction


def float_below(value: Fraction) -> float:
    """The largest float ≤ ``value`` (``float(value)``, one step down where it rounded up).

    Example:
        >>> from fractions import Fraction
        >>> x = float_below(Fraction(1, 10))
        >>> x <= Fraction(1, 10) < math.nextafter(x, 1.0), float(Fraction(1, 10)) > Fraction(1, 10)
        (True, True)
    """
    nearest = float(value)
    return math.nextafter(nearest, -math.inf) if Fraction(nearest) > value else nearest


def float_above(value: Fraction) -> float:
    """The smallest float ≥ ``value`` (``float(value)``, one step up where it rounded down).

    Example:
        >>> from fractions import Fraction
        >>> x = float_above(Fraction(1, 3))
        >>> math.nextafter(x, 0.0) < Fraction(1, 3) <= x, float(Fraction(1, 3)) < Fraction(1, 3)
        (True, True)
    """
    if value > _LARGEST:
        return math.inf  # float(value) would raise OverflowError
    nearest = float(value)
    return math.nextafter(nearest, math.inf) if Fraction(nearest) < value else nearest


_LARGEST = Fraction(sys.float_info.max)
