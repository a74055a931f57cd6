"""Bad input raises a precise exception naming the argument and value; nothing is charged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privguard import (
    Concentrated,
    Explicit,
    InvalidArgumentError,
    Ledger,
    RDPCurve,
    UnknownMechanismError,
    mechanism_from_dict,
)
from privguard import mechanisms as M

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs,name", [
    (dict(epsilon=1.0, delta=0.0), "delta"),
    (dict(epsilon=1.0, delta=1.0), "delta"),
    (dict(epsilon=1.0, delta=NAN), "delta"),
    (dict(epsilon=1.0, delta=-1e-5), "delta"),
    (dict(epsilon=0.0, delta=1e-5), "epsilon"),
    (dict(epsilon=-1.0, delta=1e-5), "epsilon"),
    (dict(epsilon=NAN, delta=1e-5), "epsilon"),
    (dict(epsilon=INF, delta=1e-5), "epsilon"),
    (dict(epsilon=1.0), "delta"),
    (dict(delta=1e-5, orders=[1.0, 2.0]), "orders"),
    (dict(delta=1e-5, orders=[0.5, 2.0]), "orders"),
    (dict(delta=1e-5, orders=[3.0, 2.0]), "orders"),
    (dict(delta=1e-5, orders=[2.0, 2.0]), "orders"),
    (dict(delta=1e-5, orders=[2.0, NAN]), "orders"),
    (dict(delta=1e-5, orders=[]), "orders"),
    (dict(delta=1e-5, odometer="fast"), "odometer"),
    (dict(orders=[2.0, 3.0], rdp_budget=[1.0, -1.0]), "rdp_budget"),
    (dict(orders=[2.0, 3.0], rdp_budget=[1.0, NAN]), "rdp_budget"),
    (dict(orders=[2.0, 3.0], rdp_budget=[1.0]), "rdp_budget"),
    (dict(epsilon=1.0, delta=1e-5, rdp_budget=[1.0]), "rdp_budget"),
    (dict(delta=1e-5, shares=Concentrated()), "shares"),
    (dict(epsilon=1.0, delta=1e-5, shares="uniform"), "shares"),
    (dict(epsilon=1.0, delta=1e-5, plan="step"), "plan"),
])
def test_ledger_constructor(kwargs, name):
    with pytest.raises(InvalidArgumentError) as info:
        Ledger(**kwargs)
    assert info.value.argument == name
    assert name in str(info.value)


@pytest.mark.parametrize("make,name", [
    (lambda: M.Gaussian(0.0), "noise_multiplier"),
    (lambda: M.Gaussian(-1.0), "noise_multiplier"),
    (lambda: M.Gaussian(NAN), "noise_multiplier"),
    (lambda: M.Gaussian("1"), "noise_multiplier"),
    (lambda: M.SubsampledGaussian(1.0, 0.0), "sample_rate"),
    (lambda: M.SubsampledGaussian(1.0, 1.5), "sample_rate"),
    (lambda: M.SubsampledGaussian(1.0, NAN), "sample_rate"),
    (lambda: M.SubsampledGaussian(0.0, 0.1), "noise_multiplier"),
    (lambda: M.SubsampledGaussian(1.0, 0.1, steps=0), "steps"),
    (lambda: M.SubsampledGaussian(1.0, 0.1, steps=2.5), "steps"),
    (lambda: M.Laplace(0.0), "scale"),
    (lambda: M.PureDP(0.0), "epsilon"),
    (lambda: M.PureDP(INF), "epsilon"),
    (lambda: M.ZCDP(-0.1), "rho"),
    (lambda: M.Composed(()), "mechanisms"),
    (lambda: RDPCurve([2.0, 3.0], [0.1, -0.1]), "epsilons"),
    (lambda: RDPCurve([2.0, 3.0], [0.1, NAN]), "epsilons"),
    (lambda: RDPCurve([1.0, 3.0], [0.1, 0.2]), "orders"),
    (lambda: Concentrated(share=1.5), "share"),
    (lambda: Explicit({2.0: 0.7, 3.0: 0.7}), "shares"),
])
def test_mechanism_and_share_parameters(make, name):
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert info.value.argument == name


def test_unknown_mechanism_type():
    with pytest.raises(UnknownMechanismError, match="Bogus"):
        mechanism_from_dict({"type": "Bogus", "params": {}})
    with pytest.raises(InvalidArgumentError, match="params"):
        mechanism_from_dict({"type": "Gaussian", "params": {"sigma": 1.0}})


@pytest.mark.parametrize("bad", [None, 1.0, "gaussian", {"type": "Gaussian"}])
def test_charging_a_non_mechanism_charges_nothing(bad):
    ledger = Ledger(1.0, 1e-5)
    with pytest.raises(InvalidArgumentError, match="mechanism"):
        ledger.charge(bad)
    with pytest.raises(InvalidArgumentError):
        ledger.can_afford(bad)
    assert ledger.history == () and not ledger.spent.any()


def test_bad_label_and_bad_query_delta_charge_nothing():
    ledger = Ledger(1.0, 1e-5)
    with pytest.raises(InvalidArgumentError, match="label"):
        ledger.charge(M.Gaussian(10.0), label=3)
    assert ledger.history == ()
    with pytest.raises(InvalidArgumentError, match="delta"):
        ledger.epsilon(delta=2.0)
    with pytest.raises(InvalidArgumentError, match="delta"):
        Ledger().epsilon()


def test_orders_off_grid_for_single_order_share():
    with pytest.raises(InvalidArgumentError, match="order"):
        Ledger(1.0, 1e-5, shares=Concentrated(1.0, order=2.05))


def test_mechanism_rdp_rejects_bad_orders():
    with pytest.raises(InvalidArgumentError, match="orders"):
        M.Gaussian(1.0).rdp([2.0, 1.5])
    with pytest.raises(InvalidArgumentError, match="orders"):
        M.Gaussian(1.0).rdp([[2.0, 3.0]])
    assert math.isinf(RDPCurve([2.0], [1.0]).rdp([3.0])[0])
    assert np.isfinite(M.Gaussian(1.0).rdp([1.0001])).all()
