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

Review radv7: the count over the step's window alone let a batch left untrained pay for
another backpropagated twice (Lightning: a ``training_step`` that returns before any
backward on one batch and calls ``manual_backward`` twice on the next; Hugging Face: the
same over the micro-batches of ``gradient_accumulation_steps``): sets = batches, charged
``AccumulatedSubsampledGaussian(σ, q, 2)``, one draw at weight 2. :class:`BatchSets` also
counts the sets each batch added (the entries of the optimizer's ``grad_sample`` that
were not held when the batch was handed over), at most its draws. And a second real step
inside one Hugging Face step (a ``training_step`` that calls ``optimizer.step()`` itself,
then the Trainer's own step on the same per-sample gradients) has no batch since the
first, refused like Lightning's.
"""

from __future__ import annotations

import weakref
from typing import Any

from privguard._errors import InvalidArgumentError
from privguard.integrations import _describe

__all__ = ["BatchSets"]


def _refuse(sets: int, batches: int, where: str) -> None:
    raise InvalidArgumentError(
        "optimizer", f"{sets} backward passes over {batches} batch(es) {where}",
        "holds more sets of per-sample gradients than the batches the trainer delivered: a "
        "batch backpropagated twice is in the noised sum at weight 2, and a second step on "
        "the batch of the first releases that draw again, which the charge does not cover "
        "(docs/theory.md §14.5); call manual_backward (backward) once per batch, on the sum "
        "of the losses, and step once per batch; a batch split by hand into chunks (each "
        "backpropagated once) cannot be told from these and is refused too: train on "
        "smaller Poisson batches, several a step with accumulate_grad_batches "
        "(gradient_accumulation_steps), or split one batch with Opacus' BatchMemoryManager "
        "in a plain attach loop")


class BatchSets:
    """The per-sample gradient sets of a trainer's steps against the batches it delivered.

    The trainer calls :meth:`start` when it hands a batch to the loop and :meth:`end` when
    the loop is done with it (before the step, if the batch is its last); the handle runs
    :meth:`check` before the step's charge (``AttachHandle.step_checks``).
    """

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self._before: list[Any] = []  # weak references to the sets held when the batch came
        self._over: list[Any] = []  # sets added by a batch beyond its draws, once ended

    @staticmethod
    def _refs(sets: list[Any]) -> list[Any]:
        return [weakref.ref(t) for t in sets]  # a set cleared by zero_grad() is let go

    def _added(self, held: list[Any]) -> list[Any]:
        return [t for t in held if not any(r() is t for r in self._before)]

    def start(self) -> None:
        """A batch was handed to the loop."""
        self._before = self._refs(_describe.held_sets(self.optimizer))

    def end(self, draws: int) -> None:
        """The loop is done with the batch (``draws`` Poisson draws): sets it added beyond
        them are refused at the step that would release them."""
        held = _describe.held_sets(self.optimizer)
        added = self._added(held)
        if len(added) > draws:
            self._over += self._refs(added)
        self._over = [r for r in self._over if r() is not None]
        self._before = self._refs(held)

    def check(self, draws: int, batches: int) -> None:
        """Refuse the step if the optimizer holds more sets than the ``batches`` delivered
        since the last real step, the current batch added more than its ``draws``, or an
        earlier batch's surplus is still held.

        Raises:
            InvalidArgumentError: naming ``optimizer``.
        """
        held = _describe.held_sets(self.optimizer)
        if len(held) > batches:
            _refuse(len(held), batches, "since the last step")
        added = self._added(held)
        if len(added) > draws:
            _refuse(len(added), draws, "in the batch of the step")
        if any(r() is t for r in self._over for t in held):
            _refuse(len(held), batches, "with one earlier batch's sets above its draws")
