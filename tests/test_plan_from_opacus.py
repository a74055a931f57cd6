"""Plan.from_opacus: σ and q exactly as Opacus uses them (issue 25 item 4)."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import InvalidArgumentError, Ledger, Plan
from privguard import mechanisms as M
from privguard.integrations.opacus import NonPoissonSamplingError

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")


def _with_epsilon(epochs=3, n=1000, batch=50):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(n, 4), torch.zeros(n, dtype=torch.long)),
                        batch_size=batch)
    engine = PrivacyEngine()  # PRV, Opacus' default
    _, opt, loader = engine.make_private_with_epsilon(
        module=model, optimizer=opt, data_loader=loader, target_epsilon=3.0, target_delta=1e-5,
        epochs=epochs, max_grad_norm=1.0)
    return opt, loader


def test_make_private_with_epsilon_plan_and_hybrid_filter_admit_every_planned_step():
    opt, loader = _with_epsilon()
    plan = Plan.from_opacus(opt, loader, epochs=3)
    assert plan.step == M.SubsampledGaussian(opt.noise_multiplier, 1 / len(loader))
    assert plan.steps == 3 * len(loader)
    ledger = Ledger(3.0, 1e-5, plan=plan, filter="hybrid")
    ledger.charge(plan.step, times=plan.steps)  # raises BudgetExhausted if one is refused
    assert len(ledger.history) == plan.steps
    # the RDP filter alone would not: PRV calibrated σ tighter than RDP accounts
    assert Ledger(3.0, 1e-5, plan=plan).remaining(plan.step).repeats < plan.steps


def test_accumulation_and_steps():
    opt, loader = _with_epsilon()
    plan = Plan.from_opacus(opt, loader, steps=7, gradient_accumulation_steps=2)
    assert plan.step == M.AccumulatedSubsampledGaussian(opt.noise_multiplier,
                                                        1 / len(loader), 2)
    assert plan.steps == 7
    epochs = Plan.from_opacus(opt, loader, epochs=2, gradient_accumulation_steps=3)
    assert epochs.steps == 2 * -(-len(loader) // 3)


def test_refusals():
    opt, loader = _with_epsilon()
    shuffled = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2, shuffle=True)
    with pytest.raises(NonPoissonSamplingError, match="shuffled"):
        Plan.from_opacus(opt, shuffled, epochs=1)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        Plan.from_opacus(opt, loader)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        Plan.from_opacus(opt, loader, epochs=1, steps=3)
    with pytest.raises(InvalidArgumentError, match="optimizer"):
        Plan.from_opacus(object(), loader, epochs=1)


def test_an_attached_prv_calibrated_run_ends_with_the_meter_within_1_percent_of_the_target():
    """Issue 25's number: make_private_with_epsilon + Plan.from_opacus + the hybrid filter,
    attached to the real loop: every planned step runs and the meter ends in [0.99, 1] × ε."""
    from privguard.integrations.opacus import attach

    torch.manual_seed(0)
    n, batch, epochs = 1000, 50, 3
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(n, 4)
    data = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=batch)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private_with_epsilon(
        module=model, optimizer=opt, data_loader=data, target_epsilon=3.0, target_delta=1e-5,
        epochs=epochs, max_grad_norm=1.0)
    plan = Plan.from_opacus(opt, loader, epochs=epochs)
    ledger = Ledger(3.0, 1e-5, plan=plan, filter="hybrid")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    assert handle.steps_charged == plan.steps
    b = ledger.budget()
    assert 0.99 * 3.0 <= b.spent <= 3.0, b
