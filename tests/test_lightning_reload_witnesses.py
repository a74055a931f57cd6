"""Review lr, item 2: ``LedgerCallback(witnesses=True)`` and a training loader Lightning reloads
(``reload_dataloaders_every_n_epochs``). The sampling witness follows the new loader (its
dataset size, its batch sampler for the per-record counts, the micro-batch counter), each
test's level index carried over so that the run still spends Σ_j α_j ≤ α per test
(docs/theory.md §16.2); where it cannot follow it refuses before any step on the new loader.
A witness left on the first loader tested the new loader's batches against the first
dataset's size and refused a correct pipeline."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from _lightning_quiet import QUIET  # noqa: E402
from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations._witnesses import Witnesses  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = QUIET
SIGMA, Q = 1.0, 0.25


def _data(n: int) -> TensorDataset:
    x = torch.randn(n, 10, generator=torch.Generator().manual_seed(n))
    return TensorDataset(x, (x[:, 0] > 0).long())


def _loader(n: int) -> DPDataLoader:  # q = 1/4 over n records
    return DPDataLoader.from_data_loader(DataLoader(_data(n), batch_size=n // 4),
                                         generator=torch.Generator().manual_seed(n))


class _Growing(pl.LightningModule):
    """Epoch 0 samples 16 records at q = 1/4, the reloaded loader of epoch 1 256 at q = 1/4."""

    def __init__(self, sizes=(16, 256)):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))
        self.sizes = sizes

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1), noise_multiplier=SIGMA,
                           max_grad_norm=1.0, expected_batch_size=4)

    def train_dataloader(self):
        return _loader(self.sizes[min(self.current_epoch, len(self.sizes) - 1)])


def _fit(ledger, model, epochs=2):
    callback = LedgerCallback(ledger, witnesses=True)
    trainer = pl.Trainer(callbacks=[callback], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=epochs,
                         reload_dataloaders_every_n_epochs=1)
    seen = []
    original = Witnesses.check

    def spy(self, mechanism):  # the N each step's batch is tested against
        seen.append(self.dataset_size)
        return original(self, mechanism)

    Witnesses.check = spy
    try:
        trainer.fit(model)
    finally:
        Witnesses.check = original
    return trainer, seen


def test_the_sampling_witness_follows_a_reloaded_loader_to_its_dataset():
    ledger = Ledger(8.0, 1e-5)
    _, seen = _fit(ledger, _Growing())
    assert seen == [16] * 4 + [256] * 4  # a witness left on the first loader refused step 5
    steps = [r.mechanism for r in ledger.history if isinstance(r.mechanism, M.SubsampledGaussian)]
    assert steps == [M.SubsampledGaussian(SIGMA, Q)] * 8
    assert sum(isinstance(r.mechanism, M.DeltaReserve) for r in ledger.history) == 1


class _Unsized(TensorDataset):
    """A dataset whose size stops being known once its loader is built (a stream)."""

    sized = True

    def __len__(self):
        if not self.sized:
            raise TypeError("a stream has no len()")
        return super().__len__()


def test_a_reloaded_loader_the_witness_cannot_follow_is_refused_before_its_steps():
    class _Streaming(_Growing):
        def train_dataloader(self):
            if self.current_epoch == 0:
                return _loader(16)
            data = _Unsized(*_data(16).tensors)
            loader = DPDataLoader.from_data_loader(DataLoader(data, batch_size=4))
            data.sized = False
            return loader

    ledger = Ledger(8.0, 1e-5)
    with pytest.raises(InvalidArgumentError, match="dataset of known size"):
        _fit(ledger, _Streaming())
    assert sum(isinstance(r.mechanism, M.SubsampledGaussian) for r in ledger.history) == 4


def _step(opt, model, batch):
    x, y = batch
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_follow_carries_each_test_index_over_and_restores_the_old_sampler():
    model = GradSampleModule(nn.Linear(10, 2))
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=SIGMA,
                      max_grad_norm=1.0, expected_batch_size=4)
    first, second = _loader(16), _loader(64)
    handle = attach(opt, Ledger(8.0, 1e-5), data_loader=first, witnesses=True,
                    check_poisson=False)
    witnesses = handle.witnesses
    assert witnesses is not None and witnesses.inclusion is not None
    for _ in range(3):
        for batch in first:
            _step(opt, model, batch)
    tests, steps, checks = witnesses.inclusion.tests, witnesses.steps, witnesses.noise_checks
    assert tests >= 1
    old_class = type(first.batch_sampler)
    witnesses.follow(second, None)
    assert type(first.batch_sampler) is not old_class  # the recording subclass is undone
    assert witnesses.inclusion.sampler is second.batch_sampler
    assert (witnesses.inclusion.tests, witnesses.steps, witnesses.noise_checks) == \
        (tests, steps, checks)  # the levels α_j go on from the j reached
    assert witnesses.dataset_size == 64
    handle.detach()


class _Allocated(_Growing):
    """A RandomAllocationSampler loader over 64 records (t = 4), rebuilt for every epoch."""

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1), noise_multiplier=SIGMA,
                           max_grad_norm=1.0, expected_batch_size=16)

    def train_dataloader(self):
        from privguard.integrations import RandomAllocationSampler

        return DataLoader(_data(64), batch_sampler=RandomAllocationSampler(
            64, 4, generator=torch.Generator().manual_seed(self.current_epoch)))


class _Watching(LedgerCallback):
    """Records, after each step, the sampler the allocation witness watches, the training
    loader's, and the witness's count of epochs tested."""

    seen: list

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        allocation = self.handle.witnesses.allocation
        self.seen.append((allocation.sampler, trainer.train_dataloader.batch_sampler,
                          allocation.tests))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def test_the_allocation_witness_follows_a_rebuilt_sampler_with_its_epoch_count():
    ledger = Ledger(8.0, 1e-5)
    callback = _Watching(ledger, witnesses=True)
    callback.seen = []
    trainer = pl.Trainer(callbacks=[callback], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=3,
                         reload_dataloaders_every_n_epochs=1)
    trainer.fit(_Allocated())
    epochs = [r.mechanism for r in ledger.history if isinstance(r.mechanism, M.RandomAllocation)]
    assert epochs == [M.RandomAllocation(SIGMA, 4)] * 3
    assert all(watched is loader for watched, loader, _ in callback.seen)  # was: the first
    tests = [count for *_, count in callback.seen]
    assert tests == sorted(tests) and tests[-1] >= 2  # the epoch count goes on across samplers
