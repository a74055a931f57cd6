"""Review smp (adversarial pass over the samplers and attach's charge, as an Opacus user)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _private_mlp import private as _private  # noqa: E402
from _private_mlp import quiet_attach as _attach  # noqa: E402
from _private_mlp import step as _step  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402


def _refused_untouched(model, opt, loader, ledger) -> InvalidArgumentError:
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidArgumentError) as info:
        _step(model, opt, loader)
    assert info.value.argument == "sample_rate"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(ledger.history) == 0
    return info.value


def test_a_sample_rate_callable_below_the_loaders_rate_is_refused_before_the_update():
    # A fixed sample_rate= is checked against the Poisson loader's q (issue 27); a callable
    # was not: q/100 was charged for steps drawn at q, the update released
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader, sample_rate=lambda: q / 100)
    _refused_untouched(model, opt, loader, ledger)


@pytest.mark.parametrize("kind", [float, "float32", "tensor"])
def test_a_loader_rate_raised_after_attach_refuses_the_hand_set_rate(kind):
    # sample_rate= equal to the loader's q at attach; the loader's sampler was then set to
    # draw at 4q (Opacus' sampler reads sample_rate at each epoch): q was still charged
    # (also a 4q that is not a plain float, which the sampler draws at all the same)
    import numpy as np

    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader, sample_rate=q)
    raised = {float: float, "float32": np.float32, "tensor": torch.tensor}[kind](4 * q)
    loader.batch_sampler.sample_rate = raised
    exc = _refused_untouched(model, opt, loader, ledger)
    assert exc.value == q


def test_a_sample_rate_callable_that_follows_the_loader_charges_the_rate_in_force():
    # the callable's use (a policy that changes the batch size) still works
    model, opt, loader = _private()
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader,
            sample_rate=lambda: loader.batch_sampler.sample_rate)
    _step(model, opt, loader)
    loader.batch_sampler.sample_rate = 0.25
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [0.125, 0.25]


def _ledger_accountant_run(**kwargs):
    """make_private with a LedgerAccountant standing in for Opacus' accountant."""
    from opacus import PrivacyEngine

    from privguard.integrations.opacus import LedgerAccountant

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ledger = Ledger(delta=1e-5)
    engine = PrivacyEngine()
    engine.accountant = LedgerAccountant(ledger)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=8), noise_multiplier=1.0,
            max_grad_norm=1.0, **kwargs)
    return (ledger, *private)


def test_a_ledger_accountant_charges_accumulated_micro_batches_as_accumulated():
    # Opacus' hook steps the accountant at q·k for k backward passes per step; the
    # LedgerAccountant charged SubsampledGaussian(σ, k·q), which under-counts k Poisson
    # draws noised once (docs/theory.md §14; attach charges the accumulated mechanism)
    from privguard import mechanisms as M

    ledger, model, opt, loader = _ledger_accountant_run()
    model.allow_grad_accumulation()
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)
    opt.zero_grad()
    for _ in range(3):
        x, y = next(batches)
        nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    (record,) = ledger.history
    assert record.mechanism == M.AccumulatedSubsampledGaussian(1.0, q, 3)
    assert M.AccumulatedSubsampledGaussian(1.0, q, 3).rdp([8.0])[0] > \
        M.SubsampledGaussian(1.0, 3 * q).rdp([8.0])[0]  # what was charged before: less


def test_a_ledger_accountant_refuses_a_ghost_clipping_optimizer_before_the_update():
    # a ghost-clipping optimizer reports one micro-batch whatever ran: the accountant
    # cannot count them (attach counts the wrapped loss' backward passes)
    ledger, model, opt, criterion, loader = _ledger_accountant_run(
        grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss())
    before = [p.detach().clone() for p in model.parameters()]
    x, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(x), y).backward()
    with pytest.raises(InvalidArgumentError, match="ghost clipping") as info:
        opt.step()
    assert info.value.argument == "optimizer"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(ledger.history) == 0


def test_accumulated_steps_recorded_before_an_attach_without_loader_are_charged_accumulated():
    # Opacus records a step of k backward passes at q·k; attach recognised that as k
    # accumulated draws only against data_loader's rate: without data_loader (the rate
    # then comes from Opacus' own hook, the q it multiplied by k) the steps before attach
    # were charged SubsampledGaussian(σ, k·q), an under-count (docs/theory.md §14)
    from privguard import mechanisms as M

    model, opt, loader = _private()
    model.allow_grad_accumulation()
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)
    for _ in range(2):
        opt.zero_grad()
        for _ in range(3):
            x, y = next(batches)
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    ledger = Ledger(delta=1e-5)
    handle = _attach(opt, ledger)
    assert handle.steps_replayed == 2
    assert [r.mechanism for r in ledger.history] == \
        [M.AccumulatedSubsampledGaussian(1.0, q, 3)] * 2


def test_a_step_hook_replaced_after_attach_sees_each_step_after_its_charge():
    # Opacus calls one step hook: optimizer.attach_step_hook(fn) after attach replaced
    # privguard's, and every later step was noised and applied with nothing charged (smp:
    # then charged and refused; review rsmp: under DDP uncharged, or a hang, so the hook
    # now runs behind the charge, on one process as with every rank)
    model, opt, loader = _private()
    ledger = Ledger(delta=1e-5)
    handle = _attach(opt, ledger, data_loader=loader)
    seen = []

    def logging_hook(optimizer):  # e.g. a logging hook, replacing privguard's
        seen.append(len(ledger.history))

    opt.attach_step_hook(logging_hook)
    before = [p.detach().clone() for p in model.parameters()]
    _step(model, opt, loader)
    assert seen == [1] and handle.steps_charged == 1  # charged before the hook saw it
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.step_hook is logging_hook  # the user's hook stays theirs
    # a hook that calls privguard's (chained) is charged once per step
    previous = handle._hook

    def chained(optimizer):
        previous(optimizer)
        seen.append(len(ledger.history))

    opt.attach_step_hook(chained)
    _step(model, opt, loader)
    assert seen == [1, 2] and len(ledger.history) == 2 == handle.steps_charged
    opt.attach_step_hook(None)  # no hook at all: still charged
    _step(model, opt, loader)
    assert len(ledger.history) == 3 == handle.steps_charged
    opt.attach_step_hook(logging_hook)
    handle.detach()  # a detached optimizer steps freely, with the user's hook
    _step(model, opt, loader)
    assert len(ledger.history) == 3 and seen == [1, 2, 3] and opt.step_hook is logging_hook


def test_a_step_hook_replaced_while_the_step_is_noised_is_charged_and_refused_at_the_gate():
    # the release gate (a step pre-hook of the wrapped optimizer) stays behind the chain:
    # a hook set after the step's check (here by an add_noise override) saw the noisy
    # gradient uncharged; the step is charged, then refused before the update
    model, opt, loader = _private()
    ledger = Ledger(delta=1e-5)
    handle = _attach(opt, ledger, data_loader=loader)
    logged = []
    noise = opt.add_noise

    def add_noise():
        noise()
        opt.step_hook = logged.append

    opt.add_noise = add_noise
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidArgumentError, match="step hook") as info:
        _step(model, opt, loader)
    assert info.value.argument == "optimizer.step_hook"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(logged) == 1 and len(ledger.history) == 1 == handle.steps_charged


def test_a_step_hook_replaced_after_attach_on_an_exhausted_ledger_raises_budget_exhausted():
    from privguard import BudgetExhausted

    model, opt, loader = _private()
    ledger = Ledger(0.01, 1e-5)  # not even one step fits
    _attach(opt, ledger, data_loader=loader)
    seen = []
    opt.attach_step_hook(seen.append)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BudgetExhausted):
        _step(model, opt, loader)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(ledger.history) == 0 and seen == []  # refused before that hook saw the step


def test_a_clipping_bound_lowered_inside_an_accumulation_is_charged_at_the_effective_sigma():
    # BatchMemoryManager's virtual steps clip each physical batch at the max_grad_norm in
    # force then; the real step adds noise σ·C at the C in force at the real step. A C
    # lowered at the last physical batch (a per-iteration clipping schedule) left records
    # clipped at 10 under noise σ·0.1, an effective σ/100, and was charged as σ
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    from privguard import mechanisms as M

    model, opt, loader = _private(batch_size=16)
    opt.max_grad_norm = 10.0
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=2,
                            optimizer=opt) as batches:
        virtual = 0
        for x, y in batches:
            real = opt._step_skip_queue[0] is False  # the logical batch's last piece
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            if real:
                opt.max_grad_norm = 0.1
            opt.step()
            if real:
                break
            virtual += 1
    assert virtual >= 1  # (seeded: the first draw is split into several pieces)
    (record,) = ledger.history
    assert record.mechanism == M.SubsampledGaussian(1.0 * 0.1 / 10.0, 0.25)


def test_under_ghost_clipping_a_bound_set_on_the_optimizer_alone_is_charged_at_the_effective_sigma():
    # ghost clipping clips in the wrapped loss's backward at the module's max_grad_norm;
    # the optimizer's noise is σ·C with its own max_grad_norm. An adaptive schedule that
    # lowers the optimizer's C alone left records clipped at 10 under noise σ·0.1
    from privguard import mechanisms as M

    model, opt, criterion, loader = _private(max_grad_norm=10.0, grad_sample_mode="ghost",
                                             criterion=nn.CrossEntropyLoss())
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader)
    opt.max_grad_norm = 0.1
    x, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.step()
    (record,) = ledger.history
    assert record.mechanism == M.SubsampledGaussian(1.0 * 0.1 / 10.0, 0.125)


def test_per_layer_bounds_raised_on_the_optimizer_are_charged_at_the_effective_sigma():
    # per-layer clipping clips with max_grad_norms; the noise is σ·max_grad_norm, the norm
    # of the list when the optimizer was built. A schedule that raised the layers' bounds
    # left records clipped at ‖(10, 10, 10, 10)‖ = 20 under noise σ·0.1
    from privguard import mechanisms as M

    model, opt, loader = _private(max_grad_norm=[0.05] * 4, clipping="per_layer")
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader)
    _step(model, opt, loader)  # the list as built: charged at σ exactly
    opt.max_grad_norms = [10.0] * 4
    _step(model, opt, loader)
    first, second = (r.mechanism for r in ledger.history)
    assert first == M.SubsampledGaussian(1.0, 0.125)
    assert second.noise_multiplier == pytest.approx(opt.max_grad_norm / 20.0, rel=1e-6)


def test_a_batch_drawn_before_the_rate_was_lowered_is_charged_at_its_draw_rate():
    # Opacus' sampler reads sample_rate at each draw; a schedule that lowers the rate at the
    # top of the loop (for the next batches) left the step on a batch drawn at q = 0.5
    # charged at 0.01
    from privguard import mechanisms as M

    model, opt, loader = _private(batch_size=32)  # q = 0.5
    ledger = Ledger(delta=1e-5)
    handle = _attach(opt, ledger, data_loader=loader)
    batches = (batch for _ in range(2) for batch in loader)  # 2 steps an epoch at q = 0.5
    for _ in range(3):
        x, y = next(batches)
        loader.batch_sampler.sample_rate = 0.01
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        opt.step()
    first, second, third = (r.mechanism for r in ledger.history)
    assert first == M.SubsampledGaussian(1.0, 0.5)  # drawn at 0.5
    # the window holds the draws since the step before the last (a batch held across a
    # step, review rsmp), then moves on
    assert second == M.SubsampledGaussian(1.0, 0.5)
    assert third == M.SubsampledGaussian(1.0, 0.01)
    handle.detach()  # the batch sampler gets its own class back
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    assert type(loader.batch_sampler) is UniformWithReplacementSampler


class _CountedRates(list):
    """A stand-in for DrawnRates' record that counts the rates a step reads."""

    read = 0

    def _counted(self, items):
        for item in items:
            type(self).read += 1
            yield item

    def __iter__(self):
        return self._counted(list.__iter__(self))

    def __reversed__(self):
        return self._counted(list.__reversed__(self))


def test_a_step_reads_only_the_draws_it_may_train_on_not_every_kept_rate():
    # review rsmp: the step copied every kept rate (up to 4096) to read its window: ~15 µs
    # on the critical path of every step of a long run (issue 26: attach ≤ 1.02× Opacus)
    from privguard.integrations._drawn_rates import DrawnRates

    _model, _opt, loader = _private(batch_size=8)
    drawn = DrawnRates(loader, 0.125)
    try:
        drawn.rates = _CountedRates([0.125] * 4000 + [0.5])  # type: ignore[assignment]
        drawn.since = 1
        assert drawn.rate(0.125) == 0.5  # the newest draw, at 0.5
        assert _CountedRates.read <= drawn.since + drawn.ahead
    finally:
        drawn.restore()


def test_batches_in_flight_in_two_iterators_of_one_loader_are_charged_at_their_draw_rate():
    # review rsmp: the window held the prefetch of one iterator (prefetch_factor ×
    # num_workers draws); two live iterators of the loader (zip(loader, loader), a step on
    # each batch) hold twice that in flight, and the fourth step on the first iterator
    # trained on a batch drawn at q = 0.125 and charged the lowered rate
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=8, num_workers=1, prefetch_factor=2),
            noise_multiplier=1.0, max_grad_norm=1.0)
    assert (loader.num_workers, loader.prefetch_factor) == (1, 2)  # q = 0.125
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader)
    first, second = iter(loader), iter(loader)  # each draws 2 batches ahead at q = 0.125
    for i in range(4):
        for x, y in (next(first), next(second)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
            opt.step()
        loader.batch_sampler.sample_rate = 0.01  # the draws from here on
    # each iterator's batches 1 to 3 (its 2 ahead and the one drawn at its first next())
    # were drawn at 0.125: steps A1 B1 A2 B2 A3 B3 (A3 was charged 0.01 before)
    assert [r.mechanism.sample_rate for r in ledger.history][:6] == [0.125] * 6
    del first, second


def test_a_batch_held_by_a_prefetcher_across_a_step_is_charged_at_its_draw_rate():
    # review rsmp: a loop that holds the next batch while it trains on this one (a device
    # prefetcher) trains, after the rate was lowered, on a batch drawn before; the window
    # (the draws since the last step) held only the batch drawn for the step after
    model, opt, loader = _private(batch_size=16)  # q = 0.25
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    ahead = next(batches)
    for _ in range(3):
        (x, y), ahead = ahead, next(batches)  # the next batch drawn before this step
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        opt.step()
        loader.batch_sampler.sample_rate = 0.01
    # the first two steps trained on batches drawn at 0.25 (the second was charged 0.01)
    assert [r.mechanism.sample_rate for r in ledger.history][:2] == [0.25, 0.25]


def test_detach_after_a_step_that_failed_before_its_hook_gives_back_the_replacing_hook():
    # a replacing hook is put behind the charge for one step; a step that fails before its
    # hook (here add_noise) leaves it there until the next step or detach
    model, opt, loader = _private()
    ledger = Ledger(delta=1e-5)
    handle = _attach(opt, ledger, data_loader=loader)
    seen = []
    opt.attach_step_hook(seen.append)
    noise = opt.add_noise

    def failing():
        raise RuntimeError("device lost")

    opt.add_noise = failing
    with pytest.raises(RuntimeError, match="device lost"):
        _step(model, opt, loader)
    opt.add_noise = noise
    handle.detach()
    assert opt.step_hook == seen.append and seen == [] and len(ledger.history) == 0
