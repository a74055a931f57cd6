"""Opacus' adaptive clipping under ghost clipping is refused by name (private; task adv4).

``opacus.utils.adaptive_clipping`` trains with a plain ``DPOptimizerFastGradientClipping``
(``PrivacyEngineAdaptiveClipping.make_private(..., grad_sample_mode="ghost")``, whose
criterion is a ``DPLossFastGradientAdaptiveClipping``), not an ``AdaClipDPOptimizer``, so
a check of the optimizer's class does not see it. Between its two backward passes, each
wrapped backward (``DPTensorFastGradientAdaptiveClipping.backward``):

* releases the count U of the batch's unclipped records plus Gaussian noise of std
  σ_u = B/20, B the drawn batch size (a std that is itself a function of the private
  batch), divided by B, through the clipping bound it sets for the step
  (``max_grad_norm``, on the module and on the optimizer);
* sets ``optimizer._adjusted_noise_multiplier`` = (σ⁻² − (2σ_u)⁻²)^(−1/2), which Opacus'
  ``DPOptimizerFastGradientClipping.add_noise`` reads in place of ``noise_multiplier``
  (the σ attach charges) for the gradient's noise.

Adding or removing one record moves U by up to 1 (not the ½ of Theorem 1 of Andrew et al.
2021, which Opacus' split assumes) and B by 1, so the step is not the
``SubsampledGaussian(σ, q)`` it would be charged as (the composition of the two Gaussians
alone gives μ² = σ⁻² + ¾·σ_u⁻² by Dong, Roth & Su 2022, Corollary 3.3, and the released B
and the B-dependent σ_u are covered by no Gaussian charge; docs/theory.md §14.8 for the
same count under ``AdaClipDPOptimizer``). On main such a step was refused only because
privguard's ghost counter (``integrations/_ghost.py``) did not recognise the adaptive
backward's ``zero_grad`` and took its gradient for an unclipped one, with a message
telling the user to use the criterion ``make_private`` returned, which they did.

And an ``_adjusted_noise_multiplier`` set any other way (it is a plain attribute Opacus
documents in ``add_noise``) makes the noise σ′·C for a σ′ the charge never reads: one
below σ was charged at σ (an under-count). So the attribute is refused wherever it is,
at attach and before each step's charge (``_ghost.BackwardCounter.check``), and so is a
``PrivacyEngineAdaptiveClipping`` given to attach, both for ghost-clipping optimizers only
(the others neither read the attribute nor run the adaptive criterion).
"""

from __future__ import annotations

from typing import Any

from privguard._errors import InvalidArgumentError

__all__ = ["refuse_adaptive_ghost"]

_ATTRIBUTE = "_adjusted_noise_multiplier"


def _adaptive_engine(privacy_engine: Any) -> bool:
    """Whether ``privacy_engine`` is (a subclass of) ``PrivacyEngineAdaptiveClipping``."""
    if privacy_engine is None:
        return False
    try:
        from opacus.utils.adaptive_clipping import PrivacyEngineAdaptiveClipping
    except ImportError:  # an Opacus without it
        return False
    return isinstance(privacy_engine, PrivacyEngineAdaptiveClipping)


def refuse_adaptive_ghost(optimizer: Any, privacy_engine: Any = None) -> None:
    """Raise :class:`~privguard.InvalidArgumentError` if ``optimizer`` carries Opacus'
    ``_adjusted_noise_multiplier`` (naming ``optimizer``) or ``privacy_engine`` is a
    ``PrivacyEngineAdaptiveClipping`` (naming ``privacy_engine``); otherwise return.

    Example:
        >>> refuse_adaptive_ghost(object())
    """
    adjusted = getattr(optimizer, _ATTRIBUTE, None)  # as Opacus' add_noise reads it
    if adjusted is not None:
        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            f"has _adjusted_noise_multiplier = {adjusted!r}, which Opacus' ghost-clipping "
            f"add_noise uses in place of noise_multiplier = {optimizer.noise_multiplier!r} "
            "(the σ privguard charges). Opacus' adaptive ghost clipping "
            "(opacus.utils.adaptive_clipping) sets it, and each of its steps also releases "
            "the noisy count of unclipped records divided by the drawn batch size, which no "
            "SubsampledGaussian charge covers (integrations/_adaptive_ghost.py). The step "
            "is refused, nothing charged or applied. Use a fixed clipping bound (Opacus' "
            "PrivacyEngine and the criterion its make_private returns), and delete the "
            "attribute")
    if _adaptive_engine(privacy_engine):
        raise InvalidArgumentError(
            "privacy_engine", type(privacy_engine).__name__,
            "trains with Opacus' adaptive ghost clipping: each step also releases the noisy "
            "count of unclipped records (noise std batch size / 20) divided by the drawn "
            "batch size, which no SubsampledGaussian charge covers "
            "(integrations/_adaptive_ghost.py). Use opacus.PrivacyEngine with a fixed "
            "clipping bound")
