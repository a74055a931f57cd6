"""Review radv6: adv6 gave the Lightning callback a one-batch-ahead allowance for every
loader, but Lightning's fetcher draws ahead only from a loader it cannot take len() of. With
the allowance, a step that pairs its batch with one it drew from the loader itself (two
batches through one backward(), docs/theory.md §14.9) passed: the drawn batch was held as
if Lightning had fetched it ahead, the step charged and applied, and only the next refused.
A sized loader gets no allowance now: the first paired step is refused before its charge.
"""

from __future__ import annotations

import warnings

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, BATCH = 256, 16


class Paired(pl.LightningModule):
    """From the second epoch (Lightning's first epoch iterator predates attach, so its
    batches are not counted), each step adds a second batch drawn from the loader."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(10, 2))
        x = torch.randn(N, 10)
        self.data = TensorDataset(x, (x[:, 0] > 0).long())
        self.loader = None
        self.extra = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.current_epoch >= 1:
            if self.extra is None:
                self.extra = iter(self.loader)
            x2, y2 = next(self.extra)
            loss = loss + nn.functional.cross_entropy(self.net(x2), y2)
        return loss

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1), noise_multiplier=1.0,
                           max_grad_norm=1.0, expected_batch_size=BATCH)

    def train_dataloader(self):
        self.loader = DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=BATCH))
        return self.loader


def test_a_lightning_step_pairing_a_batch_it_drew_is_refused_before_its_charge():
    ledger = Ledger(delta=1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=2)
    with pytest.raises(InvalidArgumentError, match="one backward"):
        trainer.fit(Paired())
    # the first epoch's steps only: adv6 charged (and applied) the first paired step too
    assert len(ledger.history) == N // BATCH
