"""Task adv4: Opacus' adaptive clipping under ghost clipping (``opacus.utils.adaptive_clipping``).

``PrivacyEngineAdaptiveClipping`` trains with a plain ``DPOptimizerFastGradientClipping``,
so a check of the optimizer's class (task adv3's ``AdaClipDPOptimizer``) does not see it.
Its wrapped backward releases the noisy count of unclipped records divided by the drawn
batch size and sets ``optimizer._adjusted_noise_multiplier``, which Opacus' ``add_noise``
uses in place of the ``noise_multiplier`` attach charges. On main:

* a step of the adaptive criterion was refused only by accident (privguard's ghost counter
  took its gradient for an unclipped one: ``PipelineMismatchError`` telling the user to use
  the criterion ``make_private`` returned, which they did), and attach accepted the
  adaptive engine;
* an ``_adjusted_noise_multiplier`` below σ on a ghost optimizer (a plain attribute) noised
  the step at σ′·C and the step was charged ``SubsampledGaussian(σ, q)``: an under-count.

Both are now refused with ``InvalidArgumentError`` naming the argument, before anything is
charged or applied (``integrations/_adaptive_clipping.py``).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Opacus' hook and RNG notes
SIGMA = 1.0


def _ghost(adaptive, loss_reduction="mean", n=400, batch_size=40, features=3):
    """(engine, model, optimizer, criterion, loader) of make_private with ghost clipping."""
    torch.manual_seed(0)
    x = torch.randn(n, features)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(features, 2)
    extra = dict(target_unclipped_quantile=0.5, min_clipbound=0.01, max_clipbound=10.0,
                 clipbound_learning_rate=0.2) if adaptive else {}
    if adaptive:
        from opacus.utils.adaptive_clipping import PrivacyEngineAdaptiveClipping
        engine = PrivacyEngineAdaptiveClipping(accountant="rdp")
    else:
        engine = opacus.PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, criterion, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=batch_size),
            criterion=nn.CrossEntropyLoss(reduction=loss_reduction), noise_multiplier=SIGMA,
            max_grad_norm=1.0, grad_sample_mode="ghost", loss_reduction=loss_reduction,
            **extra)
    return engine, model, opt, criterion, loader


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(model, before):
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_adaptive_engine_is_refused_at_attach():
    # main: attached, every step then refused as "unclipped" (or, were the ghost counter
    # taught the adaptive backward, charged SubsampledGaussian(σ, q): an under-count)
    engine, _model, opt, _criterion, loader = _ghost(adaptive=True)
    ledger = Ledger(delta=1e-5)
    hook = opt.step_hook
    with pytest.raises(InvalidArgumentError) as info:
        attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    assert info.value.argument == "privacy_engine"
    assert "PrivacyEngineAdaptiveClipping" in str(info.value)
    assert ledger.history == [] and opt.step_hook is hook  # nothing charged or attached
    assert engine.accountant.__class__.__name__ == "RDPAccountant"


def test_a_step_of_the_adaptive_criterion_is_refused_naming_the_cause():
    # main: PipelineMismatchError "a loss that is not from the criterion make_private
    # returned", while it was that criterion
    _engine, model, opt, criterion, loader = _ghost(adaptive=True)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    x, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(x), y).backward()
    assert opt._adjusted_noise_multiplier > SIGMA  # Opacus' split: the gradient's share
    before = _params(model)
    with pytest.raises(InvalidArgumentError) as info:
        opt.step()
    assert info.value.argument == "optimizer"
    assert "_adjusted_noise_multiplier" in str(info.value)
    assert ledger.history == [] and _unchanged(model, before)


def test_attach_after_an_adaptive_backward_is_refused():
    _engine, model, opt, criterion, loader = _ghost(adaptive=True)
    x, y = next(iter(loader))
    criterion(model(x), y).backward()
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError) as info:
        attach(opt, ledger, data_loader=loader)
    assert info.value.argument == "optimizer" and ledger.history == []


def test_opacus_noises_a_ghost_step_at_the_adjusted_multiplier():
    # the reason: DPOptimizerFastGradientClipping.add_noise reads _adjusted_noise_multiplier
    # in place of noise_multiplier (no attach here: what Opacus releases)
    _engine, model, opt, criterion, loader = _ghost(adaptive=False, loss_reduction="sum",
                                                    features=400)
    opt._adjusted_noise_multiplier = 0.25
    x, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.step()
    noise = torch.cat([(p.grad - p.summed_grad).flatten() for p in model.parameters()])
    assert noise.numel() > 500
    assert 0.2 < float(noise.std()) < 0.3  # σ′·C = 0.25, not σ·C = 1.0


def test_an_adjusted_multiplier_below_sigma_is_refused():
    # main: the step noised at 0.25·C was charged SubsampledGaussian(1.0, q)
    _engine, model, opt, criterion, loader = _ghost(adaptive=False)
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    x, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.step()  # a fixed-bound step: charged as before
    assert len(ledger.history) == 1
    opt._adjusted_noise_multiplier = 0.25
    opt.zero_grad()
    criterion(model(x), y).backward()
    before = _params(model)
    with pytest.raises(InvalidArgumentError) as info:
        opt.step()
    assert info.value.argument == "optimizer" and "0.25" in str(info.value)
    assert len(ledger.history) == 1 and _unchanged(model, before)
    del opt._adjusted_noise_multiplier  # the fixed bound again: charged
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.step()
    assert len(ledger.history) == 2 and handle.steps_charged == 2


def test_the_adaptive_engine_without_ghost_clipping_is_charged_as_before():
    # its adaptive criterion exists under ghost clipping only; in hooks mode the engine makes
    # a plain DPOptimizer, which never reads _adjusted_noise_multiplier: not refused
    from opacus.utils.adaptive_clipping import PrivacyEngineAdaptiveClipping

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    engine = PrivacyEngineAdaptiveClipping(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(torch.randn(40, 3), torch.zeros(40).long()),
                                   batch_size=10),
            noise_multiplier=SIGMA, max_grad_norm=1.0)
    opt._adjusted_noise_multiplier = 0.25  # not read by DPOptimizer.add_noise
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert handle.steps_charged == 1 and len(ledger.history) == 1
    handle.detach()
