"""The Opacus integration on a tiny real model: counts, numbers, refusals, hooks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import BudgetExhausted, InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard.integrations.opacus import (
    LedgerAccountant,
    NonPoissonSamplingError,
    attach,
)

DELTA = 1e-5
warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")
warnings.filterwarnings("ignore", message=".*Optimal order is the.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def make_private(noise=1.0, batch_size=32, n=512, seed=0, accountant="rdp"):
    torch.manual_seed(seed)
    x = torch.randn(n, 10)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    engine = PrivacyEngine(accountant=accountant)
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                             noise_multiplier=noise, max_grad_norm=1.0)
    return engine, model, opt, loader


def train(model, opt, loader, steps):
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1
            if done == steps:
                return


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_epsilon_equals_opacus_rdp_accountant_for_fixed_sigma():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, 40)
    assert handle.steps_charged == 40 == len(ledger.history)
    opacus_eps = engine.accountant.get_epsilon(DELTA, alphas=list(ledger.orders))
    assert ledger.nonadaptive_epsilon() == opacus_eps
    assert ledger.epsilon() > opacus_eps  # the running ε is valid under adaptivity too


def test_sigma_changed_mid_run_equals_hand_composition():
    engine, model, opt, loader = make_private(noise=1.2)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger)  # sample rate inferred from Opacus' own hook
    train(model, opt, loader, 10)
    opt.noise_multiplier = 0.8
    train(model, opt, loader, 15)
    q = 1 / len(loader)
    by_hand = (M.SubsampledGaussian(1.2, q, 10).rdp(ledger.orders)
               + M.SubsampledGaussian(0.8, q, 15).rdp(ledger.orders))
    np.testing.assert_allclose(ledger.spent, by_hand, rtol=1e-12)
    sigmas = [r.mechanism.noise_multiplier for r in ledger.history]
    assert sigmas == [1.2] * 10 + [0.8] * 15


def test_batch_memory_manager_virtual_steps_are_not_charged():
    engine, model, opt, loader = make_private(batch_size=64)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        physical = 0
        for x, y in mem:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            physical += 1
    opacus_steps = sum(n for _, _, n in engine.accountant.history)
    assert physical > opacus_steps  # there were virtual steps
    assert len(ledger.history) == opacus_steps


def test_skipped_steps_are_not_charged():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.signal_skip_step(do_skip=(i % 2 == 0))
        opt.step()
        if i == 9:
            break
    assert len(ledger.history) == sum(n for _, _, n in engine.accountant.history) == 5


def test_refused_step_raises_before_the_update_and_charges_nothing():
    engine, model, opt, loader = make_private(noise=1.0)
    step = M.SubsampledGaussian(1.0, 1 / len(loader))
    ledger = Ledger(3.0, DELTA, plan=step)
    allowed = ledger.remaining(step).repeats
    assert allowed > 10
    attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, allowed)
    before, n_opacus = params(model), len(engine.accountant.history)
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(BudgetExhausted):
        opt.step()
    for a, b in zip(before, params(model)):
        assert torch.equal(a, b)  # bit for bit
    assert len(ledger.history) == allowed
    assert len(engine.accountant.history) == n_opacus  # Opacus' hook did not run either
    assert sum(n for _, _, n in engine.accountant.history) == allowed


def test_graceful_stop_mode_stops_the_loop():
    engine, model, opt, loader = make_private(noise=1.0)
    ledger = Ledger(3.0, DELTA)
    handle = attach(opt, ledger, data_loader=loader, on_exhausted="stop")
    steps = 0
    for _ in range(50):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            before = params(model)
            opt.step()
            if handle.exhausted:
                assert all(torch.equal(a, b) for a, b in zip(before, params(model)))
                break
            steps += 1
        if handle.exhausted:
            break
    assert handle.exhausted and steps == len(ledger.history) > 10
    assert not handle.can_step() and handle.should_stop


def test_existing_hooks_still_run_and_detach_restores():
    engine, model, opt, loader = make_private()
    calls = []
    opacus_hook = opt.step_hook
    opt.attach_step_hook(lambda o: (calls.append(1), opacus_hook(o)))
    previous = opt.step_hook
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, sample_rate=1 / len(loader))
    train(model, opt, loader, 5)
    assert len(calls) == 5 and len(ledger.history) == 5
    handle.detach()
    assert opt.step_hook is previous and "step" not in vars(opt)
    train(model, opt, loader, 3)
    assert len(calls) == 8 and len(ledger.history) == 5


def test_context_manager_detaches():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    with attach(opt, ledger, data_loader=loader, on_exhausted="stop"):
        train(model, opt, loader, 3)
    assert "step" not in vars(opt)
    train(model, opt, loader, 2)
    assert len(ledger.history) == 3


def test_privacy_engine_get_epsilon_reports_the_ledger():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    train(model, opt, loader, 10)
    assert engine.get_epsilon(DELTA) == ledger.epsilon()
    handle.detach()
    assert isinstance(engine.accountant, RDPAccountant)


def test_ledger_accountant_in_place_of_opacus():
    torch.manual_seed(0)
    x, y = torch.randn(256, 10), torch.randint(0, 2, (256,))
    model = nn.Linear(10, 2)
    engine = PrivacyEngine()
    ledger = Ledger(delta=DELTA)
    engine.accountant = LedgerAccountant(ledger)
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
        noise_multiplier=1.0, max_grad_norm=1.0)
    train(model, opt, loader, 7)
    assert len(ledger.history) == 7 and engine.get_epsilon(DELTA) == ledger.epsilon()
    state = engine.accountant.state_dict()
    fresh = LedgerAccountant(Ledger(delta=DELTA))
    fresh.load_state_dict(state)
    assert len(fresh) == 7


def test_non_poisson_loader_is_reported():
    engine, model, opt, loader = make_private()
    plain = DataLoader(TensorDataset(torch.randn(64, 10), torch.zeros(64).long()), batch_size=8,
                       shuffle=True)
    with pytest.raises(NonPoissonSamplingError, match="Poisson"):
        attach(opt, Ledger(delta=DELTA), data_loader=plain)
    attach(opt, Ledger(delta=DELTA), data_loader=plain, check_poisson=False).detach()


def test_bad_arguments():
    engine, model, opt, loader = make_private()
    with pytest.raises(InvalidArgumentError, match="optimizer"):
        attach(torch.optim.SGD(model.parameters(), lr=0.1), Ledger(delta=DELTA))
    with pytest.raises(InvalidArgumentError, match="on_exhausted"):
        attach(opt, Ledger(delta=DELTA), on_exhausted="ignore")
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        attach(opt, Ledger(delta=DELTA), sample_rate=1.5)
    opt.step_hook = None
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        attach(opt, Ledger(delta=DELTA))


def test_detach_restores_a_step_wrapper_set_by_someone_else():
    engine, model, opt, loader = make_private()
    scheduler = torch.optim.lr_scheduler.StepLR(opt.original_optimizer, step_size=1)
    wrapper = lambda *a, **k: type(opt).step(opt, *a, **k)  # noqa: E731
    opt.step = wrapper  # what some schedulers and frameworks do
    handle = attach(opt, Ledger(delta=DELTA), data_loader=loader, on_exhausted="stop")
    train(model, opt, loader, 2)
    handle.detach()
    assert vars(opt)["step"] is wrapper and len(handle.ledger.history) == 2
    del scheduler


def test_missing_optional_framework_gives_an_install_hint():
    from privguard.integrations._frameworks import require

    with pytest.raises(ImportError, match=r"pip install 'privguard\[lightning\]'"):
        require("privguard_no_such_framework", "lightning")


def test_optimizer_from_make_private_with_epsilon():
    torch.manual_seed(0)
    x, y = torch.randn(512, 10), torch.randint(0, 2, (512,))
    model = nn.Linear(10, 2)
    engine = PrivacyEngine(accountant="rdp")  # Opacus' default is PRV; compare like with like
    model, opt, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
        target_epsilon=4.0, target_delta=DELTA, epochs=2, max_grad_norm=1.0)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, 2 * len(loader))
    assert ledger.nonadaptive_epsilon() == engine.accountant.get_epsilon(
        DELTA, alphas=list(ledger.orders))
    assert {r.mechanism.noise_multiplier for r in ledger.history} == {opt.noise_multiplier}
