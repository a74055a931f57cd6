"""RandomAllocation: the curve against brute force, mpmath integration and its own bounds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, InvalidArgumentError, mechanism_from_dict
from privguard import mechanisms as M
from privguard._curves._upward import times_up
from privguard._mechanisms import _allocation as A
from privguard._mechanisms import _allocation_add as B

ORDERS = np.array(DEFAULT_ORDERS)


def _brute_log_moment(n: int, sigma: float, t: int) -> float:
    """log E_Q[L^n] by enumerating every allocation of the n factors to the t steps."""
    s2, total = 1.0 / sigma**2, 0.0
    for ks in itertools.product(range(n + 1), repeat=t):
        if sum(ks) == n:
            coef = math.factorial(n)
            for k in ks:
                coef //= math.factorial(k)
            total += coef * math.exp(sum(k * (k - 1) * s2 / 2 for k in ks))
    return math.log(total) - n * math.log(t)


@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.5])
@pytest.mark.parametrize("t", [2, 3, 5])
def test_log_moments_equal_the_multinomial_sum(sigma, t):
    binary = A.log_moments(7, sigma, t)  # t + 1 < 7 for t ≤ 5: binary powering
    miller = A.log_moments(t + 1, sigma, t)  # Miller's recurrence
    for n in range(2, 8):
        ref = _brute_log_moment(n, sigma, t)
        assert binary[n] == pytest.approx(ref, rel=1e-12, abs=1e-12)
        if n <= t + 1:
            assert miller[n] == pytest.approx(ref, rel=1e-12, abs=1e-12)


def test_both_recurrences_agree_where_they_overlap():
    t = 40
    miller = A.log_moments(41, 0.9, t)
    s2 = 1 / 0.9**2
    log_g, base, e = np.full(42, -np.inf), A._log_series(41, s2), t
    log_g[0] = 0.0
    while e:
        if e & 1:
            log_g = A._log_mul(log_g, base)
        e >>= 1
        if e:
            base = A._log_mul(base, base)
    n = np.arange(42.0)
    binary = A.gammaln(n + 1) - n * math.log(t) + log_g
    np.testing.assert_allclose(miller, binary, rtol=1e-12, atol=1e-12)


def _mp_two_steps(sigma: float, beta: float) -> float:
    """log E_Q[L^β] for t = 2 by mpmath: L = e^(z̄)·cosh((z1−z2)/2), z̄ and z1 − z2 independent."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 20
    s2 = mp.mpf(1) / mp.mpf(sigma) ** 2
    b = mp.mpf(beta)
    mean_part = -b * s2 / 2 + b * b * s2 / 4  # z̄ ~ N(−s²/2, s²/2)
    sd = mp.sqrt(2 * s2)  # z1 − z2 ~ N(0, 2s²)
    f = lambda d: mp.npdf(d, 0, sd) * mp.cosh(d / 2) ** b
    return float(mean_part + mp.log(mp.quad(f, [-mp.inf, -5 * sd, 0, 5 * sd, mp.inf])))


@pytest.mark.parametrize("sigma,alpha", [(0.8, 2.0), (0.8, 4.7), (1.0, 1.5), (1.0, 3.0), (2.0, 2.0),
                                         (2.0, 8.0)])
def test_two_steps_against_mpmath_in_both_directions(sigma, alpha):
    ours = M.RandomAllocation(sigma, 2).rdp([alpha])[0]
    remove = _mp_two_steps(sigma, alpha) / (alpha - 1)
    add = _mp_two_steps(sigma, 1 - alpha) / (alpha - 1)
    assert ours >= remove * (1 - 1e-9) and ours >= add * (1 - 1e-9)
    laplace = B.add_bound(np.array([alpha]), sigma, 2)[0]
    assert add <= laplace
    if float(alpha).is_integer():  # the remove direction is exact at integer orders
        assert A.remove_bound(np.array([alpha]), sigma, 2)[0] == pytest.approx(remove, rel=1e-9)
        assert laplace <= add * 1.05  # and the add bound is close at integer orders


def _hermite_three_steps(sigma: float, beta: float) -> float:
    """log E_Q[L^β] for t = 3 by a 3-D Gauss–Hermite product rule (96 nodes a step)."""
    x, w = np.polynomial.hermite_e.hermegauss(96)  # ∫ f(x) e^(−x²/2) dx ≈ Σ w f(x)
    w = w / math.sqrt(2 * math.pi)
    s = 1.0 / sigma
    e = np.exp(s * x - s * s / 2)  # per step: exp((2y − 1)/(2σ²)) with y = σx
    lik = (e[:, None, None] + e[None, :, None] + e[None, None, :]) / 3
    weights = w[:, None, None] * w[None, :, None] * w[None, None, :]
    return float(np.log(np.sum(weights * lik**beta)))


@pytest.mark.parametrize("sigma", [1.0, 2.0])
@pytest.mark.parametrize("alpha", [2.0, 3.0, 4.5])
def test_three_steps_against_quadrature(sigma, alpha):
    remove = _hermite_three_steps(sigma, alpha) / (alpha - 1)
    add = _hermite_three_steps(sigma, 1 - alpha) / (alpha - 1)
    ours = M.RandomAllocation(sigma, 3).rdp([alpha])[0]
    if float(alpha).is_integer():
        assert A.remove_bound(np.array([alpha]), sigma, 3)[0] == pytest.approx(remove, rel=1e-8)
    assert ours >= remove * (1 - 1e-8) and ours >= add * (1 - 1e-8)


def test_fractional_orders_lie_on_or_above_the_true_curve():
    # log E[L^α] is convex in α: the chord is above it; check at t = 2 against mpmath
    for alpha in (2.3, 5.5):
        exact = _mp_two_steps(1.0, alpha) / (alpha - 1)
        bound = A.remove_bound(np.array([alpha]), 1.0, 2)[0]
        assert exact <= bound <= exact * 1.2


def test_one_step_is_the_gaussian_and_curve_is_at_most_gaussian():
    np.testing.assert_array_equal(M.RandomAllocation(1.3, 1).rdp(ORDERS), M.Gaussian(1.3).rdp(ORDERS))
    for sigma, t in [(0.5, 10), (1.0, 1000), (4.0, 10**4)]:
        c = M.RandomAllocation(sigma, t).rdp(ORDERS)
        assert np.all(c <= M.Gaussian(sigma).rdp(ORDERS))
        assert np.all(np.diff(c) >= 0)
        # never below the exact remove direction, nor the add bound
        assert np.all(c >= A.remove_bound(ORDERS, sigma, t))
        add = np.minimum(A.add_bound(ORDERS, sigma, t), B.add_bound(ORDERS, sigma, t))
        assert np.all(c >= add * (1 - 1e-12))


def test_epochs_compose_and_dict_round_trip():
    one = M.RandomAllocation(1.1, 50).rdp(ORDERS)
    m = M.RandomAllocation(1.1, 50, epochs=7)
    np.testing.assert_array_equal(m.rdp(ORDERS), times_up(7, one))  # rounded up (task sr)
    assert mechanism_from_dict(m.to_dict()) == m
    assert mechanism_from_dict({"type": "RandomAllocation",
                                "params": {"noise_multiplier": 1.1, "steps": 50}}).epochs == 1


@pytest.mark.parametrize("kwargs", [dict(noise_multiplier=0.0, steps=3), dict(noise_multiplier=1.0, steps=0),
                                    dict(noise_multiplier=1.0, steps=2.5), dict(noise_multiplier=1.0, steps=3,
                                                                                epochs=True)])
def test_bad_arguments_are_refused_by_name(kwargs):
    with pytest.raises(InvalidArgumentError) as err:
        M.RandomAllocation(**kwargs)
    bad = [k for k, v in kwargs.items() if v in (0.0, 0, 2.5, True) and not (k == "noise_multiplier" and v)]
    assert bad[-1] in str(err.value)


@pytest.mark.parametrize("sigma", [1e-300, 1e-5, 1e5, 1e300])
def test_extreme_noise_gives_a_valid_curve(sigma):
    c = M.RandomAllocation(sigma, 100).rdp(ORDERS)
    assert not np.isnan(c).any()
    assert np.all(c <= M.Gaussian(sigma).rdp(ORDERS))


def _add_reference(beta: float, sigma: float, t: int) -> float:
    """log E_Q[L^(−β)] by scipy quadrature of the Laplace representation (independent code)."""
    from scipy import integrate, special

    s = 1.0 / sigma

    def phi(v):
        f = lambda z: math.exp(-v * math.exp(s * z - s * s / 2) - z * z / 2) / math.sqrt(2 * math.pi)
        return integrate.quad(f, -12, 12 + 2 * s, limit=200, epsabs=1e-15, epsrel=1e-13)[0]

    def g(u):
        return math.exp((beta - 1) * math.log(u) + t * math.log(phi(u / t)) - special.gammaln(beta))

    return math.log(integrate.quad(g, 0, np.inf, limit=400, epsrel=1e-11)[0])


@pytest.mark.parametrize("sigma,t", [(1.0, 1000), (0.7, 300), (2.0, 50)])
@pytest.mark.parametrize("beta", [1.0, 4.0])
def test_add_bound_is_above_an_independent_quadrature_and_close(sigma, t, beta):
    ref = _add_reference(beta, sigma, t)
    ours = B.log_moment_upper(np.array([beta]), sigma, t)[0]
    assert ref <= ours <= ref * 1.005


def test_add_bound_is_above_a_monte_carlo_estimate():
    # fully independent of the Laplace representation: E_Q[1/L] by sampling (fixed seed)
    rng = np.random.default_rng(7)
    sigma, t, n = 1.0, 100, 100_000
    moment = 0.0
    for _ in range(2):
        z = rng.standard_normal((n // 2, t))
        lik = np.exp(z / sigma - 1 / (2 * sigma**2)).mean(axis=1)
        moment += (1 / lik).sum()
    est = math.log(moment / n)  # about 0.0166; its standard error is about 0.0004
    ours = B.log_moment_upper(np.array([1.0]), sigma, t)[0]
    assert est - 0.0015 <= ours <= est + 0.0015


def test_target_thousand_steps_hundred_epochs_within_ten_percent_of_poisson():
    from privguard import RDPCurve

    sigma, t, epochs, delta = 1.0, 1000, 100, 1e-5
    alloc = RDPCurve(ORDERS, M.RandomAllocation(sigma, t, epochs=epochs).rdp(ORDERS)).epsilon(delta)
    poisson = RDPCurve(ORDERS, M.SubsampledGaussian(sigma, 1 / t, steps=t * epochs).rdp(ORDERS)).epsilon(delta)
    assert alloc <= 1.10 * poisson
    # and never below the exact remove direction's own ε
    remove = RDPCurve(ORDERS, np.maximum.accumulate(A.remove_bound(ORDERS, sigma, t)) * epochs).epsilon(delta)
    assert alloc >= remove


def test_add_bound_stays_tight_for_a_million_steps():
    # the rounding allowance scales with φ − 1 (log1p), not with 1: t·1e-12 would swamp 1/t here
    orders = np.array([2.0, 10.0])
    add = B.add_bound(orders, 1.0, 10**6)
    remove = A.remove_bound(orders, 1.0, 10**6)
    assert np.all(add <= remove * 1.01)


def test_any_valid_parameters_give_a_valid_curve():
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.settings(max_examples=30, deadline=None)
    @hyp.given(st.floats(1e-300, 1e300), st.integers(1, 2**53), st.integers(1, 1000))
    def check(sigma, steps, epochs):
        c = M.RandomAllocation(sigma, steps, epochs=epochs).rdp(ORDERS)
        assert not np.isnan(c).any() and (c >= 0).all() and (c[1:] >= c[:-1]).all()
        # e epochs are e × one epoch rounded up (task sr), so at most the Gaussian's e steps
        # rounded up the same way (monotone; an ulp where that product is subnormal)
        gaussian = times_up(epochs, M.Gaussian(sigma).rdp(ORDERS))
        assert (c <= gaussian * (1 + 1e-12)).all()

    check()
