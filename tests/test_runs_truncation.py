"""The random-K sampler draws min(K, MAX_RUNS): a tuner whose TruncatedNegativeBinomial has a
tail beyond MAX_RUNS above the uniform's resolution is refused before it charges (the bound
charged is D_{η,γ}'s, the candidates run would follow another law). The law itself stays a
valid description for accounting (a journal may hold one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard._mechanisms._runs import MAX_RUNS, MAX_TAIL, _solve_gamma, _tail_beyond
from privguard.tuning import DPHyPOSearch, RandomSearch, TruncatedNegativeBinomial

TRUNCATED = [
    (3.0, {"gamma": 1e-102}),   # E[K] = 3e102: every draw ran exactly 10^7 candidates
    (1.0, {"gamma": 1e-8}),     # geometric, P[K > 10^7] = 0.905
    (-0.5, {"mean": 1000.0}),   # P[K > 10^7] ≈ 2e-6 (heavy tail)
    (-0.9, {"mean": 5.0}),      # P[K > 10^7] ≈ 2e-8
]


@pytest.mark.parametrize("eta,kw", TRUNCATED)
def test_a_law_the_sampler_would_truncate_is_refused(eta, kw):
    runs = TruncatedNegativeBinomial(eta, **kw)  # a valid description
    with pytest.raises(InvalidArgumentError) as info:
        runs.check_sampleable()
    assert info.value.argument == "runs" and f"P[K > {MAX_RUNS}]" in str(info.value)


@pytest.mark.parametrize("eta,kw", TRUNCATED)
@pytest.mark.parametrize("tuner", ["random", "dp_hypo"])
def test_a_tuner_refuses_it_before_it_charges_or_runs(eta, kw, tuner):
    runs = TruncatedNegativeBinomial(eta, **kw)
    make = RandomSearch if tuner == "random" else DPHyPOSearch
    search = make({"x": [1, 2]}, runs, cost=M.Gaussian(1e6), progress=False, seed=0)
    ran = []
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError) as info:
        search.run(lambda params, child: ran.append(params) or 0.0, ledger)
    assert info.value.argument == "runs" and ledger.history == () and ran == []


@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("mean", [2.0, 10.0, 100.0, 300.0])
def test_the_usual_laws_are_accepted(eta, mean):
    assert TruncatedNegativeBinomial(eta, mean=mean).mean == pytest.approx(mean, rel=1e-6)


@pytest.mark.parametrize("gamma", [1e-6, 3e-7, 1e-7])
def test_the_bound_is_the_exact_tail_for_the_geometric(gamma):
    # η = 1: pmf(k) = γ(1−γ)^(k−1), P[K > N] = (1−γ)^N exactly
    exact = math.exp(MAX_RUNS * math.log1p(-gamma))
    pmf_next = gamma * math.exp(MAX_RUNS * math.log1p(-gamma))
    bound = _tail_beyond(1.0, gamma, pmf_next)
    assert exact <= bound <= exact * (1 + 1e-5)


@pytest.mark.parametrize("eta,mean", [(-0.9, 5.0), (-0.9, 3.0), (-0.5, 1000.0), (0.0, 1e5),
                                      (2.5, 2e6)])
def test_the_bound_is_above_the_summed_tail(eta, mean):
    # a partial sum of the tail (2·10^8 terms past N) is a lower bound of it
    g = _solve_gamma(eta, mean)
    k = np.arange(MAX_RUNS + 1, MAX_RUNS + 1 + 2 * 10**7, dtype=np.float64)
    norm = abs(math.expm1(-eta * math.log(g))) if eta else math.log(1 / g)
    if eta:
        logp = k * np.log1p(-g) + gammaln(k + eta) - math.lgamma(eta) - gammaln(k + 1)
    else:
        logp = k * np.log1p(-g) - np.log(k)
    tail = np.exp(logp).sum() / norm
    assert tail <= _tail_beyond(eta, g, float(np.exp(logp[0]) / norm))


def test_an_accepted_law_truncates_below_the_uniforms_resolution():
    d = TruncatedNegativeBinomial(-0.9, mean=3.0)
    assert _tail_beyond(d.eta, d.gamma, d.pmf(MAX_RUNS + 1)) <= MAX_TAIL
