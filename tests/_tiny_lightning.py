"""A tiny LightningModule under Opacus (DPOptimizer, Poisson DPDataLoader): 128 rows of 4
features in expected batches of 16, σ = 1, clipping 1. Shared by test_review_cbk and
test_rewind_lrw; import it after ``pytest.importorskip("lightning.pytorch")``."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N, BATCH = 128, 16


class TinyDP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = GradSampleModule(nn.Linear(4, 2))
        x = torch.randn(N, 4, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, (x[:, 0] > 0).long())

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1), noise_multiplier=1.0,
                           max_grad_norm=1.0, expected_batch_size=BATCH)

    def train_dataloader(self):
        return DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=BATCH))
