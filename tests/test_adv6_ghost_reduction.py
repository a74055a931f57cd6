"""A hand-built ``DPTensorFastGradientClipping`` whose reduction is not its module's (adv6).

Opacus' first ghost pass backpropagates the mean (or sum) of the per-sample losses the
tensor was built with, and the module scales the backprops by n only under its own
``loss_reduction="mean"``. A mean loss into a module of ``"sum"`` reads every per-sample
norm n times too small, so a record's clipped gradient reaches n·C under noise σ·C; main
charged the step ``SubsampledGaussian(σ, q)``. Now refused before the charge. A sum into
a module of ``"mean"`` clips harder (norms read n times too large) and is charged as
before, as is a tensor with the module's own reduction.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]
SIGMA = 1.0


def _ghost(loss_reduction):
    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(6, 2)
    model, opt, _, loader = opacus.PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=8),
        criterion=nn.CrossEntropyLoss(reduction=loss_reduction), noise_multiplier=SIGMA,
        max_grad_norm=1.0, grad_sample_mode="ghost", loss_reduction=loss_reduction)
    return model, opt, loader


def _step(model, opt, loader, reduction):
    x, y = next(x for x in loader if len(x[0]))
    opt.zero_grad()
    per_sample = nn.functional.cross_entropy(model(x), y, reduction="none")
    DPTensorFastGradientClipping(model, opt, per_sample, loss_reduction=reduction).backward()
    opt.step()


def test_a_mean_loss_into_a_summing_module_is_refused_before_the_charge():
    model, opt, loader = _ghost("sum")
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidArgumentError, match="loss_reduction") as info:
        _step(model, opt, loader, "mean")
    assert "'sum'" in str(info.value)
    assert ledger.history == [] and handle.steps_charged == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    _step(model, opt, loader, "sum")  # the module's own reduction: charged as before
    q = loader.batch_sampler.sample_rate
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)]


@pytest.mark.parametrize(("module", "loss"), [("mean", "mean"), ("mean", "sum")])
def test_the_other_reductions_are_charged_as_before(module, loss):
    model, opt, loader = _ghost(module)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    _step(model, opt, loader, loss)
    q = loader.batch_sampler.sample_rate
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(SIGMA, q)]
