"""Subset tuning: Theorem 6 and Theorem 4 against slow references, limits, plan, extrapolation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _slow_subset import eps1, eps2, zhu_wang

from privguard import DEFAULT_ORDERS, BudgetExhausted, InvalidArgumentError, Ledger, RDPCurve
from privguard import mechanisms as M
from privguard._mechanisms._subset import koskela_kulkarni_variant1, zhu_wang_subsampled
from privguard.tuning import Poisson, RandomSearch, SubsetSearch, paper_extrapolation

ORDERS = np.array(DEFAULT_ORDERS)
RUN = M.SubsampledGaussian(1.5, 0.02, steps=300)
TUNE = M.RepeatAndSelect(RUN, Poisson(15.0))


def integer_curve(mech, n):
    ints = np.arange(2, n + 1, dtype=float)
    return np.concatenate([[0.0, 0.0], mech.rdp(ints)])


@pytest.mark.parametrize("q", [0.01, 0.1, 0.37, 0.9])
def test_theorem_6_against_a_slow_reference(q):
    n = 24
    et, eb = integer_curve(TUNE, n), integer_curve(RUN, n)
    ours = koskela_kulkarni_variant1(et, eb, q)
    for a in (2, 3, 7, 16, 24):
        ref = max(eps1(a, q, lambda k: et[k], lambda k: eb[k]),
                  eps2(a, q, lambda k: et[k], lambda k: eb[k]))
        assert ours[a] == pytest.approx(ref, rel=1e-10)


def test_both_terms_are_needed():
    # A case where ε₂ > ε₁: ε₁ alone would under-report.
    et, eb = (lambda a: 0.3 * a), (lambda a: 0.01 * a)
    a, q = 8, 0.2
    e1, e2 = eps1(a, q, et, eb), eps2(a, q, et, eb)
    assert e2 > e1
    ours = koskela_kulkarni_variant1(np.array([0.0, 0.0] + [et(k) for k in range(2, 9)]),
                                     np.array([0.0, 0.0] + [eb(k) for k in range(2, 9)]), q)
    assert ours[a] == pytest.approx(e2, rel=1e-12)


def test_remark_7_limits_q_to_0_and_1():
    n = 30
    et, eb = integer_curve(TUNE, n), integer_curve(RUN, n)
    # the limits up to the round-up of the evaluation (review al): never below, within 1e-11
    at1, at0 = koskela_kulkarni_variant1(et, eb, 1.0)[2:], koskela_kulkarni_variant1(et, eb, 0.0)[2:]
    assert np.all(at1 >= et[2:]) and np.all(at0 >= eb[2:])
    np.testing.assert_allclose(at1, et[2:], rtol=1e-11)
    np.testing.assert_allclose(at0, eb[2:], rtol=1e-11)
    near0 = koskela_kulkarni_variant1(et, eb, 1e-6)[2:]
    near1 = koskela_kulkarni_variant1(et, eb, 1 - 1e-6)[2:]
    assert np.allclose(near0, eb[2:], rtol=1e-3)
    assert np.allclose(near1, et[2:], rtol=1e-3)


@pytest.mark.parametrize("gamma", [0.001, 0.01, 0.1, 0.5])
def test_zhu_wang_against_slow_reference(gamma):
    n = 20
    e = integer_curve(M.Gaussian(2.0), n)
    ours = zhu_wang_subsampled(e, gamma)
    for a in (2, 3, 9, 20):
        assert ours[a] == pytest.approx(zhu_wang(a, gamma, lambda k: e[k]), rel=1e-10)


@pytest.mark.parametrize("sigma,gamma", [(1.0, 0.01), (2.0, 0.1), (0.8, 0.05), (4.0, 0.5)])
def test_zhu_wang_upper_bounds_opacus_subsampled_gaussian_and_is_tight(sigma, gamma):
    n = 32
    zw = zhu_wang_subsampled(integer_curve(M.Gaussian(sigma), n), gamma)[2:]
    exact = M.SubsampledGaussian(sigma, gamma).rdp(np.arange(2, n + 1, dtype=float))
    assert np.all(zw >= exact * (1 - 1e-9))  # a valid upper bound
    # tight within the known factor: for a Gaussian, the general bound's j >= 3 terms are
    # exactly 3× the exact expansion's, so (α−1)(ε_ZW − ε_exact) <= log 3
    alphas = np.arange(2, n + 1)
    assert np.all((alphas - 1) * (zw - exact) <= math.log(3) + 1e-9)
    assert zw[0] == pytest.approx(exact[0], rel=1e-9)  # at α = 2 both are exact


def test_mechanism_extends_to_the_grid_by_monotonicity():
    plan = M.SubsetTuning(TUNE, RUN, q=0.1, variant=1)
    curve = plan.rdp(ORDERS)
    ints = plan.integer_curve(256)
    for a, v in zip(ORDERS, curve):
        k = max(2, math.ceil(a))
        assert v == (ints[k] if k <= 256 else math.inf)
    assert np.all(curve[1:] >= curve[:-1])
    assert M.mechanism_from_dict(plan.to_dict()) == plan


def test_variant_1_is_tighter_than_variant_2_here_and_both_beat_the_baseline():
    eps = {}
    for v in (1, 2):
        eps[v] = RDPCurve(ORDERS, M.SubsetTuning(TUNE, RUN, 0.1, v).rdp(ORDERS)).epsilon(1e-5)
    baseline = RDPCurve(ORDERS, TUNE.rdp(ORDERS)).epsilon(1e-5)
    assert eps[1] < eps[2] < baseline


def counting_search(variant, seed):
    tuner = RandomSearch({"lr": [0.1, 0.2]}, Poisson(15.0), cost=RUN, seed=seed, progress=False)
    return SubsetSearch(tuner, q=0.1, final_cost=RUN, variant=variant, seed=seed)


@pytest.mark.parametrize("variant", [1, 2])
def test_gradient_evaluations_match_section_3_4(variant):
    n, epochs, mu, q = 2000, 3, 15.0, 0.1
    totals = []
    for seed in range(300):
        count = [0]

        def tune(params, child, idx):
            count[0] += epochs * len(idx)
            return params["lr"]

        def final(params, child, idx, tuned):
            count[0] += epochs * len(idx)

        counting_search(variant, seed).run(tune, final, Ledger(epsilon=50.0, delta=1e-5), n)
        totals.append(count[0])
    expected = epochs * (mu * q * n + ((1 - q) * n if variant == 1 else n))
    se = np.std(totals) / math.sqrt(len(totals))
    assert abs(np.mean(totals) - expected) < 4 * se
    baseline = epochs * mu * n
    assert baseline / expected > 3  # the savings §3.4 promises (≈ μ/(μq+1) ≈ 6 for variant 2)


def test_plan_charged_once_before_anything_and_extrapolation_applied():
    # the ledger refuses reads while the candidates run (review at): its charge events count
    charges = []
    ledger = Ledger(epsilon=50.0, delta=1e-5,
                    listeners=[lambda e: charges.append(e) if e.kind == "charge" else None])
    seen, finals = [], []
    search = counting_search(1, seed=3)

    def tune(params, child, idx):
        seen.append(len(charges))
        for _ in range(300):
            child.charge(M.SubsampledGaussian(1.5, 0.02))
        return params["lr"]

    def final(params, child, idx, tuned):
        finals.append(params)
        for _ in range(300):
            child.charge(M.SubsampledGaussian(1.5, 0.02))
        return "model"

    result = search.run(tune, final, ledger, 1000)
    assert len(ledger.history) == 1 and isinstance(ledger.history[0].mechanism, M.SubsetTuning)
    assert all(n == 1 for n in seen)
    assert result.params["lr"] == pytest.approx(result.tuned_params["lr"] * 0.9 / 0.1)
    assert finals == [result.params] and result.artifact == "model"


def test_refused_plan_runs_nothing():
    ran = []
    with pytest.raises(BudgetExhausted):
        counting_search(1, 0).run(lambda *a: ran.append(1), lambda *a: ran.append(1),
                                  Ledger(epsilon=0.1, delta=1e-5), 100)
    assert ran == []


def test_extrapolation_rules_and_bad_input():
    assert paper_extrapolation("sgd")({"lr": 0.1, "clip": 1.0}, 9.0) == {"lr": pytest.approx(0.9),
                                                                       "clip": 1.0}
    assert paper_extrapolation("adam")({"lr": 0.1}, 9.0) == {"lr": 0.1}
    with pytest.raises(InvalidArgumentError, match="q"):
        M.SubsetTuning(TUNE, RUN, q=1.5)
    with pytest.raises(InvalidArgumentError, match="variant"):
        M.SubsetTuning(TUNE, RUN, q=0.1, variant=3)
    with pytest.raises(InvalidArgumentError, match="q"):
        counting_search(1, 0).__class__(RandomSearch({"lr": [1]}, Poisson(2.0), cost=RUN), q=1.0,
                                        final_cost=RUN)


def test_failed_candidates_and_a_failed_final_training_are_bottom():
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    search = counting_search(1, seed=3)

    def tune(params, child, idx):
        if params["lr"] == 0.2:
            raise FloatingPointError("diverged")
        return 1.0, "tuned"

    def final(params, child, idx, tuned):
        raise MemoryError("out of memory in the final training")

    result = search.run(tune, final, ledger, 1000)
    assert result.selected and result.tuned_params == {"lr": 0.1}
    assert not result.trained and result.artifact is None
    assert len(ledger.history) == 1
    assert set(vars(result)) == {"selected", "params", "tuned_params", "artifact", "trained",
                                 "cost", "seeded"}
    ok = counting_search(1, seed=3).run(tune, lambda *a: "model", Ledger(50.0, 1e-5), 1000)
    assert ok.trained and ok.artifact == "model"


def test_no_selection_trains_nothing():
    finals = []
    result = counting_search(2, seed=0).run(lambda *a: math.nan, lambda *a: finals.append(1),
                                            Ledger(epsilon=50.0, delta=1e-5), 100)
    assert not result.selected and not result.trained and finals == []
