"""Task lo7, item 6: ``audit_opacus`` with a loss that becomes NaN (or whose gradients do)
finished with ε_lower = 0, a vacuous audit reported as a result. It now raises
InvalidArgumentError naming ``loss`` (or ``build`` for a 4th item) without any value of
the data (no batch size); the steps already run stay charged (never refunded: the
audit's own ledger, dropped with the refusal), and no step runs after the one refused."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from test_adv3_audit_loss import _pipeline  # noqa: E402

from privguard import InvalidArgumentError  # noqa: E402
from privguard.audit import audit_opacus  # noqa: E402

_CE = torch.nn.functional.cross_entropy


def _nan_loss(logits, labels):
    return _CE(logits, labels) * float("nan")


def _inf_loss(logits, labels):
    return _CE(logits, labels) + float("inf")


def _nan_gradient(logits, labels):
    """A finite loss (its value is the cross-entropy's) whose gradient is NaN (0 · ∞)."""
    return _CE(logits, labels) + (0.0 * torch.sqrt(logits - logits.detach())).sum()


def _audit(build, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return audit_opacus(build, steps=5, canaries=4, seed=0, **kwargs)


@pytest.mark.parametrize("loss, what", [(_nan_loss, "not finite"), (_inf_loss, "not finite"),
                                        (_nan_gradient, "gradients are not finite")],
                         ids=["nan-loss", "inf-loss", "nan-gradient"])
def test_a_loss_that_is_not_finite_is_refused_naming_loss(loss, what):
    with pytest.raises(InvalidArgumentError) as caught:
        _audit(_pipeline(), loss=loss)
    assert caught.value.argument == "loss" and what in str(caught.value)
    assert "16" not in str(caught.value) and "nan" not in str(caught.value).lower().replace(
        "nan or inf", "")


def test_a_4th_item_loss_that_is_not_finite_is_refused_naming_build():
    with pytest.raises(InvalidArgumentError) as caught:
        _audit(_pipeline(_nan_loss))
    assert caught.value.argument == "build"


def test_empty_poisson_batches_under_a_mean_loss_are_not_refused():
    """An empty batch's mean cross-entropy is NaN with no example's gradient (expected batch
    1 of 64: most batches are empty); the audit runs to its end."""
    result = _audit(_pipeline(batch_size=1), loss=_CE)
    assert result.steps == 5


def _from_step(k, broken):
    """A cross-entropy loss that turns into ``broken`` from its k-th call (the k-th step)
    on; ``calls`` counts the steps it was asked for."""
    calls = []

    def loss(logits, labels):
        calls.append(1)
        return broken(logits, labels) if len(calls) >= k else _CE(logits, labels)

    return loss, calls


@pytest.mark.parametrize("broken, wording", [
    (_nan_loss, "must give a finite loss: the loss at step {k} was NaN or infinite"),
    (_inf_loss, "must give a finite loss: the loss at step {k} was NaN or infinite"),
    (_nan_gradient, "at step {k}, the released update, and so the canaries' scores, were "
                    "NaN or infinite")], ids=["nan-loss", "inf-loss", "nan-gradient"])
def test_the_refusal_says_what_was_wrong_and_at_which_step(broken, wording):
    """Task lo8: a NaN or infinite loss was refused with "must give a scalar loss of the
    batch that depends on the model", which it was. The message now says what was wrong
    and at which step, and still no value of the loss or the batch."""
    loss, calls = _from_step(3, broken)
    with pytest.raises(InvalidArgumentError) as caught:
        _audit(_pipeline(), loss=loss)
    text = str(caught.value)
    assert wording.format(k=len(calls)) in text, text
    assert "scalar loss" not in text and len(calls) >= 3
