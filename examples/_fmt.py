"""Printing a privacy bound: rounded up, so the shorter number is still a bound."""

from __future__ import annotations

import decimal
import math


def up(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals, rounded towards +∞ (``f"{x:.3f}"`` rounds to
    nearest: a tuning ε of 9.02548 was printed as 9.025, a smaller ε than the bound).

    Example:
        >>> up(9.025482783687025), up(7.0463, 2), up(3.0), up(float("inf"))
        ('9.026', '7.05', '3.000', 'inf')
    """
    if not math.isfinite(x):
        return str(x)
    exact = decimal.Context(prec=400)  # a float's digits and then some: no rounding here
    step = decimal.Decimal(1).scaleb(-digits)
    return str(decimal.Decimal(x).quantize(step, rounding=decimal.ROUND_CEILING, context=exact))
