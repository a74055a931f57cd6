"""Ghost clipping fed by a loss that is not Opacus' wrapped loss (task gz).

Under ``grad_sample_mode="ghost"`` only a backward of the criterion ``make_private``
returned clips: a ``backward()`` of the user's own criterion, of ``F.cross_entropy`` or of
the wrapped loss's ``loss_per_sample.mean()`` puts the UNCLIPPED batch gradient into
``p.grad``, Opacus' ``pre_step`` adds it to the sum as if clipped and noises it for C, and
main charged the step as the clipped mechanism (sensitivity unbounded, ε finite). attach now
sees every gradient accumulated into a parameter and refuses the real step whose sum holds
one that came through no wrapped backward (``integrations/_ghost.py``, docs/theory.md §14.5):
``PipelineMismatchError``, nothing charged or applied.
"""

from __future__ import annotations

import os

import opacus
import pytest
import torch
import torch.nn.functional as F
from test_ghost_backward_count import Run
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger, PipelineMismatchError
from privguard.integrations.opacus import attach

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Opacus' hook and RNG notes


def _plain(run, how):
    """One backward of a loss that is not from the wrapped criterion."""
    x, y = next(run.batches)
    out = run.model(x)
    if how == "criterion":
        nn.CrossEntropyLoss()(out, y).backward()
    elif how == "functional":
        F.cross_entropy(out, y, reduction="sum").backward()
    else:  # the wrapped loss's own per-sample losses, reduced by hand
        run.criterion(out, y).loss_per_sample.mean().backward()


def _params(run):
    return [p.detach().clone() for p in run.model.parameters()]


def _unchanged(run, before):
    return all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


def _refused(run, count=0, unclipped=1):
    """The next step() is refused as unclipped: nothing charged, the parameters untouched;
    then the loop goes on with the wrapped loss and the next step is charged."""
    before = _params(run)
    with pytest.raises(PipelineMismatchError) as info:
        run.opt.step()
    exc = info.value
    assert exc.witness == "ghost_clipping" and exc.interval is None and exc.step == 1
    assert (exc.charged, exc.measured) == (count, unclipped)
    assert "criterion make_private returned" in str(exc)
    assert run.charged() == [] and _unchanged(run, before)
    run.opt.zero_grad()
    run.backward()
    run.opt.step()
    assert run.charged() == [run.step(1)] and not _unchanged(run, before)


@pytest.mark.parametrize("how", ["criterion", "functional", "loss_per_sample"])
def test_a_step_of_a_plain_loss_is_refused(how):
    # main: charged SubsampledGaussian(σ, q) for a sum never clipped
    run = Run()
    run.opt.zero_grad()
    _plain(run, how)
    _refused(run)


def test_a_plain_backward_after_the_wrapped_one_is_refused():
    # the wrapped backward's clipped batch plus an unclipped gradient on top of it
    run = Run()
    run.backward()
    _plain(run, "criterion")
    _refused(run, count=1)


def test_a_plain_backward_in_a_skipped_step_is_refused_at_the_real_step():
    # the skipped step added the unclipped gradient to the sum, which the loop's zero_grad
    # keeps: the real step after it, of the wrapped loss only, is refused
    run = Run()
    _plain(run, "criterion")
    run.opt.signal_skip_step(do_skip=True)
    run.opt.step()
    run.opt.zero_grad()
    run.backward()
    _refused(run, count=1)


def test_a_plain_backward_cleared_by_the_wrapped_one_is_admitted():
    # the wrapped backward zero_grads between its passes: the plain gradient before it is
    # gone, p.grad holds the clipped batch only
    run = Run()
    _plain(run, "criterion")
    run.backward()
    run.opt.step()
    assert run.charged() == [run.step(1)]


def test_correct_ghost_loops_are_admitted():
    # the wrapped loss, two accumulated, a skipped step then a real one, no zero_grad at all
    run = Run()
    run.opt.zero_grad()
    run.backward()
    run.opt.step()
    run.opt.zero_grad()
    run.backward(2)
    run.opt.step()
    run.skipped_step()
    run.opt.zero_grad()
    run.backward()
    run.opt.step()
    run.backward()
    run.opt.step()
    assert run.charged() == [run.step(1), run.step(2), run.step(2), run.step(1)]


def test_a_wrapped_loss_scaled_or_summed_is_admitted():
    # Opacus' own arithmetic on the wrapped loss stays a wrapped loss (one clipped backward)
    run = Run()
    x, y = next(run.batches)
    out = run.model(x)
    (0.5 * run.criterion(out, y) + run.criterion(out, y) / 2).backward()
    run.opt.step()
    assert run.charged() == [run.step(1)]


def test_detach_removes_the_gradient_hooks():
    run = Run()
    run.handle.detach()
    assert all(not p._post_accumulate_grad_hooks for p in run.opt.params)
    _plain(run, "criterion")
    run.opt.step()  # privguard no longer watches (nor charges) this optimizer
    assert run.charged() == []


@pytest.mark.skipif(os.environ.get("CI") != "true" and os.environ.get("PRIVGUARD_SLOW") != "1",
                    reason="a 2-rank launch: run with CI=true or PRIVGUARD_SLOW=1 (always in CI)")
def test_under_ddp_the_refusal_is_taken_by_every_rank(tmp_path):
    # rank 1's unclipped step is refused inside the step's first all-gather: rank 0 (whose
    # own gradient is clipped) refuses it too, nothing charged or applied on either rank
    pytest.importorskip("torch.distributed")
    import test_ddp

    r0, r1 = test_ddp.launch("ghost_unclipped", str(tmp_path), 50.0)
    assert r1["refused"] == [None, "PipelineMismatchError", None, None]
    assert r0["refused"][1] is not None and r0["refused"][::2] == [None, None]
    for r in (r0, r1):
        assert r["unchanged"] == [False, True, False, False]
        assert r["charged"] == r["history"] == 3


@pytest.mark.skipif(os.environ.get("CI") != "true" and os.environ.get("PRIVGUARD_SLOW") != "1",
                    reason="a 2-rank launch: run with CI=true or PRIVGUARD_SLOW=1 (always in CI)")
def test_under_ddp_random_allocation_the_refusal_is_taken_by_every_rank(tmp_path):
    # review ir2: the random-allocation path under DDP ran no ghost check (it is in the
    # Poisson step's collective only): rank 1's unclipped step was applied, the epoch charged
    # as clipped. Now refused on every rank inside the step's check, nothing applied
    pytest.importorskip("torch.distributed")
    import test_ddp

    r0, r1 = test_ddp.launch("allocation_ghost_unclipped", str(tmp_path), 50.0)
    assert r1["refused"][1] == "PipelineMismatchError" and r0["refused"][1] is not None
    for r in (r0, r1):
        assert r["refused"][0] is None and r["refused"][2:] == [None] * (len(r["refused"]) - 2)
        assert r["unchanged"][1] and not r["unchanged"][0]
        assert r["charged"] == len(r["refused"]) - 1


def test_parameters_added_after_attach_are_refused():
    # a parameter group added after attach has no hook: whether its gradient came through
    # the wrapped loss is unknown, so every later step is refused (fail closed)
    run = Run()
    extra = nn.Parameter(torch.zeros(2))
    run.opt.add_param_group({"params": [extra]})
    run.backward()
    extra.grad = torch.ones(2)  # e.g. the gradient of a loss of its own
    before = _params(run)
    with pytest.raises(PipelineMismatchError) as info:
        run.opt.step()
    assert "changed since attach" in str(info.value) and run.charged() == []
    assert _unchanged(run, before)



def _private(module):
    """make_private with ghost clipping of ``module``, attached to a fresh ledger."""
    torch.manual_seed(0)
    x = torch.randn(128, 6)
    y = (x[:, 0] > 0).long()
    model, opt, criterion, loader = opacus.PrivacyEngine(accountant="rdp").make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=8),
        criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0,
        grad_sample_mode="ghost")
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    return model, opt, criterion, loader, ledger


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 2), nn.Linear(6, 2)

    def forward(self, x):
        return self.a(x), self.b(x)


def test_a_plain_loss_on_a_head_the_wrapped_backward_did_not_reach_is_refused():
    # review rgz: step 2's wrapped loss reaches head a only (head b's per-sample norms are
    # left from step 1's batch, of the same size), a plain loss (x1000) reaches head b only.
    # gz's head left b "awaiting the second pass" after the wrapped backward, took the plain
    # gradient for the clipped one and charged the step as clipped
    model, opt, criterion, loader, ledger = _private(_TwoHeads())
    xb, yb = next(iter(loader))
    out_a, out_b = model(xb)
    (criterion(out_a, yb) + criterion(out_b, yb)).backward()
    opt.step()
    size = len(xb)
    epochs = (batch for _ in range(20) for batch in loader)  # Poisson sizes: find one
    xb, yb = next(batch for batch in epochs if len(batch[0]) == size)
    opt.zero_grad()
    out_a, out_b = model(xb)
    criterion(out_a, yb).backward()
    (1000 * nn.CrossEntropyLoss()(out_b, yb)).backward()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PipelineMismatchError) as info:
        opt.step()
    assert info.value.witness == "ghost_clipping" and (info.value.charged, info.value.measured) \
        == (1, 1)
    assert len(ledger.history) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_zero_grad_replaced_before_attach_is_named_in_the_refusal():
    # review rgz: an instance zero_grad set before attach (even one that only delegates) may
    # not clear p.grad, so the wrapped backward's first, unclipped pass is counted and every
    # step is refused (fail closed); gz's head blamed a plain loss the loop never ran. Set
    # after attach, the same wrapper calls privguard's and the step is charged
    from test_ghost_backward_count import _ghost

    _, model, opt, loader, criterion = _ghost()
    inner = opt.zero_grad
    opt.zero_grad = lambda *args, **kwargs: inner(*args, **kwargs)
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    x, y = next(iter(loader))
    opt.zero_grad()
    criterion(model(x), y).backward()
    with pytest.raises(PipelineMismatchError, match="replaced before attach"):
        opt.step()
    assert ledger.history == []
    run = Run()
    inner = run.opt.zero_grad
    run.opt.zero_grad = lambda *args, **kwargs: inner(*args, **kwargs)
    run.opt.zero_grad()
    run.backward()
    run.opt.step()
    assert run.charged() == [run.step(1)]


class _CheckpointedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.c, torch.relu(self.a(x)), use_reentrant=True)


def test_a_reentrant_checkpoint_in_the_wrapped_loss_is_admitted():
    # review rgz: the last layer under a reentrant checkpoint accumulates in a nested
    # backward; the second pass is still one (its end queued on the outer backward), so the
    # step is charged (a first fix ending it with the nested backward refused it)
    model, opt, criterion, loader, ledger = _private(_CheckpointedHead())
    for xb, yb in list(loader)[:2]:
        opt.zero_grad()
        criterion(model(xb), yb).backward()
        opt.step()
    assert len(ledger.history) == 2
