"""Review radv6 of task adv6 (docs/theory.md §14.9): what the pairing check let through.

* One batch through two ``backward()`` calls: Opacus holds two entries of the same
  records, main and adv6 charged ``AccumulatedSubsampledGaussian(σ, q, 2)``; but a
  record then sits at weight 2 in one Poisson draw (its sum moves by 2C with
  probability q), which k independent draws do not cover. Refused before the charge.
* Opacus' accumulation unwrapped (an ``importlib.reload``) or renamed: adv6 skipped the
  check; now a clip is treated as marked (fail closed) and the wrap is put back.
* Lightning's batch drawn ahead was forgotten at every clip with no marked parameter,
  so the next marked clip compared rows against the wrong batch (false refusals).
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.grad_sample import grad_sample_module as gsm  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations import _forward_pairing  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
SIGMA = 1.0


def _private(separate=False, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(64, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    engine = opacus.PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=SIGMA,
        max_grad_norm=1.0, poisson_sampling=not separate)
    if separate:  # Opacus' hook for its own loader raises on several backward() a step
        loader = DPDataLoader.from_data_loader(loader)
    return model, opt, loader, nn.CrossEntropyLoss()


def _nonempty(batches):
    for x, y in batches:
        if len(x):
            return x, y
    raise AssertionError("the loader ran out")


def test_one_batch_through_two_backward_calls_is_refused_before_the_charge():
    model, opt, loader, crit = _private(separate=True)
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _nonempty(iter(loader))
    opt.zero_grad()
    crit(model(x), y).backward()
    crit(model(x), y).backward()
    # adv6 (and main) charged AccumulatedSubsampledGaussian(σ, q, 2) and applied it
    with pytest.raises(InvalidArgumentError, match="More backward"):
        opt.step()
    assert handle.steps_charged == 0 and ledger.history == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_one_backward_per_batch_with_a_batch_left_out_is_charged_as_before():
    # a batch drawn and not trained on (an empty one skipped, say) leaves the count
    model, opt, loader, crit = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    steps = 0
    for i, (x, y) in enumerate(loader):
        if i % 3 == 1:
            continue
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        steps += 1
    assert len(ledger.history) == steps


def test_an_unwrapped_accumulation_fails_closed_and_is_wrapped_again(monkeypatch):
    model, opt, loader, crit = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    wrapped = gsm.create_or_accumulate_grad_sample
    # what an importlib.reload of Opacus' module does: its own function back in place
    monkeypatch.setattr(gsm, "create_or_accumulate_grad_sample", wrapped.__wrapped__)
    batches = iter(loader)
    (x1, y1), (x2, y2) = _nonempty(batches), _nonempty(batches)
    opt.zero_grad()
    (crit(model(x1), y1) + crit(model(x2), y2)).backward()
    with pytest.raises(InvalidArgumentError, match="one backward"):
        opt.step()  # adv6: nothing marked, charged AccumulatedSubsampledGaussian(σ, q, 2)
    assert ledger.history == []
    assert _forward_pairing.watched()  # the next backward passes are watched again


def test_the_wrap_is_made_once_and_survives_a_reload_of_its_module():
    assert _forward_pairing.watch_opacus()
    first = gsm.create_or_accumulate_grad_sample
    reloaded = importlib.reload(_forward_pairing)
    assert reloaded.watch_opacus()
    assert gsm.create_or_accumulate_grad_sample is first  # not wrapped twice (adv6: was)
    assert reloaded.watched()


def test_the_wrap_changes_nothing_of_opacus_for_a_model_not_attached(monkeypatch):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(torch.tanh(self.inner(x)))

    def per_sample():
        torch.manual_seed(3)
        model = opacus.GradSampleModule(Tied())
        x = torch.randn(5, 4)
        (model(x).sum() + model(x + 1).sum()).backward()
        return [p.grad_sample.clone() for p in model.parameters()]

    assert _forward_pairing.watch_opacus()
    watched = per_sample()
    monkeypatch.setattr(gsm, "create_or_accumulate_grad_sample",
                        gsm.create_or_accumulate_grad_sample.__wrapped__)
    plain = per_sample()
    assert all(torch.equal(a, b) for a, b in zip(watched, plain))


def test_a_batch_drawn_ahead_is_held_over_clips_with_nothing_marked():
    # Lightning's fetcher draws one batch ahead (LedgerCallback sets ahead = 1); the
    # loop runs the batch twice (an augmentation) on every other step only. adv6 forgot
    # the held batch at the unmarked clips and refused a marked one whose batch was
    # smaller than the one drawn after it.
    for seed in range(4):
        model, opt, loader, crit = _private(seed=seed)
        ledger = Ledger(delta=1e-5)
        handle = attach(opt, ledger, data_loader=loader)
        handle.pairing.ahead = 1
        batches = iter(loader)
        nxt = next(batches)
        step = 0
        while nxt is not None:
            (x, y), nxt = nxt, next(batches, None)
            opt.zero_grad()
            loss = crit(model(x), y)
            if step % 2:
                loss = loss + crit(model(x + 0.1 * torch.randn_like(x)), y)
            loss.backward()
            opt.step()
            step += 1
        q = loader.batch_sampler.sample_rate
        assert all(r.mechanism in (M.SubsampledGaussian(SIGMA, q),
                                   M.AccumulatedSubsampledGaussian(SIGMA, q, 2))
                   for r in ledger.history)
        assert len(ledger.history) == step



def test_a_batch_split_by_hand_with_an_augmented_second_half_is_charged_as_before():
    # the second half's clip is marked (two forwards, one backward) and no batch was
    # delivered for it: left to the counts (an intermediate radv6 took min() of nothing;
    # a marked first half is refused, as on adv6: fewer rows than the batch's records)
    model, opt, loader, crit = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    q = loader.batch_sampler.sample_rate
    for step, (x, y) in enumerate(loader):
        half = len(x) // 2
        for j, (xs, ys) in enumerate(((x[:half], y[:half]), (x[half:], y[half:]))):
            opt.zero_grad()
            loss = crit(model(xs), ys)
            (loss + crit(model(xs + 0.1), ys) if j else loss).backward()
            if j == 0:
                opt.signal_skip_step(do_skip=True)
            opt.step()
        if step == 2:
            break
    assert [r.mechanism for r in ledger.history] == \
        [M.AccumulatedSubsampledGaussian(SIGMA, q, 2)] * 3
