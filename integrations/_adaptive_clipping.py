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
"""

from __future__ import annotations

from typing import Any

from privguard._errors import InvalidArgumentError

__all__ = ["is_adaptive_clipping", "is_adaptive_criterion", "refuse_adaptive_clipping"]


def is_adaptive_clipping(optimizer: Any) -> bool:
    """Whether ``optimizer`` is (a subclass of) Opacus' ``AdaClipDPOptimizer``, or has its
    ``unclipped_num_std`` or ``update_max_grad_norm``, or is a ghost-clipping optimizer whose noise Opacus' adaptive criterion has set
    (:func:`_ghost_adaptive`).

    Example:
        >>> is_adaptive_clipping(object())
        False
    """
    if _ghost_adaptive(optimizer) or any(
            hasattr(optimizer, name) for name in ("unclipped_num_std", "update_max_grad_norm")):
        # review radv3: by what it does too, not by the class only: an Opacus that moves or
        # renames AdaClipDPOptimizer (the import below failing) was attached as a fixed bound
        return True
    try:
        from opacus.optimizers import AdaClipDPOptimizer
    except ImportError:  # an Opacus without adaptive clipping, or one that moved it
        return False
    return isinstance(optimizer, AdaClipDPOptimizer)


def _ghost_adaptive(optimizer: Any) -> bool:
    """Whether Opacus' ghost-clipping adaptive criterion has run a backward for ``optimizer``
    (review radv3). ``PrivacyEngineAdaptiveClipping.make_private(..., grad_sample_mode=
    "ghost")`` returns a plain ``DPOptimizerFastGradientClipping``, so only its criterion
    (``DPLossFastGradientAdaptiveClipping``) clips adaptively: each backward moves the bound
    by the batch's noisy unclipped count, of noise std (drawn batch size)/20, and sets the
    optimizer's ``_adjusted_noise_multiplier`` (σ⁻² − (size/10)⁻²)^(−1/2), which its
    ``add_noise`` draws at instead of σ: the noise's scale releases the drawn batch size.
    That attribute is read, never a value of the data."""
    return getattr(optimizer, "_adjusted_noise_multiplier", None) is not None


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


def refuse_adaptive_clipping(optimizer: Any) -> None:
    """Raise :class:`~privguard.InvalidArgumentError` naming ``optimizer`` if it clips
    adaptively (:func:`is_adaptive_clipping`); otherwise return."""
    if not is_adaptive_clipping(optimizer):
        return
    raise InvalidArgumentError(
        "optimizer", type(optimizer).__name__,
        "clips adaptively (make_private(..., clipping='adaptive'), or the criterion of "
        "opacus.utils.adaptive_clipping.PrivacyEngineAdaptiveClipping): each step also releases "
        "the noisy count of unclipped records, divided by the drawn batch size, so it is not "
        "the SubsampledGaussian(noise_multiplier, q) it would be charged as (an add/remove of "
        "one record moves the count by 1, not the ½ Opacus' noise split assumes; "
        "docs/theory.md §14.8). Use a fixed clipping bound (clipping='flat' or 'per_layer')")
