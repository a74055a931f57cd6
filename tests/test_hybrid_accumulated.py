"""The hybrid filter's envelope for accumulated steps (issue 27 item 5; docs/theory.md §2b.1).

* the one-step mixture PLD is pessimistic in both directions against the exact
  hockey-stick (a closed form up to one root, computed here in mpmath);
* T_A against the closed form at q₀ = 1 (the T-fold envelope is μ-GDP with
  μ = k₀√T/σ₀) and against dp-accounting's own accountant composing
  ``MixtureOfGaussiansDpEvent`` T times;
* T_A is non-decreasing in σ₀; k₀ = 1 is today's envelope, bit for bit;
* inside/outside, a run on plan, a step off the envelope, serialisation.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import binom, norm
from test_hybrid_ledger import admitted

from privguard import (
    DEFAULT_ORDERS,
    Concentrated,
    InvalidArgumentError,
    Ledger,
    LedgerStateError,
    Plan,
)
from privguard import mechanisms as M
from privguard._accounting import _budget
from privguard._accounting import _hybrid as H
from privguard._accounting._hybrid import (
    Envelope,
    HybridFilter,
    certified_delta,
    envelope_of,
    envelope_steps,
    envelope_steps_in,
)

ORDERS = np.array(DEFAULT_ORDERS)
EPS, DELTA = 3.0, 1e-5
DELTA_A = H.DEFAULT_SHARE_A * DELTA
# One accumulated envelope shared by the tests below (its PLD is built once per process).
SIGMA, Q, K = 2.0, 0.125, 2  # T_A = 20 at (3, 0.99e-5)
STEP = M.AccumulatedSubsampledGaussian(SIGMA, Q, K, aligned=True)  # C3′ (§2b.1)
ENV = Envelope(SIGMA, Q, K)


def exact_one_step_delta(sigma: float, q: float, k: int, eps: float) -> float:
    """max over remove and add of the exact hockey-stick of P = Σ_j b_j N(j, σ²), Q = N(0, σ²).

    P/Q = f(x) = Σ_j b_j exp((j x − j²/2)/σ²) is increasing, so H_γ(P‖Q) =
    P(x > x₁) − γ Q(x > x₁) with f(x₁) = γ, and H_γ(Q‖P) = Q(x < x₂) − γ P(x < x₂)
    with f(x₂) = 1/γ (γ = e^ε). Independent of dp-accounting: mpmath, 30 digits.
    """
    mpmath.mp.dps = 30
    b = [mpmath.binomial(k, j) * mpmath.mpf(q) ** j * (1 - mpmath.mpf(q)) ** (k - j)
         for j in range(k + 1)]
    s2 = mpmath.mpf(sigma) ** 2

    def log_f(x):
        return mpmath.log(sum(b[j] * mpmath.exp((j * x - j * j / 2) / s2) for j in range(k + 1)))

    def cdf(x):
        return mpmath.ncdf(x / sigma)

    gamma = mpmath.exp(eps)
    out = []
    for target, remove in ((mpmath.mpf(eps), True), (-mpmath.mpf(eps), False)):
        if target <= mpmath.log(b[0]):  # f ≥ b_0 everywhere: the whole line
            out.append(1 - gamma if remove else mpmath.mpf(0))
            continue
        lo, hi = mpmath.mpf(-200) * sigma ** 2 - k, mpmath.mpf(200) * sigma ** 2 + k
        for _ in range(200):  # log f is increasing: bisection
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if log_f(mid) < target else (lo, mid)
        x = (lo + hi) / 2
        if remove:
            p = sum(b[j] * (1 - cdf(x - j)) for j in range(k + 1))
            out.append(p - gamma * (1 - cdf(x)))
        else:
            p = sum(b[j] * cdf(x - j) for j in range(k + 1))
            out.append(cdf(x) - gamma * p)
    return float(max(max(out), 0))


@pytest.fixture
def coarse(monkeypatch):
    """A coarser (still pessimistic) mixture grid, for tests about ordering, not tightness."""
    caches = (H._one_step_pld, H._envelope_steps, _budget._pld_epsilon)
    for c in caches:
        c.cache_clear()
    monkeypatch.setattr(H, "MIXTURE_POINTS", 800)
    yield
    for c in caches:
        c.cache_clear()


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.0, 3.5])
def test_one_step_mixture_pld_is_pessimistic_against_the_exact_hockey_stick(eps):
    pld = H._one_step_pld(ENV)
    exact = exact_one_step_delta(SIGMA, Q, K, eps)
    got = float(pld.get_delta_for_epsilon(eps))
    assert got >= exact * (1 - 1e-9) - 1e-15
    assert got <= exact * 1.02 + 1e-6  # and tight: within the grid's rounding
    # the early check T_A = 0 uses dp-accounting's continuous one-step value: the same
    assert H._one_step_delta(ENV, eps) == pytest.approx(exact, rel=1e-4, abs=1e-12)


def test_one_step_pessimism_at_small_q_and_many_micro_batches(coarse):
    # the regime where RDP fails (rare events: the example in all k micro-batches)
    for sigma, q, k in [(1.1, 256 / 60000, 4), (0.8, 0.002, 8)]:
        pld = H._one_step_pld(Envelope(sigma, q, k))
        for eps in (0.05, 1.0, 4.0):
            exact = exact_one_step_delta(sigma, q, k, eps)
            assert float(pld.get_delta_for_epsilon(eps)) >= exact * (1 - 1e-9) - 1e-15


@pytest.mark.parametrize("steps", [5, 40])
def test_composed_mixture_pld_is_pessimistic_against_the_gdp_closed_form(steps, coarse):
    # q₀ = 1: every micro-batch holds the example, the step is N(k₀, σ₀²) against
    # N(0, σ₀²), and T steps are μ-GDP with μ = k₀√T/σ₀ (Dong, Roth & Su 2022, Cor. 3.3)
    env = Envelope(20.0, 1.0, 3)
    mu = 3 * math.sqrt(steps) / 20.0
    for eps in (0.5, 2.0, 4.0):
        closed = float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))
        got = certified_delta(env, eps, steps)
        assert closed <= got <= closed * 1.02 + 1e-12


def test_T_A_at_q_one_is_the_gdp_count(coarse):
    env = Envelope(20.0, 1.0, 3)
    t_a = envelope_steps(env, 2.0, 1e-3)
    target = 1e-3 * (1 - H.MARGIN)

    def closed(t):
        mu = 3 * math.sqrt(t) / 20.0
        return float(norm.cdf(-2.0 / mu + mu / 2) - math.exp(2.0) * norm.cdf(-2.0 / mu - mu / 2))

    best = max(t for t in range(1, 2000) if closed(t) <= target)
    assert best * 0.95 <= t_a <= best  # never above the exact count, and close to it


def test_T_A_against_dp_accountings_accountant_composed_directly():
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    t_a = envelope_steps(ENV, EPS, DELTA_A)
    assert t_a > 0
    event = dp_event.MixtureOfGaussiansDpEvent(SIGMA, list(range(K + 1)),
                                               binom.pmf(np.arange(K + 1), K, Q).tolist())

    def accountant_delta(t):
        acc = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=H.mixture_interval(ENV))
        acc.compose(event, t)
        return acc.get_delta(EPS)

    target = DELTA_A * (1 - H.MARGIN)
    assert accountant_delta(t_a) <= target * (1 + 1e-6)
    assert accountant_delta(t_a + 1) > target * (1 - 1e-6)  # the largest such count


def test_T_A_is_non_decreasing_in_sigma(coarse):
    counts = [envelope_steps(Envelope(s, 0.05, 3), EPS, DELTA_A) for s in (1.5, 2.0, 2.5, 3.0)]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert counts[0] > 0


def test_k_one_is_todays_envelope_bit_for_bit():
    plain = M.SubsampledGaussian(1.0, 0.01)
    one = M.AccumulatedSubsampledGaussian(1.0, 0.01, 1)
    assert envelope_of(one) == envelope_of(plain) == Envelope(1.0, 0.01)
    assert Envelope(1.0, 0.01, 1).to_dict() == {"noise_multiplier": 1.0, "sample_rate": 0.01}
    assert repr(Envelope(1.0, 0.01, 1)) == "Envelope(noise_multiplier=1.0, sample_rate=0.01)"
    a = HybridFilter(EPS, DELTA, envelope_of(one), ORDERS, Concentrated())
    b = HybridFilter(EPS, DELTA, envelope_of(plain), ORDERS, Concentrated())
    assert a.steps_a == b.steps_a == 2662  # docs/theory.md §2b, "Numbers"
    assert a.config() == b.config()
    # an accumulated k = 1 charge is the subsampled Gaussian: inside as it is
    assert envelope_steps_in(M.AccumulatedSubsampledGaussian(1.2, 0.005, 1, steps=3),
                             Envelope(1.0, 0.01)) == 3


def test_inside_and_outside_an_accumulated_envelope():
    env = Envelope(1.0, 0.125, 2)
    inside = [M.AccumulatedSubsampledGaussian(1.0, 0.125, 2, aligned=True),  # the envelope step
              M.AccumulatedSubsampledGaussian(3.0, 0.125, 2, steps=4, aligned=True)]
    assert [envelope_steps_in(m, env) for m in inside] == [1, 4]
    outside = [M.AccumulatedSubsampledGaussian(1.0, 0.125, 2),    # may be non-aligned: §14
               M.AccumulatedSubsampledGaussian(0.99, 0.125, 2, aligned=True),   # less noise
               M.AccumulatedSubsampledGaussian(1.0, 0.25, 2),     # more sampling
               M.AccumulatedSubsampledGaussian(1.0, 0.0625, 2),   # less sampling: not proved
               M.AccumulatedSubsampledGaussian(1.0, 0.125, 3),    # more micro-batches
               M.AccumulatedSubsampledGaussian(1.0, 0.125, 1),    # fewer: not proved
               M.SubsampledGaussian(1.0, 0.125), M.Gaussian(5.0), M.Laplace(1.0)]
    assert [envelope_steps_in(m, env) for m in outside] == [None] * len(outside)
    # a k₀ = 1 envelope does not hold accumulated steps with k ≥ 2 either
    assert envelope_steps_in(M.AccumulatedSubsampledGaussian(2.0, 0.01, 2),
                             Envelope(1.0, 0.125)) is None


def test_an_accumulated_plan_runs_T_A_steps_in_part_A():
    hybrid = Ledger(EPS, DELTA, plan=Plan(STEP, 100), filter="hybrid")
    flt = hybrid._acc.filter
    assert flt.kind == "hybrid" and flt.envelope == ENV
    t_a = flt.steps_a
    assert t_a == envelope_steps(ENV, EPS, flt.delta_a)
    n = admitted(hybrid, STEP)
    assert n == t_a and flt.a_count == t_a and flt.a_alive  # all in A, none past it
    rdp = Ledger(EPS, DELTA, plan=Plan(STEP, 100))
    assert admitted(rdp, STEP) < n  # the RDP filter at the full δ admits fewer


def test_a_step_off_the_envelope_closes_part_A():
    ledger = Ledger(EPS, DELTA, plan=Plan(STEP, 100), filter="hybrid")
    flt = ledger._acc.filter
    for _ in range(3):
        ledger.charge(STEP)
    ledger.charge(M.AccumulatedSubsampledGaussian(2.5, 0.125, 2, aligned=True))  # inside
    assert flt.a_count == 4 and flt.a_alive
    with pytest.warns(UserWarning, match="left the plan"):
        ledger.charge(M.AccumulatedSubsampledGaussian(4.0, 0.0625, 2))  # another q: outside
    assert not flt.a_alive
    before = flt.a_count
    ledger.charge(STEP)  # from now on only B decides, and A never counts again
    assert flt.a_count == before and not flt.a_alive


def test_envelope_dicts_round_trip_and_old_ones_load():
    for env in (Envelope(1.0, 0.01), Envelope(1.5, 0.125, 2), Envelope(0.7, 1.0, 32)):
        assert Envelope.from_dict(env.to_dict()) == env
    old = {"noise_multiplier": 1.1, "sample_rate": 0.004}  # written before this change
    assert Envelope.from_dict(old) == Envelope(1.1, 0.004, 1)
    for bad in ({**old, "micro_batches": 1}, {**old, "micro_batches": 0},
                {**old, "micro_batches": 33}, {**old, "micro_batches": 2.5},
                {**old, "micro_batches": True}, {**old, "extra": 2}):
        with pytest.raises(InvalidArgumentError):
            Envelope.from_dict(bad)


def test_an_accumulated_hybrid_state_round_trips(tmp_path):
    f = HybridFilter(EPS, DELTA, ENV, ORDERS, Concentrated())
    f.fix(STEP._rdp_checked(ORDERS))
    again = HybridFilter.from_config(f.config(), ORDERS)
    assert again.envelope == ENV and again.steps_a == f.steps_a
    assert f.config()["envelope"]["micro_batches"] == K
    forged = f.config()
    forged["envelope"] = {**forged["envelope"], "micro_batches": 3}  # T_A not certified for it
    with pytest.raises(LedgerStateError):
        HybridFilter.from_config(forged, ORDERS)
    ledger = Ledger(EPS, DELTA, plan=Plan(STEP, 100), filter="hybrid", path=tmp_path / "a.db",
                    lease=1)
    for _ in range(5):
        ledger.charge(STEP)
    ledger.close()
    opened = Ledger.open(tmp_path / "a.db")
    assert opened._acc.filter.envelope == ENV
    assert opened._acc.filter.a_count == 5 and opened._acc.filter.a_alive
    copy = Ledger.load_state_dict(opened.state_dict())
    assert copy._acc.filter.a_count == 5 and copy._acc.filter.envelope == ENV


def test_an_envelope_beyond_32_micro_batches_is_refused_by_name():
    with pytest.raises(InvalidArgumentError, match="micro_batches"):
        Envelope(1.0, 0.01, 33)
    big = M.AccumulatedSubsampledGaussian(50.0, 0.01, 64)
    with pytest.raises(InvalidArgumentError, match="at most 32 micro-batches"):
        Ledger(EPS, DELTA, plan=big, filter="hybrid")
    assert envelope_of(big) is None
    # no plan declared: the first charge fixes it, and without an envelope the ledger is
    # the RDP filter at the full δ (docs/theory.md §2b), as for any step without one
    ledger = Ledger(EPS, DELTA, filter="hybrid")
    ledger.charge(big)
    assert ledger._acc.filter.kind == "dp"


MC_SIGMA, MC_Q, MC_EPS, MC_DELTA_A = 2.0, 0.125, 1.0, 0.99 * 0.02  # T_A = 18


def _mc_statistic(steps, sigmas, remove, n=100_000, seed=0):
    """E[(1 − e^(ε−L))₊] over n exact runs of ``steps`` envelope-or-inside steps: the
    hockey-stick H_{e^ε} of the realised interaction (docs/theory.md §2b, Monte-Carlo).

    L sums the exact one-step losses log(P_σ/Q_σ) (remove: x ~ P_σ; add: −log, x ~ Q_σ)
    of the mixture pair at the σ the adversary picks; ``sigmas(L)`` picks it per run from
    the loss so far (adaptive noise inside the envelope), and returns σ ≥ σ₀.
    """
    rng = np.random.default_rng(seed)
    j = np.arange(K + 1)
    log_b = np.log(binom.pmf(j, K, MC_Q))
    loss = np.zeros(n)
    for _ in range(steps):
        s = sigmas(loss)
        x = rng.normal(0.0, s, n) + (rng.binomial(K, MC_Q, n) if remove else 0.0)
        terms = log_b[None, :] + (j[None, :] * x[:, None] - j[None, :] ** 2 / 2) / s[:, None] ** 2
        one = np.logaddexp.reduce(terms, axis=1)
        loss += one if remove else -one
    v = np.maximum(0.0, 1.0 - np.exp(MC_EPS - loss))
    return float(v.mean()), float(v.std() / math.sqrt(n))


def test_monte_carlo_T_A_holds_against_adaptive_noise_and_fails_when_inflated():
    t_a = envelope_steps(Envelope(MC_SIGMA, MC_Q, K), MC_EPS, MC_DELTA_A)
    assert 10 <= t_a <= 40

    def plan(loss):
        return np.full(loss.shape, MC_SIGMA)

    def lucky_then_quiet(loss):  # more noise once the loss so far is high (inside: σ ≥ σ₀)
        return np.where(loss > 0.5, 1.5 * MC_SIGMA, MC_SIGMA)

    for sigmas, remove in ((plan, True), (plan, False), (lucky_then_quiet, True)):
        value, se = _mc_statistic(t_a, sigmas, remove, seed=1)
        assert value <= MC_DELTA_A + 4 * se
    # power: 15% more envelope steps than certified exceed δ_A clearly
    value, se = _mc_statistic(math.ceil(1.15 * t_a), plan, True, seed=2)
    assert value - 4 * se > 1.05 * MC_DELTA_A
