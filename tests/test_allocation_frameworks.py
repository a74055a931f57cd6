"""Random allocation under the Lightning and Hugging Face callbacks (issue 27 item 2).

Each epoch of a RandomAllocationSampler loader is charged whole, RandomAllocation(σ, t),
before its first step: the filter admits the epoch or nothing of it runs; an epoch stopped
early stays charged; σ changed inside an epoch is refused. Small real Trainer runs.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")
transformers = pytest.importorskip("transformers")

import test_huggingface  # noqa: E402  (its Pairs data set and Tiny model)
from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations import RandomAllocationSampler  # noqa: E402
from privguard.integrations.huggingface import LedgerTrainerCallback  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, T, SIGMA = test_huggingface.N, 4, 1.0  # its Pairs data set
EPOCH = M.RandomAllocation(SIGMA, T)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 10, generator=g)
    return x, (x[:, 0] > 0).long()


def _sampler():
    return RandomAllocationSampler(N, T, generator=torch.Generator().manual_seed(0))


def _admitting(epochs: int) -> Ledger:
    """A filter ledger that admits exactly ``epochs`` epochs of EPOCH."""
    for eps in [0.05 * 1.05 ** i for i in range(200)]:
        ledger = Ledger(eps, 1e-5)
        if ledger.remaining(EPOCH).repeats == epochs:
            return ledger
    raise AssertionError(f"no target admits exactly {epochs} epochs")


def _params(module):
    return [p.detach().clone() for p in module.parameters()]


# ------------------------------------------------------------------------- Lightning
class Tiny(pl.LightningModule):
    def __init__(self, extra_loader: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))
        self.data = TensorDataset(*_data())
        self.extra_loader = extra_loader
        self.snapshots: list = []  # parameters after each batch

    def training_step(self, batch, batch_idx):
        x, y = batch[0] if self.extra_loader else batch
        return nn.functional.cross_entropy(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.snapshots.append(_params(self.net))

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                           noise_multiplier=SIGMA, max_grad_norm=1.0,
                           expected_batch_size=N // T)

    def train_dataloader(self):
        loader = DataLoader(self.data, batch_sampler=_sampler())
        if self.extra_loader:
            return [loader, DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=8))]
        return loader


def _fit(ledger, model=None, callbacks=(), **kw):
    model = model or Tiny()
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger), *callbacks], accelerator="cpu",
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, **kw)
    trainer.fit(model)
    return trainer, model


def test_lightning_charges_each_epoch_once_before_its_first_step():
    ledger = Ledger(delta=1e-5)
    trainer, _ = _fit(ledger, max_epochs=3)
    assert trainer.global_step == 3 * T
    assert [r.mechanism for r in ledger.history] == [EPOCH] * 3


class _Workers(Tiny):
    def train_dataloader(self):
        return DataLoader(self.data, batch_sampler=_sampler(), num_workers=1,
                          persistent_workers=True)


def test_lightning_a_loader_with_workers_is_charged_each_epoch_once():
    """Review ra: Lightning makes the loader's iterator before on_train_start, and with
    workers that draws the first epoch; attach refused it (review rz), so no fit with a
    worker loader could run. It is charged at its first step instead."""
    ledger = Ledger(delta=1e-5)
    trainer, _ = _fit(ledger, model=_Workers(), max_epochs=2)
    assert trainer.global_step == 2 * T
    assert [r.mechanism for r in ledger.history] == [EPOCH] * 2


def test_lightning_a_loader_reloaded_every_epoch_is_charged_each_epoch_once():
    """Review ra: with reload_dataloaders_every_n_epochs=1 Lightning builds a new loader (a
    new sampler) each epoch; the charges watched the first one, and the second epoch's fifth
    step was refused as more than t steps of its last epoch."""
    ledger = Ledger(delta=1e-5)
    trainer, _ = _fit(ledger, max_epochs=3, reload_dataloaders_every_n_epochs=1)
    assert trainer.global_step == 3 * T
    assert [r.mechanism for r in ledger.history] == [EPOCH] * 3


def test_lightning_an_epoch_stopped_early_stays_charged_in_full():
    ledger = Ledger(delta=1e-5)
    trainer, _ = _fit(ledger, max_steps=T + 1)  # one step into the second epoch
    assert trainer.global_step == T + 1
    assert [r.mechanism for r in ledger.history] == [EPOCH] * 2


def test_lightning_an_epoch_the_filter_refuses_runs_nothing():
    # a budget below one epoch: its first step is refused before its update, and training stops
    ledger = _admitting(0)
    model = Tiny()
    initial = _params(model.net)
    trainer, model = _fit(ledger, model=model, max_epochs=5)
    assert len(ledger.history) == 0 and trainer.should_stop
    assert len(model.snapshots) == 1
    assert all(torch.equal(a, b) for a, b in zip(initial, model.snapshots[0]))
    # a budget of one epoch: the second is foreseen refused after the first's last step
    ledger = _admitting(1)
    trainer, model = _fit(ledger, max_epochs=5)
    assert [r.mechanism for r in ledger.history] == [EPOCH]
    assert trainer.should_stop and len(model.snapshots) == trainer.global_step == T


class _ChangeSigma(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:
            trainer.optimizers[0].noise_multiplier = 2 * SIGMA


def test_lightning_sigma_changed_inside_an_epoch_is_refused():
    ledger = Ledger(delta=1e-5)
    model = Tiny()
    with pytest.raises(InvalidArgumentError, match="changed inside a random-allocation epoch"):
        _fit(ledger, model=model, callbacks=[_ChangeSigma()], max_epochs=2)
    assert [r.mechanism for r in ledger.history] == [EPOCH]
    assert len(model.snapshots) == 2


def test_lightning_an_allocation_loader_beside_another_loader_is_refused():
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="single training loader"):
        _fit(ledger, model=Tiny(extra_loader=True), max_epochs=1)
    assert len(ledger.history) == 0


def test_lightning_accumulated_batches_of_an_allocation_loader_are_refused():
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="under-counts"):
        _fit(ledger, max_epochs=1, accumulate_grad_batches=2)
    assert len(ledger.history) == 0


# ------------------------------------------------------------------------- Hugging Face
class AllocationTrainer(transformers.Trainer):
    """Feeds random-allocation batches (privguard's RandomAllocationSampler)."""

    def get_train_dataloader(self):
        return DataLoader(self.train_dataset, batch_sampler=_sampler(),
                          collate_fn=transformers.default_data_collator)


def _hf(tmp_path, ledger, **kw):
    torch.manual_seed(0)
    model = GradSampleModule(test_huggingface.Tiny())
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=SIGMA,
                      max_grad_norm=1.0, expected_batch_size=N // T)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=N // T, logging_steps=1,
        report_to=[], use_cpu=True, remove_unused_columns=False, disable_tqdm=True,
        save_strategy="no", **kw)
    return AllocationTrainer(model=model, args=args, train_dataset=test_huggingface.Pairs(),
                             optimizers=(opt, None), callbacks=[LedgerTrainerCallback(ledger)])


def test_huggingface_charges_each_epoch_once_and_an_early_stop_stays_charged(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer = _hf(tmp_path, ledger, max_steps=T + 1)
    trainer.train()
    assert trainer.state.global_step == T + 1
    assert [r.mechanism for r in ledger.history] == [EPOCH] * 2


def test_huggingface_an_epoch_the_filter_refuses_runs_nothing(tmp_path):
    ledger = _admitting(1)
    trainer = _hf(tmp_path, ledger, num_train_epochs=4)
    trainer.train()
    assert [r.mechanism for r in ledger.history] == [EPOCH]
    assert trainer.state.global_step == T  # epoch 2 foreseen refused: none of it ran


def test_huggingface_accumulation_on_an_allocation_loader_is_refused(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer = _hf(tmp_path, ledger, max_steps=2, gradient_accumulation_steps=2)
    with pytest.raises(InvalidArgumentError, match="under-counts"):
        trainer.train()
    assert len(ledger.history) == 0


class _WeightedTiny(Tiny):
    def train_dataloader(self):  # the Opacus #813 shape: 32 of the N records per epoch
        few = torch.utils.data.WeightedRandomSampler([1.0] * N, 32)
        return DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=8, sampler=few))


def test_lightning_warns_on_the_opacus_813_configuration():
    from privguard.integrations.opacus import SampleRateWarning

    with pytest.warns(SampleRateWarning, match=r"q = 1/len\(loader\) = 0\.25 .*batch size 8"):
        _fit(Ledger(delta=1e-5), model=_WeightedTiny(), max_steps=1)


def test_under_ddp_an_allocation_loader_is_refused_with_what_is_missing(monkeypatch):
    """attach (which both callbacks call) refuses it before anything is charged or installed."""
    import privguard.integrations.opacus as po

    monkeypatch.setattr(po, "is_distributed", lambda optimizer: True)
    w = nn.Parameter(torch.zeros(2))
    opt = DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=SIGMA, max_grad_norm=1.0,
                      expected_batch_size=N // T)
    loader = DataLoader(TensorDataset(*_data()), batch_sampler=_sampler())
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match=r"each rank would draw its own allocation.*"
                                                   "DistributedRandomAllocationSampler"):
        po.attach(opt, ledger, data_loader=loader)
    assert len(ledger.history) == 0 and opt.step_hook is None


def test_a_rank_share_sampler_without_a_distributed_optimizer_is_refused(monkeypatch):
    """The shares of one allocation are one epoch only when the ranks' sums are added."""
    from privguard.integrations import DistributedRandomAllocationSampler
    from privguard.integrations.opacus import attach

    with pytest.raises(InvalidArgumentError, match="needs a process group"):
        DistributedRandomAllocationSampler(N, T)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 1)
    sampler = DistributedRandomAllocationSampler(N, T)
    w = nn.Parameter(torch.zeros(2))
    opt = DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=SIGMA, max_grad_norm=1.0,
                      expected_batch_size=N // T)
    loader = DataLoader(TensorDataset(*_data()), batch_sampler=sampler)
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match=r"only its share \(1/2\)"):
        attach(opt, ledger, data_loader=loader)
    assert len(ledger.history) == 0 and opt.step_hook is None
