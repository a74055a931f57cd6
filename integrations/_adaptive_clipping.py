"""Opacus' adaptive clipping is refused: its step is not the mechanism it would be charged as
(private; task adv3).

``make_private(..., clipping="adaptive")`` returns an ``AdaClipDPOptimizer``
(Andrew et al. 2021, "Differentially private learning with adaptive clipping").
Its ``noise_multiplier`` σ stays the one Opacus accounts with, so a ledger read
it and charged ``SubsampledGaussian(σ, q)``, as for fixed clipping. What the step
releases is more than that (docs/theory.md §14.8):

* the clipped sum plus Gaussian noise of std σ_g·C, σ_g = (σ⁻² − (2σ_u)⁻²)^(−1/2)
  (σ_u = ``unclipped_num_std``), which is the number Opacus derives from Theorem 1
  of that paper, and
* the count U of records left unclipped plus Gaussian noise of std σ_u, read
  again through the next step's clipping bound, divided by the exact number of
  records the Poisson batch drew.

Theorem 1 counts ``b_i − ½`` over a public number of participants (sensitivity ½).
Opacus counts ``b_i`` in {0, 1} over a Poisson batch whose size is private: adding
or removing one record moves U by up to 1, so the two Gaussians of one step
compose to μ² = σ_g⁻² + σ_u⁻² = σ⁻² + ¾·σ_u⁻² (Dong, Roth & Su 2022, Corollary
3.3: Gaussian DP composes by μ² sums), which is a subsampled Gaussian of noise
multiplier (σ⁻² + ¾·σ_u⁻²)^(−1/2) < σ; and the division by the drawn batch size
releases that size, which no Gaussian charge covers. Charging σ under-counted, so
``attach`` and ``LedgerAccountant`` refuse the optimizer, before anything is
charged or updated.

Opacus' other adaptive clipping, ``opacus.utils.adaptive_clipping`` under ghost clipping
(``PrivacyEngineAdaptiveClipping.make_private(..., grad_sample_mode="ghost")``), trains with
a plain ``DPOptimizerFastGradientClipping``: only its criterion
(``DPLossFastGradientAdaptiveClipping``) clips adaptively. Each of its backward passes
releases the batch's unclipped count plus noise of std (drawn batch size)/20 through the
bound it sets, and sets the optimizer's ``_adjusted_noise_multiplier``, which the ghost
optimizer's ``add_noise`` draws at in place of the σ a ledger charges. So that attribute on
a ghost-clipping optimizer is refused wherever it comes from (a value below σ noised the step
below its charge), and so is a ``PrivacyEngineAdaptiveClipping`` given to ``attach`` with a
ghost-clipping optimizer (in hooks mode that engine makes a plain optimizer with a fixed
bound, which never reads the attribute). Tasks adv3, adv4 and reviews radv3, radv4 found
these; review radv4 merged their two modules into this one (one check path): ``attach`` and
``LedgerAccountant`` call :func:`refuse_adaptive_clipping`, attach's step (inside its DDP
collective) :func:`refuse_adjusted_noise`, ``audit_opacus`` :func:`is_adaptive_clipping` and
:func:`is_adaptive_criterion`.
"""

from __future__ import annotations

from typing import Any

from privguard._errors import InvalidArgumentError
from privguard.integrations._describe import is_ghost

__all__ = ["is_adaptive_clipping", "is_adaptive_criterion", "is_adaptive_engine",
           "refuse_adaptive_clipping", "refuse_adjusted_noise"]

_ADJUSTED = "_adjusted_noise_multiplier"


def _adjusted(optimizer: Any) -> Any:
    """The ``_adjusted_noise_multiplier`` a ghost-clipping ``optimizer`` noises with in place of
    ``noise_multiplier`` (as Opacus' ``add_noise`` reads it), or ``None``: set by Opacus'
    ghost-clipping adaptive criterion's backward, or by hand. Other optimizers never read it."""
    if not is_ghost(optimizer):
        return None
    return getattr(optimizer, _ADJUSTED, None)


def is_adaptive_clipping(optimizer: Any) -> bool:
    """Whether ``optimizer`` is (a subclass of) Opacus' ``AdaClipDPOptimizer``, or has its
    ``unclipped_num_std`` or ``update_max_grad_norm``, or is a ghost-clipping optimizer with an
    ``_adjusted_noise_multiplier`` (what Opacus' adaptive criterion sets; it noises with it).

    Example:
        >>> is_adaptive_clipping(object())
        False
    """
    if _adjusted(optimizer) is not None or any(
            hasattr(optimizer, name) for name in ("unclipped_num_std", "update_max_grad_norm")):
        # review radv3: by what it does too, not by the class only: an Opacus that moves or
        # renames AdaClipDPOptimizer (the import below failing) was attached as a fixed bound
        return True
    try:
        from opacus.optimizers import AdaClipDPOptimizer
    except ImportError:  # an Opacus without adaptive clipping, or one that moved it
        return False
    return isinstance(optimizer, AdaClipDPOptimizer)


def is_adaptive_criterion(criterion: Any) -> bool:
    """Whether ``criterion`` is Opacus' ghost-clipping adaptive criterion
    (``DPLossFastGradientAdaptiveClipping``, from ``PrivacyEngineAdaptiveClipping``), known by
    what it holds, before any backward sets the optimizer's noise (review radv3).

    Example:
        >>> is_adaptive_criterion(object())
        False
    """
    return all(hasattr(criterion, name)
               for name in ("target_unclipped_quantile", "clipbound_learning_rate"))


def is_adaptive_engine(privacy_engine: Any) -> bool:
    """Whether ``privacy_engine`` is (a subclass of) Opacus' ``PrivacyEngineAdaptiveClipping``
    (task adv4).

    Example:
        >>> is_adaptive_engine(None)
        False
    """
    if privacy_engine is None:
        return False
    try:
        from opacus.utils.adaptive_clipping import PrivacyEngineAdaptiveClipping
    except ImportError:  # an Opacus without it
        return False
    return isinstance(privacy_engine, PrivacyEngineAdaptiveClipping)


def refuse_adjusted_noise(optimizer: Any) -> None:
    """Raise :class:`~privguard.InvalidArgumentError` naming ``optimizer`` if it is a
    ghost-clipping optimizer with an ``_adjusted_noise_multiplier``; otherwise return. One
    attribute read past the (cached) class test: what attach's step runs (the optimizer's
    class, refused at attach if adaptive, does not change)."""
    adjusted = _adjusted(optimizer)
    if adjusted is None:
        return
    raise InvalidArgumentError(
        "optimizer", type(optimizer).__name__,
        f"clips adaptively: it has _adjusted_noise_multiplier = {adjusted!r}, which Opacus' "
        f"ghost-clipping add_noise uses in place of noise_multiplier = "
        f"{getattr(optimizer, 'noise_multiplier', None)!r} (the σ privguard charges). Opacus' "
        "adaptive ghost clipping (opacus.utils.adaptive_clipping) sets it, and each of its "
        "steps also releases the noisy count of unclipped records divided by the drawn batch "
        "size, which no SubsampledGaussian charge covers (docs/theory.md §14.8). Nothing is "
        "charged or applied. Use a fixed clipping bound (opacus.PrivacyEngine and the "
        "criterion its make_private returns), and delete the attribute")


def refuse_adaptive_clipping(optimizer: Any, privacy_engine: Any = None) -> None:
    """Raise :class:`~privguard.InvalidArgumentError` if ``optimizer`` clips adaptively
    (:func:`is_adaptive_clipping`, naming ``optimizer``) or ``privacy_engine`` is a
    ``PrivacyEngineAdaptiveClipping`` of a ghost-clipping ``optimizer`` (naming
    ``privacy_engine``); otherwise return.

    Example:
        >>> refuse_adaptive_clipping(object())
    """
    refuse_adjusted_noise(optimizer)
    if is_adaptive_clipping(optimizer):
        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            "clips adaptively (make_private(..., clipping='adaptive')): each step also "
            "releases the noisy count of unclipped records, divided by the drawn batch size, "
            "so it is not the SubsampledGaussian(noise_multiplier, q) it would be charged as "
            "(an add/remove of one record moves the count by 1, not the ½ Opacus' noise split "
            "assumes; docs/theory.md §14.8). Use a fixed clipping bound (clipping='flat' or "
            "'per_layer')")
    if is_ghost(optimizer) and is_adaptive_engine(privacy_engine):
        raise InvalidArgumentError(
            "privacy_engine", type(privacy_engine).__name__,
            "trains with Opacus' adaptive ghost clipping: each step also releases the noisy "
            "count of unclipped records (noise std batch size / 20) divided by the drawn "
            "batch size, which no SubsampledGaussian charge covers (docs/theory.md §14.8). "
            "Use opacus.PrivacyEngine with a fixed clipping bound")
