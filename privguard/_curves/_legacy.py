"""The subsampled Gaussian's curve as privguard computed it before e08c1f5, for loading only.

Commit e08c1f5 (2026-11-26) lowered step 3b's tolerance of :mod:`privguard._curves._sgm`
(``FRACTIONAL_RTOL``) from 1e-4 to ``RELIABLE_RTOL``: a fractional order's Opacus value
more than 1e-9 (was 1e-4) below the stable estimate is replaced. Some values rose by up to
1e-4 relative; nothing else changed. A ledger's fix entry (δ shares, mixture weights,
hybrid part-B weights) derived with the older curves may therefore differ from today's
derivation near a tie between two orders (tests/test_revision_fixed_plan.py). Such an
entry is still a fixed, data-independent choice (docs/theory.md §1.1, "Fix entries
derived before the revision"), so the load paths re-derive it with the older curves too
(:meth:`privguard._accounting._accounting.Accounting.derive_fixed_legacy`).

The older tolerance is switched on by :func:`pre_revision` for the current context only (a
:class:`contextvars.ContextVar`: other threads and tasks never see it), and while it is on
``Mechanism._rdp_checked`` bypasses the process-wide curve cache, so a legacy curve is
never stored where ordinary callers read. No module constant is changed.

Task cv (checkpoint curves version 5) made ``PureDP``'s curve ε₀ itself from
ε₀ = ``_stable.PURE_DP_FLAT`` on; before, the stable form was up to 6.3e-12 (relative) lower
near α = 1 (on a grid with such orders and ε₀ ≳ 1e10). A fix entry derived from a plan over
such a ``PureDP`` (its mixture weights, δ shares) by privguard before task cv is likewise
an older data-independent choice: :func:`pre_flat` computes that curve for the load paths,
and :func:`pre_revision` does too (files of before e08c1f5 predate task cv).

Task sg (checkpoint curves version 6) lowered the tolerance within which Opacus' subsampled
Gaussian values are kept bit for bit (``_sgm.RELIABLE_RTOL`` and ``FRACTIONAL_RTOL``) from
1e-9 to 1e-12 (fractional: 5e-13 since review rsg): values Opacus' cancellation put up to
1e-9 below the truth rose (by at most 2e-9 relative on the default grid at σ ≤ 10; review
rsg); none fell (task sgr: the bound's rounding margin is main's again, and today's curve
is never below the one :func:`pre_sg` computes, docs/theory.md §1.2). :func:`pre_sg`
computes the curves of before it with version 5's tolerances (PureDP as today) and the
same bound, so bit for bit version 5's (checked against main e0b2a80 on the default grid
at 50 (σ, q), task sgr); :func:`pre_flat` and :func:`pre_revision` imply it (both predate
task sg).

Commit 4fcbec5 (review rsr, checkpoint curves version 7) rounds up each sum of a
``Composed``'s parts' curves; before, numpy's sum rounded to nearest, up to an ulp lower
per part. ``Concentrated`` δ shares put their share on the order where the plan is
cheapest against its budget (an argmax), which that ulp moves where two orders nearly tie:
a fix entry of then was refused on load (task lo6, tests/test_lo6_sum_up_fix.py).
:func:`pre_sum_up` adds to nearest for the load paths; :func:`pre_sg`, :func:`pre_flat`
and :func:`pre_revision` imply it (all predate 4fcbec5).

Review radv8 (checkpoint curves version 8) rounds up ``Gaussian``'s α/(2σ²), the bound
every curve built on the Gaussian uses (``_sgm.gaussian_bound``: the subsampled Gaussian at
q = 1 and its cap, ``RandomAllocation``, ``AccumulatedSubsampledGaussian``), and ``ZCDP``'s
ρα; before, α/fl(2σ²) and fl(ρα) were rounded to nearest, up to about 2u (u = 2⁻⁵³)
below the exact value (task adv8). Values rose by at most 2 ulps, none fell; a fix entry's
argmax or weights derived from such a plan may move at a near tie, as with the sums of
version 7. :func:`pre_gaussian_up` computes them to nearest for the load paths; every
older context implies it (all predate version 8).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

LEGACY_FRACTIONAL_RTOL = 1e-4
"""Step 3b's tolerance before e08c1f5 (``privguard._curves._sgm.FRACTIONAL_RTOL`` then)."""

_FRACTIONAL_RTOL: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "_FRACTIONAL_RTOL", default=None)


_PRE_FLAT: contextvars.ContextVar[bool] = contextvars.ContextVar("_PRE_FLAT", default=False)

LEGACY_KEEP_RTOL = 1e-9
"""How far (relative) an Opacus value could lie below privguard's check and be kept before
task sg (``privguard._curves._sgm.RELIABLE_RTOL`` then, checkpoint curves up to version 5)."""

_PRE_SG: contextvars.ContextVar[bool] = contextvars.ContextVar("_PRE_SG", default=False)

_NEAREST_SUMS: contextvars.ContextVar[bool] = contextvars.ContextVar("_NEAREST_SUMS",
                                                                    default=False)


_NEAREST_CURVES: contextvars.ContextVar[bool] = contextvars.ContextVar("_NEAREST_CURVES",
                                                                      default=False)


def active() -> bool:
    """Whether this context computes older curves (then nothing may cache them)."""
    return (_FRACTIONAL_RTOL.get() is not None or _PRE_FLAT.get() or _PRE_SG.get()
            or _NEAREST_SUMS.get() or _NEAREST_CURVES.get())


def nearest_curves() -> bool:
    """Whether the Gaussian's α/fl(2σ²) and zCDP's fl(ρα) are left rounded to nearest in
    this context, as before checkpoint curves version 8 (review radv8): inside
    :func:`pre_gaussian_up` or any older context (today's are rounded up)."""
    return _NEAREST_CURVES.get() or nearest_sums()


@contextlib.contextmanager
def pre_gaussian_up() -> Iterator[None]:
    """Compute the Gaussian's and zCDP's curves rounded to nearest within the block, as
    before checkpoint curves version 8 (all else as today), in this context only
    (thread-safe; curves computed inside are not cached).

    Example:
        >>> from privguard._curves import _legacy
        >>> with _legacy.pre_gaussian_up():
        ...     _legacy.nearest_curves(), _legacy.nearest_sums()
        (True, False)
        >>> _legacy.nearest_curves()
        False
    """
    token = _NEAREST_CURVES.set(True)
    try:
        yield
    finally:
        _NEAREST_CURVES.reset(token)


def nearest_sums() -> bool:
    """Whether ``Composed`` adds its parts' curves to nearest in this context, as before
    4fcbec5: inside :func:`pre_sum_up`, :func:`pre_sg`, :func:`pre_flat` or
    :func:`pre_revision` (today's sums are rounded up)."""
    return _NEAREST_SUMS.get() or _PRE_SG.get() or _PRE_FLAT.get()


@contextlib.contextmanager
def pre_sum_up() -> Iterator[None]:
    """Add a ``Composed``'s curves to nearest within the block, as before 4fcbec5, and the
    Gaussian's and zCDP's curves to nearest (:func:`nearest_curves`: version 8 came later;
    all else as today), in this context only (thread-safe; curves computed inside are not
    cached).

    Example:
        >>> from privguard._curves import _legacy
        >>> with _legacy.pre_sum_up():
        ...     _legacy.nearest_sums()
        True
        >>> _legacy.nearest_sums()
        False
    """
    token = _NEAREST_SUMS.set(True)
    try:
        yield
    finally:
        _NEAREST_SUMS.reset(token)


def keep_rtol(today: float) -> float:
    """How far an Opacus value may lie below privguard's check and be kept in this context
    (steps 2b and 3b of :mod:`privguard._curves._sgm`): ``today``'s unless :func:`pre_sg`,
    :func:`pre_flat` or :func:`pre_revision` is on (then 1e-9, as before task sg)."""
    return LEGACY_KEEP_RTOL if _PRE_SG.get() or _PRE_FLAT.get() else today


@contextlib.contextmanager
def pre_sg() -> Iterator[None]:
    """Compute subsampled-Gaussian curves as before task sg (checkpoint curves version 5:
    Opacus' values kept within 1e-9 of the check, not 1e-12) within the block, in this
    context only (thread-safe; curves computed inside are not cached).

    Example:
        >>> from privguard._curves import _legacy
        >>> with _legacy.pre_sg():
        ...     _legacy.keep_rtol(1e-12)
        1e-09
        >>> _legacy.keep_rtol(1e-12)
        1e-12
    """
    token = _PRE_SG.set(True)
    try:
        yield
    finally:
        _PRE_SG.reset(token)


def pure_dp_flat() -> bool:
    """Whether ``PureDP``'s curve is ε₀ itself from ``PURE_DP_FLAT`` on in this context
    (task cv): today's, unless :func:`pre_flat` or :func:`pre_revision` is on."""
    return not _PRE_FLAT.get()


@contextlib.contextmanager
def pre_flat() -> Iterator[None]:
    """Compute ``PureDP``'s curve as before task cv within the block (the stable form for
    every ε₀), and the subsampled Gaussian's as before task sg (:func:`keep_rtol`: task cv
    preceded it), in this context only (thread-safe; curves computed inside are not cached).

    Example:
        >>> from privguard._curves import _legacy
        >>> with _legacy.pre_flat():
        ...     _legacy.pure_dp_flat()
        False
        >>> _legacy.pure_dp_flat()
        True
    """
    token = _PRE_FLAT.set(True)
    try:
        yield
    finally:
        _PRE_FLAT.reset(token)


def fractional_rtol(today: float) -> float:
    """Step 3b's tolerance in this context: ``today``'s unless :func:`pre_revision` is on."""
    legacy = _FRACTIONAL_RTOL.get()
    return today if legacy is None else legacy


@contextlib.contextmanager
def pre_revision() -> Iterator[None]:
    """Compute subsampled-Gaussian curves as before e08c1f5 within the block, and
    ``PureDP``'s as before task cv (:func:`pre_flat`), in this context only (thread-safe;
    curves computed inside are not cached).

    Example:
        >>> from privguard._curves import _legacy
        >>> with _legacy.pre_revision():
        ...     _legacy.fractional_rtol(1e-9)
        0.0001
        >>> _legacy.fractional_rtol(1e-9)
        1e-09
    """
    token = _FRACTIONAL_RTOL.set(LEGACY_FRACTIONAL_RTOL)
    try:
        with pre_flat():
            yield
    finally:
        _FRACTIONAL_RTOL.reset(token)
