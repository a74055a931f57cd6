"""Review bi: a real step refused after skipped steps (``signal_skip_step``) under attach.

Opacus' ``pre_step`` clips the step's micro-batches into ``p.summed_grad`` and noises it
before the hook charges. Before the fix a refusal left that sum in place with
``_is_last_step_skipped`` still True, so ``zero_grad()`` kept it and the next real step
raised Opacus' plain ``ValueError`` ("Gradients haven't been cleared since the last
optimizer step"); had it not, the refused micro-batches would have been noised again
inside a later, differently charged step. The refused step's state is now dropped and the
next real step is charged for its own micro-batches only.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import BudgetExhausted, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
              pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def _private(mode):
    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    engine = opacus.PrivacyEngine(accountant="rdp")
    criterion = nn.CrossEntropyLoss()
    kwargs = dict(module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
                  max_grad_norm=1.0)
    if mode == "ghost":
        model, opt, criterion, loader = engine.make_private(
            criterion=criterion, grad_sample_mode="ghost", **kwargs)
    else:
        model, opt, loader = engine.make_private(**kwargs)
    return model, opt, loader, criterion


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("on_exhausted", ["raise", "stop"])
def test_the_step_after_a_refused_accumulated_step_is_its_own(mode, on_exhausted):
    model, opt, loader, criterion = _private(mode)
    ledger = Ledger(0.5, 1e-5)
    handle = attach(opt, ledger, data_loader=loader, on_exhausted=on_exhausted)
    batches = iter(loader)
    q = 8 / 64

    def step(skip):
        opt.zero_grad()
        x, y = next(batches)
        criterion(model(x), y).backward()
        if skip:
            opt.signal_skip_step(do_skip=True)
        opt.step()

    before = [p.detach().clone() for p in model.parameters()]
    step(True)
    if on_exhausted == "raise":
        with pytest.raises(BudgetExhausted):
            step(False)
    else:
        step(False)
        assert handle.exhausted
    assert len(ledger.runs) == 0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(getattr(p, "summed_grad", None) is None and p.grad is None
               for p in opt.params)  # nothing of the refused step is kept to be released
    opt.noise_multiplier = 1000.0  # the loop adds noise: the next step fits
    step(True)
    step(False)  # was: ValueError("Gradients haven't been cleared ...")
    (run,) = ledger.runs
    assert run.mechanism == M.AccumulatedSubsampledGaussian(1000.0, q, 2)
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


@pytest.mark.parametrize("kwargs, name", [({"micro_batches": 2**21}, "micro_batches"),
                                          ({"micro_batches": 10**400}, "micro_batches"),
                                          ({"planned_steps": 2**60}, "planned_steps")])
def test_attach_refuses_counts_no_step_could_be_charged_with(kwargs, name):
    # attached before, then every step refused (micro_batches above the accumulated step's
    # 2^20); a plan beyond 2^53 steps
    from privguard import InvalidArgumentError

    _, opt, loader, _ = _private("hooks")
    with pytest.raises(InvalidArgumentError, match=f"{name}="):
        attach(opt, Ledger(3.0, 1e-5), data_loader=loader, **kwargs)
    attach(opt, Ledger(3.0, 1e-5), data_loader=loader).detach()  # nothing was attached
