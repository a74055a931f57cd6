"""Loaders are accepted only where q is each record's draw probability; the rest refused by name."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.utils.data import DataLoader, Subset, TensorDataset, WeightedRandomSampler

from privguard import InvalidArgumentError, Ledger
from privguard.integrations._sampling import check_poisson
from privguard.integrations.opacus import NonPoissonSamplingError, attach

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
DATA = TensorDataset(torch.zeros(64, 2))


@pytest.mark.parametrize("loader,what", [
    (DataLoader(DATA, batch_size=8, shuffle=True), "shuffled loader"),
    (DataLoader(DATA, batch_size=8), "sequential loader"),
    (DataLoader(DATA, batch_size=8, sampler=WeightedRandomSampler([1.0] * 64, 64)),
     "WeightedRandomSampler"),
    (DataLoader(DATA, batch_sampler=[[0, 1], [2, 3]]), "does not know (list)"),
    (DataLoader(DATA, batch_size=8, sampler=[3, 1, 2]), "does not know (list)"),
])
def test_unaccounted_loaders_are_refused_by_name_with_both_alternatives(loader, what):
    with pytest.raises(NonPoissonSamplingError) as info:
        check_poisson(loader)
    message = str(info.value)
    assert what in message
    assert "DPDataLoader" in message and "RandomAllocationSampler" in message


def test_a_subset_whose_size_the_sampler_ignores_is_refused_with_both_numbers():
    loader = DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=8))
    assert check_poisson(loader) == 0.125
    # a Poisson sampler built for the whole dataset in front of a 16-record Subset
    sampler = UniformWithReplacementSampler(num_samples=64, sample_rate=0.125)
    loader = DataLoader(Subset(DATA, range(16)), batch_sampler=sampler)
    with pytest.raises(NonPoissonSamplingError, match="from 64 samples but its dataset has 16"):
        check_poisson(loader)


def test_a_hand_set_rate_that_differs_from_the_loader_is_refused_with_both_numbers():
    loader = DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=8))
    w = torch.nn.Parameter(torch.zeros(2))
    opt = DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=8)
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match=r"0\.01.*0\.125|sample_rate=0\.01"):
        attach(opt, ledger, sample_rate=0.01, data_loader=loader)
    assert len(ledger.history) == 0
    attach(opt, ledger, sample_rate=0.125, data_loader=loader).detach()  # the same q: fine
