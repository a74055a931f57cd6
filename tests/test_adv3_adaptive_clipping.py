"""Task adv3: Opacus' adaptive clipping (``make_private(..., clipping="adaptive")``, an
``AdaClipDPOptimizer``) was attached and every step charged ``SubsampledGaussian(σ, q)`` at
its accounting σ, while the step also releases the noisy count of unclipped records (add/remove
sensitivity 1, not the ½ Opacus' noise split assumes) divided by the drawn batch size: an
under-count (docs/theory.md §14.8). ``attach`` and ``LedgerAccountant`` now refuse it, with
``InvalidArgumentError`` naming ``optimizer``, before anything is charged or updated."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from opacus import PrivacyEngine  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.opacus import LedgerAccountant, attach  # noqa: E402

SIGMA, SIGMA_U = 1.0, 1.0


def _adaptive(engine=None):
    """(model, optimizer, loader) of make_private with adaptive clipping: 40 rows in expected
    batches of 10, σ = 1, unclipped_num_std = 1."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    loader = DataLoader(TensorDataset(torch.randn(40, 2), torch.randn(40, 1)), batch_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (engine or PrivacyEngine()).make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=1.0, clipping="adaptive",
            target_unclipped_quantile=0.5, clipbound_learning_rate=0.2, max_clipbound=10.0,
            min_clipbound=0.01, unclipped_num_std=SIGMA_U)


def _step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return optimizer.step()


def test_the_charge_at_sigma_is_below_what_one_adaptive_step_releases():
    """The reason (docs/theory.md §14.8, Proposition 14.9): the gradient's noise σ_g and the
    count's σ_u compose to a subsampled Gaussian of σ' = (σ_g⁻² + σ_u⁻²)^(−1/2) < σ, whose ε
    exceeds the one of the charge at σ that main wrote."""
    _model, optimizer, _loader = _adaptive()
    sigma_g = (SIGMA ** -2 - (2 * SIGMA_U) ** -2) ** -0.5  # Opacus' own split
    sigma_step = (sigma_g ** -2 + optimizer.unclipped_num_std ** -2) ** -0.5
    assert math.isclose(sigma_step, (SIGMA ** -2 + 0.75 * SIGMA_U ** -2) ** -0.5)
    released, charged = Ledger(delta=1e-5), Ledger(delta=1e-5)
    released.charge(M.SubsampledGaussian(sigma_step, 0.25))
    charged.charge(M.SubsampledGaussian(optimizer.noise_multiplier, 0.25))  # main's charge
    assert released.epsilon() > charged.epsilon()


def test_attach_refuses_an_adaptive_clipping_optimizer_and_changes_nothing():
    _model, optimizer, loader = _adaptive()
    ledger = Ledger(delta=1e-5)
    hook = optimizer.step_hook
    with pytest.raises(InvalidArgumentError) as caught:
        attach(optimizer, ledger, data_loader=loader)
    assert caught.value.argument == "optimizer"
    assert "AdaClipDPOptimizer" in str(caught.value) and "adaptive" in str(caught.value)
    assert len(ledger.history) == 0 and optimizer.step_hook is hook
    assert "step" not in vars(optimizer)  # no graceful-step wrapper left behind


def test_a_ledger_accountant_refuses_the_first_adaptive_step_before_its_update():
    engine = PrivacyEngine()
    ledger = Ledger(delta=1e-5)
    engine.accountant = LedgerAccountant(ledger)
    model, optimizer, loader = _adaptive(engine)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidArgumentError) as caught:
        _step(model, optimizer, next(iter(loader)))
    assert caught.value.argument == "optimizer"
    assert len(ledger.history) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_ledger_accountant_that_does_not_charge_still_records_an_adaptive_step():
    """charge=False (Opacus' record only, attach charges): nothing to refuse there."""
    engine = PrivacyEngine()
    engine.accountant = LedgerAccountant(Ledger(delta=1e-5), charge=False)
    model, optimizer, loader = _adaptive(engine)
    _step(model, optimizer, next(iter(loader)))
    assert engine.accountant.history == [(SIGMA, 0.25, 1)]


def test_attach_refuses_opacus_ghost_adaptive_clipping_at_its_first_step():
    """Review radv3: Opacus' other adaptive clipping, ``PrivacyEngineAdaptiveClipping`` under
    ghost clipping, returns a plain ``DPOptimizerFastGradientClipping``: only its criterion's
    backward moves the bound and sets ``_adjusted_noise_multiplier``, of noise std (drawn
    batch size)/20, whose noise scale releases the drawn batch size. adv3's refusal looked at
    the optimizer's class only; the ghost check then refused the step as "a loss that is not
    from the criterion make_private returned" (a PipelineMismatchError, untrue). It is refused
    as adaptive clipping, before anything is charged or updated."""
    adaptive = pytest.importorskip("opacus.utils.adaptive_clipping")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    data = DataLoader(TensorDataset(torch.randn(400, 2), torch.randn(400, 1)), batch_size=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, criterion, loader = adaptive.PrivacyEngineAdaptiveClipping().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=data,
            criterion=torch.nn.MSELoss(), noise_multiplier=SIGMA, max_grad_norm=1.0,
            grad_sample_mode="ghost", target_unclipped_quantile=0.5, min_clipbound=0.01,
            max_clipbound=10.0, clipbound_learning_rate=0.2)
    ledger = Ledger(delta=1e-5)
    handle = attach(optimizer, ledger, data_loader=loader)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = next(iter(loader))
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    assert optimizer._adjusted_noise_multiplier > SIGMA  # the adaptive criterion ran
    with pytest.raises(InvalidArgumentError) as caught:
        optimizer.step()
    assert caught.value.argument == "optimizer" and "adaptive" in str(caught.value)
    assert len(ledger.history) == 0 and handle.steps_charged == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_attach_refuses_adaptive_clipping_where_opacus_moved_its_class(monkeypatch):
    """Review radv3: adv3 decided by ``isinstance`` against ``opacus.optimizers.
    AdaClipDPOptimizer`` and took a failed import for "no adaptive clipping", so an Opacus
    that moves or renames the class was attached and charged σ. Here the name is removed
    from ``opacus.optimizers`` (the import fails); the optimizer still has what makes it
    adaptive (``unclipped_num_std``, ``update_max_grad_norm``) and is refused."""
    import opacus.optimizers

    _model, optimizer, loader = _adaptive()
    monkeypatch.delattr(opacus.optimizers, "AdaClipDPOptimizer")
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError) as caught:
        attach(optimizer, ledger, data_loader=loader)
    assert caught.value.argument == "optimizer" and len(ledger.history) == 0


def _ghost_adaptive_build():
    adaptive = pytest.importorskip("opacus.utils.adaptive_clipping")

    def build():
        torch.manual_seed(0)
        x = torch.randn(400, 4)
        model = torch.nn.Linear(4, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, criterion, loader = \
                adaptive.PrivacyEngineAdaptiveClipping().make_private(
                    module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()),
                                           batch_size=100),
                    criterion=torch.nn.CrossEntropyLoss(), noise_multiplier=SIGMA,
                    max_grad_norm=1.0, grad_sample_mode="ghost")
        return model, optimizer, loader, criterion  # the audit's order

    return build


def _adaptive_build():
    def build():
        model, optimizer, loader = _adaptive()
        return model, optimizer, loader, torch.nn.functional.mse_loss

    return build


@pytest.mark.parametrize("make", [_adaptive_build, _ghost_adaptive_build],
                         ids=["AdaClipDPOptimizer", "ghost-adaptive-criterion"])
def test_audit_opacus_refuses_adaptive_clipping_naming_build(make):
    """Review radv3: audit_opacus let attach's refusal name ``optimizer``, no argument of
    audit_opacus (its other refusals of what build() returned name ``build``), and took the
    ghost-clipping adaptive criterion only to its first step's PipelineMismatchError."""
    from privguard.audit import audit_opacus

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InvalidArgumentError) as caught:
            audit_opacus(make(), steps=2, canaries=4, seed=0)
    assert caught.value.argument == "build" and "adaptive" in str(caught.value)
