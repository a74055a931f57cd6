"""Review radv4: Opacus' ``rand_on_empty=True``, which task adv4's table called sound.

``make_private(..., rand_on_empty=True)`` wraps the loader's collate function so that an empty
Poisson batch becomes one made-up record of random 0/1 values. Its clipped gradient enters the
noised sum, so where the rest of the batch is empty a record drawn alone moves the sum by up
to 2C (clip(g_x) against clip(g_fake)), not C: the step is not the ``SubsampledGaussian(σ, q)``
attach charged it as. attach (and every integration's Poisson check) now refuses such a loader
with ``InvalidArgumentError`` naming it, before anything is attached or charged.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations._sampling import check_poisson  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _private(rand_on_empty, **extra):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return opacus.PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(torch.randn(40, 3), torch.randn(40, 1)),
                                   batch_size=10),
            noise_multiplier=1.0, max_grad_norm=1.0, rand_on_empty=rand_on_empty, **extra)


def test_rand_on_empty_turns_an_empty_batch_into_one_record():
    # the reason: the empty batch's sum is a made-up record's clipped gradient, not 0
    _model, _opt, loader = _private(rand_on_empty=True)
    collate = loader.collate_fn
    collate([(torch.zeros(3), torch.zeros(1))])  # the first batch fixes the structure
    x, y = collate([])
    assert x.shape == (1, 3) and y.shape == (1, 1)


@pytest.mark.parametrize("check", [True, False], ids=["checked", "check_poisson=False"])
def test_attach_refuses_a_rand_on_empty_loader_and_changes_nothing(check):
    _model, opt, loader = _private(rand_on_empty=True)
    ledger = Ledger(delta=1e-5)
    hook = opt.step_hook
    with pytest.raises(InvalidArgumentError) as info:
        attach(opt, ledger, data_loader=loader, check_poisson=check)
    assert info.value.argument == "data_loader" and "rand_on_empty" in str(info.value)
    assert ledger.history == [] and opt.step_hook is hook


def test_the_integrations_poisson_check_refuses_it_by_the_name_given():
    _model, _opt, loader = _private(rand_on_empty=True)
    with pytest.raises(InvalidArgumentError) as info:
        check_poisson(loader, "train_dataloader")
    assert info.value.argument == "train_dataloader"


def test_opacus_default_empty_batches_are_attached_and_charged():
    model, opt, loader = _private(rand_on_empty=False)
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert handle.steps_charged == 1 and len(ledger.history) == 1
    handle.detach()
