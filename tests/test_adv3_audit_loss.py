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


def _pipeline(*extra):
    def build():
        torch.manual_seed(0)
        x = torch.randn(64, 4)
        model = torch.nn.Linear(4, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = PrivacyEngine().make_private(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16),
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
