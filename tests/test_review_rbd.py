"""Review rbd (adversarial review of branch bd): findings, each with its test."""

from __future__ import annotations

import warnings

import pytest

from privguard import Ledger
from privguard import mechanisms as M

ORDERS = [1.5, 2.0, 4.0, 8.0, 64.0]


def test_a_lease_sized_past_the_float_range_is_warning_free(tmp_path):
    # bd made base + n × curve warning-free in the journal and the fast path, but the
    # lease's meter search (privguard/_accounting/_lease.py, meter_room) probed
    # spent + m × curve past 1.8e308: under -W error the third charge, which the ε filter
    # admits at α = 1.5, raised RuntimeWarning out of charge instead of being recorded.
    ledger = Ledger(1e308, 1e-5, orders=ORDERS, path=tmp_path / "l.db", lease=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            ledger.charge(M.ZCDP(1e306))
    held = len(ledger.history)  # the three, and the lease's steps taken with them
    assert held >= 3
    ledger.close()
    assert len(Ledger.open(tmp_path / "l.db", read_only=True).history) == held


@pytest.mark.parametrize("budget,q", [(10.0, 1e-310), (1e308, 0.01)], ids=["subnormal-q", "huge"])
def test_a_strict_lease_whose_room_passes_the_float_range_is_warning_free(tmp_path, budget, q):
    # the strict filter's lease cap FRACTION × (b(α) − S(α)) / c(α) overflowed in the
    # divide for a subnormal c(α) (a sample rate of 1e-310, budget 10) or a budget of
    # 1e308: under -W error RuntimeWarning escaped charge (found by review rbd's fuzz)
    ledger = Ledger(orders=ORDERS, rdp_budget=[budget] * len(ORDERS), delta=1e-5,
                    path=tmp_path / "l.db", lease=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            ledger.charge(M.SubsampledGaussian(1.0, q))
    assert len(ledger.history) >= 3


def test_a_stored_hybrid_target_beyond_the_range_is_named_and_ledger_open_suggested(
        tmp_path, monkeypatch):
    # Ledger(150, δ, filter="hybrid", path=...) for a file written with that target before
    # the bound is refused (a new configuration is built from the arguments); the message
    # said only "use filter='rdp'", which that file refuses without a retarget (review rbd)
    from privguard import InvalidArgumentError
    from privguard._accounting import _hybrid

    path = tmp_path / "l.db"
    with monkeypatch.context() as mp:
        mp.setattr(_hybrid, "MAX_EPSILON", 1e9)
        Ledger(150.0, 1e-5, filter="hybrid", path=path).close()
    with pytest.raises(InvalidArgumentError, match=r"Ledger\.open\(path\)"):
        Ledger(150.0, 1e-5, filter="hybrid", path=path)
    assert Ledger.open(path).target == (150.0, 1e-5)


def _bool_values():
    import numpy as np

    values = [np.True_, np.array(True)]
    try:
        import torch
    except ImportError:
        return values
    return [*values, torch.tensor(True)]


@pytest.mark.parametrize("bad", _bool_values(), ids=repr)
def test_a_sample_rate_callable_returning_a_numpy_or_torch_bool_is_refused(bad):
    # bd checks the callable's value "as sample_rate= is", which refuses np.True_; float()
    # took a numpy or torch bool as q = 1 (review rbd)
    from test_bad_input_bd import _opacus_step

    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as info:
        _opacus_step(lambda: bad)
    assert info.value.argument == "sample_rate"


def test_a_sample_rate_callable_returning_a_tensor_or_numpy_rate_charges_that_rate():
    torch = pytest.importorskip("torch")
    import numpy as np
    from test_bad_input_bd import _opacus_step

    # above the rate of Opacus' hook (0.25): below it, the hook's rate is charged (review lo2)
    for value in (torch.tensor(0.5), np.float32(0.5), np.array(0.5)):
        (record,) = _opacus_step(lambda v=value: v).history
        assert record.mechanism.sample_rate == 0.5
