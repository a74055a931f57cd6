"""Ghost clipping: backward passes counted at the optimizer, not only at the loader (task gc).

Under ``grad_sample_mode="ghost"`` the optimizer reports one micro-batch per step whatever
the loop ran, so several ``backward()`` before a ``step()`` were seen only by the loader
counter, which misses an iterator made before attach: such a step was charged
``SubsampledGaussian(σ, q)`` (k = 1). attach now counts each backward of Opacus' wrapped
loss at the optimizer (``integrations/_ghost.py``, docs/theory.md §14.5) and charges the
largest of that and the other counts.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
SIGMA = 1.0


def _ghost(n=128, batch_size=8, seed=0):
    """make_private with ghost clipping and Opacus' own Poisson loader."""
    torch.manual_seed(seed)
    x = torch.randn(n, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = opacus.PrivacyEngine(accountant="rdp")
    model, opt, criterion, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=DataLoader(TensorDataset(x, y),
                                                            batch_size=batch_size),
        criterion=nn.CrossEntropyLoss(), noise_multiplier=SIGMA, max_grad_norm=1.0,
        grad_sample_mode="ghost")
    return engine, model, opt, loader, criterion


def _backward(model, criterion, batches, times):
    for _ in range(times):
        x, y = next(batches)
        criterion(model(x), y).backward()


@pytest.mark.parametrize("k", [2, 3])
def test_the_reproducer_several_backward_from_an_early_iterator(k):
    # the gap of theory §14 "Not covered": iterator made before attach, k backward() per
    # step(): main charged SubsampledGaussian(σ, q) (k = 1)
    _, model, opt, loader, criterion = _ghost()
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)  # before attach: the loader counter never sees its batches
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    predicted = []
    for _ in range(3):
        opt.zero_grad()
        _backward(model, criterion, batches, k)
        predicted.append(handle.next_mechanism())
        opt.step()
    assert handle.counter is not None and handle.counter.count == 0  # the counter saw nothing
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, k)] * 3
    assert predicted == [M.AccumulatedSubsampledGaussian(SIGMA, q, k)] * 3


def test_a_zero_grad_of_the_loop_restarts_the_count():
    # the loop's zero_grad() clears p.grad: only the backward passes after it reach the step
    _, model, opt, loader, criterion = _ghost()
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    _backward(model, criterion, batches, 2)
    opt.zero_grad()
    _backward(model, criterion, batches, 1)
    opt.step()
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)]


def test_several_backward_in_a_skipped_ghost_step_are_all_counted():
    # a skipped step holding two backward passes and a real step of one: k = 3 (main: the
    # skip counter took the ghost optimizer's 1 per step, k = 2)
    _, model, opt, loader, criterion = _ghost()
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    opt.zero_grad()
    _backward(model, criterion, batches, 2)
    opt.signal_skip_step(do_skip=True)
    opt.step()
    opt.zero_grad()
    _backward(model, criterion, batches, 1)
    opt.step()
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 3)]


def test_a_refused_ghost_step_restarts_the_count():
    # two backward passes are refused (k = 2 does not fit, k = 1 would): nothing charged,
    # nothing applied, and the next step of one backward is charged as one draw (main: the
    # refused step was admitted as k = 1)
    _, model, opt, loader, criterion = _ghost()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(epsilon=2.5, delta=1e-5)
    assert not ledger.can_afford(M.AccumulatedSubsampledGaussian(SIGMA, q, 2))
    assert ledger.can_afford(M.SubsampledGaussian(SIGMA, q))
    batches = iter(loader)
    handle = attach(opt, ledger, data_loader=loader, on_exhausted="stop")
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    _backward(model, criterion, batches, 2)
    opt.step()
    assert handle.exhausted and len(ledger.history) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert handle.next_mechanism() == M.SubsampledGaussian(SIGMA, q)
    _backward(model, criterion, batches, 1)
    opt.step()
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)]


def test_each_optimizer_counts_the_backward_passes_of_its_own_loss():
    # two privately made models, each with its own optimizer and ledger: a backward of one
    # model's wrapped loss zero_grads its own optimizer only
    _, model_a, opt_a, loader_a, crit_a = _ghost(seed=0)
    _, model_b, opt_b, loader_b, crit_b = _ghost(seed=1)
    q = loader_a.batch_sampler.sample_rate
    a, b = iter(loader_a), iter(loader_b)
    ledger_a, ledger_b = Ledger(delta=1e-5), Ledger(delta=1e-5)
    attach(opt_a, ledger_a, data_loader=loader_a)
    attach(opt_b, ledger_b, data_loader=loader_b)
    for _ in range(2):
        opt_a.zero_grad()
        opt_b.zero_grad()
        _backward(model_a, crit_a, a, 1)
        _backward(model_b, crit_b, b, 1)
        _backward(model_a, crit_a, a, 1)
        opt_a.step()
        opt_b.step()
    assert [r.mechanism for r in ledger_a.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 2
    assert [r.mechanism for r in ledger_b.history] == [M.SubsampledGaussian(SIGMA, q)] * 2


def test_batch_memory_manager_under_ghost_stays_one_draw_per_logical_batch():
    # its virtual steps split ONE Poisson draw, one backward per physical batch: the
    # backward count is per step(), so the splits stay one SubsampledGaussian
    engine, model, opt, loader, criterion = _ghost(n=256, batch_size=64)
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    physical = 0
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        batches = iter(mem)  # made before attach: no loader count
        attach(opt, ledger, data_loader=loader)
        for x, y in batches:
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
            physical += 1
    real = sum(n for _, _, n in engine.accountant.history)
    assert physical > real > 0
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)] * real


def test_detach_restores_zero_grad():
    _, model, opt, loader, criterion = _ghost()
    handle = attach(opt, Ledger(delta=1e-5), data_loader=loader)
    assert "zero_grad" in vars(opt)
    handle.detach()
    assert "zero_grad" not in vars(opt)
    x, y = next(iter(loader))
    criterion(model(x), y).backward()  # the wrapped loss still runs on the restored optimizer
    opt.step()
