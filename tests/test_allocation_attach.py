"""attach() with a RandomAllocationSampler loader: the whole epoch is charged before its first step."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, Plan  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations import RandomAllocationSampler  # noqa: E402
from privguard.integrations.opacus import NonPoissonSamplingError, attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Using a non-full backward hook")]
N, T, SIGMA = 64, 4, 1.0


def _setup(seed=0, sigma=SIGMA):
    torch.manual_seed(seed)
    x = torch.randn(N, 5)
    y = (x[:, 0] > 0).long()
    sampler = RandomAllocationSampler(N, T, generator=torch.Generator().manual_seed(seed))
    loader = DataLoader(TensorDataset(x, y), batch_sampler=sampler)
    model = nn.Linear(5, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = opacus.PrivacyEngine()
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                             noise_multiplier=sigma, max_grad_norm=1.0,
                                             poisson_sampling=False)
    return model, opt, loader


def _step(model, opt, x, y):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _refused(model, opt, batch, ledger, error, charges, match=None):
    """The step raises ``error`` and changes nothing: parameters, and ``charges`` charges kept."""
    before = _params(model)
    with pytest.raises(error, match=match):
        _step(model, opt, *batch)
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model)))
    assert len(ledger.history) == charges


def test_each_epoch_is_charged_once_before_its_first_step():
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    assert handle.next_mechanism() == M.RandomAllocation(SIGMA, T)
    for epoch in range(2):
        for i, (x, y) in enumerate(loader):
            _step(model, opt, x, y)
            assert len(ledger.history) == epoch + 1  # charged at the first step, not again
    assert [r.mechanism for r in ledger.history] == [M.RandomAllocation(SIGMA, T)] * 2
    assert handle.steps_charged == 2 * T
    direct = Ledger(epsilon=50.0, delta=1e-5)
    for _ in range(2):
        direct.charge(M.RandomAllocation(SIGMA, T))
    assert ledger.epsilon() == direct.epsilon()


def test_an_epoch_stopped_early_stays_charged_in_full():
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    for x, y in loader:
        _step(model, opt, x, y)
        break  # one step of epoch 1
    for x, y in loader:
        _step(model, opt, x, y)
    assert [r.mechanism for r in ledger.history] == [M.RandomAllocation(SIGMA, T)] * 2


def test_an_epoch_the_filter_refuses_runs_nothing():
    model, opt, loader = _setup()
    one = M.RandomAllocation(SIGMA, T)
    ledger = Ledger(epsilon=1.0, delta=1e-5)
    assert not ledger.can_afford(one)
    handle = attach(opt, ledger, data_loader=loader)
    batch = next(iter(loader))
    assert not handle.can_step()
    _refused(model, opt, batch, ledger, BudgetExhausted, 0)


def test_sigma_changed_inside_an_epoch_is_refused():
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    _step(model, opt, *next(batches))
    opt.noise_multiplier = 2.0
    _refused(model, opt, next(batches), ledger, InvalidArgumentError, 1, match="noise_multiplier")


def test_more_steps_than_batches_in_an_epoch_is_refused():
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches = []
    for x, y in loader:  # one step per batch drawn (batches drawn ahead count as accumulated)
        _step(model, opt, x, y)
        batches.append((x, y))
    # a 5th step in a 4-batch epoch would use examples again
    _refused(model, opt, batches[0], ledger, InvalidArgumentError, 1, match=r"optimizer\.step")


def test_refusals_at_attach():
    _, opt, loader = _setup()
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        attach(opt, Ledger(epsilon=5.0, delta=1e-5), data_loader=loader, sample_rate=0.25)
    hybrid = Ledger(epsilon=5.0, delta=1e-5, plan=Plan(M.SubsampledGaussian(SIGMA, 0.25), steps=8),
                    filter="hybrid")
    with pytest.raises(InvalidArgumentError,
                       match=r"no certified PLD envelope for random allocation.*filter=.rdp."):
        attach(opt, hybrid, data_loader=loader)
    # nor one whose plan is random allocation at another t (docs/theory.md §2b.3)
    other_t = Ledger(epsilon=5.0, delta=1e-5, plan=Plan(M.RandomAllocation(2.0, 2 * T), steps=2),
                     filter="hybrid")
    with pytest.raises(InvalidArgumentError,
                       match=r"no certified PLD envelope for random allocation.*filter=.rdp."):
        attach(opt, other_t, data_loader=loader)
    # nothing was attached: a plain ledger still attaches, with no Poisson warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader).detach()


def test_a_hybrid_ledger_planning_the_epoch_charges_it_in_part_a():
    """docs/theory.md §2b.3: with a plan RandomAllocation(σ₀, t), attach charges each epoch
    whole before its first step, as one envelope unit of part A."""
    model, opt, loader = _setup(sigma=2.0)
    ledger = Ledger(epsilon=5.0, delta=1e-5, plan=Plan(M.RandomAllocation(2.0, T), steps=2),
                    filter="hybrid")
    flt = ledger._acc.filter
    assert flt.kind == "hybrid" and flt.envelope.allocation_steps == T
    attach(opt, ledger, data_loader=loader)
    for epoch in range(2):
        for x, y in loader:
            _step(model, opt, x, y)
            assert flt.a_count == epoch + 1 and flt.a_alive  # charged at the first step
    assert [r.mechanism for r in ledger.history] == [M.RandomAllocation(2.0, T)] * 2


def test_steps_opacus_recorded_before_attach_are_refused():
    model, opt, loader = _setup()
    _step(model, opt, *next(iter(loader)))  # recorded by Opacus' accountant as Poisson q = 1/t
    with pytest.raises(InvalidArgumentError, match="recorded"):
        attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader)


def test_accumulated_micro_batches_of_an_allocation_loader_are_refused():
    # t batches stepped in pairs are t/2 steps: RandomAllocation(σ, t) would under-count.
    model, opt, loader = _setup()
    with pytest.raises(NonPoissonSamplingError, match="micro_batches"):
        attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader, micro_batches=2)
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    x1, y1 = next(batches)
    x2, y2 = next(batches)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x1), y1).backward()
    nn.functional.cross_entropy(model(x2), y2).backward()
    before = _params(model)
    with pytest.raises(NonPoissonSamplingError, match="RandomAllocation"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model)))
    assert len(ledger.history) == 0


def test_an_epoch_drawn_before_attach_is_charged_at_its_first_step_not_run_uncharged():
    """Review rz: attach counted every epoch the sampler had started as charged, so the rest
    of an epoch whose first batch was drawn before attach ran with no charge at all. rz refused
    the attach instead; review ra: that refused every Lightning fit with a worker loader
    (Lightning makes the iterator, which draws the first epoch, before on_train_start). The
    last epoch drawn is charged at the first step; an earlier one's iterator refuses."""
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    earlier = iter(loader)
    next(earlier)  # epoch 1, drawn before attach
    batches = iter(loader)
    first = next(batches)  # epoch 2, drawn before attach
    attach(opt, ledger, data_loader=loader)
    assert len(ledger.history) == 0
    _step(model, opt, *first)  # the epoch is charged before this step updates anything
    assert [r.mechanism for r in ledger.history] == [M.RandomAllocation(SIGMA, T)]
    with pytest.raises(InvalidArgumentError, match=r"a batch of epoch 1"):
        next(earlier)
    for batch in batches:
        _step(model, opt, *batch)
    assert len(ledger.history) == 1


def test_steps_per_epoch_is_fixed_when_the_sampler_is_built():
    # Review rz: t changed between drawing an epoch and its first step charged the epoch,
    # allocated over the old t, at the new one. Now t cannot change.
    sampler = RandomAllocationSampler(num_samples=12, steps_per_epoch=4)
    epoch = iter(sampler)
    next(epoch)
    with pytest.raises(InvalidArgumentError, match=r"^steps_per_epoch=2 is invalid: is fixed"):
        sampler.steps_per_epoch = 2
    assert sampler.steps_per_epoch == 4 and len(sampler) == 4


def test_two_epochs_stepped_in_turn_are_refused_not_interleaved():
    """Epochs run one after another (docs/theory.md §15.3): once a second iterator of the
    loader drew the next epoch's first batch, the first iterator's epoch is over, and a
    further batch of it is refused before any step uses it (on main it was handed out, and
    the steps of two epochs ran interleaved, which the per-epoch argument does not cover)."""
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    first, second = iter(loader), iter(loader)
    _step(model, opt, *next(first))  # epoch 1, charged at its first step
    _step(model, opt, *next(second))  # epoch 2 began: charged
    assert len(ledger.history) == 2
    before = _params(model)
    with pytest.raises(InvalidArgumentError, match=r"a batch of epoch 1.*epoch 2 .*began"):
        next(first)
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model)))
    for x, y in second:  # the current epoch goes on: its t − 1 remaining batches
        _step(model, opt, x, y)
    assert len(ledger.history) == 2


def test_a_step_before_any_batch_of_the_loader_is_refused_not_run_uncharged():
    """Review ra: with no epoch drawn since attach, a step (on a batch that is not the
    loader's: another loader, one made by hand) charged nothing, t times over."""
    model, opt, loader = _setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    assert handle.can_step()  # the first epoch, drawn by the loop, would fit
    x, y = loader.dataset.tensors
    _refused(model, opt, (x[:8], y[:8]), ledger, InvalidArgumentError, 0,
             match=r"^optimizer.step=1 is invalid: runs before any batch was drawn")
    _step(model, opt, *next(iter(loader)))  # the loader's own batch: its epoch is charged
    assert len(ledger.history) == 1 and handle.steps_charged == 1


def test_a_loader_with_workers_steps_no_batch_of_an_earlier_epoch():
    """Review ra: a loader with workers fetched epoch 1's batches ahead and handed them out
    after epoch 2's first step (the sampler's refusal was raised once at most, or not at all
    once the epoch was drawn in full), so the two epochs' steps ran interleaved."""
    torch.manual_seed(0)
    x = torch.randn(N, 5)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_sampler=RandomAllocationSampler(N, T),
                        num_workers=2, prefetch_factor=2)
    model, opt = nn.Linear(5, 2), None
    engine = opacus.PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=1.0, poisson_sampling=False)
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    first = iter(loader)
    _step(model, opt, *next(first))
    second = iter(loader)
    _step(model, opt, *next(second))
    for _ in range(T):
        with pytest.raises((InvalidArgumentError, StopIteration)):
            next(first)
    for batch in second:
        _step(model, opt, *batch)
    assert len(ledger.history) == 2
