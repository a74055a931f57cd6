"""The Lightning callback on a tiny model: charges, logs ε, stops, checkpoints."""

from __future__ import annotations

import pickle
import warnings

import lightning.pytorch as pl
import pytest
import torch
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.integrations.lightning import LedgerCallback
from privguard.integrations.opacus import NonPoissonSamplingError, attach

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, BATCH = 512, 32


class Tiny(pl.LightningModule):
    def __init__(self, noise: float = 1.0, poisson: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))
        self.noise = noise
        self.poisson = poisson
        x = torch.randn(N, 10)
        self.data = TensorDataset(x, (x[:, 0] > 0).long())

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                           noise_multiplier=self.noise, max_grad_norm=1.0,
                           expected_batch_size=BATCH)

    def train_dataloader(self):
        plain = DataLoader(self.data, batch_size=BATCH, shuffle=True)
        return DPDataLoader.from_data_loader(plain) if self.poisson else plain


def trainer(cb, **kw):
    return pl.Trainer(callbacks=[cb], accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, **kw)


def test_charges_logs_and_stops_at_exhaustion():
    step = M.SubsampledGaussian(1.0, BATCH / N)
    ledger = Ledger(3.0, 1e-5, plan=step)
    allowed = ledger.remaining(step).repeats
    cb = LedgerCallback(ledger)
    t = trainer(cb, max_epochs=100)
    t.fit(Tiny())
    assert len(ledger.history) == allowed == t.global_step
    assert t.should_stop
    assert t.callback_metrics["privacy/epsilon"].item() == pytest.approx(ledger.epsilon())


def test_state_round_trips_through_a_checkpoint(tmp_path):
    ledger = Ledger(delta=1e-5)
    cb = LedgerCallback(ledger)
    t = trainer(cb, max_steps=5)
    model = Tiny()
    t.fit(model)
    path = tmp_path / "last.ckpt"
    t.save_checkpoint(path)
    fresh = LedgerCallback(Ledger(delta=1e-5))
    t2 = trainer(fresh, max_steps=8)
    t2.fit(Tiny(), ckpt_path=path)
    assert len(fresh.ledger.history) == 8  # 5 restored + 3 new
    assert [r.index for r in fresh.ledger.history] == list(range(8))


def test_a_plain_shuffled_loader_is_refused_before_any_step():
    ledger = Ledger(delta=1e-5)
    model = Tiny(poisson=False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonPoissonSamplingError) as info:
        trainer(LedgerCallback(ledger), max_steps=3).fit(model)
    assert info.value.argument == "train_dataloader"
    assert len(ledger.history) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opted_out = Ledger(delta=1e-5)
    trainer(LedgerCallback(opted_out, check_poisson=False), max_steps=3).fit(Tiny(poisson=False))
    assert len(opted_out.history) == 3  # the explicit, documented opt-out


def _fit_and_save(tmp_path, ledger, steps=5):
    t = trainer(LedgerCallback(ledger), max_steps=steps)
    t.fit(Tiny())
    path = tmp_path / "at5.ckpt"
    t.save_checkpoint(path)
    return path


def test_a_resume_never_rewinds_and_refuses_a_foreign_ledger(tmp_path):
    ledger = Ledger(delta=1e-5)
    path = _fit_and_save(tmp_path, ledger)
    trainer(LedgerCallback(ledger), max_steps=3).fit(Tiny())  # 3 more steps, same ledger
    assert len(ledger.history) == 8
    cb = LedgerCallback(ledger)
    trainer(cb, max_steps=7).fit(Tiny(), ckpt_path=path)  # back to step 5, then 2 steps
    assert len(ledger.history) == 10  # not rewound to 5: the 3 later steps stay spent
    foreign = Ledger(delta=1e-5)
    foreign.charge(M.Gaussian(5.0), label="another run")
    with pytest.raises(LedgerStateError):
        trainer(LedgerCallback(foreign), max_steps=7).fit(Tiny(), ckpt_path=path)
    assert len(foreign.history) == 1


def test_a_file_backed_ledger_resumes_from_its_file(tmp_path):
    db = str(tmp_path / "ledger.db")
    path = _fit_and_save(tmp_path, Ledger(delta=1e-5, path=db, lease=1))  # exact counts
    with pytest.raises(LedgerStateError, match=r"ledger\.db"):
        trainer(LedgerCallback(Ledger(delta=1e-5)), max_steps=8).fit(Tiny(), ckpt_path=path)
    reopened = Ledger(delta=1e-5, path=db, lease=1)
    trainer(LedgerCallback(reopened), max_steps=8).fit(Tiny(), ckpt_path=path)
    assert len(Ledger.open(db).history) == 8


def test_the_callback_pickles_without_its_live_attachment():
    ledger = Ledger(delta=1e-5)
    model = Tiny()
    cb = LedgerCallback(ledger)
    cb.handle = attach(model.configure_optimizers(), ledger, sample_rate=BATCH / N,
                       check_poisson=False)
    ledger.charge(M.SubsampledGaussian(1.0, BATCH / N), label="step")
    copy = pickle.loads(pickle.dumps(cb))
    assert copy.handle is None and cb.handle is not None
    assert [r.mechanism for r in copy.ledger.history] == [r.mechanism for r in ledger.history]


def test_bad_arguments():
    for kwargs, name in [({"check_poisson": 1}, "check_poisson"), ({"label": None}, "label"),
                         ({"log_name": 3}, "log_name")]:
        with pytest.raises(InvalidArgumentError) as info:
            LedgerCallback(Ledger(delta=1e-5), **kwargs)
        assert info.value.argument == name
    with pytest.raises(InvalidArgumentError, match="ledger"):
        LedgerCallback("not a ledger")


def test_accumulate_grad_batches_is_charged_as_accumulation():
    # issue 27: accumulate_grad_batches=2 is two Poisson micro-batches per optimizer step
    ledger = Ledger(delta=1e-5)
    t = trainer(LedgerCallback(ledger), max_steps=3, accumulate_grad_batches=2)
    t.fit(Tiny())
    assert t.global_step == 3
    assert [r.mechanism for r in ledger.history] == [
        M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2)] * 3


def test_accumulate_grad_batches_under_a_hybrid_ledger_with_the_plan():
    # issue 27 (docs/theory.md §2b.1, §14.2): the PLD envelope of an accumulated step is
    # proved for aligned=True only; the callback charges the default (it cannot see
    # dropout or augmentation): a default plan is refused under the hybrid filter, and
    # under an aligned plan the charges are outside, so part A closes
    from privguard import Plan

    step = M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2)
    with pytest.raises(InvalidArgumentError, match="aligned=True"):
        Ledger(epsilon=8.0, delta=1e-5, plan=Plan(step, steps=3), filter="hybrid")
    aligned = M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2, aligned=True)
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(aligned, steps=3), filter="hybrid")
    t = trainer(LedgerCallback(ledger), max_steps=3, accumulate_grad_batches=2)
    with pytest.warns(UserWarning, match="left the plan"):
        t.fit(Tiny())
    assert [r.mechanism for r in ledger.history] == [step] * 3
    assert not ledger._acc.filter.a_alive
