"""The largest float at or below an exact value: rounding that never overstates a bound.

A budget left, a share of δ, a test's level: each must not exceed its exact value, and
``float(q)`` of an exact rational q rounds to nearest, up to half an ulp above it.
"""

from __future__ import annotations

import math
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
