"""DP-HyPO: the projection, Theorem 1 and 2, the GP sampler's bounds, the tuner."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from privguard import DEFAULT_ORDERS, InvalidArgumentError, Ledger, RDPCurve
from privguard import mechanisms as M
from privguard.tuning import (
    DPHyPOSearch,
    Geometric,
    Poisson,
    TruncatedNegativeBinomial,
    project_bounded_simplex,
    project_density,
)

ORDERS = np.array(DEFAULT_ORDERS)


def brute_force(p, lo, hi):
    res = minimize(lambda x: ((x - p) ** 2).sum(), np.clip(np.full(p.size, 1 / p.size), lo, hi),
                   jac=lambda x: 2 * (x - p), bounds=list(zip(lo, hi)), method="SLSQP",
                   constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
                   options={"ftol": 1e-15, "maxiter": 1000})
    return res.x


def check_kkt(f, p, lo, hi, tol=1e-10):
    """f = clip(p − ν, lo, hi) for one ν: free coordinates share p − f, bound ones are consistent."""
    free = (f > lo + tol) & (f < hi - tol)
    if free.any():
        nu = np.mean((p - f)[free])
        np.testing.assert_allclose((p - f)[free], nu, atol=1e-9)
        np.testing.assert_allclose(f, np.clip(p - nu, lo, hi), atol=1e-9)


@pytest.mark.parametrize("n", [2, 3, 5, 12, 40])
def test_projection_is_feasible_and_optimal(n):
    rng = np.random.default_rng(n)
    for _ in range(10):
        prior = rng.dirichlet(np.ones(n))
        C, c = rng.uniform(1.0, 4.0), rng.uniform(0.1, 1.0)
        p = rng.normal(1 / n, 2 / n, n)
        lo, hi = c * prior, C * prior
        f = project_bounded_simplex(p, lo, hi)
        assert f.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.all(f >= lo - 1e-15) and np.all(f <= hi + 1e-15)
        check_kkt(f, p, lo, hi)
        ref = brute_force(p, lo, hi)
        assert ((f - p) ** 2).sum() <= ((ref - p) ** 2).sum() + 1e-12


def test_projection_edge_cases():
    prior = np.full(4, 0.25)
    feasible = np.array([0.3, 0.2, 0.25, 0.25])
    np.testing.assert_allclose(project_density(feasible, prior, 2.0, 0.5), feasible, atol=1e-15)
    ties = project_density(np.array([1.0, 1.0, 0.0, 0.0]), prior, 1.5, 0.5)
    assert ties[0] == ties[1] and ties[2] == ties[3] and ties.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(project_density(np.array([5.0, 0, 0, 0]), prior, 1.0, 1.0), prior)
    extreme = project_density(np.array([1.0, 0, 0, 0]), prior, 1e6, 1e-9)
    np.testing.assert_allclose(extreme, [1.0 - 3 * 0.25e-9, 0.25e-9, 0.25e-9, 0.25e-9], atol=1e-15)
    with pytest.raises(InvalidArgumentError, match="bounds"):
        project_bounded_simplex(np.ones(3), np.full(3, 0.5), np.ones(3))


def theorem_1_by_hand(base, theta, gamma, C, c):
    mean = TruncatedNegativeBinomial(theta, gamma=gamma).mean
    aux = min((1 + theta) * (1 - 1 / lh) * base[j] + (1 + theta) * math.log(1 / gamma) / lh
              for j, lh in enumerate(ORDERS))
    raw = [base[i] + aux + (lam / (lam - 1) + 1 + theta) * math.log(C / c)
           + math.log(mean) / (lam - 1) for i, lam in enumerate(ORDERS)]
    return [min(raw[i:]) for i in range(len(raw))]


@pytest.mark.parametrize("theta,gamma,C,c", [(1.0, 0.1, 2.0, 0.75), (0.0, 0.02, 1.5, 0.5),
                                             (-0.5, 0.05, 3.0, 1.0), (2.0, 0.3, 1.0, 0.9)])
def test_theorem_1_against_an_independent_implementation(theta, gamma, C, c):
    mech = M.SubsampledGaussian(1.0, 0.01, 500)
    ours = M.DPHyPO(mech, TruncatedNegativeBinomial(theta, gamma=gamma), C, c).rdp(ORDERS)
    expected = theorem_1_by_hand(mech.rdp(ORDERS), theta, gamma, C, c)
    np.testing.assert_allclose(ours, expected, rtol=1e-12)


def test_c_equals_one_reproduces_random_k_exactly():
    for runs in (Geometric(mean=10.0), TruncatedNegativeBinomial(0.5, gamma=0.05)):
        for base in (M.SubsampledGaussian(1.0, 0.01, 500), M.PureDP(0.3)):
            a = M.DPHyPO(base, runs, 1.0, 1.0).rdp(ORDERS)
            b = M.RepeatAndSelect(base, runs).rdp(ORDERS)
            assert np.array_equal(a, b)


@pytest.mark.parametrize("theta", [0.0, 1.0, 3.0])
def test_theorem_2_pure_dp_exact(theta):
    t = M.DPHyPO(M.PureDP(0.2), TruncatedNegativeBinomial(theta, mean=6.0), 2.0, 0.5)
    assert t.pure_epsilon == pytest.approx((2 + theta) * (0.2 + math.log(4.0)), rel=1e-15)
    assert np.all(t.rdp(ORDERS) <= M.PureDP(t.pure_epsilon).rdp(ORDERS) + 1e-15)


def test_bad_density_bounds_and_runs():
    base = M.Gaussian(5.0)
    with pytest.raises(InvalidArgumentError, match="C="):
        M.DPHyPO(base, Geometric(mean=5.0), 0.9, 0.5)
    with pytest.raises(InvalidArgumentError, match="c="):
        M.DPHyPO(base, Geometric(mean=5.0), 2.0, 1.5)
    with pytest.raises(InvalidArgumentError, match="runs"):
        DPHyPOSearch({"lr": [0.1, 1.0]}, Poisson(5.0), cost=base)


SPACE = {"lr": [0.001, 0.01, 0.1, 1.0, 10.0], "clip": [0.5, 1.0, 2.0]}


def test_gp_densities_always_within_bounds():
    tuner = DPHyPOSearch(SPACE, Geometric(mean=5.0), cost=M.Gaussian(5.0), progress=False)
    rng = np.random.default_rng(0)
    prior = tuner.prior
    for _ in range(30):
        history = [(int(rng.integers(15)), float(rng.normal(0.5, 0.3)))
                   for _ in range(int(rng.integers(1, 12)))]
        pi = tuner.density(history)
        assert pi.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.all(pi >= 0.75 * prior - 1e-15) and np.all(pi <= 2.0 * prior + 1e-15)


def test_any_update_rule_is_privatised_by_the_projection():
    greedy = lambda history, coords: np.eye(len(coords))[max(history, key=lambda h: h[1])[0]]
    tuner = DPHyPOSearch(SPACE, Geometric(mean=5.0), cost=M.Gaussian(5.0), update=greedy,
                         C=1.5, c=0.5, progress=False)
    pi = tuner.density([(3, 0.9), (7, 0.1)])
    assert pi[3] == pytest.approx(1.5 / 15) and np.all(pi >= 0.5 / 15 - 1e-15)


def test_tuner_charges_theorem_1_once_before_running():
    # the ledger refuses reads while the candidates run (review at): its charge events count
    charges = []
    ledger = Ledger(epsilon=30.0, delta=1e-5,
                    listeners=[lambda e: charges.append(e) if e.kind == "charge" else None])
    seen = []

    def objective(params, child):
        seen.append(len(charges))
        child.charge(M.SubsampledGaussian(1.0, 0.01, 100))
        return -abs(math.log10(params["lr"]))

    tuner = DPHyPOSearch(SPACE, Geometric(mean=6.0), cost=M.SubsampledGaussian(1.0, 0.01, 100),
                         seed=2, progress=False)
    result = tuner.run(objective, ledger)
    assert len(ledger.history) == 1 and isinstance(ledger.history[0].mechanism, M.DPHyPO)
    assert seen and all(n == 1 for n in seen)
    assert result.selected and result.params in tuner.candidates
    assert set(vars(result)) == {"selected", "params", "score", "artifact", "cost", "seeded"}
    plan = tuner.plan(1e-5)
    rk = M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, 100), Geometric(mean=6.0))
    assert plan.epsilon > RDPCurve(ORDERS, rk.rdp(ORDERS)).epsilon(1e-5)  # adaptivity costs


def test_failed_runs_are_bottom_and_stay_out_of_the_history():
    histories = []

    def update(history, coords):
        histories.append(list(history))
        return np.ones(len(coords))

    def objective(params, child):
        child.charge(M.Gaussian(5.0))
        if params["lr"] == 10.0:
            raise FloatingPointError("diverged")
        if params["lr"] == 1.0:
            return math.nan
        return -abs(math.log10(params["lr"]) + 2)  # best: lr = 0.01

    tuner = DPHyPOSearch(SPACE, Geometric(mean=30.0), cost=M.Gaussian(5.0), update=update,
                         seed=0, progress=False)  # T = 30 for this seed
    result = tuner.run(objective, Ledger(epsilon=50.0, delta=1e-5))
    assert result.params["lr"] == 0.01 and result.score == 0.0
    bad = {i for i, c in enumerate(tuner.candidates) if c["lr"] in (1.0, 10.0)}
    assert len(histories) == 30  # the probe before the charge, then one per step after the first
    assert all(i not in bad and math.isfinite(s) for h in histories for i, s in h)


def test_an_update_rule_that_fails_mid_run_falls_back_to_the_prior():
    calls = []

    def update(history, coords):
        calls.append(len(history))
        if len(history) in (2, 4):
            raise RuntimeError("surrogate failed")
        if len(history) == 3:
            return np.full(len(coords), np.nan)  # not a density
        return np.ones(len(coords))

    tuner = DPHyPOSearch(SPACE, Geometric(mean=20.0), cost=M.Gaussian(5.0), update=update,
                         seed=0, progress=False)  # T = 20 for this seed
    assert np.array_equal(tuner._density_or_prior([(0, 0.1), (1, 0.2)]), tuner.prior)
    result = tuner.run(lambda p, c: -abs(math.log10(p["lr"])), Ledger(epsilon=50.0, delta=1e-5))
    assert result.selected and max(calls) >= 5  # the run went on past the failures
    with pytest.raises(InvalidArgumentError, match="update"):
        tuner.density([(0, 0.1), (1, 0.2), (2, 0.3)])  # the public method says what is wrong
