"""A small make_private pipeline and one step of it (helpers for the attach tests)."""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard.integrations.opacus import attach


def private(batch_size: int = 8, rows: int = 64, **kwargs):
    """(model, optimizer, Poisson loader) of make_private: ``rows`` rows, q = batch_size / rows
    (with a criterion before the loader under ghost clipping); ``kwargs`` to make_private."""
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(rows, 4), torch.randint(0, 2, (rows,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    kwargs.setdefault("max_grad_norm", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivacyEngine(accountant="rdp").make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=batch_size), noise_multiplier=1.0,
            **kwargs)


def step(model, opt, loader) -> None:
    """One real step on the loader's next non-empty batch."""
    for x, y in loader:
        if len(x):
            break
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def quiet_attach(opt, ledger, **kwargs):
    """``attach`` with its warnings silenced (the tests are about the charge)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attach(opt, ledger, **kwargs)
