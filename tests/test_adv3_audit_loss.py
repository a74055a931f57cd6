"""Task adv3: ``audit_opacus`` with a loss it cannot back-propagate (a per-sample loss,
``CrossEntropyLoss(reduction="none")``, or a loss detached from the model), given as
``loss=`` or as ``build()``'s 4th item, let torch's RuntimeError escape the public call.
It is now refused with ``InvalidArgumentError`` naming where the loss came from, before that
step's backward (nothing of it is taken), and without the loss's length (the drawn batch's
size)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from opacus import PrivacyEngine  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError  # noqa: E402
from privguard.audit import audit_opacus  # noqa: E402


def _pipeline(*extra, batch_size=16):
    def build():
        torch.manual_seed(0)
        x = torch.randn(64, 4)
        model = torch.nn.Linear(4, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = PrivacyEngine().make_private(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()),
                                       batch_size=batch_size),
                noise_multiplier=1.0, max_grad_norm=1.0)
        return (*built, *extra)

    return build


def _detached(logits, labels):
    return torch.nn.functional.cross_entropy(logits, labels).detach()


@pytest.mark.parametrize("build, kwargs, argument", [
    (_pipeline(torch.nn.CrossEntropyLoss(reduction="none")), {}, "build"),
    (_pipeline(), {"loss": torch.nn.CrossEntropyLoss(reduction="none")}, "loss"),
    (_pipeline(), {"loss": _detached}, "loss"),
    (_pipeline(), {"loss": lambda logits, labels: 0.5}, "loss"),
], ids=["per-sample-4th-item", "per-sample-loss", "detached", "a-float"])
def test_a_loss_the_audit_cannot_backpropagate_is_an_invalid_argument(build, kwargs, argument):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InvalidArgumentError) as caught:
            audit_opacus(build, steps=2, canaries=4, seed=0, **kwargs)
    assert caught.value.argument == argument
    assert "shape" not in str(caught.value) and "torch.Size" not in str(caught.value)


_FREE = None  # a tensor that requires grad, not of the model (made lazily: torch at import)


def _apart(logits, labels):
    """A loss of a tensor that requires grad but is no function of the model."""
    global _FREE
    if _FREE is None:
        _FREE = torch.ones((), requires_grad=True)
    return _FREE * 2.0


@pytest.mark.parametrize("loss, what", [
    (lambda logits, labels: torch.ones((), requires_grad=True), "without a gradient"),
    (_apart, "does not reach"),
    (lambda logits, labels: torch.nn.functional.cross_entropy(logits, labels).to(
        torch.complex64), "not real"),
], ids=["a-leaf", "apart-from-the-model", "complex"])
def test_review_radv3_a_loss_opacus_or_torch_raised_on_is_an_invalid_argument(loss, what):
    """Review radv3: these let Opacus' ValueError ("Per sample gradient is not initialized")
    or torch's RuntimeError (a complex scalar) out of audit_opacus on adv3's branch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InvalidArgumentError) as caught:
            audit_opacus(_pipeline(), steps=2, canaries=4, seed=0, loss=loss)
    assert caught.value.argument == "loss" and what in str(caught.value)


def test_review_radv3_empty_poisson_batches_are_not_refused_as_a_loss_apart_from_the_model():
    """The check that every trained parameter got per-sample gradients must not refuse the
    empty batches Poisson sampling draws (expected batch 1 of 64: most are empty)."""
    build = _pipeline(batch_size=1)

    def summed(logits, labels):  # 0 (not NaN) on an empty batch
        return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = audit_opacus(build, steps=20, canaries=4, seed=0, loss=summed)
    assert result.steps == 20
