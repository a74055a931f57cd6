"""The explicit opt-in to the aligned accumulation curve (issue a27; docs/theory.md §14, §14.2).

``aligned_micro_batches=True`` on attach, the Lightning and Hugging Face callbacks and
``Plan.from_opacus`` charges ``AccumulatedSubsampledGaussian(..., aligned=True)`` for k > 1
micro-batches; a model with dropout that would draw masks is refused by name.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import GradSampleModule, PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from test_accumulation_attach import _accumulate  # k backward() per step()
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import InvalidArgumentError, Ledger, Plan
from privguard import mechanisms as M
from privguard.integrations.opacus import attach

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing",
                                        "ignore::UserWarning")

ALIGNED = M.AccumulatedSubsampledGaussian(1.0, 0.125, 2, aligned=True)
DEFAULT = M.AccumulatedSubsampledGaussian(1.0, 0.125, 2)


def _private(*layers, mode="hooks"):
    """The reproducer of issue 27: make_private, then a separately built DPDataLoader of
    q = 0.125 (Opacus' own Poisson loader refuses accumulation)."""
    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(6, 6), *layers, nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    engine = PrivacyEngine(accountant="rdp")
    criterion = nn.CrossEntropyLoss()
    if mode == "ghost":
        model, opt, criterion, loader = engine.make_private(
            module=model, optimizer=opt, data_loader=loader, criterion=criterion,
            noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost",
            poisson_sampling=False)
    else:
        model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                                 noise_multiplier=1.0, max_grad_norm=1.0,
                                                 poisson_sampling=False)
    loader = DPDataLoader.from_data_loader(loader)
    assert loader.batch_sampler.sample_rate == 0.125
    return engine, model, opt, loader, criterion


# ---------------------------------------------------------------- attach: what is charged
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_the_opt_in_charges_the_aligned_curve_for_two_backward_per_step(mode):
    _, model, opt, loader, criterion = _private(mode=mode)
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    assert handle.next_mechanism().steps == 1
    _accumulate(model, opt, loader, criterion, steps=3, k=2)
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 3
    assert all(r.mechanism.aligned for r in ledger.history)
    handle.detach()


def test_without_the_opt_in_the_default_curve_is_charged():
    _, model, opt, loader, criterion = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader, model=model)  # a model alone opts in to nothing
    _accumulate(model, opt, loader, criterion, steps=2, k=2)
    charged = [r.mechanism for r in ledger.history]
    assert charged == [DEFAULT] * 2 and not charged[0].aligned


def test_one_backward_per_step_stays_subsampled_gaussian_with_the_opt_in():
    _, model, opt, loader, criterion = _private()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    _accumulate(model, opt, loader, criterion, steps=2, k=1)
    assert [r.mechanism for r in ledger.history] == [M.SubsampledGaussian(1.0, 0.125)] * 2


def test_steps_recorded_before_attach_are_replayed_aligned_with_the_opt_in():
    engine, model, opt, loader, criterion = _private()
    _accumulate(model, opt, loader, criterion, steps=2, k=2)  # before attach: Opacus q·k
    assert [q for _, q, _ in engine.accountant.history] == [0.25]
    ledger = Ledger(delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    assert handle.steps_replayed == 2
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 2


def test_a_hybrid_ledger_on_an_aligned_plan_keeps_part_A_alive_with_the_opt_in():
    # the opposite of test_attach_charges_outside_an_aligned_envelope_and_closes_part_A:
    # with the opt-in every step is the plan's step, inside the PLD envelope (§2b.1)
    _, model, opt, loader, criterion = _private()
    plan = Plan.from_opacus(opt, loader, steps=3, gradient_accumulation_steps=2,
                            aligned_micro_batches=True)
    assert plan.step == ALIGNED
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=plan, filter="hybrid")
    flt = ledger._acc.filter
    attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    _accumulate(model, opt, loader, criterion, steps=3, k=2)
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 3
    assert flt.kind == "hybrid" and flt.a_alive


# ---------------------------------------------------------------- dropout: refused by name
DROPOUTS = [nn.Dropout(0.1), nn.Dropout1d(0.1), nn.Dropout2d(0.1), nn.Dropout3d(0.1),
            nn.AlphaDropout(0.1), nn.FeatureAlphaDropout(0.1)]


@pytest.mark.parametrize("layer", DROPOUTS, ids=lambda m: type(m).__name__)
def test_a_dropout_model_in_training_mode_is_refused_at_attach(layer):
    _, model, opt, loader, _ = _private(layer)
    hook, loader_class = opt.step_hook, type(loader)
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match=rf"model=.*{type(layer).__name__}\(p=0.1\)"
                       r".*training mode") as info:
        attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    assert info.value.argument == "model"
    assert opt.step_hook is hook and type(loader) is loader_class  # nothing attached
    assert len(ledger.history) == 0
    attach(opt, ledger, data_loader=loader, model=model)  # the default curve takes it


def test_a_rate_attribute_in_training_mode_is_refused():
    # nn.MultiheadAttention / nn.LSTM draw dropout functionally from a float attribute
    model = nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4, num_layers=2, dropout=0.2))
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=8)
    with pytest.raises(InvalidArgumentError, match=r"1: LSTM\(dropout=0.2\)"):
        attach(opt, Ledger(delta=1e-5), sample_rate=0.1, check_poisson=False,
               aligned_micro_batches=True, model=model)
    model.eval()
    attach(opt, Ledger(delta=1e-5), sample_rate=0.1, check_poisson=False,
           aligned_micro_batches=True, model=model)


@pytest.mark.parametrize("how", ["eval", "p=0"])
def test_dropout_in_eval_mode_or_with_p_0_is_accepted(how):
    layer = nn.Dropout(0.0 if how == "p=0" else 0.5)
    _, model, opt, loader, criterion = _private(layer)
    if how == "eval":  # (Opacus' hooks capture nothing from a module in eval mode:
        layer.eval()    # the dropout layer alone) the identity: one gradient per example
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    _accumulate(model, opt, loader, criterion, steps=2, k=2)
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 2


@pytest.mark.parametrize("on_exhausted", ["raise", "stop"])
def test_dropout_switched_on_after_attach_is_refused_before_the_step(on_exhausted):
    layer = nn.Dropout(0.5)
    _, model, opt, loader, criterion = _private(layer)
    layer.eval()
    ledger = Ledger(delta=1e-5)
    attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model,
           on_exhausted=on_exhausted)
    _accumulate(model, opt, loader, criterion, steps=1, k=2)
    assert len(ledger.history) == 1
    model.train()  # mid-run: masks drawn per micro-batch from now on
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidArgumentError, match=r"model=.*Dropout\(p=0.5\) in training mode"):
        _accumulate(model, opt, loader, criterion, steps=1, k=2)
    assert len(ledger.history) == 1  # nothing charged
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no update
    layer.p = 0.0  # a rate of 0 in training mode is fine
    _accumulate(model, opt, loader, criterion, steps=1, k=2)
    assert len(ledger.history) == 2 and ledger.history[-1].mechanism.aligned


# ---------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_a_non_bool_opt_in_is_refused_by_name(value):
    _, model, opt, loader, _ = _private()
    with pytest.raises(InvalidArgumentError, match="aligned_micro_batches") as info:
        attach(opt, Ledger(delta=1e-5), data_loader=loader, aligned_micro_batches=value,
               model=model)
    assert info.value.argument == "aligned_micro_batches"
    with pytest.raises(InvalidArgumentError, match="aligned_micro_batches"):
        Plan.from_opacus(opt, loader, steps=3, gradient_accumulation_steps=2,
                         aligned_micro_batches=value)


def test_the_opt_in_needs_the_model_and_a_module():
    _, model, opt, loader, _ = _private()
    hook = opt.step_hook
    with pytest.raises(InvalidArgumentError, match=r"model=None.*needed") as info:
        attach(opt, Ledger(delta=1e-5), data_loader=loader, aligned_micro_batches=True)
    assert info.value.argument == "model"
    for bad in ("model", object(), [model]):
        with pytest.raises(InvalidArgumentError, match=r"model=.*torch\.nn\.Module"):
            attach(opt, Ledger(delta=1e-5), data_loader=loader, aligned_micro_batches=True,
                   model=bad)
        with pytest.raises(InvalidArgumentError, match=r"model=.*torch\.nn\.Module"):
            attach(opt, Ledger(delta=1e-5), data_loader=loader, model=bad)
    _, other, _, _, _ = _private()  # a model, but not the one this optimizer trains
    with pytest.raises(InvalidArgumentError, match=r"model=.*does not hold 4 of the param"):
        attach(opt, Ledger(delta=1e-5), data_loader=loader, aligned_micro_batches=True,
               model=other)
    assert opt.step_hook is hook


def test_plan_from_opacus_default_stays_unaligned_and_k_1_stays_subsampled_gaussian():
    _, _, opt, loader, _ = _private()
    assert Plan.from_opacus(opt, loader, steps=3, gradient_accumulation_steps=2).step == DEFAULT
    one = Plan.from_opacus(opt, loader, steps=3, aligned_micro_batches=True)
    assert one.step == M.SubsampledGaussian(1.0, 0.125)


def test_the_callbacks_validate_the_opt_in():
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from privguard.integrations.huggingface import LedgerTrainerCallback
    from privguard.integrations.lightning import LedgerCallback

    for cls in (LedgerCallback, LedgerTrainerCallback):
        assert cls(Ledger(delta=1e-5)).aligned_micro_batches is False
        assert cls(Ledger(delta=1e-5), aligned_micro_batches=True).aligned_micro_batches
        for bad in (1, "true", None):
            with pytest.raises(InvalidArgumentError, match="aligned_micro_batches"):
                cls(Ledger(delta=1e-5), aligned_micro_batches=bad)


@pytest.mark.parametrize("rate", [float("nan"), "0.1", None])
def test_a_rate_that_is_not_a_number_is_refused(rate):
    # fail closed: a rate changed after attach to something not comparable is not a 0
    from privguard.integrations._aligned import guard_for

    layer = nn.Dropout(0.0)
    guard = guard_for(nn.Sequential(nn.Linear(2, 2), layer))
    layer.p = rate
    with pytest.raises(InvalidArgumentError, match=r"model=.*1: Dropout\(p="):
        guard.check()
    layer.eval()
    guard.check()  # eval mode: the rate is not used


def test_a_grad_sample_module_is_scanned_through():
    # the HF/Lightning models are GradSampleModules: the wrapped module's dropout is seen
    from privguard.integrations._aligned import guard_for

    wrapped = GradSampleModule(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.1)))
    wrapped.eval()
    guard_for(wrapped)  # eval mode: accepted
    with pytest.raises(InvalidArgumentError, match=r"_module.1: Dropout\(p=0.1\) in eval mode"):
        guard_for(wrapped, assume_training=True)  # a trainer that trains it: refused
