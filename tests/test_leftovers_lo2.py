"""Leftovers of the last stop that broke a stated promise (task lo2)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations.opacus import AccountantWarning, attach  # noqa: E402


def _private(rows: int = 64, batch_size: int = 8, **kwargs):
    """(model, optimizer, Poisson loader) of make_private: q = batch_size / rows."""
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(rows, 4), torch.randint(0, 2, (rows,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    kwargs.setdefault("max_grad_norm", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivacyEngine(accountant="rdp").make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=batch_size), noise_multiplier=1.0,
            **kwargs)


def _step(model, opt, loader) -> None:
    """One real step on the loader's next non-empty batch."""
    for x, y in loader:
        if len(x):
            break
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _attach(opt, ledger, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attach(opt, ledger, **kwargs)


# ---- 1. a hand-set rate without a loader, against Opacus' own hook's rate

def test_a_fixed_rate_below_opacus_hook_is_charged_at_the_hooks_rate_with_a_warning():
    # make_private's hook records q each step; sample_rate=q/100 without data_loader= was
    # charged q/100 (the ledger reported less than Opacus' own accountant)
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    with pytest.warns(AccountantWarning, match="accountant hook"):
        attach(opt, ledger, sample_rate=q / 100)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [q]


def test_a_callable_rate_below_opacus_hook_is_charged_at_the_hooks_rate_each_step():
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    given = [q / 100]
    _attach(opt, ledger, sample_rate=lambda: given[0])
    _step(model, opt, loader)
    given[0] = 2 * q  # above the hook's: charged as given
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [q, 2 * q]


def test_a_fixed_rate_above_opacus_hook_is_charged_as_given_without_a_warning():
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccountantWarning)
        attach(opt, ledger, sample_rate=2 * q)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [2 * q]


# ---- 1b. a hand-set rate within float32 rounding of the loader's

def test_a_float32_hand_rate_is_accepted_and_the_larger_is_charged():
    # q = 0.1 is not a float32: np.float32(0.1) = 0.10000000149... was refused as a
    # different rate; it is accepted, and the charge is the larger of the two
    np = pytest.importorskip("numpy")
    model, opt, loader = _private(rows=100, batch_size=10)
    q = loader.batch_sampler.sample_rate
    assert q == 0.1
    rounded = float(np.float32(q))
    assert rounded > q
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader, sample_rate=np.float32(q))
    _step(model, opt, loader)
    loader.batch_sampler.sample_rate = rounded  # the loader now draws at the larger one
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [rounded, rounded]


def test_a_hand_rate_below_a_float32_loader_rate_is_charged_at_the_loaders():
    np = pytest.importorskip("numpy")
    model, opt, loader = _private(rows=100, batch_size=10)
    rounded = float(np.float32(0.1))
    loader.batch_sampler.sample_rate = rounded
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader, sample_rate=0.1)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [rounded]


def test_a_hand_rate_beyond_float32_rounding_is_still_refused():
    _model, opt, loader = _private(rows=100, batch_size=10)
    with pytest.raises(InvalidArgumentError) as info:
        _attach(opt, Ledger(delta=1e-5), data_loader=loader, sample_rate=0.1 * (1 + 1e-6))
    assert info.value.argument == "sample_rate"
