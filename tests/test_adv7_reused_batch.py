"""Task adv7: a batch used twice in one Lightning step, or by two steps.

Lightning's manual optimization lets ``training_step`` call ``manual_backward`` on two
losses of one batch before ``opt.step()`` (Opacus then holds two sets of per-sample
gradients, each record of the draw clipped and summed twice: one draw at weight 2), or
step twice on one batch. Both were charged as independent Poisson draws
(``AccumulatedSubsampledGaussian(σ, q, 2)``, two ``SubsampledGaussian(σ, q)``), below the
steps' curves (``SubsampledGaussian(σ/2, q)``; ``SubsampledGaussian(σ/√2, q)`` per pair):
integrations/_reused_batches.py. Now the step is refused before its charge and update,
``InvalidArgumentError`` naming ``optimizer``.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from _adv7_manual import fit_one_epoch, poisson_loader  # noqa: E402
from opacus import GradSampleModule  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, BATCH, SIGMA = 64, 16, 1.0


class _Manual(pl.LightningModule):
    """``mode``: "once" (one backward, one step per batch), "two_backward" (two losses of
    the batch backpropagated one by one, one step), "two_steps" (two steps per batch)."""

    def __init__(self, mode: str):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.net = GradSampleModule(nn.Linear(4, 2))
        x = torch.randn(N, 4, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, (x[:, 0] > 0).long())
        self.mode = mode
        self.updates = 0

    def _loss(self, batch):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def _step(self, opt) -> None:
        before = [p.detach().clone() for p in self.net.parameters()]
        opt.step()
        opt.zero_grad()
        self.updates += any(not torch.equal(a, p) for a, p in zip(before, self.net.parameters()))

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        if self.mode in ("skip_then_twice", "twice_then_step"):  # review radv7
            self._pairs(opt, batch, batch_idx)
            return
        if self.mode == "chunks":  # review radv7: each record once, by hand
            x, y = batch
            half = len(x) // 2
            self.manual_backward(self._loss((x[:half], y[:half])))
            self.manual_backward(self._loss((x[half:], y[half:])))
            self._step(opt)
            return
        self.manual_backward(self._loss(batch))
        if self.mode == "two_backward":
            self.manual_backward(0.5 * self._loss(batch))
        self._step(opt)
        if self.mode == "two_steps":
            self.manual_backward(self._loss(batch))
            self._step(opt)

    def _pairs(self, opt, batch, batch_idx) -> None:
        """Two batches a step; one of them backpropagated twice, the other not at all
        ("skip_then_twice": the second twice, then the step; "twice_then_step": the first
        twice, the step in the second)."""
        twice = batch_idx % 2 == (1 if self.mode == "skip_then_twice" else 0)
        if twice:
            self.manual_backward(self._loss(batch))
            self.manual_backward(0.5 * self._loss(batch))
        if batch_idx % 2 == 1:
            self._step(opt)

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                           noise_multiplier=SIGMA, max_grad_norm=1.0, expected_batch_size=BATCH)

    def train_dataloader(self):
        return poisson_loader(self.data, BATCH)




def _eps(mechanism) -> float:
    ledger = Ledger(delta=1e-5)
    ledger.charge(mechanism)
    return ledger.epsilon(1e-5)


def test_the_charge_two_draws_would_take_is_below_one_draw_at_weight_two():
    """Why the steps cannot be charged as they were (the curves of theory §14.5)."""
    q = BATCH / N
    assert _eps(M.AccumulatedSubsampledGaussian(SIGMA, q, 2, steps=4)) < \
        _eps(M.SubsampledGaussian(SIGMA / 2, q, steps=4))
    assert _eps(M.SubsampledGaussian(SIGMA, q, steps=8)) < \
        _eps(M.SubsampledGaussian(SIGMA / math.sqrt(2), q, steps=4))


def test_a_batch_backpropagated_twice_is_refused_before_its_charge():
    ledger, model = Ledger(delta=1e-5), _Manual("two_backward")
    with pytest.raises(InvalidArgumentError) as info:
        fit_one_epoch(ledger, model)
    assert info.value.argument == "optimizer" and "2 backward passes over 1" in str(info.value)
    assert len(ledger.history) == 0 and model.updates == 0


def test_a_second_step_on_the_same_batch_is_refused_before_its_charge():
    ledger, model = Ledger(delta=1e-5), _Manual("two_steps")
    with pytest.raises(InvalidArgumentError) as info:
        fit_one_epoch(ledger, model)
    assert info.value.argument == "optimizer" and "over 0 batch" in str(info.value)
    assert len(ledger.history) == 1 and model.updates == 1  # the first step only


def test_one_backward_and_one_step_per_batch_still_trains():
    ledger, model = Ledger(delta=1e-5), _Manual("once")
    trainer = fit_one_epoch(ledger, model)
    assert model.updates == trainer.global_step == len(ledger.history) > 0
    assert {r.mechanism for r in ledger.history} == {M.SubsampledGaussian(SIGMA, BATCH / N)}


@pytest.mark.parametrize("mode", ["skip_then_twice", "twice_then_step"])
def test_a_batch_left_untrained_does_not_pay_for_one_backpropagated_twice(mode):
    """Review radv7: two batches, two sets, one step passed adv7's count (sets <= batches
    since the step) and was charged AccumulatedSubsampledGaussian(σ, q, 2), where one
    batch is in the sum at weight 2 (the other not at all): SubsampledGaussian(σ/2, q)."""
    ledger, model = Ledger(delta=1e-5), _Manual(mode)
    with pytest.raises(InvalidArgumentError) as info:
        fit_one_epoch(ledger, model)
    assert info.value.argument == "optimizer"
    assert len(ledger.history) == 0 and model.updates == 0


def test_a_batch_split_by_hand_is_refused_with_what_to_do_instead():
    """Review radv7: chunks of one batch, each backpropagated once (an over-count), cannot
    be told from a batch backpropagated twice; the message says so and names the ways that
    are charged."""
    ledger, model = Ledger(delta=1e-5), _Manual("chunks")
    with pytest.raises(InvalidArgumentError) as info:
        fit_one_epoch(ledger, model)
    assert "split by hand" in str(info.value) and "accumulate_grad_batches" in str(info.value)
    assert len(ledger.history) == 0 and model.updates == 0
