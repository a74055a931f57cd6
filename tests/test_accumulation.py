"""AccumulatedSubsampledGaussian: k Poisson micro-batches, one noise draw (theory §14)."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, Ledger, RDPCurve, mechanism_from_dict
from privguard import mechanisms as M
from privguard._errors import InvalidArgumentError
from privguard._mechanisms import _accumulated as acc

GRID = np.array(DEFAULT_ORDERS)


def _exact_remove(q: float, sigma: float, k: int, alpha: int) -> float:
    """D_α(Σ_j b_j N(j, σ²) ‖ N(0, σ²)) by the multinomial expansion, in mpmath.

    E_Q[(P/Q)^α] = Σ over count vectors (n_0..n_k), Σ n_j = α, of
    multinomial(α; n)·Π b_j^{n_j}·exp(((Σ j n_j)² − Σ j² n_j)/(2σ²)),
    summed by dynamic programming over (j, used, Σ j n_j, Σ j² n_j): an
    independent route from the module's polynomial powers.
    """
    mp.mp.dps = 40
    s2 = mp.mpf(sigma) ** 2
    b = [mp.binomial(k, j) * mp.mpf(q) ** j * (1 - mp.mpf(q)) ** (k - j) for j in range(k + 1)]
    # state: (used, linear, square) -> Σ Π b_j^{n_j} / Π n_j!
    states = {(0, 0, 0): mp.mpf(1)}
    for j in range(k + 1):
        nxt: dict = {}
        for (used, lin, sq), w in states.items():
            for n in range(alpha - used + 1):
                key = (used + n, lin + j * n, sq + j * j * n)
                nxt[key] = nxt.get(key, 0) + w * b[j] ** n / mp.factorial(n)
        states = nxt
    total = mp.fsum(w * mp.factorial(alpha) * mp.e ** ((lin * lin - sq) / (2 * s2))
                    for (used, lin, sq), w in states.items() if used == alpha)
    return float(mp.log(total) / (alpha - 1))


def _add_mpmath(q: float, sigma: float, k: int, alpha: float) -> float:
    """D_α(N(0, σ²) ‖ Σ_j b_j N(j, σ²)) by mpmath's adaptive quadrature (u = z/σ)."""
    mp.mp.dps = 20
    b = [mp.binomial(k, j) * mp.mpf(q) ** j * (1 - mp.mpf(q)) ** (k - j) for j in range(k + 1)]

    def integrand(u):
        f = mp.fsum(b[j] * mp.e ** (j * u / sigma - j * j / (2 * sigma**2)) for j in range(k + 1))
        return f ** (-(alpha - 1)) * mp.npdf(u)

    return float(mp.log(mp.quad(integrand, [-mp.inf, -5, 0, 5, mp.inf])) / (alpha - 1))


def test_issue_numbers():
    # issue 27: σ = 1, q = 0.125, α = 4: 2.51 (charged 0.448 as SGM(1, 0.25));
    # σ = 1, q = 0.05, α = 8: 9.15 (charged 1.38 as SGM(1, 0.1)); both k = 2.
    a = M.AccumulatedSubsampledGaussian(1.0, 0.125, 2).rdp([4.0])[0]
    b = M.AccumulatedSubsampledGaussian(1.0, 0.05, 2).rdp([8.0])[0]
    assert round(a, 2) == 2.51 and round(b, 2) == 9.15
    assert a > 5 * M.SubsampledGaussian(1.0, 0.25).rdp([4.0])[0]
    assert b > 6 * M.SubsampledGaussian(1.0, 0.1).rdp([8.0])[0]


@pytest.mark.parametrize("sigma,q,k,alpha", [
    (1.0, 0.125, 2, 4), (1.0, 0.05, 2, 8), (0.7, 0.03, 3, 6), (2.0, 0.3, 4, 5),
    (0.5, 0.01, 5, 3), (3.0, 0.5, 3, 16)])
def test_remove_direction_is_the_exact_expansion(sigma, q, k, alpha):
    exact = _exact_remove(q, sigma, k, alpha)
    ours = acc.remove_integer(q, sigma, k, alpha)[alpha - 2] / (alpha - 1)
    assert ours == pytest.approx(exact, rel=1e-10, abs=1e-13)
    assert M.AccumulatedSubsampledGaussian(sigma, q, k).rdp([float(alpha)])[0] >= exact * (1 - 1e-12)


@pytest.mark.parametrize("sigma,q,k", [(1.0, 0.01, 2), (0.7, 0.03, 6), (2.0, 0.05, 4),
                                        (1.0, 0.5, 3)])
def test_add_direction_quadrature_is_an_upper_bound(sigma, q, k):
    orders = np.array([1.5, 4.5, 32.0])
    ours = acc.add_quadrature(q, sigma, k, orders)
    for alpha, value in zip(orders, ours):
        truth = _add_mpmath(q, sigma, k, float(alpha))
        assert truth <= value  # a bound ...
        assert value <= truth + 0.05 * truth + 5e-4  # ... and a tight one
    # and the charged aligned curve covers it; the default curve (any vectors, §14
    # Lemma 14.5) bounds the aligned case too
    curve = M.AccumulatedSubsampledGaussian(sigma, q, k, aligned=True).rdp(orders)
    assert (curve >= ours).all()
    default = M.AccumulatedSubsampledGaussian(sigma, q, k).rdp(orders)
    assert all(d >= _add_mpmath(q, sigma, k, float(a)) for a, d in zip(orders, default))


def test_both_directions_are_covered_at_small_orders():
    # σ = 1, q = 0.01, k = 2: remove (exact) 6.99e-4 and add (mpmath) 6.12e-4 at α = 2;
    # at α = 1.5 the remove bound is the chord to α = 2, the add bound the quadrature.
    c = M.AccumulatedSubsampledGaussian(1.0, 0.01, 2).rdp([1.5, 2.0])
    assert c[0] >= _add_mpmath(0.01, 1.0, 2, 1.5)
    assert c[1] >= _exact_remove(0.01, 1.0, 2, 2)
    assert c[1] >= _add_mpmath(0.01, 1.0, 2, 2.0)


def test_one_micro_batch_is_subsampled_gaussian_bit_for_bit():
    for sigma, q, steps in [(1.1, 0.01, 1), (0.8, 0.3, 100), (5.0, 1e-4, 7)]:
        a = M.AccumulatedSubsampledGaussian(sigma, q, 1, steps=steps).rdp(GRID)
        b = M.SubsampledGaussian(sigma, q, steps=steps).rdp(GRID)
        assert a.tobytes() == b.tobytes()


def test_property_charge_covers_the_exact_curve_at_integer_orders():
    # σ ∈ [0.5, 5], q ∈ [1e-4, 0.5], k ∈ {1..8}; integer orders up to 64.
    rng = np.random.default_rng(27)
    orders = [2, 3, 7, 16, 33, 64]
    for _ in range(6):
        sigma = float(rng.uniform(0.5, 5.0))
        q = float(10 ** rng.uniform(-4, math.log10(0.5)))
        k = int(rng.integers(1, 9))
        curve = M.AccumulatedSubsampledGaussian(sigma, q, k).rdp(GRID)
        for alpha in orders:
            idx = int(np.flatnonzero(GRID == alpha)[0])
            exact = (acc.remove_integer(q, sigma, k, alpha)[alpha - 2] / (alpha - 1)
                     if k > 1 else float(M.SubsampledGaussian(sigma, q).rdp([alpha])[0]))
            assert curve[idx] >= exact * (1 - 1e-12) - 1e-15
        # the composition bound (Lemma 14.4) is itself never below the exact value
        if k > 1:
            comp = acc.composition_bound(q, sigma, k, np.array(orders, dtype=float))
            exact = acc.remove_integer(q, sigma, k, 64)[np.array(orders) - 2] / (np.array(orders) - 1)
            assert (comp >= exact * (1 - 1e-9)).all()


def test_property_spot_check_against_the_multinomial_expansion():
    rng = np.random.default_rng(2027)
    for _ in range(3):
        sigma = float(rng.uniform(0.5, 5.0))
        q = float(10 ** rng.uniform(-4, math.log10(0.5)))
        k = int(rng.integers(2, 6))
        alpha = int(rng.integers(2, 12))
        exact = _exact_remove(q, sigma, k, alpha)
        value = M.AccumulatedSubsampledGaussian(sigma, q, k).rdp([float(alpha)])[0]
        assert value >= exact * (1 - 1e-12)


def test_fractional_orders_lie_on_or_above_the_truth_and_below_the_ceiling():
    sigma, q, k = 1.0, 0.05, 3
    curve = M.AccumulatedSubsampledGaussian(sigma, q, k).rdp([4.0, 4.5, 5.0])
    assert curve[0] <= curve[1] <= curve[2]
    # Lemma 14.2 (convexity of (α−1)D_α) at the midpoint, checked against mpmath's
    # direct integral of the remove direction at α = 4.5
    mp.mp.dps = 30
    b = [mp.binomial(k, j) * mp.mpf(q) ** j * (1 - mp.mpf(q)) ** (k - j) for j in range(k + 1)]

    def integrand(u):
        f = mp.fsum(b[j] * mp.e ** (j * u / sigma - j * j / (2 * sigma**2)) for j in range(k + 1))
        return f ** 4.5 * mp.npdf(u)

    truth = float(mp.log(mp.quad(integrand, [-mp.inf, 0, 5, 10, 20, mp.inf])) / 3.5)
    assert truth <= curve[1] <= curve[2]


def test_pld_of_the_mixture_is_never_above_ours():
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant as pld

    # includes a regime where the RDP route is far above the PLD (σ = 0.8, k = 8)
    for sigma, q, k, steps in [(1.0, 0.01, 2, 100), (2.0, 0.05, 4, 50), (0.8, 0.002, 8, 300)]:
        probs = [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]
        event = dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs)
        accountant = pld.PLDAccountant(value_discretization_interval=1e-2)
        accountant.compose(event, steps)
        ours = RDPCurve(GRID, M.AccumulatedSubsampledGaussian(sigma, q, k, steps=steps).rdp(GRID))
        for delta in (1e-5, 1e-3):
            assert accountant.get_epsilon(delta) <= ours.epsilon(delta)


def test_remove_quadrature_bounds_fractional_orders_below_three():
    # the chord from g(1) = 0 to g(2) is D_2 at every α < 2: 1.04 at σ = 0.8, q = 0.002,
    # k = 8, where the truth at 1.5 is below 1e-3 (the j = 8 term only dominates from α ≈ 2)
    c = M.AccumulatedSubsampledGaussian(0.8, 0.002, 8, aligned=True).rdp([1.5, 2.0])
    assert c[0] < 2e-3 < 1.0 < c[1]
    for sigma, q, k, alpha in [(1.0, 0.01, 2, 1.5), (1.0, 0.05, 3, 2.5)]:
        mp.mp.dps = 20
        b = [mp.binomial(k, j) * mp.mpf(q) ** j * (1 - mp.mpf(q)) ** (k - j)
             for j in range(k + 1)]

        def integrand(u, b=b, sigma=sigma, k=k, alpha=alpha):
            f = mp.fsum(b[j] * mp.e ** (j * u / sigma - j * j / (2 * sigma**2))
                        for j in range(k + 1))
            return f ** alpha * mp.npdf(u)

        truth = float(mp.log(mp.quad(integrand, [-mp.inf, 0, 5, 10, 20, mp.inf])) / (alpha - 1))
        ours = acc.remove_quadrature(q, sigma, k, np.array([alpha]))[0]
        assert truth <= ours <= truth * 1.1


def test_serialises_and_charges():
    step = M.AccumulatedSubsampledGaussian(1.0, 0.01, 4, steps=3)
    assert mechanism_from_dict(step.to_dict()) == step
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    ledger.charge(step)
    assert ledger.epsilon() > 0


@pytest.mark.parametrize("field,value", [("micro_batches", 0), ("micro_batches", 1.5),
                                         ("micro_batches", True), ("sample_rate", 0.0),
                                         ("noise_multiplier", -1.0), ("steps", 0)])
def test_bad_arguments_are_refused_by_name(field, value):
    params = {"noise_multiplier": 1.0, "sample_rate": 0.1, "micro_batches": 2, "steps": 1}
    params[field] = value
    with pytest.raises(InvalidArgumentError, match=field):
        M.AccumulatedSubsampledGaussian(**params)


def test_extreme_parameters_give_valid_curves():
    for sigma, q, k in [(1e-3, 0.5, 2), (1e4, 1e-6, 8), (1.0, 1.0, 4), (1.0, 0.01, 100)]:
        curve = M.AccumulatedSubsampledGaussian(sigma, q, k).rdp(GRID)
        assert not np.isnan(curve).any() and (np.diff(curve) >= 0).all()
    # q = 1: every micro-batch holds the example: the Gaussian of sensitivity k
    c = M.AccumulatedSubsampledGaussian(2.0, 1.0, 3).rdp([2.0, 8.0])
    assert c.tolist() == pytest.approx([2 * 9 / 8, 8 * 9 / 8])


def test_hybrid_filter_refuses_an_accumulated_plan_beyond_its_envelope_by_name():
    # docs/theory.md §2b.1: accumulated envelopes exist up to 32 micro-batches
    from privguard import Plan

    plan = Plan(M.AccumulatedSubsampledGaussian(1.0, 0.01, 33), steps=100)
    with pytest.raises(InvalidArgumentError, match="at most 32 micro-batches"):
        Ledger(epsilon=3.0, delta=1e-5, filter="hybrid", plan=plan)
    Ledger(epsilon=3.0, delta=1e-5, plan=plan)  # the RDP filter takes it
    # k = 1 is SubsampledGaussian: a hybrid plan is fine
    Ledger(epsilon=3.0, delta=1e-5, filter="hybrid",
           plan=Plan(M.AccumulatedSubsampledGaussian(1.0, 0.01, 1), steps=100))
