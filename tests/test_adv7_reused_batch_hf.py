"""Task adv7: a Hugging Face ``training_step`` that backpropagates its inputs twice.

The Trainer calls ``training_step`` once per micro-batch (one Poisson draw); one overridden
to run the parent's forward and backward twice on the same inputs leaves two sets of
per-sample gradients of the same records, clipped and summed: one draw at weight 2 (the
curve of ``SubsampledGaussian(σ/2, q)``), which was charged as two independent draws,
``AccumulatedSubsampledGaussian(σ, q, 2)`` (integrations/_reused_batches.py). Now the step
is refused before its charge and update, ``InvalidArgumentError`` naming ``optimizer``;
``gradient_accumulation_steps=2`` (two batches, one backward each) is still charged k = 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("opacus")

import torch
from test_huggingface import BATCH, N, PoissonTrainer, make_trainer

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


class _TwiceTrainer(PoissonTrainer):
    """Backpropagates every micro-batch twice (two losses of one batch, one by one)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        super().training_step(model, inputs, num_items_in_batch)
        return super().training_step(model, inputs, num_items_in_batch)


def test_a_batch_backpropagated_twice_is_refused_before_its_charge(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, trainer_cls=_TwiceTrainer, max_steps=3,
                                save_strategy="no")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(InvalidArgumentError) as info:
        trainer.train()
    assert info.value.argument == "optimizer" and "2 backward passes over 1" in str(info.value)
    assert len(ledger.history) == 0
    assert all(a.equal(p) for a, p in zip(before, trainer.model.parameters()))  # not applied


def test_accumulated_micro_batches_are_still_charged_as_draws(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, max_steps=3, save_strategy="no",
                                gradient_accumulation_steps=2)
    trainer.train()
    assert len(ledger.history) == trainer.state.global_step == 3
    assert {r.mechanism for r in ledger.history} == {
        M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2)}


class _SteppingTrainer(PoissonTrainer):
    """Steps the optimizer inside ``training_step``, clears it and backpropagates the same
    inputs again; the Trainer then steps on them: two releases of one draw (review
    radv7; without the clearing Opacus itself refuses the second step)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        super().training_step(model, inputs, num_items_in_batch)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return super().training_step(model, inputs, num_items_in_batch)


class _SkipThenTwiceTrainer(PoissonTrainer):
    """Of each step's two micro-batches, backpropagates the first not at all and the
    second twice (review radv7)."""

    calls = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.calls += 1
        if self.calls % 2 == 1:
            return torch.zeros((), device=self.args.device)
        super().training_step(model, inputs, num_items_in_batch)
        return super().training_step(model, inputs, num_items_in_batch)


def test_a_second_real_step_in_one_trainer_step_is_refused(tmp_path):
    """Review radv7: the Trainer's step released the draw of the user's step again and was
    charged as a second independent draw (SubsampledGaussian(σ/√2, q) per pair, §14.5)."""
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, trainer_cls=_SteppingTrainer, max_steps=3,
                                save_strategy="no")
    with pytest.raises(InvalidArgumentError) as info:
        trainer.train()
    assert info.value.argument == "optimizer" and "over 0 batch" in str(info.value)
    assert len(ledger.history) == 1  # the user's step only


def test_a_micro_batch_left_untrained_does_not_pay_for_one_backpropagated_twice(tmp_path):
    """Review radv7: 2 sets over 2 micro-batches passed adv7's count and were charged
    AccumulatedSubsampledGaussian(σ, q, 2): one draw at weight 2."""
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, trainer_cls=_SkipThenTwiceTrainer,
                                max_steps=3, save_strategy="no", gradient_accumulation_steps=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(InvalidArgumentError) as info:
        trainer.train()
    assert info.value.argument == "optimizer" and "in the batch of the step" in str(info.value)
    assert len(ledger.history) == 0
    assert all(a.equal(p) for a, p in zip(before, trainer.model.parameters()))
