"""Review sa: Lightning makes the first epoch's loader iterator before ``on_train_start``
(where the callback attaches), so the micro-batch counter's class swap on the loader never
saw that epoch's batches (it counted 0). A manual-optimization loop that accumulates two
batches into one noise draw with Opacus' ``signal_skip_step`` (the optimizer then reports
one batch: only the loader's count tells, integrations/_describe.py) was charged one
``SubsampledGaussian`` per real step in the first epoch (the truth: two Poisson draws,
``AccumulatedSubsampledGaussian(σ, q, 2)``), and a RandomAllocationSampler epoch ran t/2
merged steps charged as ``RandomAllocation(σ, t)``; from the second epoch on it was right.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations import RandomAllocationSampler  # noqa: E402
from privguard.integrations._sampling import NonPoissonSamplingError  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, T, SIGMA = 64, 4, 1.0


class _SkipStep(pl.LightningModule):
    """Two batches per real step: the first one's step is skipped (Opacus accumulates it)."""

    def __init__(self, allocation: bool):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.net = GradSampleModule(nn.Linear(10, 2))
        x = torch.randn(N, 10, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, (x[:, 0] > 0).long())
        self.allocation = allocation
        self.updates = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        self.manual_backward(nn.functional.cross_entropy(self.net(x), y))
        opt.optimizer.signal_skip_step(do_skip=batch_idx % 2 == 0)
        before = [p.detach().clone() for p in self.net.parameters()]
        opt.step()
        opt.zero_grad()
        self.updates += any(not torch.equal(a, p) for a, p in zip(before, self.net.parameters()))

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                           noise_multiplier=SIGMA, max_grad_norm=1.0, expected_batch_size=N // T)

    def train_dataloader(self):
        if self.allocation:
            return DataLoader(self.data, batch_sampler=RandomAllocationSampler(
                N, T, generator=torch.Generator().manual_seed(0)))
        return DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=N // T),
                                             generator=torch.Generator().manual_seed(0))


def _fit(ledger, model):
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=2)
    trainer.fit(model)
    return trainer


def test_first_epoch_accumulated_poisson_batches_are_charged_as_two_draws():
    ledger = Ledger(delta=1e-5)
    _fit(ledger, _SkipStep(allocation=False))
    two = M.AccumulatedSubsampledGaussian(SIGMA, 1.0 / T, 2)
    assert [r.mechanism for r in ledger.history] == [two] * 4  # was SubsampledGaussian × 2 first


def test_first_epoch_accumulated_allocation_batches_are_refused_before_any_update():
    ledger = Ledger(delta=1e-5)
    model = _SkipStep(allocation=True)
    with pytest.raises(NonPoissonSamplingError, match="accumulated micro-batches"):
        _fit(ledger, model)
    assert len(ledger.history) == 0 and model.updates == 0  # was: epoch 1 ran t/2 merged steps


# Review sc: the callback counted the batches it hands to training_step only where attach had
# a loader counter. With several training loaders (attach gets data_loader=None) there is
# none, and the two-batch signal_skip_step accumulation above was charged one
# SubsampledGaussian per real step (the truth: AccumulatedSubsampledGaussian(σ, q, 2)).


class _TwoLoadersSkipStep(_SkipStep):
    """Two training loaders; two batches per real step (the first one's step is skipped)."""

    def __init__(self):
        super().__init__(allocation=False)

    def training_step(self, batch, batch_idx):
        (x1, y1), (x2, y2) = batch
        opt = self.optimizers()
        out = self.net(torch.cat([x1, x2]))
        self.manual_backward(nn.functional.cross_entropy(out, torch.cat([y1, y2])))
        opt.optimizer.signal_skip_step(do_skip=batch_idx % 2 == 0)
        opt.step()
        opt.zero_grad()

    def train_dataloader(self):
        return [DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=N // T),
                                              generator=torch.Generator().manual_seed(seed))
                for seed in (0, 1)]


def test_two_loaders_accumulated_batches_are_charged_as_four_draws():
    ledger = Ledger(delta=1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger, sample_rate=1.0 / T)],
                         accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, max_epochs=1)
    trainer.fit(_TwoLoadersSkipStep())
    # review lr: each batch holds one Poisson draw of each loader, both over the same records,
    # so a real step of two batches noises four draws (sc's fix charged two)
    four = M.AccumulatedSubsampledGaussian(SIGMA, 1.0 / T, 4)
    assert [r.mechanism for r in ledger.history] == [four] * 2  # was SubsampledGaussian × 2


# Review sc: with reload_dataloaders_every_n_epochs Lightning builds a new Poisson loader per
# epoch, but the charge read q from the loader attach saw: a loader reloaded at a higher rate
# (a batch-size curriculum) was charged at the first one's q.


class _Curriculum(_SkipStep):
    """One Poisson batch per step; the reloaded loader of epoch 1 samples at q = 1/2."""

    def __init__(self):
        super().__init__(allocation=False)
        self.automatic_optimization = True

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def train_dataloader(self):
        size = N // T if self.current_epoch == 0 else N // 2
        return DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=size),
                                             generator=torch.Generator().manual_seed(0))


def _fit_reloading(ledger, model, **callback):
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger, **callback)], accelerator="cpu",
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=2,
                         reload_dataloaders_every_n_epochs=1)
    trainer.fit(model)


def test_a_reloaded_loader_is_charged_at_its_own_rate():
    ledger = Ledger(delta=1e-5)
    _fit_reloading(ledger, _Curriculum())
    rates = [r.mechanism.sample_rate for r in ledger.history]
    assert rates == [1.0 / T] * T + [0.5] * 2  # was [1/T] * (T + 2)


def test_a_reloaded_loader_at_another_rate_than_a_given_one_is_refused():
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="train_dataloader"):
        _fit_reloading(ledger, _Curriculum(), sample_rate=1.0 / T)
    assert len(ledger.history) == T  # the first epoch only
