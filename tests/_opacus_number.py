"""Opacus' RDP number beside privguard's: since task ul privguard's conversion is Opacus'
expression rounded up by the bound on its rounding (docs/theory.md §1.2), a few 10⁻¹⁵
(relative) above it, never below."""

from __future__ import annotations


def rounded_up_from(ours: float, theirs: float) -> bool:
    """Whether ``ours`` is Opacus' ``theirs`` raised by at most 10⁻¹³ (relative)."""
    return float(theirs) <= ours <= float(theirs) * (1 + 1e-13)
