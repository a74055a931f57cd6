"""Review tb: the tuners' bounds against the exact law of what a tuner releases.

For a base mechanism with finitely many ordered outputs, laws p (input D) and q (D'),
the best of K independent runs has an exact law: P[best ≤ y] = f(F(y)), f the
generating function of K, and K = 0 (Poisson) releases ⊥ with probability f(0). Its
Rényi divergence is a finite sum, so the charged curve can be checked order by order
against the truth, with no Monte-Carlo error; and a known-wrong charge (the best of K
charged as one run) must fail the same check.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from privguard import RDPCurve
from privguard import mechanisms as M
from privguard._curves._orders import DEFAULT_ORDERS
from privguard.tuning import Geometric, Logarithmic, Poisson, TruncatedNegativeBinomial

ORDERS = np.array([a for a in DEFAULT_ORDERS if a <= 64])


def renyi(p: np.ndarray, q: np.ndarray, a: float) -> float:
    """D_a(p ‖ q) of two laws on the same finite outcomes (q > 0 wherever p > 0)."""
    m = p > 0
    return float(logsumexp(a * np.log(p[m]) + (1 - a) * np.log(q[m]))) / (a - 1)


def exact_curve(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The RDP curve of the pair on ORDERS, both directions."""
    return np.array([max(renyi(p, q, a), renyi(q, p, a)) for a in ORDERS])


def best_of(p: np.ndarray, runs) -> np.ndarray:
    """The law of the best of K ~ runs draws from p (outputs ordered by index), with ⊥
    (K = 0) as outcome 0."""
    cdf = np.minimum(np.cumsum(p), 1.0)
    f0 = runs.pgf(0.0)
    below = np.array([runs.pgf(float(x)) for x in cdf])
    return np.concatenate([[f0], np.diff(np.concatenate([[f0], below]))])


def base_curve(p: np.ndarray, q: np.ndarray) -> RDPCurve:
    """The base's exact curve, rounded up by a hair (a valid declared cost)."""
    return RDPCurve(ORDERS, np.maximum(exact_curve(p, q), 0.0) * (1 + 1e-9) + 1e-15)


def random_pairs(seed: int, count: int, spread: float):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        p = rng.dirichlet(np.full(int(rng.integers(2, 6)), 0.4))
        p = 0.99 * p + 0.01 / p.size  # every outcome >= 0.002: the laws' sums keep their digits
        q = p * np.exp(rng.uniform(-spread, spread, p.size))
        yield p, q / q.sum()


def test_poisson_with_mean_below_one_is_charged_what_it_releases():
    """Seed 002 Theorem 6 (ε + μδ̂ + log μ/(λ−1)) leaves out the outcome of K = 0. With
    μ = 0.5 the bound went to 0 while the released winner's divergence is 0.07."""
    p, q = np.array([0.9876, 0.0124]), np.array([0.9722, 0.0278])
    runs = Poisson(0.5)
    truth = exact_curve(best_of(p, runs), best_of(q, runs))
    charged = M.RepeatAndSelect(base_curve(p, q), runs).rdp(ORDERS)
    i = int(np.argmin(np.abs(ORDERS - 5.2)))
    assert truth[i] > 0.07
    assert np.all(truth <= charged + 1e-12), (ORDERS[np.argmax(truth - charged)],
                                              float(np.max(truth - charged)))


@pytest.mark.parametrize("runs", [Poisson(0.1), Poisson(0.5), Poisson(0.9), Poisson(1.0),
                                  Poisson(3.0), Poisson(30.0), Geometric(mean=10.0),
                                  Logarithmic(mean=10.0),
                                  TruncatedNegativeBinomial(-0.5, mean=10.0),
                                  TruncatedNegativeBinomial(2.0, mean=30.0)],
                         ids=repr)
def test_the_charged_curve_bounds_the_exact_release(runs):
    violations, wrong = [], 0.0
    for p, q in random_pairs(7, 25, 1.5):
        bc = base_curve(p, q)
        truth = exact_curve(best_of(p, runs), best_of(q, runs))
        charged = M.RepeatAndSelect(bc, runs).rdp(ORDERS)
        if np.any(truth > charged + 1e-12):
            violations.append(float(np.max(truth - charged)))
        wrong = max(wrong, float(np.max(truth - bc.rdp(ORDERS))))
    assert violations == []
    if runs.mean >= 3:  # the best of K charged as one run is caught by the same check
        assert wrong > 0.1


def test_the_charged_curve_bounds_the_exact_hockey_stick():
    """The guarantee in the form the ledger reports it: (ε, δ) from the charged curve,
    and the release's exact hockey-stick divergence at that ε is at most δ."""
    def hockey_stick(a: np.ndarray, b: np.ndarray, eps: float) -> float:
        return max(np.maximum(a - math.exp(eps) * b, 0).sum(),
                   np.maximum(b - math.exp(eps) * a, 0).sum())

    wrong = 0.0
    for runs in (Poisson(0.5), Poisson(5.0), Geometric(mean=20.0)):
        for p, q in random_pairs(3, 10, 2.0):
            a, b = best_of(p, runs), best_of(q, runs)
            bc = base_curve(p, q)
            eps = RDPCurve(ORDERS, M.RepeatAndSelect(bc, runs).rdp(ORDERS)).epsilon(1e-5)
            assert hockey_stick(a, b, eps) <= 1e-5
            wrong = max(wrong, hockey_stick(a, b, bc.epsilon(1e-5)))
    assert wrong > 1e-3  # the best of K charged as one run fails the same check


def test_dp_hypo_bounds_densities_that_differ_with_the_data():
    """Seed 003 Theorem 1 with the extreme case its proof allows: on D every run samples
    from one density in S_{C,c}, on D' from another (ratio up to C/c per candidate)."""
    C, c = 2.0, 0.75
    rng = np.random.default_rng(11)
    for _ in range(15):
        n = 3
        pairs = list(random_pairs(int(rng.integers(1 << 30)), n, 1.0))
        size = max(p.size for p, _ in pairs)
        ps = np.array([np.pad(p, (0, size - p.size)) for p, _ in pairs])
        qs = np.array([np.pad(q, (0, size - q.size)) for _, q in pairs])
        pi = np.array([C, c, (3 - C - c)]) / 3      # within [c, C] × uniform, sums to 1
        pi2 = np.array([c, C, (3 - C - c)]) / 3
        # the law of one run: candidate drawn from π, then its output
        base_d, base_d2 = pi @ ps, pi2 @ qs
        worst = np.max([exact_curve(ps[i][ps[i] > 0], qs[i][ps[i] > 0]) for i in range(n)],
                       axis=0)
        bound = RDPCurve(ORDERS, worst * (1 + 1e-9) + 1e-15)
        for runs in (Geometric(mean=10.0), Logarithmic(mean=5.0)):
            keep = (base_d > 0) | (base_d2 > 0)
            truth = exact_curve(best_of(base_d[keep], runs), best_of(base_d2[keep], runs))
            charged = M.DPHyPO(bound, runs, C=C, c=c).rdp(ORDERS)
            assert np.all(truth <= charged + 1e-12)


def adaptive_law(bases: np.ndarray, owner: np.ndarray, rule: np.ndarray, runs,
                 tmax: int = 400) -> np.ndarray:
    """The exact law of DP-HyPO's winner for a rule that sees the history through the
    best run so far.

    ``bases[i]`` is candidate i's law over the global output levels (ordered, each
    level owned by one candidate, so there are no ties); ``rule[s]`` the sampling density
    over the candidates when the best level so far is s (s = 0: no run yet; s = ℓ + 1:
    level ℓ). The state after t runs is the best level; the winner is the state at T.
    """
    levels = bases.shape[1]
    step = np.zeros((levels + 1, levels + 1))  # state -> state after one more run
    for s in range(levels + 1):
        mix = rule[s] @ bases  # the law of one run's level under the density at s
        for lvl in range(levels):
            step[s, max(s, lvl + 1)] += mix[lvl]
    state = np.zeros(levels + 1)
    state[0] = 1.0
    out = np.zeros(levels + 1)
    for t in range(1, tmax):
        state = state @ step
        out += runs.pmf(t) * state
    return out[1:]


def test_dp_hypo_bounds_an_adaptive_rule_exactly():
    """Seed 003 Theorem 1 against the exact law of an adaptive run: two candidates, the
    density pushed to the edge of S_{C,c} towards whichever candidate holds the best run
    (a rule of the history only, the same on D and D')."""
    C, c = 2.0, 0.75
    lo, hi = 0.375, 0.625  # the extremes of S_{C,c} around the uniform prior on 2 candidates
    rng = np.random.default_rng(5)
    worst_wrong = 0.0
    for _ in range(12):
        pairs = list(random_pairs(int(rng.integers(1 << 30)), 2, 1.5))
        levels = sum(p.size for p, _ in pairs)
        owner = np.concatenate([np.full(p.size, i) for i, (p, _) in enumerate(pairs)])
        order = rng.permutation(levels)  # interleave the candidates' levels
        owner = owner[order]
        ps, qs = np.zeros((2, levels)), np.zeros((2, levels))
        for i, (p, q) in enumerate(pairs):
            where = np.flatnonzero(owner == i)
            ps[i, where], qs[i, where] = p, q
        rule = np.array([[0.5, 0.5]] + [[hi, lo] if owner[s] == 0 else [lo, hi]
                                        for s in range(levels)])
        worst = np.max([exact_curve(p, q) for p, q in pairs], axis=0)
        bound = RDPCurve(ORDERS, worst * (1 + 1e-9) + 1e-15)
        for runs in (Geometric(mean=5.0), Logarithmic(mean=5.0)):
            a, b = adaptive_law(ps, owner, rule, runs), adaptive_law(qs, owner, rule, runs)
            assert abs(a.sum() - 1) < 1e-9 and abs(b.sum() - 1) < 1e-9
            truth = exact_curve(a, b)
            assert np.all(truth <= M.DPHyPO(bound, runs, C=C, c=c).rdp(ORDERS) + 1e-12)
            worst_wrong = max(worst_wrong, float(np.max(truth - bound.rdp(ORDERS))))
    assert worst_wrong > 0.05  # charging the adaptive best-of-T as one run fails


@pytest.mark.parametrize("variant", [1, 2])
def test_subset_tuning_bounds_the_exact_release(variant):
    """Seed 000: the differing record joins the tuning set X₁ with probability q. Tuning
    releases T₁ (record in X₁) or T₀; the final training B₁ (record in its data) or B₀.
    Variant 1 (final on X ∖ X₁): with the record, q·T₁×B₀ + (1−q)·T₀×B₁; variant 2
    (final on X): q·T₁×B₁ + (1−q)·T₀×B₁; without it T₀×B₀ — exact laws of the pair."""
    worst_wrong = 0.0
    for seed in range(8):
        (t1, t0), (b1, b0) = random_pairs(100 + seed, 2, 1.5)
        for q in (0.05, 0.3, 0.7):
            other = b0 if variant == 1 else b1
            with_record = q * np.outer(t1, other) + (1 - q) * np.outer(t0, b1)
            without = np.outer(t0, b0)
            truth = exact_curve(with_record.ravel(), without.ravel())
            plan = M.SubsetTuning(base_curve(t1, t0), base_curve(b1, b0), q=q, variant=variant)
            charged = plan.rdp(ORDERS)
            assert np.all(truth <= charged + 1e-12)
            # the final training alone (the tuning forgotten) is a known-wrong charge
            worst_wrong = max(worst_wrong, float(np.max(truth - base_curve(b1, b0).rdp(ORDERS))))
    assert worst_wrong > 0.01


def above_threshold_law(u: np.ndarray, thr_scale: float, cand_scale: float,
                        level: float) -> np.ndarray:
    """The law of one propose-test round's output (the first candidate whose noisy utility
    reaches the noisy threshold, or none as the last outcome), by numerical integration
    over the threshold's Laplace noise."""
    from scipy import stats

    t = level + np.linspace(-50, 50, 60001) * thr_scale
    w = stats.laplace.pdf(t - level, scale=thr_scale)
    w /= w.sum()
    out, alive = [], np.ones_like(t)
    for ui in u:
        hit = stats.laplace.sf(t - ui, scale=cand_scale)
        out.append(float(np.sum(w * alive * hit)))
        alive = alive * (1 - hit)
    out.append(float(np.sum(w * alive)))
    return np.array(out)


def test_a_propose_test_round_is_epsilon0_dp():
    """Seed 004: each round is ε₀-DP for utilities of sensitivity 1/k, with the tuner's own
    noise scales; halving the candidates' noise (a known-wrong scale) is caught."""
    from privguard.tuning import ProposeTest

    tuner = ProposeTest([{"i": 0}, {"i": 1}, {"i": 2}], epsilon0=0.5, partitions=5,
                        progress=False)
    rng = np.random.default_rng(0)
    worst, wrong = 0.0, 0.0
    for _ in range(40):
        u = rng.uniform(0, 1, 3)
        u2 = np.clip(u + rng.choice([-1, 0, 1], 3) / tuner.k, 0, 1)
        level = float(rng.uniform(0, 1))
        for scale, sink in ((tuner.candidate_scale, "ok"), (tuner.candidate_scale / 2, "wrong")):
            a = above_threshold_law(u, tuner.threshold_scale, scale, level)
            b = above_threshold_law(u2, tuner.threshold_scale, scale, level)
            loss = float(np.max(np.abs(np.log(a / b))))
            if sink == "ok":
                worst = max(worst, loss)
            else:
                wrong = max(wrong, loss)
    assert worst <= tuner.epsilon0 * (1 + 1e-6)
    assert wrong > tuner.epsilon0
