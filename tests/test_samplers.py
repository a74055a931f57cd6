"""Loaders are accepted only where q is each record's draw probability; the rest refused by name."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.utils.data import DataLoader, Subset, TensorDataset, WeightedRandomSampler

from privguard import InvalidArgumentError, Ledger, RDPCurve
from privguard import mechanisms as M
from privguard._accounting._results import upper
from privguard.integrations import _samplers
from privguard.integrations._sampling import check_poisson
from privguard.integrations.opacus import NonPoissonSamplingError, SampleRateWarning, attach

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


# ---- issue 27 item 3, the rest: sharding in front of / around a Poisson sampler; Opacus #813

def _opt(sigma=1.0):
    w = torch.nn.Parameter(torch.zeros(2))
    return DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=sigma, max_grad_norm=1.0,
                       expected_batch_size=8)


def test_a_non_distributed_poisson_sampler_under_ddp_is_refused_with_both_numbers(monkeypatch):
    import privguard.integrations.opacus as po

    loader = DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=8))  # q = 1/8
    assert _samplers.distributed_mismatch(loader, 1) is None
    text = _samplers.distributed_mismatch(loader, 2)
    assert "q = 0.125" in text and "0.2344" in text  # 1 − (1 − 1/8)² = 0.234375
    # attach on a rank of a 2-process group: refused before anything is charged or installed
    monkeypatch.setattr(po, "is_distributed", lambda optimizer: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    ledger, opt = Ledger(delta=1e-5), _opt()
    with pytest.raises(NonPoissonSamplingError, match=r"0\.2344.*charged q = 0\.125"):
        attach(opt, ledger, data_loader=loader)
    assert len(ledger.history) == 0 and opt.step_hook is None


def test_a_sharding_wrapper_around_a_poisson_sampler_is_refused_with_both_numbers():
    shard = pytest.importorskip("accelerate.data_loader").BatchSamplerShard
    poisson = UniformWithReplacementSampler(num_samples=64, sample_rate=0.125)
    dealt = DataLoader(DATA, batch_sampler=shard(poisson, num_processes=2, process_index=0))
    with pytest.raises(NonPoissonSamplingError, match=r"probability 0\.2344 .*q = 0\.125"):
        check_poisson(dealt)


def _issue_813(n=100_000, drawn=128, batch=16):
    """The reproducer of Opacus #813 (make_private_with_epsilon behind a WeightedRandomSampler)."""
    from opacus import PrivacyEngine

    data = TensorDataset(torch.zeros(n, 2), torch.zeros(n, dtype=torch.long))
    sampler = WeightedRandomSampler(torch.ones(n), num_samples=drawn, replacement=True)
    model = torch.nn.Linear(2, 2)
    _, opt, loader = PrivacyEngine(accountant="rdp").make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=batch, sampler=sampler), target_epsilon=8.0,
        target_delta=1e-5, epochs=1, max_grad_norm=1.0)
    return opt, loader


def test_the_opacus_813_configuration_warns_at_attach_with_both_numbers_and_the_cost():
    opt, loader = _issue_813()
    assert loader.sample_rate == 0.125  # Opacus' 1/len(loader): 8 batches of 16
    ledger = Ledger(8.0, 1e-5)
    with pytest.warns(SampleRateWarning) as caught:
        handle = attach(opt, ledger, data_loader=loader)
    text = str(caught[0].message)
    assert "q = 1/len(loader) = 0.125" in text and "0.00016" in text and "781×" in text
    assert "WeightedRandomSampler drew 128 of the 100000" in text
    epoch = M.SubsampledGaussian(opt.noise_multiplier, 0.125, steps=8)
    eps = RDPCurve._trusted(ledger.orders, epoch.rdp(ledger.orders)).epsilon(1e-5)
    assert f"costs ε = {upper(eps, '.4g')}" in text  # rounded up (review rlo2)
    assert f"admits {ledger.remaining(M.SubsampledGaussian(opt.noise_multiplier, 0.125)).repeats}"\
        in text
    assert handle.next_mechanism() == M.SubsampledGaussian(opt.noise_multiplier, 0.125)  # honest
    handle.detach()


@pytest.mark.parametrize("plain", [
    DataLoader(DATA, batch_size=8), DataLoader(DATA, batch_size=8, shuffle=True),
    DataLoader(DATA, batch_size=24),  # q = 1/3: expected batch 21.3 ≤ 24
    DataLoader(DATA, batch_size=8, sampler=WeightedRandomSampler([1.0] * 64, 64)),
])
def test_a_dpdataloader_over_the_whole_dataset_does_not_warn(plain):
    loader = DPDataLoader.from_data_loader(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SampleRateWarning)
        attach(_opt(), Ledger(delta=1e-5), data_loader=loader).detach()


def test_a_distributed_sampler_on_one_process_in_front_of_poisson_warns():
    from torch.utils.data.distributed import DistributedSampler

    shard = DistributedSampler(DATA, num_replicas=4, rank=0)  # 16 of the 64 records
    loader = DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=8, sampler=shard))
    assert loader.sample_rate == 0.5  # 2 batches of 8: every record at 1/2, not 8/64
    with pytest.warns(SampleRateWarning, match=r"q = 1/len\(loader\) = 0\.5 .*0\.125"):
        attach(_opt(), Ledger(delta=1e-5), data_loader=loader).detach()


def test_opacus_ddp_usage_a_distributed_sampler_per_rank_does_not_warn(monkeypatch):
    """make_private under DDP: a DistributedSampler of B per rank becomes a distributed Poisson
    sampler at q = 1/len(loader) ≈ W·B/N, the global batch meant: no warning."""
    from torch.utils.data.distributed import DistributedSampler

    from privguard.integrations import _provenance

    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 4)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 0)
    shard = DistributedSampler(DATA, num_replicas=4, rank=0)
    loader = DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=8, sampler=shard),
                                           distributed=True)
    assert loader.sample_rate == 0.5  # 32 = 4 ranks × 8 records per global step
    assert _provenance.unintended_rate(loader, 0.5) is None
    few = WeightedRandomSampler([1.0] * 64, 8)  # 4 batches of 2 per rank: q = 1/4, 16 per step
    weighted = DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=2, sampler=few),
                                             distributed=True)
    assert _provenance.unintended_rate(weighted, 0.25) == (8, 0.125)  # meant 4 ranks × 2
