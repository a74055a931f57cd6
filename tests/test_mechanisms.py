"""Mechanism curves against independent references: Opacus, dp-accounting, closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from opacus.accountants.analysis.rdp import compute_rdp

from privguard import DEFAULT_ORDERS, RDPCurve, mechanism_from_dict
from privguard import mechanisms as M

ORDERS = np.array(DEFAULT_ORDERS)


@pytest.mark.parametrize("sigma,q,steps", [(1.1, 0.004, 1), (0.8, 0.01, 7), (2.0, 0.3, 100), (1.0, 1.0, 3)])
def test_subsampled_gaussian_equals_opacus_compute_rdp(sigma, q, steps):
    ours = M.SubsampledGaussian(sigma, q, steps).rdp(ORDERS)
    ref = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS))
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("sigma,q", [(1.1, 0.004), (0.7, 0.05), (3.0, 0.5)])
def test_subsampled_gaussian_agrees_with_dp_accounting(sigma, q):
    # dp-accounting evaluates fractional orders conservatively (up to ~2% high
    # near order 1, or +inf where it gives up; see the quadrature test below for the exact value):
    # ours equals it at integer orders and is never above it.
    ours = M.SubsampledGaussian(sigma, q).rdp(ORDERS)
    ref = dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, ORDERS)
    integer = ORDERS == np.round(ORDERS)
    np.testing.assert_allclose(ours[integer], ref[integer], rtol=1e-6)
    assert np.all(ours <= ref * (1 + 1e-9))


@pytest.mark.parametrize("alpha", [1.1, 1.5, 2.5, 7.3])
def test_subsampled_gaussian_equals_numerical_integration(alpha):
    """Independent reference: A_α = E_{z~N(0,σ²)}[(1−q+q·e^((2z−1)/(2σ²)))^α] by mpmath quadrature."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 30
    q, s = mp.mpf("0.004"), mp.mpf("1.1")
    a = mp.mpf(alpha)
    f = lambda z: mp.npdf(z, 0, s) * (1 - q + q * mp.e ** ((2 * z - 1) / (2 * s**2))) ** a  # noqa: E731
    exact = float(mp.log(mp.quad(f, [-mp.inf, -5, 0, 5, mp.inf])) / (a - 1))
    ours = M.SubsampledGaussian(1.1, 0.004).rdp([alpha])[0]
    assert ours == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.7])
def test_gaussian_closed_form(sigma):
    np.testing.assert_allclose(M.Gaussian(sigma).rdp(ORDERS), ORDERS / (2 * sigma**2), rtol=1e-15)


def test_k_fold_composition_is_k_times_one_step():
    one = M.SubsampledGaussian(1.1, 0.01).rdp(ORDERS)
    np.testing.assert_array_equal(M.SubsampledGaussian(1.1, 0.01, steps=250).rdp(ORDERS), 250 * one)
    c = RDPCurve(ORDERS, one)
    assert (c * 250).epsilons == tuple((250 * one).tolist())
    assert sum([c] * 3) == c + c + c


@pytest.mark.parametrize("b", [0.3, 1.0, 5.0])
def test_laplace_matches_dp_accounting(b):
    ours = M.Laplace(b).rdp(ORDERS)
    ref = np.array([dpa_rdp._laplace_rdp(1 / b, a) for a in ORDERS])
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("eps0", [0.05, 0.5, 1.0, 4.0])
def test_pure_dp_is_randomized_response_and_below_both_bounds(eps0):
    ours = M.PureDP(eps0).rdp(ORDERS)
    # Binary randomized response with P(truth) = e^ε/(1+e^ε), from dp-accounting.
    p = 2 / (1 + math.exp(eps0))
    rr = np.array([dpa_rdp._randomized_response_rdp_replace_one(p, 2, a) for a in ORDERS])
    np.testing.assert_allclose(ours, rr, rtol=1e-9, atol=1e-12)
    assert np.all(ours <= np.minimum(eps0, ORDERS * eps0**2 / 2) + 1e-12)


def test_zcdp_and_composed():
    np.testing.assert_allclose(M.ZCDP(0.2).rdp(ORDERS), 0.2 * ORDERS)
    both = M.Composed((M.ZCDP(0.2), M.Gaussian(2.0))).rdp(ORDERS)
    np.testing.assert_allclose(both, 0.2 * ORDERS + ORDERS / 8)


ALL = [M.Gaussian(1.3), M.SubsampledGaussian(1.1, 0.004, 3), M.Laplace(2.0), M.PureDP(0.3),
       M.ZCDP(0.01), RDPCurve([2.0, 3.5], [0.1, 0.2]),
       M.Composed((M.ZCDP(0.01), M.Gaussian(2.0)))]


@pytest.mark.parametrize("mech", ALL, ids=lambda m: type(m).__name__)
def test_round_trip_and_value_semantics(mech):
    again = mechanism_from_dict(mech.to_dict())
    assert again == mech and hash(again) == hash(mech)
    with pytest.raises((AttributeError, TypeError)):
        mech.noise_multiplier = 3.0  # frozen
    curve = mech.rdp(ORDERS)
    assert np.all(curve[1:] >= curve[:-1] - 1e-12), "an RDP curve is non-decreasing in the order"


def test_raw_curve_on_another_grid_is_a_monotone_upper_bound():
    c = RDPCurve([2.0, 4.0, 8.0], [0.1, 0.3, 0.9])
    np.testing.assert_array_equal(c.rdp([1.5, 2.0, 3.0, 8.0, 9.0]), [0.1, 0.1, 0.3, 0.9, np.inf])
