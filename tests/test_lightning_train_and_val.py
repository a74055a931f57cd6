"""Review rwl: the common Lightning fit, one Poisson training loader and a validation loader,
with ``reload_dataloaders_every_n_epochs`` and the witnesses on. lr charged a batch of L
training loaders as L draws and follows reloaded loaders; this pins that the common case is
charged one draw of q per step (no over-charge from the validation loader or the reload) and
is not refused."""

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

from privguard import Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = QUIET
N, T, SIGMA = 64, 4, 1.0
DATA = TensorDataset(torch.randn(N, 10, generator=torch.Generator().manual_seed(0)),
                     torch.zeros(N, dtype=torch.long))


class _TrainAndVal(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1), noise_multiplier=SIGMA,
                           max_grad_norm=1.0, expected_batch_size=N // T)

    def train_dataloader(self):  # a new DPDataLoader at every reload
        return DPDataLoader.from_data_loader(
            DataLoader(DATA, batch_size=N // T),
            generator=torch.Generator().manual_seed(self.current_epoch))

    def val_dataloader(self):
        return DataLoader(DATA, batch_size=16)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_training_loader_and_a_validation_loader_are_charged_one_draw_per_batch(accumulate):
    ledger = Ledger(50.0, 1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger, witnesses=True)], accelerator="cpu",
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=2,
                         reload_dataloaders_every_n_epochs=1, accumulate_grad_batches=accumulate,
                         num_sanity_val_steps=1)
    trainer.fit(_TrainAndVal())
    steps = [r.mechanism for r in ledger.history if not isinstance(r.mechanism, M.DeltaReserve)]
    one = M.SubsampledGaussian(SIGMA, 1.0 / T) if accumulate == 1 else \
        M.AccumulatedSubsampledGaussian(SIGMA, 1.0 / T, accumulate)
    assert steps == [one] * (2 * T // accumulate)
