"""Review rwl: what a witness refusal costs (docs/theory.md §16.2, *What a refusal is a
function of*).

Proposition 16.1 covers a refusal whose probability is at most a on every dataset. The
precision guard of wr (refuse when u_p·s‖g‖ ≥ σC√d, g the noisy gradient) is not such a
refusal: on one bfloat16 pipeline it refuses a dataset whose records' gradients align and
passes its neighbour whose records' gradients cancel, so its occurrence is a function of the
data. On wr's head nothing of the refused step was charged: the refusal released one
uncharged bit of ‖a + Z‖, as informative as a step of the Gaussian mechanism itself. A
threshold on the noisy gradient is a post-processing of the step's release, so the step is now
charged before this refusal (and only this one) is raised; it is still not applied.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger, PipelineMismatchError
from privguard import mechanisms as M
from privguard.integrations.opacus import attach

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing",
                                        "ignore:.*non-full backward hook.*",
                                        "ignore:.*Optimal order is the.*")
N, BATCH, SIGMA = 2048, 512, 1.0  # q = 1/4; ~512 records a step, each clipped to C = 1


def _pipeline(aligned: bool):
    """A one-weight bfloat16 model (d = 1). ``aligned``: every record's gradient is +200
    (clipped to +1: ‖a‖ ≈ 512, u·‖a‖ = 2 ≥ σC√d = 1, refused); otherwise the residuals
    alternate in sign (‖a‖ ≈ 0: passes)."""
    torch.manual_seed(0)
    x = torch.full((N, 1), 10.0)
    y = torch.zeros(N, 1) if aligned else 10.0 + torch.tensor([(-1.0) ** i for i in range(N)])[
        :, None]
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=opt, data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH),
        noise_multiplier=SIGMA, max_grad_norm=1.0)
    model.to(torch.bfloat16)
    return model, opt, loader


def _step(model, opt, loader):
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.mse_loss(model(x.to(torch.bfloat16)), y.to(torch.bfloat16)).backward()
    opt.step()


def test_the_precision_guard_refuses_on_the_data_so_its_refused_step_is_charged():
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    model, opt, loader = _pipeline(aligned=True)
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    before = model._module.weight.detach().clone()
    with pytest.raises(PipelineMismatchError, match="cannot hold it") as info:
        _step(model, opt, loader)
    # wr's head: nothing (the refusal, a function of ‖a + Z‖, released uncharged)
    steps = [r.mechanism for r in ledger.history if isinstance(r.mechanism,
                                                                M.SubsampledGaussian)]
    assert steps == [M.SubsampledGaussian(SIGMA, BATCH / N)]
    assert info.value.step_charged and "was charged" in str(info.value)
    assert torch.equal(model._module.weight.detach(), before)  # not applied
    assert handle.should_stop
    charged = len(ledger.history)
    for _ in range(2):  # every later step refused, none charged again
        with pytest.raises(PipelineMismatchError, match="cannot hold it"):
            _step(model, opt, loader)
    assert len(ledger.history) == charged and torch.equal(model._module.weight.detach(), before)
    handle.detach()


def test_the_neighbouring_pipeline_whose_gradients_cancel_passes():
    """The same pipeline, dtype and σ on data whose clipped gradients cancel: not refused (the
    guard's decision is the data's, which is why its refusal must be charged)."""
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    model, opt, loader = _pipeline(aligned=False)
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    _step(model, opt, loader)
    assert handle.witnesses.failure is None and handle.steps_charged == 1
    handle.detach()


def test_a_refusal_of_the_noise_test_itself_is_still_not_charged():
    """The statistical refusals (bounded false-alarm probability, Proposition 16.1) and the
    refusals of broken steps keep charging nothing: only the precision guard charges."""
    from test_witnesses import DELTA, EPSILON, _refusal, pipeline

    model, opt, loader, crit = pipeline(seed=1)
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)

    def add_no_noise():
        for p in opt.params:
            p.grad = p.summed_grad.clone().view_as(p) / (opt.expected_batch_size
                                                         * opt.accumulated_iterations)

    opt.add_noise = add_no_noise
    exc = _refusal(handle, model, opt, loader, crit, steps=1)  # asserts: nothing charged
    assert exc.witness == "noise" and not exc.step_charged


def test_a_precision_refusal_whose_charge_the_ledger_refuses_leaves_no_refusal_behind():
    """The charge comes first: refused (BudgetExhausted, a data-independent decision), the
    step is neither charged nor applied and the guard's bit is not kept for the next step
    (it would be released there uncharged)."""
    from privguard import BudgetExhausted

    ledger = Ledger(epsilon=0.3, delta=1e-5)
    model, opt, loader = _pipeline(aligned=True)
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    assert not ledger.can_afford(M.SubsampledGaussian(SIGMA, BATCH / N))
    with pytest.raises(BudgetExhausted):
        _step(model, opt, loader)
    assert handle.witnesses.failure is None and len(ledger.history) == 0
    assert not handle._refusal_charged
    handle.detach()


# ------------------------------------------------------------------ a step without noise
def _noise_free(dtype, magnitude, d, sigma):
    """Every coordinate of the clipped sum ``magnitude`` (records whose gradients align), mean
    reduction over s = 4,096, and the noise turned off: g = a/s exactly, z = s·g − a = 0."""
    from test_witness_robustness import _params, _witness

    a = torch.full((d,), magnitude, dtype=torch.float64).to(dtype)
    g = (a.double() / 4096.0).to(dtype)
    return _witness(_params([a], [g]), 4096.0, sigma=sigma)


@pytest.mark.parametrize("dtype,magnitude,d,sigma", [
    (torch.bfloat16, 100.0, 1474, 1.0),   # u·s‖g‖ = 15σC < σC√d = 38σC: under wr's bound
    (torch.float16, 1000.0, 1474, 1.0),   # 19σC < 38σC
    (torch.float16, 632.0, 42, 0.5),      # the *Low precision* model in float16: 2.0 < 3.2
])
def test_a_low_precision_step_without_noise_is_not_passed(dtype, magnitude, d, sigma):
    """wr's total statistic adds E = 4u·s‖g‖ (Opacus' rounding), so a step with no noise has
    statistic ≥ E; wr refused only from E ≥ 4σC√d, and these steps without noise passed
    every test on wr's head (main, without E, refused them). Refused now, charged (the
    decision is a function of g)."""
    w = _noise_free(dtype, magnitude, d, sigma)
    with pytest.raises(PipelineMismatchError, match="cannot hold it") as info:
        w._check_noise(sigma, 4096)
    assert info.value.step_charged and w.failure is info.value


def test_a_one_coordinate_bfloat16_model_is_not_refused_for_its_vacuous_test():
    """At d = 1 the total test's quantile is ≈ 10⁻²⁴: the float64 widening alone passes a step
    without noise (on main too), so the dtype's allowance is not what blinds it: no refusal
    below wr's bound (u·s|g| < σC)."""
    w = _noise_free(torch.bfloat16, 64.0, 1, 1.0)  # u·s|g| = 0.25σC
    w._check_noise(1.0, 4096)
    assert w.failure is None and w.noise_checks == 1


# ------------------------------------------------------------------ below the normal range
def test_the_statistics_bound_the_noise_drawn_below_the_smallest_normal_number():
    """The allowance 4u·s‖g‖ bounds relative rounding only: below float16's smallest normal
    number (6.1·10⁻⁵) the error is absolute, up to half the subnormal spacing η = 2⁻²⁴. Noise
    Z_j = 17η on a zero clipped sum, s = 64: Opacus' fl(fl(a + Z)/s) = fl(0.27η) = 0, so
    z = s·g − a = 0 and wr's statistics (total, per parameter) were 0 < ‖Z‖: a correct step
    refused (uncharged, and on the data's side: a clipped sum near 0). Every statistic now
    adds (1 + s)·η·√d and stays ≥ ‖Z‖."""
    from test_witness_robustness import _params, _witness

    eta, d, s = 2.0 ** -24, 64, 64.0
    z = torch.full((d,), 17 * eta, dtype=torch.float16)
    a = torch.zeros(d, dtype=torch.float16)
    g = (a + z) / s  # Opacus' add_noise and scale_grad, in the parameter's dtype
    assert float(z[0]) == 17 * eta and not g.any()  # the noise is rounded away entirely
    noise = 17 * eta * math.sqrt(d)  # ‖Z‖, exactly
    w = _witness(_params([a, a.clone()], [g, g.clone()]), s, sigma=1.0)
    z_high = w._measure(s)[0]
    assert z_high >= math.sqrt(2) * noise  # wr's head: 0.0
    parts, _ = w._noise_parts(s)
    assert all(high >= noise for _, _, high, _ in parts)


def test_a_precision_refusal_under_random_allocation_charges_the_epoch_once():
    """The hook's random-allocation path: the refused step is the epoch's first, so the epoch
    RandomAllocation(σ, t) is charged (once), the step not applied; later steps charge
    nothing."""
    from privguard.integrations import RandomAllocationSampler

    torch.manual_seed(0)
    t = 4
    x, y = torch.full((N, 1), 10.0), torch.zeros(N, 1)
    sampler = RandomAllocationSampler(N, t, generator=torch.Generator().manual_seed(0))
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    model, opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=DataLoader(TensorDataset(x, y), batch_sampler=sampler),
        noise_multiplier=SIGMA, max_grad_norm=1.0, poisson_sampling=False)
    model.to(torch.bfloat16)
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    batches = iter(loader)
    for _ in range(2):
        xb, yb = next(batches)
        opt.zero_grad()
        nn.functional.mse_loss(model(xb.to(torch.bfloat16)), yb.to(torch.bfloat16)).backward()
        with pytest.raises(PipelineMismatchError, match="cannot hold it"):
            opt.step()
    epochs = [r.mechanism for r in ledger.history
              if isinstance(r.mechanism, M.RandomAllocation)]
    assert epochs == [M.RandomAllocation(SIGMA, t)]
    handle.detach()
