"""The explicit opt-in to the aligned accumulation curve, and what it checks (private).

``attach(..., aligned_micro_batches=True, model=model)`` (and the Lightning and
Hugging Face callbacks' argument of the same name) charges k > 1 accumulated
micro-batches as ``AccumulatedSubsampledGaussian(σ, q, k, aligned=True)``
(docs/theory.md §14, Lemma 14.1) instead of the default ``aligned=False``
(§14.2). The aligned curve holds only when every example's clipped gradient
is the same vector in every micro-batch of a step it is drawn into (C3′, §2b.1):
nothing in the forward or backward pass may draw randomness per micro-batch.
That is an assertion about the training loop, made by the user; privguard
refuses it where it can see that it is false:

* at attach: a dropout module (any ``torch.nn`` dropout layer,
  ``_DropoutNd``: ``Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``,
  ``FeatureAlphaDropout``, and subclasses) in training mode with p > 0, or a
  module with a dropout rate attribute (:data:`RATE_ATTRIBUTES`: the
  ``dropout`` of ``nn.MultiheadAttention`` and ``nn.LSTM``/``GRU``/``RNN``,
  Opacus' ``DPRNNBase``, the ``attention_dropout`` of many Hugging Face
  attention layers) > 0 in training mode, is refused with
  :class:`~privguard.InvalidArgumentError` naming ``model``, the module's
  name and its rate; the callbacks refuse a rate > 0 in either mode (the
  trainers switch the model to training mode themselves);
* at every real step, before the charge: the modules found at attach are
  re-read (the training flag and the rate of each: a few attribute reads per
  dropout module, no walk over the model), so a ``model.train()`` or a rate
  raised after attach is refused before the step updates anything, and
  nothing is charged. Under DDP the re-check runs inside the step's first
  collective (no extra one): a refusal on any rank stops every rank before
  anything is charged or updated (review rgc: the ranks agree on the step
  before the charge; tests/test_ddp.py).

What it cannot see: dropout called functionally
(``torch.nn.functional.dropout`` in a ``forward``), the ``dropout_p`` of
``scaled_dot_product_attention`` unless it comes from a rate attribute above,
modules added to the model after attach, any other per-draw randomness in
the model (stochastic depth, noise layers), and augmentation drawn per
micro-batch in the data pipeline. Steps Opacus recorded before attach are
charged as aligned too, on the user's word. The opt-in is the user's
assertion that none of these happen.
"""

from __future__ import annotations

from typing import Any

from privguard._errors import InvalidArgumentError

__all__ = ["RATE_ATTRIBUTES", "DropoutGuard", "check_model", "guard_for"]

RATE_ATTRIBUTES = ("dropout", "dropout_p", "attention_dropout", "attn_dropout")
"""Float attributes read as a module's dropout rate (besides ``_DropoutNd.p``)."""

_REQUIREMENT = (
    "is refused with aligned_micro_batches=True: dropout draws a fresh mask in every "
    "micro-batch, so an example drawn into two micro-batches of a step has two different "
    "clipped gradients and the aligned curve does not hold (docs/theory.md §14.2). Set its "
    "rate to 0 or keep it in eval mode, or leave aligned_micro_batches=False (the default "
    "curve, valid with dropout)")


def _rate(module: Any) -> tuple[str, float] | None:
    """(attribute, rate) of a module that draws dropout masks, or None."""
    from torch.nn.modules.dropout import _DropoutNd

    if isinstance(module, _DropoutNd):
        return "p", float(module.p)
    for attribute in RATE_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return attribute, float(value)
    return None


class DropoutGuard:
    """The dropout modules of a model, re-read cheaply at every step.

    Built by :func:`guard_for`; :meth:`check` raises
    :class:`~privguard.InvalidArgumentError` naming ``model`` and the first
    module with a rate > 0 in training mode (or in either mode, with
    ``assume_training``).
    """

    def __init__(self, found: list[tuple[str, Any, str]]) -> None:
        self._found = tuple(found)  # (name, module, rate attribute)

    def __len__(self) -> int:
        return len(self._found)

    def check(self, assume_training: bool = False) -> None:
        """Refuse the first module that would draw dropout masks now."""
        for name, module, attribute in self._found:
            if not (assume_training or module.training):
                continue
            rate: Any = getattr(module, attribute, None)
            number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
            if not (number and rate <= 0):  # fail closed: NaN or a non-number is refused too
                mode = "training mode" if module.training else "eval mode (the trainer trains)"
                shown = f"{rate:g}" if number else repr(rate)
                raise InvalidArgumentError(
                    "model", f"{name or '<root>'}: {type(module).__name__}({attribute}={shown}) "
                    f"in {mode}", _REQUIREMENT)


def check_model(model: Any) -> None:
    """Refuse a ``model`` that is neither None nor a ``torch.nn.Module`` (named)."""
    if model is None:
        return None
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(
            "model", type(model).__name__,
            "must be the torch.nn.Module being trained (needed with "
            "aligned_micro_batches=True: the Opacus optimizer holds no reference to it, and "
            "the model is checked for dropout)")
    return None


def guard_for(model: Any, assume_training: bool = False,
              parameters: Any = None) -> DropoutGuard:
    """The :class:`DropoutGuard` of ``model``, checked once (the attach-time refusal).

    Args:
        model: the ``torch.nn.Module`` being trained (an Opacus
            ``GradSampleModule`` or the module it wraps).
        assume_training: refuse a rate > 0 in eval mode too (a trainer that
            calls ``model.train()`` itself: Lightning, Hugging Face).
        parameters: the parameters the optimizer trains; each must be one of
            ``model``'s (else the modules checked are not those trained).

    Raises:
        InvalidArgumentError: ``model`` is not a module, or has a dropout
            module that would draw masks (named, with its rate).

    Example:
        >>> import torch
        >>> len(guard_for(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0))))
        1
    """
    if model is None:
        raise InvalidArgumentError(
            "model", None, "is needed with aligned_micro_batches=True: the Opacus optimizer "
            "holds no reference to the model, which is checked for dropout in training mode")
    check_model(model)
    if parameters is not None:
        own = {id(p) for p in model.parameters()}
        outside = sum(id(p) not in own for p in parameters)
        if outside:
            raise InvalidArgumentError(
                "model", type(model).__name__,
                f"does not hold {outside} of the parameters the optimizer trains: pass the "
                "module being trained (the one make_private wrapped), whose dropout is checked")
    found = []
    for name, module in model.named_modules():
        rate = _rate(module)
        if rate is not None:
            found.append((name, module, rate[0]))
    guard = DropoutGuard(found)
    guard.check(assume_training)
    return guard
