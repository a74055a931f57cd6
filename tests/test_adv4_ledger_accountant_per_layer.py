"""Task adv4: ``LedgerAccountant`` under per-layer clipping whose bounds exceed the noise's.

``DPPerLayerOptimizer`` clips each layer at its ``max_grad_norms[l]`` (read at every step)
and noises with ``max_grad_norm``, the norm of that list computed once when it is built.
A list raised later (a per-layer clipping schedule) clips each record's gradient at
C′ = ‖max_grad_norms‖ > C under noise σ·C: the step is the Gaussian of noise multiplier
σ·C/C′ (docs/theory.md §14.7, Lemma 14.8). ``attach`` charges that (task lo3); main's
``LedgerAccountant`` charged ``SubsampledGaussian(σ, q)``, an under-count. It now refuses
such a step before the update (``InvalidArgumentError`` naming ``optimizer``, nothing
charged), as it refuses what else it cannot see: use ``attach``.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations.opacus import LedgerAccountant  # noqa: E402

SIGMA = 1.0


def _per_layer(ledger, bounds=(1.0, 1.0)):
    """make_private with per-layer clipping at ``bounds`` (by default [1, 1], noise bound √2),
    charged by a LedgerAccountant."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    engine = opacus.PrivacyEngine()
    engine.accountant = LedgerAccountant(ledger)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(100 * torch.randn(40, 3), torch.randn(40, 1)),
                                   batch_size=10),
            noise_multiplier=SIGMA, max_grad_norm=list(bounds), clipping="per_layer")
    return model, opt, loader


def _step(model, opt, loader):
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y, reduction="sum").backward()
    return opt.step()


def test_per_layer_bounds_above_the_noise_bound_are_refused():
    # main: the step clipped at ‖[10, 10]‖ under noise σ·√2 was charged at σ (effective
    # σ·√2/√200 = σ/10)
    ledger = Ledger(delta=1e-5)
    model, opt, loader = _per_layer(ledger)
    assert math.isclose(opt.max_grad_norm, math.sqrt(2), rel_tol=1e-6)
    _step(model, opt, loader)  # the bounds as built: charged
    assert len(ledger.history) == 1
    opt.max_grad_norms = [10.0, 10.0]  # clips at these, noise still σ·√2
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidArgumentError) as info:
        _step(model, opt, loader)
    assert info.value.argument == "optimizer" and "max_grad_norms" in str(info.value)
    assert len(ledger.history) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_per_layer_bounds_at_or_below_the_noise_bound_are_charged():
    ledger = Ledger(delta=1e-5)
    model, opt, loader = _per_layer(ledger)
    opt.max_grad_norms = [0.5, 1.0]  # C′ ≤ C: charging σ over-counts, never under
    _step(model, opt, loader)
    _step(model, opt, loader)
    assert len(ledger.history) == 2
    assert {r.mechanism.noise_multiplier for r in ledger.history} == {SIGMA}


def test_a_list_lowered_then_raised_is_compared_with_the_noise_bound():
    """Review radv4: a list lowered, then raised back to the bounds it was built with, is
    charged; one raised by one float32 step above them, or the noise's max_grad_norm lowered
    under the list's norm, is refused before the update, nothing charged."""
    ledger = Ledger(delta=1e-5)
    model, opt, loader = _per_layer(ledger, (0.3, 0.7))
    built = opt.max_grad_norm  # ‖[0.3, 0.7]‖, in float32 as Opacus computes it
    for bounds in ([0.1, 0.1], [0.3, 0.7]):  # lowered, then back as built: C′ ≤ C
        opt.max_grad_norms = bounds
        _step(model, opt, loader)
    assert len(ledger.history) == 2
    for name, value in (("max_grad_norms", [0.3, 0.7000001]), ("max_grad_norm", 0.5)):
        opt.max_grad_norms, opt.max_grad_norm = [0.3, 0.7], built
        setattr(opt, name, value)
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(InvalidArgumentError) as info:
            _step(model, opt, loader)
        assert info.value.argument == "optimizer" and "clips each record at" in str(info.value)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert len(ledger.history) == 2
