"""The Lightning callback on a tiny model: charges, logs ε, stops, checkpoints."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl  # noqa: E402  (privguard[lightning], installed by the test extra)

from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402

from privguard import Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, BATCH = 512, 32


class Tiny(pl.LightningModule):
    def __init__(self, noise: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))
        self.noise = noise
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
        return DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=BATCH))


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
