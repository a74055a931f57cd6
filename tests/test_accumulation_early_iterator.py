"""Micro-batches accumulated with ``signal_skip_step`` from an iterator made before attach (u27).

attach counts the micro-batches of a step from the batches ``data_loader`` hands out through
its swapped class; an iterator the loop made before attach is the original class's and is
never counted, and with ``zero_grad()`` between micro-batches the optimizer holds one batch's
per-sample gradients at the real step. Two accumulated Poisson draws were charged as one
``SubsampledGaussian(σ, q)``. attach now also counts the optimizer's skipped steps
(integrations/_skips.py): every skip not queued by Opacus' ``BatchMemoryManager``, whose
virtual steps split one Poisson draw and stay one ``SubsampledGaussian`` per logical batch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations import RandomAllocationSampler  # noqa: E402
from privguard.integrations.opacus import NonPoissonSamplingError, attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
SIGMA = 1.0


def _private(mode="hooks", n=64, batch_size=8, allocation=False, separate=False, workers=0):
    """make_private with Opacus' own Poisson loader (or a RandomAllocationSampler loader);
    ``separate``: a DPDataLoader built apart (Opacus' hook for its own Poisson loader raises
    on several backward() per step)."""
    torch.manual_seed(0)
    x = torch.randn(n, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(x, y)
    loader = (DataLoader(data, batch_sampler=RandomAllocationSampler(
        n, n // batch_size, generator=torch.Generator().manual_seed(0)))
        if allocation else DataLoader(data, batch_size=batch_size, num_workers=workers))
    engine = opacus.PrivacyEngine(accountant="rdp")
    criterion = nn.CrossEntropyLoss()
    kwargs = dict(module=model, optimizer=opt, data_loader=loader, noise_multiplier=SIGMA,
                  max_grad_norm=1.0, poisson_sampling=not (allocation or separate))
    if mode == "ghost":
        model, opt, criterion, loader = engine.make_private(
            criterion=criterion, grad_sample_mode="ghost", **kwargs)
    else:
        model, opt, loader = engine.make_private(**kwargs)
    if separate:
        loader = DPDataLoader.from_data_loader(loader)
    return engine, model, opt, loader, criterion


def _skip_accumulate(model, opt, batches, criterion, steps, k, backward=1):
    """``steps`` real steps of ``k`` micro-batches, the first k − 1 skipped with
    ``signal_skip_step``, ``zero_grad()`` between micro-batches; each micro-batch runs
    ``backward`` batches through ``backward()`` before its ``step()``."""
    for _ in range(steps):
        for j in range(k):
            opt.zero_grad()
            for _ in range(backward):
                x, y = next(batches)
                criterion(model(x), y).backward()
            if j < k - 1:
                opt.signal_skip_step(do_skip=True)
            opt.step()


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_the_issue_reproducer_is_charged_as_accumulation(mode):
    # the defect: `it = iter(loader)` before attach, two Poisson micro-batches per step
    _, model, opt, loader, criterion = _private(mode)
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)  # made before attach: the loader counter never sees its batches
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    _skip_accumulate(model, opt, batches, criterion, steps=3, k=2)
    assert handle.counter is not None and handle.counter.count == 0  # the counter saw nothing
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 3
    assert handle.next_mechanism() == M.AccumulatedSubsampledGaussian(SIGMA, q, 2)


def test_without_data_loader_skipped_micro_batches_are_counted_too():
    # the same loop with the rate from Opacus' hook: no loader counter at all
    _, model, opt, loader, criterion = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, check_poisson=False)
    _skip_accumulate(model, opt, iter(loader), criterion, steps=2, k=3)
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 3)] * 2


def test_several_backward_in_a_skipped_micro_batch_are_all_counted():
    # a skipped step that clipped two batches (two backward() before it) and a real step of
    # one more: three Poisson draws in one noise draw, not max(2, 1)
    _, model, opt, loader, criterion = _private(separate=True)
    q = loader.batch_sampler.sample_rate
    batches = iter(loader)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    opt.zero_grad()
    for _ in range(2):
        x, y = next(batches)
        criterion(model(x), y).backward()
    opt.signal_skip_step(do_skip=True)
    opt.step()
    opt.zero_grad()
    x, y = next(batches)
    criterion(model(x), y).backward()
    opt.step()
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 3)]


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("with_loader", [False, True])
def test_batch_memory_manager_stays_one_draw_per_logical_batch(early, with_loader, mode):
    # BatchMemoryManager's virtual steps split ONE Poisson batch: one SubsampledGaussian per
    # logical batch, also when its iterator was made before attach or attach has no loader;
    # under ghost clipping also with the backward passes counted at the optimizer (task gc:
    # one per step(), so the splits stay one draw; without a loader ghost needs micro_batches)
    engine, model, opt, loader, criterion = _private(mode, n=256, batch_size=64)
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    physical = 0
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        batches = iter(mem) if early else None
        attach(opt, ledger, **(dict(data_loader=loader) if with_loader else
                                dict(check_poisson=False, micro_batches=1)))
        for x, y in (batches if early else mem):
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
            physical += 1
    real = sum(n for _, _, n in engine.accountant.history)
    assert physical > real > 0
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)] * real


def test_batch_memory_manager_with_workers_queueing_signals_ahead():
    # the workers fetch ahead: BatchSplittingSampler queues the signals of later physical
    # batches before the loop steps on the earlier ones; Opacus consumes them in order
    # (FIFO) and so does the mirror of their origins
    engine, model, opt, loader, criterion = _private(n=256, batch_size=64, workers=2)
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    ahead = 0
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        for x, y in mem:
            ahead = max(ahead, len(opt._step_skip_queue))
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
    assert ahead > 1  # signals were queued ahead of the loop
    real = sum(n for _, _, n in engine.accountant.history)
    assert real > 0 and [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)] * real
    assert handle.skips is not None and handle.skips.skipped == 0


def test_batch_memory_manager_skips_count_when_a_step_takes_two_physical_batches():
    # BatchMemoryManager's skips mark splits of one draw only under its contract (one step()
    # per physical batch). Draws A = 4, B = 2, C = 2 records split at 2: signals T, F, F.
    # Two backward() per step(): step 1 clips A's two halves and takes A's T (skipped),
    # step 2 clips B and C and takes A's F: one noise draw over three Poisson draws, while
    # the optimizer reports 2 at the real step
    from opacus.utils.batch_memory_manager import BatchSplittingSampler

    _, model, opt, loader, criterion = _private(separate=True)
    q = loader.batch_sampler.sample_rate
    x, y = loader.dataset.tensors
    draws = [[0, 1, 2, 3], [4, 5], [6, 7], [8, 9, 10, 11]]
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    physical = iter(BatchSplittingSampler(sampler=draws, max_batch_size=2, optimizer=opt))
    for _ in range(2):
        opt.zero_grad()
        for _ in range(2):
            idx = next(physical)
            criterion(model(x[idx]), y[idx]).backward()
        opt.step()
    (charged,) = [r.mechanism for r in ledger.history]
    assert isinstance(charged, M.AccumulatedSubsampledGaussian) and charged.sample_rate == q
    assert charged.micro_batches >= 3  # here 4: every clipped batch counted


def test_a_poisson_batch_split_by_hand_counts_its_splits():
    # BatchMemoryManager by hand: one Poisson batch drawn through the counted loader, split
    # into halves with signal_skip_step. u27 charged it as one draw when the records clipped
    # equalled the counted batch's size; review rs withdrew that rule (equal totals do not
    # show the records are the counted batch's: the two tests below). The halves count:
    # over-counting (k = 2 for D = 1), also as predicted between the halves
    _, model, opt, loader, criterion = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    predicted = []
    for step, (x, y) in enumerate(loader):
        halves = [(x[: len(x) // 2], y[: len(y) // 2]), (x[len(x) // 2:], y[len(y) // 2:])]
        for j, (xs, ys) in enumerate(halves):
            opt.zero_grad()
            criterion(model(xs), ys).backward()
            if j == 0:
                opt.signal_skip_step(do_skip=True)
            opt.step()
            if j == 0:
                predicted.append(handle.next_mechanism())
        if step == 2:
            break
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 3
    assert predicted == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 3


def test_a_batch_from_an_early_iterator_next_to_a_counted_one_is_counted():
    # one micro-batch from an iterator made before attach, one through the counted loader:
    # the records clipped exceed the counted batch's, so the skips count (k = 2, not 1)
    _, model, opt, loader, criterion = _private()
    q = loader.batch_sampler.sample_rate
    early = iter(loader)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    late = iter(loader)
    for j, batches in enumerate((early, late)):
        opt.zero_grad()
        x, y = next(batches)
        assert len(x) > 0
        criterion(model(x), y).backward()
        if j == 0:
            opt.signal_skip_step(do_skip=True)
        opt.step()
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)]


def test_random_allocation_with_skipped_micro_batches_is_refused_not_charged_as_an_epoch():
    # merged steps would run an epoch of t batches in t/2 steps: RandomAllocation(σ, t)
    # under-counts; accumulation of an allocation loader is refused, nothing charged
    _, model, opt, loader, criterion = _private(allocation=True)
    batches = iter(loader)  # before attach
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonPoissonSamplingError, match="micro_batches"):
        _skip_accumulate(model, opt, batches, criterion, steps=1, k=2)
    assert len(ledger.history) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_refused_step_drops_its_skipped_micro_batches():
    # Opacus kept the clipped sum of skipped steps across a refused real step (the hook
    # raised before _is_last_step_skipped was reset), marked processed: the next real step
    # raised Opacus' ValueError (review bi). The refused step's sum is now dropped with it
    # (tests/test_adv_bi_opacus.py), and the next real step holds its own draws only
    _, model, opt, loader, criterion = _private()
    q = loader.batch_sampler.sample_rate
    step = M.AccumulatedSubsampledGaussian(SIGMA, q, 2)
    ledger = Ledger(epsilon=2.5, delta=1e-5)
    assert not ledger.can_afford(step) and ledger.can_afford(M.SubsampledGaussian(SIGMA, q))
    batches = iter(loader)  # before attach
    handle = attach(opt, ledger, data_loader=loader, on_exhausted="stop")
    _skip_accumulate(model, opt, batches, criterion, steps=1, k=2)
    assert handle.exhausted and len(ledger.history) == 0
    assert all(getattr(p, "summed_grad", None) is None for p in opt.params)
    assert handle.next_mechanism() == M.SubsampledGaussian(SIGMA, q)  # the refused draws: gone
    assert handle.should_stop  # exhausted: the loop was told to stop


def test_attach_in_the_middle_of_an_accumulation_is_refused():
    # a step skipped before attach left its clipped micro-batch in the sum the next real step
    # noises: attach cannot count it, so it refuses (nothing attached, nothing charged)
    from privguard import InvalidArgumentError

    _, model, opt, loader, criterion = _private()
    batches = iter(loader)
    x, y = next(batches)
    criterion(model(x), y).backward()
    opt.signal_skip_step(do_skip=True)
    opt.step()
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match=r"optimizer.*middle of an accumulation"):
        attach(opt, ledger, data_loader=loader)
    assert len(ledger.history) == 0 and "signal_skip_step" not in vars(opt)
    assert type(loader) is DPDataLoader  # no counter swapped in


def test_detach_restores_the_optimizer_methods():
    _, _, opt, loader, _ = _private()
    handle = attach(opt, Ledger(delta=1e-5), data_loader=loader)
    assert "signal_skip_step" in vars(opt) and "_check_skip_next_step" in vars(opt)
    handle.detach()
    assert "signal_skip_step" not in vars(opt) and "_check_skip_next_step" not in vars(opt)


def test_a_count_above_the_draws_never_charges_less():
    # the counts are floors (k ≥ the draws D, over-counting where a loop mixes its own skips
    # with BatchMemoryManager's): the charged curve of k + 1 draws is never below that of k
    # (docs/theory.md §14.4; checked here, not proved)
    import numpy as np

    orders = Ledger(delta=1e-5).orders
    for sigma in (0.5, 1.0):
        for q in (0.01, 0.5):
            prev = np.asarray(M.SubsampledGaussian(sigma, q).rdp(orders))
            for k in (2, 3, 4):
                cur = np.asarray(M.AccumulatedSubsampledGaussian(sigma, q, k).rdp(orders))
                assert np.all(cur >= prev), (sigma, q, k)
                prev = cur


def test_an_empty_draw_from_an_early_iterator_still_counts_review_rs():
    # review rs: u27's hand-split rule (records clipped == sizes the loader counter saw, since
    # withdrawn) took an empty Poisson draw from an iterator made before attach (0 records,
    # never counted) plus a counted draw as one split draw: D = 2 charged SubsampledGaussian
    _, model, opt, loader, criterion = _private(n=64, batch_size=2)  # q = 1/32: empty draws
    q = loader.batch_sampler.sample_rate
    early = iter(loader)  # made before attach: the counter never sees its batches
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    x, y = next(early)
    while len(x) > 0:  # the seeded loader's first empty draw
        x, y = next(early)
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.signal_skip_step(do_skip=True)
    opt.step()
    late = iter(loader)  # the next epoch's iterator, made after attach: counted
    x, y = next(late)
    assert len(x) > 0  # the seeded draw: one counted batch, all of it clipped
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.step()
    assert handle.counter is not None
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)]


def _bmm_draws_per_real_step(own_signal_at=None, drop_at=None, epochs=1):
    """A BatchMemoryManager loop (no workers) over a Poisson loader, attached with its
    loader: per real step (the Poisson draws whose batches its noise covered, what was
    charged). ``own_signal_at``: the loop queues ``signal_skip_step(do_skip=False)`` of its
    own at that physical batch ("before": before attach); ``drop_at``: it leaves that
    physical batch out (no backward(), no step(); "end": the first epoch's last one)."""
    _, model, opt, loader, criterion = _private(n=256, batch_size=64)
    ledger = Ledger(delta=1e-5)
    out = []
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=32, optimizer=opt) as mem:
        inner, drawn = mem.batch_sampler.sampler, []

        class Recording:  # the draw each physical batch came from (read as the loop gets it)
            def __iter__(self):
                for draw in inner:
                    drawn.append(len(draw))
                    yield draw

            def __len__(self):
                return len(inner)

        mem.batch_sampler.sampler = Recording()
        if own_signal_at == "before":
            opt.signal_skip_step(do_skip=False)
        attach(opt, ledger, data_loader=loader)
        kept = []  # each epoch's iterator, kept alive (an ended one stays referenced)

        def epochs_of():
            for _ in range(epochs):
                kept.append(iter(mem))
                yield from kept[-1]

        window = set()
        for i, (x, y) in enumerate(epochs_of()):
            last = len(drawn) == len(inner) and opt._step_skip_queue[-1:] == [False]
            if i == drop_at or (drop_at == "end" and last):
                continue
            opt.zero_grad()
            criterion(model(x), y).backward()
            if i == own_signal_at:
                opt.signal_skip_step(do_skip=False)
            charged = len(ledger.history)
            opt.step()
            window.add(len(drawn) - 1)
            if not opt._is_last_step_skipped:
                assert len(ledger.history) == charged + 1
                out.append((len(window), ledger.history[-1].mechanism))
                window = set()
    return out


@pytest.mark.parametrize("at", [0, "before"])
def test_an_own_signal_in_a_batch_memory_manager_loop_shifts_its_skips_review_rs(at):
    # review rs: Opacus' skip queue is FIFO; one signal_skip_step(False) of the loop's own
    # makes every later step consume the signal queued for the batch before it, so real
    # steps noise the end of one draw with the start of the next (D = 2) while each
    # consumed skip is still BatchMemoryManager's: charged SubsampledGaussian(σ, q)
    steps = _bmm_draws_per_real_step(own_signal_at=at)
    assert max(d for d, _ in steps) == 2  # the shift happened
    for draws, mechanism in steps:
        k = getattr(mechanism, "micro_batches", 1)
        assert k >= draws, (draws, mechanism)
    # the same loop without the signal: one draw per real step, one SubsampledGaussian each
    clean = _bmm_draws_per_real_step()
    assert clean and all(d == 1 and type(m) is M.SubsampledGaussian for d, m in clean)


@pytest.mark.parametrize("drop_at", [1, "end"])
def test_a_batch_memory_manager_loop_leaving_out_a_batch_counts_review_rs(drop_at):
    # review rs: a physical batch left out without step() (a `continue` guarding against a
    # non-finite loss, say) leaves its signal queued: every later step consumes the signal of
    # the batch before its own, real steps noise the rest of one draw with the first split
    # of the next (D = 2), and were charged SubsampledGaussian(σ, q) (also on main). Each
    # BatchMemoryManager signal is now checked against the batches its DataLoader iterator
    # handed out; "end": the left-out batch is the epoch's last, its signal consumed by the
    # next epoch's first step (a new iterator)
    steps = _bmm_draws_per_real_step(drop_at=drop_at, epochs=2 if drop_at == "end" else 1)
    assert max(d for d, _ in steps) == 2  # the shift happened: two draws under one noise
    for draws, mechanism in steps:
        assert getattr(mechanism, "micro_batches", 1) >= draws, (draws, mechanism)


def test_an_extra_step_between_batch_memory_manager_splits_counts_review_rs():
    # review rs: after a virtual step (the first split of a draw stays in the clipped sum),
    # the loop steps on a batch of another stream; the queue is empty, so that step is real
    # and noises the split with another Poisson draw (D = 2), charged SubsampledGaussian(σ, q)
    # (every skip consumed was the sampler's, paired). A real step ends the sampler's split
    # only by consuming its signal for the batch it is on
    _, model, opt, loader, criterion = _private(n=256, batch_size=64)
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    extra = iter(loader)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=32, optimizer=opt) as mem:
        batches = iter(mem)  # kept: the iterator that handed out the split is alive
        x, y = next(batches)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
        assert opt._is_last_step_skipped  # the first split: a virtual step
        x, y = next(extra)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    assert not opt._is_last_step_skipped
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)]


def test_a_prefetching_loop_with_a_second_stream_is_counted_review_rs():
    # review rs: u27's hand-split rule took "records clipped since the last real step == sizes of
    # the batches the loader counter saw since then" to mean the clipped records came from the
    # counted batches. A loop that draws the next batch ahead (a prefetcher) counts in each
    # window the batch it clips in the next; accumulating one draw of a second Poisson stream
    # (another loader object, uncounted) with it, the totals coincide whenever
    # |this batch| + |other draw| = |next batch|: D = 2 charged SubsampledGaussian(σ, q)
    _, model, opt, loader, criterion = _private(n=64, batch_size=4, separate=True)
    q = loader.batch_sampler.sample_rate
    aux = DPDataLoader.from_data_loader(loader)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches, others = iter(loader), iter(aux)
    ahead = next(batches)
    for _ in range(12):
        current, ahead = ahead, next(batches)  # the next batch drawn ahead
        for j, (x, y) in enumerate((current, next(others))):
            opt.zero_grad()
            criterion(model(x), y).backward()
            if j == 0:
                opt.signal_skip_step(do_skip=True)
            opt.step()
    assert [r.mechanism for r in ledger.history] == [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 12
