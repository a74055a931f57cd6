"""attach charges accumulated micro-batches exactly (issue 27 item 1; theory §14)."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger
from privguard import mechanisms as M
from privguard._errors import InvalidArgumentError
from privguard.integrations.opacus import NonPoissonSamplingError, attach

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def _private(mode="hooks", n=64, batch_size=8, separate=True):
    """make_private; with ``separate``, as the issue's reproducer: Opacus' own Poisson
    loader refuses accumulation, so the loop builds its DPDataLoader separately."""
    torch.manual_seed(0)
    x = torch.randn(n, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    engine = PrivacyEngine(accountant="rdp")
    criterion = nn.CrossEntropyLoss()
    if mode == "ghost":
        model, opt, criterion, loader = engine.make_private(
            module=model, optimizer=opt, data_loader=loader, criterion=criterion,
            noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost",
            poisson_sampling=not separate)
    else:
        model, opt, loader = engine.make_private(module=model, optimizer=opt,
                                                 data_loader=loader, noise_multiplier=1.0,
                                                 max_grad_norm=1.0, poisson_sampling=not separate)
    if separate:
        loader = DPDataLoader.from_data_loader(loader)
    return engine, model, opt, loader, criterion


def _accumulate(model, opt, loader, criterion, steps, k):
    batches = iter(loader)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(k):  # k backward() per step()
            x, y = next(batches)
            criterion(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_two_backward_per_step_is_charged_as_accumulation(mode):
    # the reproducer: a DPDataLoader of q = 0.125, two backward() per step()
    engine, model, opt, loader, criterion = _private(mode)
    assert loader.batch_sampler.sample_rate == 0.125
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    _accumulate(model, opt, loader, criterion, steps=3, k=2)
    charged = [r.mechanism for r in ledger.history]
    assert charged == [M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)] * 3
    # Opacus' own record: q·k (hooks) or q (ghost): both under the real cost at α = 4
    for _, q, _ in engine.accountant.history:
        assert M.SubsampledGaussian(1.0, q).rdp([4.0])[0] < charged[0].rdp([4.0])[0] / 5
    handle.detach()
    assert type(loader) is DPDataLoader  # detach gives the loader its class back


def test_one_backward_per_step_stays_subsampled_gaussian():
    _, model, opt, loader, criterion = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    _accumulate(model, opt, loader, criterion, steps=3, k=1)
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(1.0, 0.125)] * 3


def test_batch_memory_manager_virtual_steps_stay_subsampled_gaussian():
    engine, model, opt, loader, criterion = _private(n=256, batch_size=64, separate=False)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    physical = 0
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        for x, y in mem:
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
            physical += 1
    real = sum(n for _, _, n in engine.accountant.history)
    assert physical > real
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(1.0, 0.25)] * real


def test_ghost_clipping_without_a_loader_is_refused_by_name():
    _, _, opt, _, _ = _private("ghost")
    with pytest.raises(NonPoissonSamplingError, match="ghost-clipping"):
        attach(opt, Ledger(delta=1e-5), sample_rate=0.125)
    handle = attach(opt, Ledger(delta=1e-5), sample_rate=0.125, micro_batches=2)
    assert handle.next_mechanism() == M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)


def test_steps_recorded_before_attach_at_k_times_q_are_replayed_as_accumulation():
    engine, model, opt, loader, criterion = _private()
    _accumulate(model, opt, loader, criterion, steps=2, k=2)  # before attach
    assert [q for _, q, _ in engine.accountant.history] == [0.25]  # Opacus: q·k
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    assert handle.steps_replayed == 2
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)] * 2


def test_accumulation_through_skipped_steps_is_counted_from_the_loader():
    # independent Poisson batches accumulated with signal_skip_step (BatchMemoryManager's
    # mechanism, but each batch its own Poisson draw): the optimizer holds one batch at the
    # real step, only the loader's count shows the two micro-batches
    _, model, opt, loader, criterion = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    for _ in range(3):
        for i in range(2):
            x, y = next(batches)
            criterion(model(x), y).backward()
            if i == 0:
                opt.signal_skip_step(do_skip=True)
            opt.step()
            opt.zero_grad()
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)] * 3


def test_a_hybrid_ledger_refuses_a_plan_that_may_have_per_draw_randomness():
    # docs/theory.md §2b.1 (C3′) and §14 (Lemma 14.5): the PLD envelope of an accumulated
    # step is proved for aligned vectors only. The default mechanism (aligned=False, what
    # attach charges) has none: Ledger(filter="hybrid") refuses such a plan by name.
    from privguard import Plan

    step = M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)
    with pytest.raises(InvalidArgumentError, match="aligned=True"):
        Ledger(epsilon=8.0, delta=1e-5, plan=Plan(step, steps=3), filter="hybrid")


def test_attach_charges_outside_an_aligned_envelope_and_closes_part_A():
    # A plan declared aligned=True has the §2b.1 envelope, but attach cannot see dropout
    # or augmentation, so it charges the default aligned=False step: outside the
    # envelope, which closes part A (C1) and is charged to part B's RDP.
    from privguard import Plan

    _, model, opt, loader, criterion = _private()
    aligned = M.AccumulatedSubsampledGaussian(1.0, 0.125, 2, aligned=True)
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(aligned, steps=3), filter="hybrid")
    flt = ledger._acc.filter
    assert flt.kind == "hybrid" and flt.steps_a >= 3 and flt.a_alive
    attach(opt, ledger, data_loader=loader)
    _accumulate(model, opt, loader, criterion, steps=3, k=2)
    assert [r.mechanism for r in ledger.history] == [
        M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)] * 3
    assert not flt.a_alive