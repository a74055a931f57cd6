"""A tiny Opacus setup shared by the bad-input sweeps (test_bad_input_bd, test_bad_input_bs)."""

from __future__ import annotations

import warnings

import pytest


def private_linear(accountant: str = "prv"):
    """(model, optimizer, loader) of ``make_private`` on a 2-to-1 linear model, 20 rows in
    batches of 5, σ = 1, clipping 1; skips the test without torch or Opacus."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(2, 1)
    loader = DataLoader(TensorDataset(torch.randn(20, 2), torch.randn(20, 1)), batch_size=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivacyEngine(accountant=accountant).make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)
