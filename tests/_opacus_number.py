"""Opacus' RDP number beside privguard's: since task ul privguard's conversion is Opacus'
expression rounded up by the bound on its rounding (docs/theory.md §1.2), a few 10⁻¹⁵
(relative) above it, never below; and since task sg a subsampled Gaussian's value that Opacus
computes more than 10⁻¹² below the truth is raised, by at most 2·10⁻⁹ relative (§1.2)."""

from __future__ import annotations

#: How far above Opacus' number a subsampled Gaussian's may be (task sg's raised values).
SGM_RAISE = 2e-9


def rounded_up_from(ours: float, theirs: float, rtol: float = 1e-13) -> bool:
    """Whether ``ours`` is Opacus' ``theirs`` raised by at most ``rtol`` (relative): 10⁻¹³,
    the conversion's rounding up, or :data:`SGM_RAISE` where a subsampled Gaussian is charged."""
    return float(theirs) <= ours <= float(theirs) * (1 + rtol)
