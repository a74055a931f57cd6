"""Two Poisson batches through one ``backward()`` (task adv6, docs/theory.md §14.9).

Opacus' hooks add the per-sample rows of every forward pass of one backward row by
row: ``crit(model(x1), y1) + crit(model(x2), y2)`` clips g(x1ᵢ) + g(x2ᵢ) once, so
one record moves the rows of the other batch's records and the step is not the
``AccumulatedSubsampledGaussian(σ, q, 2)`` main charged it as. attach now refuses
it before the charge; tied weights, an RNN, the same batch twice, accumulation
(one backward per batch, with or without ``signal_skip_step``) and
``BatchMemoryManager`` keep a row per record and are charged as before.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.layers import DPLSTM  # noqa: E402
from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
SIGMA = 1.0


class _Tied(nn.Module):
    """One Linear applied twice (its weight is tied to itself), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.inner(torch.tanh(self.inner(x))))


class _Recurrent(nn.Module):
    """Opacus' DPLSTM over the 6 features as 3 time steps of 2."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = DPLSTM(2, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        out, _ = self.rnn(x.view(x.shape[0], 3, 2))
        return self.head(out[:, -1])


def _private(model=None, n=64, batch_size=8, separate=False):
    torch.manual_seed(0)
    x = torch.randn(n, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(6, 2) if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    engine = opacus.PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=SIGMA,
        max_grad_norm=1.0, poisson_sampling=not separate)
    if separate:  # Opacus' hook for its own loader raises on several backward() a step
        loader = DPDataLoader.from_data_loader(loader)
    return model, opt, loader, nn.CrossEntropyLoss()


def _nonempty(batches):
    """Draw until a batch has records (an empty one paired with another is harmless)."""
    for x, y in batches:
        if len(x):
            return x, y
    raise AssertionError("the loader ran out")


@pytest.mark.parametrize("witnesses", [False, True])
def test_two_batches_through_one_backward_are_refused_before_the_charge(witnesses):
    model, opt, loader, crit = _private()
    ledger = Ledger(epsilon=50.0, delta=1e-5) if witnesses else Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader, witnesses=witnesses)
    before = [p.detach().clone() for p in model.parameters()]
    batches = iter(loader)
    (x1, y1), (x2, y2) = _nonempty(batches), _nonempty(batches)
    opt.zero_grad()
    (crit(model(x1), y1) + crit(model(x2), y2)).backward()
    # main charged AccumulatedSubsampledGaussian(σ, q, 2) and applied the step
    with pytest.raises(InvalidArgumentError, match="one backward") as info:
        opt.step()
    assert "2 batch(es)" in str(info.value)
    assert "fewer per-sample rows than those batches' records" in str(info.value)
    # the drawn batch sizes depend on who is in the data: the message does not show them
    assert f"{len(x1) + len(x2)} records" not in str(info.value)
    assert f"{max(len(x1), len(x2))} per-sample rows" not in str(info.value)
    assert handle.steps_charged == 0
    assert [r for r in ledger.history if "witnesses" not in r.label] == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # the refused step's gradients are dropped; a sound next step is charged
    x, y = _nonempty(batches)
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
    q = loader.batch_sampler.sample_rate
    assert [r.mechanism for r in ledger.history if "witnesses" not in r.label] == \
        [M.SubsampledGaussian(SIGMA, q)]


def test_two_batches_in_a_skipped_micro_batch_are_refused_at_the_real_step():
    model, opt, loader, crit = _private(separate=True)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    x1, y1 = _nonempty(batches)
    opt.zero_grad()
    crit(model(x1), y1).backward()
    opt.signal_skip_step(do_skip=True)
    opt.step()  # a skipped step: nothing charged, the pairing is marked
    (x2, y2), (x3, y3) = _nonempty(batches), _nonempty(batches)
    opt.zero_grad()
    (crit(model(x2), y2) + crit(model(x3), y3)).backward()
    opt.signal_skip_step(do_skip=True)
    opt.step()
    x4, y4 = _nonempty(batches)
    opt.zero_grad()
    crit(model(x4), y4).backward()
    with pytest.raises(InvalidArgumentError, match="one backward"):
        opt.step()
    assert ledger.history == []


@pytest.mark.parametrize("make", [_Tied, _Recurrent], ids=["tied", "rnn"])
def test_tied_weights_and_time_steps_are_charged_as_before(make):
    model, opt, loader, crit = _private(make())
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    q = loader.batch_sampler.sample_rate
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)] * len(loader)


def test_the_same_batch_twice_through_one_backward_is_charged_as_before():
    # consistency regularisation: the batch and an augmentation of it, one backward
    model, opt, loader, crit = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    for x, y in loader:
        opt.zero_grad()
        (crit(model(x), y) + crit(model(x + 0.1 * torch.randn_like(x)), y)).backward()
        opt.step()
    q = loader.batch_sampler.sample_rate
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)] * len(loader)


@pytest.mark.parametrize("skip", [False, True])
def test_accumulation_one_backward_per_batch_is_charged_as_before(skip):
    model, opt, loader, crit = _private(separate=True)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    for _ in range(3):
        opt.zero_grad()
        for j in range(2):
            x, y = next(batches)
            if skip:
                opt.zero_grad()
            crit(model(x), y).backward()
            if skip and j == 0:
                opt.signal_skip_step(do_skip=True)
                opt.step()
        opt.step()
    q = loader.batch_sampler.sample_rate
    assert [r.mechanism for r in ledger.history] == \
        [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 3


def test_batch_memory_manager_is_charged_as_before():
    model, opt, loader, crit = _private(batch_size=16)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=3,
                            optimizer=opt) as physical:
        for x, y in physical:
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()
    q = loader.batch_sampler.sample_rate
    assert ledger.history and all(r.mechanism == M.SubsampledGaussian(SIGMA, q)
                                  for r in ledger.history)


def test_detach_gives_clip_and_accumulate_back():
    _, opt, loader, _ = _private()
    handle = attach(opt, Ledger(delta=1e-5), data_loader=loader)
    assert "clip_and_accumulate" in vars(opt)
    handle.detach()
    assert "clip_and_accumulate" not in vars(opt)
