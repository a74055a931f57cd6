"""Shared by the task adv7 tests: a one-epoch Lightning fit charged by a LedgerCallback,
and the Poisson loader their manual-optimization modules train on. Import it after
``pytest.importorskip("lightning.pytorch")``."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, Dataset

from privguard import Ledger
from privguard.integrations.lightning import LedgerCallback


def fit_one_epoch(ledger: Ledger, model: pl.LightningModule) -> pl.Trainer:
    """Fit ``model`` for one epoch on CPU with ``LedgerCallback(ledger)``; the trainer."""
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_epochs=1)
    trainer.fit(model)
    return trainer


def poisson_loader(data: Dataset, batch: int) -> DataLoader:
    """Opacus' Poisson loader over ``data`` at the expected ``batch`` size, seeded."""
    return DPDataLoader.from_data_loader(DataLoader(data, batch_size=batch),
                                         generator=torch.Generator().manual_seed(0))
