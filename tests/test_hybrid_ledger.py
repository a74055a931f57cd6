"""The hybrid filter wired into the ledger: Ledger(..., plan=Plan(step, steps), filter="hybrid")."""

from __future__ import annotations

import pytest
from opacus.accountants.utils import get_noise_multiplier

from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M


def admitted(ledger, step, limit=10**6):
    n = 0
    while n < limit:
        try:
            ledger.charge(step)
        except BudgetExhausted:
            return n
        n += 1
    return n


@pytest.mark.parametrize("eps,q,steps", [(3.0, 256 / 60000, 64), (3.0, 0.01, 2000),
                                         (1.0, 0.02, 500)])
def test_a_prv_calibrated_plan_runs_to_the_end(eps, q, steps):
    # What make_private_with_epsilon does by default: σ from Opacus' PRV accountant.
    sigma = get_noise_multiplier(target_epsilon=eps, target_delta=1e-5, sample_rate=q,
                                 steps=steps, accountant="prv")
    step = M.SubsampledGaussian(sigma, q)
    hybrid = Ledger(eps, 1e-5, plan=Plan(step, steps), filter="hybrid")
    rdp = Ledger(eps, 1e-5, plan=Plan(step, steps))
    n_hybrid, n_rdp = admitted(hybrid, step, steps), admitted(rdp, step, steps)
    assert n_hybrid >= 0.97 * steps  # issue 16: at least 97% of the planned steps
    assert n_rdp < n_hybrid


def test_the_envelope_state_survives_a_file_and_a_state(tmp_path):
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger(3.0, 1e-5, plan=Plan(step, 2600), filter="hybrid", path=tmp_path / "h.db",
                    lease=1)  # exact counts (leases and part A: tests/test_leases.py)
    for _ in range(1000):
        ledger.charge(step)
    ledger.close()
    again = Ledger.open(tmp_path / "h.db")
    t_a = again._acc.filter.steps_a
    assert again._acc.filter.a_count == 1000 and again._acc.filter.a_alive
    assert admitted(again, step) == t_a - 1000
    copy = Ledger.load_state_dict(again.state_dict())
    assert copy._acc.filter.a_count == t_a and not copy.can_afford(step)


def test_leaving_the_envelope_falls_back_to_rdp_for_good():
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger(3.0, 1e-5, plan=Plan(step, 2600), filter="hybrid")
    for _ in range(1000):
        ledger.charge(step)
    ledger.charge(M.Gaussian(20.0), label="noisy count")  # outside the envelope: A closes
    assert not ledger._acc.filter.a_alive
    n = admitted(ledger, step)
    full_delta = Ledger(3.0, 1e-5, plan=step)  # RDP at the full δ on the same sequence
    for _ in range(1000):
        full_delta.charge(step)
    full_delta.charge(M.Gaussian(20.0))
    assert 0 < n <= admitted(full_delta, step)


def test_a_plan_without_an_envelope_gets_the_rdp_filter_at_full_delta():
    plan = M.Laplace(10.0)
    hybrid, rdp = (Ledger(3.0, 1e-5, plan=plan, filter=f) for f in ("hybrid", "rdp"))
    assert hybrid._acc.filter.kind == "dp"
    assert admitted(hybrid, plan) == admitted(rdp, plan)


def test_the_first_charge_fixes_the_envelope_when_no_plan_is_declared():
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger(3.0, 1e-5, filter="hybrid")
    assert ledger._acc.filter is None
    declared = Ledger(3.0, 1e-5, plan=step, filter="hybrid")
    assert admitted(ledger, step) == declared._acc.filter.steps_a == admitted(declared, step)
    assert ledger.plan == Plan(step)


def test_make_private_with_epsilon_and_attach_run_the_planned_steps():
    # Issue 16: Opacus calibrates σ with PRV (its default); a ledger at the same target
    # with the plan and filter="hybrid", attached the README's way, admits the run.
    import warnings

    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from privguard.integrations.opacus import attach

    torch.manual_seed(0)
    x = torch.randn(1024, 8)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    engine = PrivacyEngine()  # accountant="prv", Opacus' default
    epochs = 4
    net = nn.Linear(8, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private_with_epsilon(
            module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=64), target_epsilon=3.0, target_delta=1e-5,
            epochs=epochs, max_grad_norm=1.0)
    planned = epochs * len(loader)
    step = M.SubsampledGaussian(optimizer.noise_multiplier, loader.sample_rate)
    ledger = Ledger(3.0, 1e-5, plan=Plan(step, planned), filter="hybrid")
    handle = attach(optimizer, ledger, data_loader=loader, on_exhausted="stop")
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            if len(xb):
                nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
    assert handle.steps_charged >= 0.97 * planned
    rdp_only = Ledger(3.0, 1e-5, plan=Plan(step, planned))
    assert rdp_only.remaining(step).repeats < handle.steps_charged
