"""Review rlo2 of branch lo2: what its fixes still let through."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _one_rank import one_rank_group  # noqa: E402, F401 (a fixture)
from _private_mlp import private as _private  # noqa: E402
from _private_mlp import quiet_attach as _attach  # noqa: E402
from _private_mlp import step as _step  # noqa: E402

from privguard import Ledger  # noqa: E402

# ---- lo2 item 1: the hand rate without a loader, at least Opacus' hook's rate


@pytest.mark.parametrize("given", ["q/100", None])
def test_an_opacus_hook_set_after_attach_raises_the_rate_charged(given):
    # lo2 read the hook's rate once, at attach: an accountant hook set afterwards
    # (optimizer.attach_step_hook, which privguard charges before calling) recorded 4q while
    # the ledger went on charging max(q/100, q) = q, or (no sample_rate) make_private's q
    from opacus.accountants import RDPAccountant

    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    kwargs = {} if given is None else {"sample_rate": q / 100}
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, **kwargs)
    _step(model, opt, loader)
    later = RDPAccountant()
    opt.attach_step_hook(later.get_optimizer_hook_fn(sample_rate=4 * q))
    for _ in range(2):
        _step(model, opt, loader)
    assert [rate for _sigma, rate, _steps in later.history] == [4 * q]
    assert [r.mechanism.sample_rate for r in ledger.history] == [q, 4 * q, 4 * q]


def test_an_opacus_hook_at_a_numpy_float32_rate_is_found():
    # find_opacus_hook took only int/float: a hook made with sample_rate=np.float32(q) was
    # not found, and sample_rate=q/100 was charged q/100 below Opacus' q
    np = pytest.importorskip("numpy")
    from opacus.accountants import RDPAccountant

    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    opt.attach_step_hook(RDPAccountant().get_optimizer_hook_fn(sample_rate=np.float32(q)))
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, sample_rate=q / 100)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [float(np.float32(q))]


# ---- lo2 item 3: DistributedPerLayerOptimizer draws its noise at backward()

def _per_layer():
    from opacus import GradSampleModule
    from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

    torch.manual_seed(0)
    model = GradSampleModule(torch.nn.Linear(4, 2))
    opt = DistributedPerLayerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       noise_multiplier=1.0, max_grad_norm=[1.0, 1.0],
                                       expected_batch_size=8)
    return model, opt


def _backward(model) -> None:
    torch.nn.functional.cross_entropy(model(torch.randn(8, 4) * 100),
                                      torch.zeros(8, dtype=torch.long)).backward()


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("attached_before", [False, True])
def test_per_layer_ddp_attach_after_the_noise_was_drawn_is_refused(attached_before):
    # the noise was drawn at σ = 1 in backward(); σ = 10 set, then attach (or attach again
    # after detach): lo2 recorded no draw and charged the step at σ = 10 (an under-count)
    from privguard import InvalidArgumentError

    model, opt = _per_layer()
    ledger = Ledger(delta=1e-5)
    if attached_before:
        handle = _attach(opt, ledger, sample_rate=0.125)
    opt.zero_grad()
    _backward(model)
    if attached_before:
        handle.detach()
    opt.noise_multiplier = 10.0
    with pytest.raises(InvalidArgumentError) as info:
        _attach(opt, ledger, sample_rate=0.125)
    assert info.value.argument == "optimizer"
    assert ledger.history == []
    opt.step()  # unattached: nothing charged
    _attach(opt, ledger, sample_rate=0.125)  # after step(): accepted
    opt.zero_grad()
    _backward(model)
    opt.step()
    assert [r.mechanism.noise_multiplier for r in ledger.history] == [10.0]


# ---- lo2 item 8: statements and descriptions state targets and parameters unrounded

def test_remaining_budget_and_the_hybrid_description_never_round_a_target_or_the_plan():
    # lo2 made repr(ledger) exact, but remaining() still stated "any-time ε = ... at δ = 1e-05"
    # for δ = 1.0000049e-05 (a smaller δ than the one the ε holds at), budget() "of ε =
    # 1.23456", and the hybrid filter's description "q≤0.123456" for its plan's q = 0.1234564
    import privguard.mechanisms as M

    ledger = Ledger(epsilon=1.234_564_9, delta=1.000_004_9e-5)
    ledger.charge(M.Gaussian(5.0))
    assert "at δ = 1.0000049e-05" in str(ledger.remaining()), str(ledger.remaining())
    assert "of ε = 1.2345649 " in str(ledger.budget()), str(ledger.budget())
    hybrid = Ledger(epsilon=3.0, delta=1e-5, filter="hybrid",
                    plan=M.SubsampledGaussian(1.234_564_9, 0.123_456_4))
    text = hybrid._acc.filter.describe()
    assert "σ≥1.2345649, q≤0.1234564" in text, text


def test_an_opacus_hook_set_while_the_step_is_noised_is_charged_at_its_rate():
    # set after the step's check (here by an add_noise override): the gate charges the step
    # that hook saw, then refuses it; lo2 charged it at the rate of attach (q), not the 4q
    # that hook recorded
    from opacus.accountants import RDPAccountant

    from privguard import InvalidArgumentError

    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, sample_rate=q)
    accountant = RDPAccountant()
    noise = opt.add_noise

    def add_noise():
        noise()
        opt.step_hook = accountant.get_optimizer_hook_fn(sample_rate=4 * q)

    opt.add_noise = add_noise
    with pytest.raises(InvalidArgumentError, match="step hook"):
        _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [4 * q]


def test_the_tuning_plan_states_its_delta_unrounded_and_the_comparison_rounded_up():
    # "at δ = 1e-05" for δ = 1.0000049e-05, and the naive comparison to nearest (1.00001 read
    # 1.0000), unlike every other printed ε
    import numpy as np

    import privguard.mechanisms as M
    from privguard.tuning._base import TuningPlan

    plan = TuningPlan(mechanism=M.Gaussian(5.0), orders=np.array([2.0]), curve=np.array([0.1]),
                      epsilon=2.5, delta=1.000_004_9e-5, expected_runs=3.0,
                      naive_epsilon=1.000_01)
    text = str(plan)
    assert "at δ = 1.0000049e-05" in text and "ε = 1.0001, rounded up" in text, text


def test_the_prv_warning_states_the_rdp_costs_rounded_up():
    # "give ε = 0.4651 at δ = 1e-05 (running ε ...: 0.9433)" for 0.46512 and 0.94333: to
    # nearest, below the costs it states
    import re

    import privguard.mechanisms as M
    from privguard.integrations.opacus import _rdp_warning

    ledger = Ledger(delta=1e-5)
    text = _rdp_warning("prv", ledger, M.SubsampledGaussian(1.5, 0.01), 100)
    probe = Ledger(delta=1e-5)
    probe.charge(M.SubsampledGaussian(1.5, 0.01, steps=100))
    shown = re.search(r"give ε = ([0-9.]+) at δ = .*stopping time: ([0-9.]+)", text)
    assert shown is not None, text
    assert float(shown.group(1)) >= probe.nonadaptive_epsilon(), text
    assert float(shown.group(2)) >= probe.epsilon(), text
