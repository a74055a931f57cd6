"""RDP→DP conversions: Opacus, dp-accounting, round trips, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from opacus.accountants.analysis.rdp import get_privacy_spent

from privguard import CLASSIC, DEFAULT_ORDERS, InvalidArgumentError, RDPCurve
from privguard import mechanisms as M

ORDERS = np.array(DEFAULT_ORDERS)


def curve(sigma=1.0, q=0.01, steps=2000) -> RDPCurve:
    return RDPCurve(ORDERS, M.SubsampledGaussian(sigma, q, steps).rdp(ORDERS))


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
def test_improved_conversion_is_opacus_rounded_up(delta):
    # Opacus' expression, raised by the bound on its rounding (task ul): never below it,
    # above it by a few 10⁻¹⁵ relative, at the same order
    c = curve()
    eps, order = c.epsilon_and_order(delta)
    ref_eps, ref_order = get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=c.as_array(), delta=delta)
    assert ref_eps < eps <= ref_eps * (1 + 1e-13) and order == ref_order


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
def test_improved_conversion_agrees_with_dp_accounting(delta):
    c = curve()
    ref, _ = dpa_rdp.compute_epsilon(ORDERS, c.as_array(), delta)
    assert c.epsilon(delta) == pytest.approx(ref, rel=1e-9)
    ref_delta, _ = dpa_rdp.compute_delta(ORDERS, c.as_array(), 3.0)
    # dp-accounting also takes a KL-based bound; ours is the RDP one, never smaller.
    assert c.delta(3.0) >= ref_delta * (1 - 1e-9)


def test_classic_is_mironov_and_looser():
    c = curve()
    d = 1e-5
    expected = np.min(c.as_array() + np.log(1 / d) / (ORDERS - 1))
    assert c.epsilon(d, method=CLASSIC) == pytest.approx(expected, rel=1e-12)
    assert c.epsilon(d, method=CLASSIC) > c.epsilon(d)


@pytest.mark.parametrize("method", ["improved", "classic"])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-9])
def test_epsilon_delta_epsilon_round_trip(method, delta):
    c = curve()
    eps = c.epsilon(delta, method)
    back = c.delta(eps, method)
    assert back == pytest.approx(delta, rel=1e-6)
    assert c.epsilon(back, method) == pytest.approx(eps, rel=1e-9)


def test_optimal_order_and_maximum():
    a, b = curve(1.0), curve(2.0)
    assert a.maximum(b) == a  # more noise, smaller curve
    assert a.optimal_order(1e-5) in DEFAULT_ORDERS


def test_composition_needs_same_grid():
    with pytest.raises(InvalidArgumentError, match=r"other\.orders"):
        RDPCurve([2.0, 3.0], [1.0, 1.0]) + RDPCurve([2.0, 4.0], [1.0, 1.0])
    with pytest.raises(InvalidArgumentError, match="k=-1"):
        RDPCurve([2.0], [1.0]) * -1


@pytest.mark.parametrize("delta", [0, 1, -0.1, 1.5, float("nan"), "x"])
def test_bad_delta(delta):
    with pytest.raises(InvalidArgumentError, match="delta"):
        curve().epsilon(delta)


def test_bad_method():
    with pytest.raises(InvalidArgumentError, match="method='exact'"):
        curve().epsilon(1e-5, method="exact")


# ------------------------------------------------------ a curve is non-decreasing in α
def test_decreasing_curve_is_refused_with_the_orders_that_decrease():
    with pytest.raises(InvalidArgumentError, match="epsilons") as info:
        RDPCurve([2.0, 4.0, 8.0], [0.1, 0.3, 0.2])
    assert "ε(4) = 0.29999999999999999 > ε(8) = 0.20000000000000001" in str(info.value)


def test_round_off_decreases_are_accepted_and_kept_as_given():
    values = [1.0, 1.0 - 0.9e-9, 1.0 - 1.8e-9]  # within 1e-9·1 + 1e-9 of the running max
    assert RDPCurve([2.0, 3.0, 4.0], values).epsilons == tuple(values)
    assert RDPCurve([2.0, 3.0], [0.0, 0.0]).epsilons == (0.0, 0.0)
    with pytest.raises(InvalidArgumentError, match="non-decreasing"):
        RDPCurve([2.0, 3.0], [1.0, 1.0 - 2.1e-9])
    with pytest.raises(InvalidArgumentError, match="non-decreasing"):  # relative part
        RDPCurve([2.0, 3.0], [1e6, 1e6 * (1 - 2e-9)])


def test_small_decreases_cannot_accumulate():
    orders = np.arange(2.0, 102.0)
    steps = 1.0 - 1.5e-9 * np.arange(100)  # each step within tolerance, the total is not
    with pytest.raises(InvalidArgumentError, match="non-decreasing"):
        RDPCurve(orders, steps)


def test_infinite_then_finite_is_a_decrease():
    assert RDPCurve([2.0, 3.0], [1.0, np.inf]).epsilons == (1.0, np.inf)
    with pytest.raises(InvalidArgumentError, match="non-decreasing"):
        RDPCurve([2.0, 3.0], [np.inf, 1.0])


@pytest.mark.parametrize("grid", [np.geomspace(1.00001, 1e6, 400), np.linspace(1.00001, 1.01, 300)])
def test_every_built_in_curve_passes_the_check_on_fine_grids(grid):
    from privguard.tuning import Poisson
    for mech in [M.Gaussian(0.7), M.Laplace(0.01), M.Laplace(3.0), M.Laplace(1e6), M.PureDP(1e-6),
                 M.PureDP(0.3), M.PureDP(20.0), M.ZCDP(1e-9), M.SubsampledGaussian(1.0, 0.01, 100),
                 M.RepeatAndSelect(M.PureDP(0.1), Poisson(5.0))]:
        curve = mech.rdp(grid)  # raises if a curve decreased beyond round-off
        assert not np.isnan(curve).any()
