"""Whether a checkpoint of an older curve version may still be resumed from (docs/theory.md
§7, "Resuming from an older checkpoint"): only where no row before it describes a mechanism
whose curve changed since that version, decided from the stored descriptions alone, without
computing a curve (the point: an old file opens without replaying its journal).

Curve changes since version 2 (``git log -p 29aa95b..main`` over privguard/_curves,
_mechanisms, _accounting and tuning; every other change there is a refusal, a message or the
same floats): 7ea9ac5, 321fb2f, the merge a9f56ac and a05d7b9 (Poisson random-K tuning: the
outcome K = 0, the joint-convexity bound, the smaller of the two at every μ, the 2⁻⁴⁸
round-up of the K = 0 bound), 2ad6965 (a Gaussian curve
whose 2σ² overflows, σ ≳ 9.5e153, is the smallest positive float, not 0: ``Gaussian``,
``SubsampledGaussian``, ``RandomAllocation``, ``AccumulatedSubsampledGaussian``) and
``SubsetTuning``'s exact ⌈α⌉ (review lo3: an order a rounding error above an integer).
Since version 3 (67c2155): a05d7b9, which did not bump the version, and lo3's. Since version 4:
review al's round-up of the truncated negative binomial's tuning bound (``_repeat_select._tnb_bound``:
``RepeatAndSelect`` with a ``TruncatedNegativeBinomial`` law, and ``DPHyPO``, whose law is
always one), whose float value had been up to 1.3e-14 (relative) below seed 002 Theorem 2's.
And review al's evaluation of ``SubsetTuning``'s sums without cancellation (every
``SubsetTuning`` counts as changed already), and its round-up of ``DeltaReserve``'s level
(an ulp below the exact value before; ``DeltaReserve`` is no longer listed). And task cv's
``PureDP`` with ε₀ ≥ 40 (:data:`PURE_DP_FLAT`: the curve is ε₀ itself there, up to 6.3e-12
relative above the older one; ``RepeatAndSelect``'s pure-DP corollary through it).
A description is *changed* for a checkpoint of version 2 or 3 (:func:`changed`) if it holds,
at any depth, a ``Poisson`` or a ``TruncatedNegativeBinomial`` law of runs, a number
of magnitude 1e150 or more (or not finite) among a mechanism's parameters, a
``SubsetTuning``, a ``DeltaReserve``, a ``PureDP`` whose ``epsilon`` is not a number below
40, a ``RepeatAndSelect`` or ``DPHyPO`` with a ``PureDP`` base (its corollary's ε₀ is a
multiple), or a
``{"type", "params"}`` dict of a type not reviewed here (fail closed: a mechanism added
later counts as changed until its curve history is read). For a checkpoint of version 4
only the changes of version 5 count (review al's: a ``TruncatedNegativeBinomial`` law, a
``SubsetTuning``, a ``DeltaReserve``; task cv's ``PureDP`` rules; a type not reviewed): the Poisson curve and the Gaussian whose 2σ²
overflows were already today's when version 4 was written (a05d7b9, 2ad6965 precede it,
c07976b), and counting them made every file main wrote with Poisson tuning before its
checkpoint replay its journal from the genesis at every open (review ral). For a checkpoint
of version 5 the types of version 5 count as unchanged (``PureDP`` at every ε₀ included),
less those changed since.

Since version 5: task sg's subsampled Gaussian (:data:`SG_CHANGED`): Opacus' values are
kept only within 1e-12 (was 1e-9) of privguard's cancellation-free check, so values that
Opacus' cancellation had put up to 1e-9 below the truth rose (by at most 2e-9 relative on
the default grid at σ ≤ 10 and at σ ∈ {100, 1e3, 1e4}); none fell (task sgr reverted task
sg's weighted rounding margin, which had lowered some at σ ≥ 100 by up to 2.5e-11;
docs/theory.md §1.2). Which (σ, q) and grids are affected is not proven
from the parameters (Opacus' rounding depends on both and on every order), so every
``SubsampledGaussian`` and ``AccumulatedSubsampledGaussian`` (``micro_batches = 1`` is the
subsampled Gaussian bit for bit; fail closed for the rest) counts as changed for every older
version, at any depth (a tuner or a composition over one, a plan holding one): such a file
replays its journal once, and a writable open writes a fresh checkpoint (task ckw).
``RandomAllocation`` uses only the Gaussian bound of :mod:`privguard._curves._sgm`:
unchanged.

Since version 5, too: task ul's absolute margin on ``PureDP`` near the smallest normal float
(``_curves._stable.PURE_DP_ABS``: a curve with ε₀ below :data:`PURE_DP_TINY` may differ, at
every older version, :func:`_pure_dp_tiny`) and its round-up of the pure-ε corollaries
(``RepeatAndSelect`` and ``DPHyPO`` with a ``PureDP`` base, already counted at every
version: the rule for them now holds for version 5 as well); for a checkpoint of version 5
task cv's ``PureDP`` rule (ε₀ ≥ 40) no longer counts.
"""

from __future__ import annotations

from typing import Any

RESUMABLE: frozenset[int] = frozenset()
"""The older curve versions whose checkpoints may be resumed from where :func:`changed`
says no row before them changed: none since version 7 (task sr). Version 8 (review radv8)
rounds up the Gaussian's α/(2σ²) and zCDP's ρα: :data:`GAUSSIAN_UP_CHANGED` changed since
every older version, and :data:`UNCHANGED_SINCE` leaves them out of every version (task
lo9). Version 7 sums the
journal's spent curve rounding every product and sum up (docs/theory.md §6, "Rounding up");
a checkpoint of versions 2 to 6 holds spent totals summed to nearest, which may lie up to
about an ulp per run below the exact sum of the charged curves, whatever its mechanisms, so
it is never resumed from: the journal is replayed from the genesis (and a writable open
writes a fresh checkpoint, task ckw). It was {2, 3, 4, 5} under version 6; :func:`changed`
still decides, for each of those versions, which curves changed (version 1, a checkpoint
without ``"curves"``, predates the revision of §1.1 and is never resumed from)."""

MECHANISMS = frozenset({
    "AccumulatedSubsampledGaussian", "Composed", "DPHyPO", "Gaussian",
    "Laplace", "PureDP", "RDPCurve", "RandomAllocation", "RepeatAndSelect",
    "SubsampledGaussian", "ZCDP"})
"""Mechanisms reviewed: their curves are the same floats in versions 2 to 5 wherever no
parameter reaches :data:`HUGE`, task cv's ``PureDP`` rules do not apply (:func:`changed`)
and no law of runs is inside; version 6 changed :data:`SG_CHANGED` (task sg) (``Poisson`` and
``TruncatedNegativeBinomial`` are not here: a ``RepeatAndSelect`` or ``DPHyPO`` always holds
one, so it counts as changed). ``DeltaReserve`` is not here: its level was rounded up in
version 5 (review al).
``SubsetTuning`` is not here either: its curve at an order a rounding error above an
integer k is now the value at k + 1, not k's (``_mechanisms/_subset._extend``, review lo3),
which differs on a grid holding such an order; a file with a subset-tuning row before its
checkpoint is replayed from the genesis."""

NOT_MECHANISMS = frozenset({"Uniform", "Concentrated", "Explicit"})
"""``{"type", "params"}`` dicts that are no mechanism: the δ-share rules of a configuration."""

HUGE = 1e150
"""Below the smallest σ whose 2σ² overflows (≈ 9.5e153, where 2ad6965 changed the curve)."""

SG_CHANGED = frozenset({"SubsampledGaussian", "AccumulatedSubsampledGaussian"})
"""Task sg (curve version 6): the subsampled Gaussian and the mechanisms computed from it
(see the module); changed for every older version."""

VERSION_5 = MECHANISMS | {"Poisson", "TruncatedNegativeBinomial", "SubsetTuning", "DeltaReserve"}
"""The types whose curves version 5 wrote as they are (versions 2–4 counted the last three
changed: review al), ``PureDP`` at every ε₀ (task cv's rule was version 5's)."""

GAUSSIAN_UP_CHANGED = frozenset({"Gaussian", "ZCDP", "RandomAllocation"})
"""Review radv8 (curve version 8): the Gaussian's α/(2σ²) (``_curves._sgm.gaussian_bound``,
used by ``Gaussian`` and ``RandomAllocation``, and by the subsampled Gaussian at q = 1 and
``AccumulatedSubsampledGaussian``, already in :data:`SG_CHANGED`) and zCDP's ρα are rounded
up, up to 2 ulps above the older values: changed for every older version (task lo9)."""

UNCHANGED_SINCE = {2: MECHANISMS - SG_CHANGED - GAUSSIAN_UP_CHANGED,
                   3: MECHANISMS - SG_CHANGED - GAUSSIAN_UP_CHANGED,
                   4: MECHANISMS - SG_CHANGED - GAUSSIAN_UP_CHANGED,
                   5: VERSION_5 - SG_CHANGED - GAUSSIAN_UP_CHANGED - {"Poisson"}}
# tasks sg, lo4 and lo9 (review radv8)
"""Per older curve version (:data:`RESUMABLE`): the types (mechanisms and laws of runs) whose
curves are the same floats today as when a checkpoint of that version was written. Version
4 adds ``Poisson``: its last change (a05d7b9) precedes version 4 (review ral). Version 5 adds
review al's types. Task sg removes :data:`SG_CHANGED` from every version. Task lo4 (version
7) rounds the Poisson law's δ̂ up (docs/theory.md §7, "Rounding of δ̂"): ``Poisson`` counts as
changed for every older version again (none is resumed from since version 7 anyway:
:data:`RESUMABLE`). Review radv8 (version 8) removes :data:`GAUSSIAN_UP_CHANGED` from every
version (task lo9)."""

PURE_DP_CHANGED = frozenset({2, 3, 4})
"""The older versions for which task cv's ``PureDP`` rule (ε₀ ≥ 40) counts as a change
(version 5 is task cv's). A tuner over a ``PureDP`` base counts at every older version (task
cv's rule, then task ul's round-up of its corollary in version 6)."""

HUGE_CHANGED = frozenset({2, 3})
"""The older versions for which a parameter of magnitude :data:`HUGE` or more counts as a
change (2ad6965 precedes version 4)."""


PURE_DP_FLAT = 40.0
"""``PureDP``'s ε₀ from which its curve changed in version 5 (``_curves._stable.PURE_DP_FLAT``,
restated here so that deciding stays free of the curves)."""


def _pure_dp_changed(params: Any) -> bool:
    """Whether a ``PureDP``'s params may give a curve other than version 4's (fail closed)."""
    eps = params.get("epsilon") if isinstance(params, dict) else None
    return (not isinstance(eps, (int, float)) or isinstance(eps, bool)
            or not abs(eps) < PURE_DP_FLAT)


PURE_DP_TINY = 1e-140
"""``PureDP``'s ε₀ below which task ul's absolute margin may change its curve (every value
from it on exceeds 10⁻²⁸¹, where the margin 2⁻¹⁰⁵² is below half an ulp:
``_curves._stable.PURE_DP_ABS``; tests/test_ul_pure_dp.py checks the floats)."""


def _pure_dp_tiny(params: Any) -> bool:
    """Whether a ``PureDP``'s params may give a curve other than version 5's (fail closed)."""
    eps = params.get("epsilon") if isinstance(params, dict) else None
    return (not isinstance(eps, (int, float)) or isinstance(eps, bool)
            or not abs(eps) >= PURE_DP_TINY)


def _pure_base(params: Any) -> bool:
    """Whether a tuner's params have a ``PureDP`` base (or are unreadable: fail closed); its
    curve takes the minimum with ``PureDP`` at (2+η)ε₀ or more, which may reach 40."""
    base = params.get("base") if isinstance(params, dict) else None
    return not isinstance(base, dict) or base.get("type") == "PureDP"


def changed(data: Any, version: int = 2) -> bool:
    """Whether JSON data (a row's body, a mechanism's or a snapshot's dict) describes, at any
    depth, a mechanism whose curve may differ from curve version ``version``'s (2, 3, 4 or 5;
    see the module; anything else counts as changed). Iterative: no recursion limit.

    Example:
        >>> changed({"type": "Laplace", "params": {"scale": 1.0}})
        False
        >>> changed({"type": "Gaussian", "params": {"noise_multiplier": 1.0}})  # version 8
        True
        >>> changed({"type": "SubsampledGaussian",
        ...          "params": {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 1}}, 5)
        True
        >>> changed({"plan": {"step": {"type": "RepeatAndSelect", "params": {
        ...     "base": {"type": "Gaussian", "params": {"noise_multiplier": 1.0}},
        ...     "runs": {"type": "Poisson", "params": {"mean": 3.0}}}}}})
        True
    """
    if type(version) is not int or version not in UNCHANGED_SINCE:
        return True
    reviewed, huge = UNCHANGED_SINCE[version], version in HUGE_CHANGED
    pure = version in PURE_DP_CHANGED
    stack: list[tuple[Any, bool]] = [(data, False)]  # (item, inside a mechanism's params)
    while stack:
        item, inside = stack.pop()
        if isinstance(item, dict):
            if set(item) == {"type", "params"}:
                kind = item["type"]
                if not isinstance(kind, str) or kind not in reviewed | NOT_MECHANISMS:
                    return True  # a changed curve, or a type never reviewed: fail closed
                if kind == "PureDP" and ((pure and _pure_dp_changed(item["params"]))
                                         or _pure_dp_tiny(item["params"])):
                    return True  # task cv, since version 4; task ul, since version 5
                if kind in ("RepeatAndSelect", "DPHyPO") and _pure_base(item["params"]):
                    return True  # its pure-DP corollary is PureDP((2+η)ε₀...): any ε₀
                inside = kind in reviewed
            stack.extend((value, inside) for value in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((value, inside) for value in item)
        elif huge and inside and isinstance(item, (int, float)) and not isinstance(item, bool):
            if not abs(item) < HUGE:  # also NaN and ±inf
                return True
    return False
