"""Random-K tuning: bounds against dp-accounting, charging, leakage, samplers, calibration."""

from __future__ import annotations

import io
import logging
import math
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from dp_accounting import dp_event as E
from dp_accounting.rdp import rdp_privacy_accountant as R
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privguard import (
    DEFAULT_ORDERS,
    BudgetExhausted,
    InvalidArgumentError,
    Ledger,
    RDPCurve,
    mechanism_from_dict,
)
from privguard import mechanisms as M
from privguard.tuning import (
    SLACK,
    Geometric,
    Logarithmic,
    Poisson,
    RandomSearch,
    TruncatedNegativeBinomial,
    calibrate_noise_multiplier,
    calibrate_tuning_noise,
    dpsgd_cost,
    expected_quantile,
    prob_top,
)

ORDERS = np.array(DEFAULT_ORDERS)


def dp_accounting_bound(sigma, q, steps, mean, shape):
    acc = R.RdpAccountant(orders=list(ORDERS))
    base = E.SelfComposedDpEvent(E.PoissonSampledDpEvent(q, E.GaussianDpEvent(sigma)), steps)
    acc.compose(E.RepeatAndSelectDpEvent(base, mean, shape))
    return acc._rdp, acc.get_epsilon(1e-5)


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.01, 1000), (0.8, 0.004, 5000), (2.0, 0.1, 50)])
@pytest.mark.parametrize("mean,shape", [(5.0, math.inf), (30.0, math.inf), (10.0, 1.0),
                                        (10.0, 0.0), (20.0, 0.5), (8.0, 3.0)])
def test_bound_never_looser_than_dp_accounting(sigma, q, steps, mean, shape):
    runs = Poisson(mean) if math.isinf(shape) else TruncatedNegativeBinomial(shape, mean=mean)
    ours = M.RepeatAndSelect(M.SubsampledGaussian(sigma, q, steps), runs).rdp(ORDERS)
    ref, ref_eps = dp_accounting_bound(sigma, q, steps, mean, shape)
    finite = np.isfinite(ref)
    if math.isinf(shape):
        # Poisson: privguard adds the mass e^(−μ) of K = 0, which Theorem 6 (and
        # dp-accounting) leave out (docs/theory.md §7, "K = 0"; review tb):
        # e^((λ−1)ε') = e^(−μ) + e^((λ−1)·(dp-accounting's ε')), then the envelope.
        with np.errstate(invalid="ignore"):
            ref = np.logaddexp(-mean, (ORDERS - 1) * ref) / (ORDERS - 1)
        ref = np.minimum.accumulate(ref[::-1])[::-1]
        ref_eps = RDPCurve(ORDERS, ref).epsilon(1e-5)
    # dp-accounting solves γ from the mean conservatively to ~1e-9; allow that much.
    assert np.all(ours[finite] <= ref[finite] * (1 + 1e-7))
    assert RDPCurve(ORDERS, ours).epsilon(1e-5) <= ref_eps * (1 + 1e-7)


def test_theorem_2_by_hand():
    """Theorem 2 written out with loops: λ̂ minimised over the grid, then the
    bound at each λ replaced by the smallest bound at any λ' >= λ."""
    base = M.Gaussian(3.0).rdp(ORDERS)
    runs = TruncatedNegativeBinomial(0.5, gamma=0.05)
    eta, gamma, mean = 0.5, 0.05, runs.mean
    aux = min((1 + eta) * (1 - 1 / lh) * base[j] + (1 + eta) * math.log(1 / gamma) / lh
              for j, lh in enumerate(ORDERS))
    raw = [base[i] + aux + math.log(mean) / (lam - 1) for i, lam in enumerate(ORDERS)]
    expected = [min(raw[i:]) for i in range(len(raw))]
    ours = M.RepeatAndSelect(M.Gaussian(3.0), runs).rdp(ORDERS)
    np.testing.assert_allclose(ours, expected, rtol=1e-12)


@pytest.mark.parametrize("eta", [-0.5, 0.0, 1.0, 2.5])
def test_pure_dp_corollary_exact(eta):
    t = M.RepeatAndSelect(M.PureDP(0.2), TruncatedNegativeBinomial(eta, mean=10.0))
    assert t.pure_epsilon == pytest.approx((2 + eta) * 0.2, rel=1e-15)
    assert np.all(t.rdp(ORDERS) <= M.PureDP((2 + eta) * 0.2).rdp(ORDERS) + 1e-15)


def test_geometric_pure_dp_is_liu_talwar_three_epsilon():
    t = M.RepeatAndSelect(M.PureDP(0.1), Geometric(mean=50.0))
    assert t.pure_epsilon == pytest.approx(0.3)


def test_limit_one_run_recovers_the_base_curve():
    # γ → 1: K = 1 almost surely, E[K] → 1; the bound tends to the base curve
    # plus the smallest auxiliary term the grid allows, (1+η)(1 − 1/λ̂)ε(λ̂) at λ̂ = 1.1.
    base = M.SubsampledGaussian(1.0, 0.01, 1000)
    b = base.rdp(ORDERS)
    t = M.RepeatAndSelect(base, TruncatedNegativeBinomial(1.0, gamma=1 - 1e-12)).rdp(ORDERS)
    aux = 2 * np.min((1 - 1 / ORDERS) * b)
    np.testing.assert_allclose(t, np.minimum.accumulate((b + aux)[::-1])[::-1], rtol=1e-6)
    assert np.all(t >= b)


def test_more_runs_cost_more():
    base = M.SubsampledGaussian(1.0, 0.01, 1000)
    eps = [RDPCurve(ORDERS, M.RepeatAndSelect(base, Poisson(m)).rdp(ORDERS)).epsilon(1e-5)
           for m in (2.0, 10.0, 50.0)]
    assert eps[0] < eps[1] < eps[2]


def test_serialisation_round_trip():
    t = M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, 10), Logarithmic(mean=7.0))
    assert mechanism_from_dict(t.to_dict()) == t


# --- the tuner ------------------------------------------------------------
STEP = M.SubsampledGaussian(1.0, 0.01)
RUN = M.SubsampledGaussian(1.0, 0.01, steps=100)


def test_charged_once_before_any_candidate_runs():
    # the ledger refuses reads while the candidates run (review at): its charge events count
    charges = []
    ledger = Ledger(epsilon=20.0, delta=1e-5,
                    listeners=[lambda e: charges.append(e) if e.kind == "charge" else None])
    seen = []

    def objective(params, child):
        seen.append((len(charges), params["lr"]))  # the bound is already charged
        for _ in range(100):
            child.charge(STEP)
        return params["lr"]

    tuner = RandomSearch({"lr": [0.1, 0.2, 0.3]}, Poisson(4.0), cost=RUN, seed=1, progress=False)
    result = tuner.run(objective, ledger)
    assert len(ledger.history) == 1 and seen and all(n == 1 for n, _ in seen)
    assert isinstance(ledger.history[0].mechanism, M.RepeatAndSelect)
    assert result.score == max(lr for _, lr in seen) == result.params["lr"]
    np.testing.assert_array_equal(ledger.spent, tuner.cost(ledger.orders).rdp(ledger.orders))


def test_refused_bound_runs_nothing():
    ledger = Ledger(epsilon=0.5, delta=1e-5)
    ran = []
    tuner = RandomSearch({"lr": [0.1]}, Poisson(10.0), cost=RUN, progress=False)
    with pytest.raises(BudgetExhausted):
        tuner.run(lambda p, c: ran.append(1) or 0.0, ledger)
    assert ran == [] and ledger.history == ()


def test_candidate_that_overspends_is_stopped_by_its_child():
    ledger = Ledger(epsilon=20.0, delta=1e-5)
    exact = []

    def objective(params, child):
        n = 100 if params["greedy"] == "no" else 101  # greedy tries one step too many
        for _ in range(n):
            child.charge(STEP)
        exact.append(params["greedy"])
        return 1.0

    tuner = RandomSearch({"greedy": ["no", "yes"]}, Poisson(20.0), cost=RUN, seed=3,
                         progress=False)
    result = tuner.run(objective, ledger)
    assert set(exact) == {"no"}  # every greedy candidate was refused: ⊥, never selected
    assert result.params == {"greedy": "no"} and result.score == 1.0


def test_exact_declared_run_is_never_refused_by_rounding():
    parts = (M.SubsampledGaussian(1.1, 0.004, 777), M.Gaussian(7.0), M.Laplace(30.0))
    declared = M.Composed(parts)
    ledger = Ledger(epsilon=50.0, delta=1e-5)

    calls, finished = [], []

    def objective(params, child):
        calls.append(1)
        for _ in range(777):
            child.charge(M.SubsampledGaussian(1.1, 0.004))
        child.charge(M.Laplace(30.0))  # a different order than declared
        child.charge(M.Gaussian(7.0))
        finished.append(1)
        return 1.0

    result = RandomSearch({"x": [1]}, Poisson(3.0), cost=declared, seed=0,
                          progress=False).run(objective, ledger)
    assert result.selected and len(calls) == len(finished) > 0


def test_poisson_zero_runs_returns_no_selection():
    tuner = RandomSearch({"x": [1]}, Poisson(1e-9), cost=RUN, seed=0, progress=False)
    result = tuner.run(lambda p, c: 1.0, Ledger(epsilon=20.0, delta=1e-5))
    assert not result.selected and result.params is None and result.score is None
    assert "no candidate selected" in repr(result)


def test_non_selected_scores_never_leak(caplog, capsys):
    # distinctive values: none is a prefix or substring of another's printout
    scores = {0.01: 0.4127391, 0.02: 0.5238462, 0.05: 0.6349573, 0.1: 0.7451684, 0.2: 0.8562795}

    def objective(params, child):
        for _ in range(100):
            child.charge(STEP)
        return scores[params["lr"]], f"model-{params['lr']}"

    out, err = io.StringIO(), io.StringIO()
    caplog.set_level(logging.DEBUG)
    with redirect_stdout(out), redirect_stderr(err):
        result = RandomSearch({"lr": list(scores)}, Poisson(12.0), cost=RUN, seed=5,
                              progress=True).run(objective, Ledger(epsilon=50.0, delta=1e-5))
    captured = out.getvalue() + err.getvalue() + caplog.text + "".join(capsys.readouterr())
    best = max(scores.values())
    assert result.score == best and result.artifact == f"model-{result.params['lr']}"
    for lr, s in scores.items():
        for text in (f"{s}", f"{s:.4f}", f"{s:.6f}"):
            if s != best:
                assert text not in captured and text not in repr(result)
        if lr != result.params["lr"]:
            assert f"model-{lr}" not in captured + repr(result)
    assert set(vars(result)) == {"selected", "params", "score", "artifact", "cost", "seeded"}


def test_cost_function_needs_a_finite_space():
    from privguard.tuning import LogUniform

    with pytest.raises(InvalidArgumentError, match="finite"):
        RandomSearch({"lr": LogUniform(1e-3, 1.0)}, Poisson(5.0), cost=lambda p: RUN)


def test_uniform_bound_is_the_maximum_over_candidates():
    cost = lambda p: M.SubsampledGaussian(p["sigma"], 0.01, 100)
    tuner = RandomSearch({"sigma": [0.8, 1.0, 1.5]}, Poisson(5.0), cost=cost, progress=False)
    worst = M.SubsampledGaussian(0.8, 0.01, 100).rdp(ORDERS) * (1 + SLACK)
    expected = M.RepeatAndSelect(RDPCurve(ORDERS, worst), Poisson(5.0)).rdp(ORDERS)
    np.testing.assert_array_equal(tuner.cost(ORDERS).rdp(ORDERS), expected)
    plan = tuner.plan(1e-5)
    assert plan.epsilon < plan.naive_epsilon


# --- distributions ----------------------------------------------------------
@pytest.mark.parametrize("runs", [Poisson(7.0), TruncatedNegativeBinomial(1.0, mean=8.0),
                                  Logarithmic(mean=8.0), TruncatedNegativeBinomial(-0.5, gamma=0.02),
                                  TruncatedNegativeBinomial(2.0, mean=5.0)], ids=repr)
def test_samplers_match_their_pmf_and_mean(runs):
    rng = np.random.default_rng(12345)
    draws = np.array([runs.sample(rng) for _ in range(40_000)])
    assert abs(draws.mean() - runs.mean) < 5 * draws.std() / math.sqrt(draws.size)
    ks = np.arange(0, 12)
    observed = np.array([(draws == k).sum() for k in ks] + [(draws >= 12).sum()])
    probs = np.array([runs.pmf(int(k)) for k in ks])
    probs = np.append(probs, 1 - probs.sum())
    keep = probs * draws.size >= 5
    chi2 = stats.chisquare(observed[keep], probs[keep] / probs[keep].sum() * observed[keep].sum())
    assert chi2.pvalue > 1e-3
    assert sum(runs.pmf(k) for k in range(0, 20_000)) == pytest.approx(1.0, abs=1e-9)


def test_distribution_parameters_are_checked():
    with pytest.raises(InvalidArgumentError, match="eta"):
        TruncatedNegativeBinomial(-1.0, gamma=0.1)
    with pytest.raises(InvalidArgumentError, match="gamma"):
        TruncatedNegativeBinomial(1.0, gamma=1.0)
    with pytest.raises(InvalidArgumentError, match="mean"):
        TruncatedNegativeBinomial(1.0, mean=0.5)
    with pytest.raises(InvalidArgumentError, match="mean"):
        Poisson(0.0)


def test_utility_helpers():
    # Geometric with mean 10: P(top 10%) = 1 − PGF(0.9), closed form below.
    g = Geometric(mean=10.0)
    pgf = 0.1 * 0.9 / (1 - 0.9 * 0.9)
    assert prob_top(g, 0.1) == pytest.approx(1 - pgf)
    assert expected_quantile(Poisson(10.0)) == pytest.approx(
        sum(Poisson(10.0).pmf(k) * k / (k + 1) for k in range(200)), rel=1e-8)


# --- calibration ------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.floats(1e-3, 0.2), st.integers(10, 5000), st.floats(0.5, 10.0))
def test_calibration_never_overshoots_and_is_tight(q, steps, eps):
    sigma = calibrate_noise_multiplier(q, steps, eps, 1e-5)
    got = RDPCurve(ORDERS, M.SubsampledGaussian(sigma, q, steps).rdp(ORDERS)).epsilon(1e-5)
    assert got <= eps
    if sigma > 1e-3 * 1.01:  # not at the floor of the search
        lower = RDPCurve(ORDERS, M.SubsampledGaussian(sigma * (1 - 2e-4), q, steps)
                         .rdp(ORDERS)).epsilon(1e-5)
        assert lower > eps  # a slightly smaller σ would overshoot: tight to 2e-4


def test_calibration_to_an_rdp_line_and_for_the_whole_tuning():
    s = calibrate_noise_multiplier(0.01, 1000, rdp_slope=0.05)
    assert np.all(M.SubsampledGaussian(s, 0.01, 1000).rdp(ORDERS) <= 0.05 * ORDERS)
    s2 = calibrate_tuning_noise(0.01, 1000, Poisson(10.0), 4.0, 1e-5)
    total = M.RepeatAndSelect(M.SubsampledGaussian(s2, 0.01, 1000), Poisson(10.0))
    assert RDPCurve(ORDERS, total.rdp(ORDERS)).epsilon(1e-5) <= 4.0
    cost = dpsgd_cost(2.0, 1e-5)
    for q, t in [(0.01, 500), (0.05, 100)]:
        m = cost({"sample_rate": q, "steps": t})
        assert RDPCurve(ORDERS, m.rdp(ORDERS)).epsilon(1e-5) <= 2.0
