"""Review lr: a training loader Lightning reloads (``reload_dataloaders_every_n_epochs``) gets
the records check attach gives the loader it is handed (``_check_records``, issue 27): a
non-distributed Poisson sampler under DDP is refused and the Opacus #813 configuration warns,
before any step on the reloaded loader is charged. On main ``_follow_reload`` checked the
reloaded loader for Poisson sampling and its rate only."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations._sampling import NonPoissonSamplingError  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402
from privguard.integrations.opacus import SampleRateWarning  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore:.*does not have many workers.*",
                                        "ignore:.*accountant is.*")
N, T, SIGMA = 64, 4, 1.0
DATA = TensorDataset(torch.randn(N, 10, generator=torch.Generator().manual_seed(0)),
                     torch.zeros(N, dtype=torch.long))


def _loader(batch: int, sampler=None) -> DPDataLoader:
    return DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=batch, sampler=sampler),
                                         generator=torch.Generator().manual_seed(0))


class _Reloading(pl.LightningModule):
    """Epoch 0: a DPDataLoader over the whole dataset; epoch 1: the Opacus #813 configuration
    (a WeightedRandomSampler drawing 16 of the 64 records, batches of 8, behind
    DPDataLoader: q = 1/len(loader) = 1/2, an expected batch of 32)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                           noise_multiplier=SIGMA, max_grad_norm=1.0, expected_batch_size=N // T)

    def train_dataloader(self):
        if self.current_epoch == 0:
            return _loader(N // T)
        return _loader(8, WeightedRandomSampler(torch.ones(N), num_samples=16, replacement=True))


def test_a_reloaded_loader_in_the_opacus_813_configuration_warns_before_its_first_charge():
    ledger = Ledger(delta=1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=2,
                         reload_dataloaders_every_n_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SampleRateWarning)  # the warning stops the fit
        with pytest.raises(SampleRateWarning, match=r"q = 1/len\(loader\) = 0\.5"):
            trainer.fit(_Reloading())  # was: epoch 1 charged at q = 1/2, nothing said
    assert [r.mechanism.sample_rate for r in ledger.history] == [1.0 / T] * T  # epoch 0 only


def _optimizer() -> DPOptimizer:
    w = nn.Parameter(torch.zeros(2))
    return DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=SIGMA, max_grad_norm=1.0,
                       expected_batch_size=8)


def test_a_reloaded_non_distributed_poisson_loader_under_ddp_is_refused_as_attach_refuses(
        monkeypatch):
    import privguard.integrations.opacus as po

    first, reloaded = _loader(8), _loader(8)  # q = 1/8 each, neither distributed
    trainer = SimpleNamespace(optimizers=[_optimizer()], train_dataloader=first,
                              accumulate_grad_batches=1)
    ledger = Ledger(delta=1e-5)
    callback = LedgerCallback(ledger)
    callback.on_train_start(trainer, None)
    handle = callback.handle
    assert handle is not None
    # the fit's ranks (2, as on a rank of a DDP fit; the records check reads them)
    monkeypatch.setattr(po, "is_distributed", lambda optimizer: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    with pytest.raises(NonPoissonSamplingError) as attached:  # what attach says of it
        po._check_records(reloaded, handle.optimizer, ledger)
    trainer.train_dataloader = reloaded
    with pytest.raises(NonPoissonSamplingError) as caught:  # was: followed, charged at q
        callback.on_train_epoch_start(trainer, None)
    assert str(caught.value) == str(attached.value)
    assert "0.2344" in str(caught.value) and "charged q = 0.125" in str(caught.value)
    assert callback._loaders == [first] and len(ledger.history) == 0
    callback.on_exception(trainer, None, caught.value)


# Item 3 of review lr, kept and documented (docs/theory.md §15.3): a deep copy of a
# RandomAllocationSampler is the sampler, so an evaluation pass over a deep-copied training
# loader draws an epoch of the charged sampler, and the next training epoch's first step
# charges it with its own (an over-count). Not charging it would under-count a loop that steps
# on a batch it kept from that pass; this pins what the theory section states.


class _DeepCopiedValidation(_Reloading):
    def __init__(self):
        super().__init__()
        self.train_loader = None

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def train_dataloader(self):
        from privguard.integrations import RandomAllocationSampler

        self.train_loader = DataLoader(DATA, batch_sampler=RandomAllocationSampler(
            N, T, generator=torch.Generator().manual_seed(0)))
        return self.train_loader

    def val_dataloader(self):
        import copy

        return copy.deepcopy(self.train_loader)


def test_an_evaluation_pass_over_a_deep_copied_allocation_loader_is_charged_as_an_epoch():
    from privguard import mechanisms as M

    ledger = Ledger(delta=1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=3, num_sanity_val_steps=0)
    trainer.fit(_DeepCopiedValidation())
    assert [r.mechanism for r in ledger.history] == [
        M.RandomAllocation(SIGMA, T), M.RandomAllocation(SIGMA, T, epochs=2),
        M.RandomAllocation(SIGMA, T, epochs=2)]


# Review lr: several training loaders (attach gets none of them). Each batch Lightning hands
# to training_step holds one Poisson draw of every loader; over records they share, a step is
# len(loaders) draws. And their rates were checked against the charged q on a reload only.


class _TwoLoaders(_Reloading):
    """Two Poisson loaders over the same records, one step per batch (a pair of draws)."""

    def __init__(self, batches=(N // T, N // T)):
        super().__init__()
        self.batches = batches

    def training_step(self, batch, batch_idx):
        (x1, y1), (x2, y2) = batch
        return nn.functional.cross_entropy(self.net(torch.cat([x1, x2])), torch.cat([y1, y2]))

    def train_dataloader(self):
        return [_loader(b) for b in self.batches]


def _fit_two(ledger, model, **callback):
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger, **callback)], accelerator="cpu",
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=1)
    trainer.fit(model)


def test_a_batch_of_two_loaders_over_the_same_records_is_charged_as_two_draws():
    from privguard import mechanisms as M

    ledger = Ledger(delta=1e-5)
    _fit_two(ledger, _TwoLoaders(), sample_rate=1.0 / T)
    two = M.AccumulatedSubsampledGaussian(SIGMA, 1.0 / T, 2)
    assert [r.mechanism for r in ledger.history] == [two] * T  # was SubsampledGaussian × T


def test_a_second_loader_above_the_charged_rate_is_refused_at_the_start():
    ledger = Ledger(delta=1e-5)
    model = _TwoLoaders(batches=(N // T, N // 2))  # q = 1/4 and 1/2
    with pytest.raises(InvalidArgumentError, match=r"train_dataloader.*0\.5.*q = 0\.25"):
        _fit_two(ledger, model, sample_rate=1.0 / T)  # was: charged at q = 1/4
    assert len(ledger.history) == 0


def test_several_non_distributed_poisson_loaders_under_ddp_are_refused_at_the_start(monkeypatch):
    import privguard.integrations.opacus as po

    monkeypatch.setattr(po, "is_distributed", lambda optimizer: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    optimizer = _optimizer()
    trainer = SimpleNamespace(optimizers=[optimizer], train_dataloader=[_loader(8), _loader(8)],
                              accumulate_grad_batches=1)
    ledger = Ledger(delta=1e-5)
    callback = LedgerCallback(ledger, sample_rate=0.125)
    with pytest.raises(NonPoissonSamplingError, match=r"0\.2344.*charged q = 0\.125"):
        callback.on_train_start(trainer, None)  # was: attached, each step charged at q
    assert callback.handle is None and optimizer.step_hook is None and len(ledger.history) == 0
