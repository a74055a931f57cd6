"""A trainer's step whose optimizer holds more backward passes than batches (private).

Task adv7. Lightning hands every training batch to ``training_step`` (the callback counts
them in ``on_train_batch_start``: one Poisson draw per batch and loader). Under Opacus'
hooks mode each ``backward()`` since the last ``zero_grad()`` leaves one set of per-sample
gradients (``accumulated_iterations``), and the step clips each set's rows separately
and sums them all. A ``training_step`` that calls ``manual_backward`` twice on one batch
(two losses backpropagated one by one, a common way to save memory) puts each record of
that draw into the sum twice, at weight 2: sensitivity 2C under noise σ·C, the curve of
``SubsampledGaussian(σ/2, q)`` (docs/theory.md §14.5, *A batch added twice*: the same
one draw at weight 2 that review rgc refused under ghost clipping). The step was charged
``AccumulatedSubsampledGaussian(σ, q, 2)``, whose Lemma 14.1 takes each of the k sets to
be its own Poisson draw: 4 steps at σ = 1, q = 1/4, δ = 10⁻⁵ charged ε ≈ 14.5 against
≈ 20.4 for the step's curve (``tests/test_adv7_reused_batch.py``).

Likewise a second real step on the batch of the first (``opt.step()`` twice in one
``training_step``, each after its own ``manual_backward``: several updates per batch):
both releases hold each of the draw's records, one draw released twice, the curve of
``SubsampledGaussian(σ/√2, q)`` per pair of steps (L2 sensitivity √2·C over the two
noisy sums), charged as two independent draws: 4 pairs at σ = 1, q = 1/4 charged
ε ≈ 8.3 against ≈ 11.6. Lightning delivered no batch since the first step: it holds
more sets (1) than batches (0), and is refused.

The Hugging Face Trainer calls ``training_step`` once per micro-batch, one draw each
(``on_substep_end`` after each but the step's last): a ``training_step`` overridden to
backpropagate its inputs twice is the same one draw at weight 2, refused alike.

Counts cannot tell these cases from a batch split by hand into chunks (each record once,
an over-count with k = the chunks) or from a second stream drawn inside
``training_step``: the step is refused when the optimizer holds more sets than Lightning
delivered batches since the last real step, before anything is charged or applied
(``InvalidArgumentError`` naming ``optimizer``). Backpropagate the sum of the losses
once, or split batches with ``accumulate_grad_batches``. Ghost clipping reports no sets
(its optimizer reports 1; its own check, ``integrations/_ghost.py``, refuses a batch
added twice): not checked here.
"""

from __future__ import annotations

from typing import Any

from privguard._errors import InvalidArgumentError
from privguard.integrations import _describe

__all__ = ["refuse_reused_batches"]


def refuse_reused_batches(optimizer: Any, batches: int) -> None:
    """Refuse the step if ``optimizer`` holds more per-sample gradient sets than the
    ``batches`` (Poisson draws) the trainer delivered since the last real step.

    Raises:
        InvalidArgumentError: naming ``optimizer``.
    """
    reported = _describe.reported_micro_batches(optimizer)  # None under ghost clipping
    if reported is not None and reported > batches:
        raise InvalidArgumentError(
            "optimizer", f"{reported} backward passes over {batches} batch(es)",
            "holds more sets of per-sample gradients than the batches the trainer delivered "
            "since the last step: a batch backpropagated twice is in the noised sum at weight "
            "2, and a second step on the batch of the first releases that draw again, which "
            "the charge does not cover (docs/theory.md §14.5); call manual_backward once per "
            "batch, on the sum of the losses, step once per batch, or split batches with "
            "accumulate_grad_batches (gradient_accumulation_steps)")
