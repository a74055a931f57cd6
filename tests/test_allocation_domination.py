"""An adaptive epoch of random allocation is dominated by the pair of docs/theory.md §2b.2.

Lemma 2b.2: whatever the model does between the steps of an epoch (the removed
example's clipped gradient, the clip norm and σ ≥ σ₀ chosen from the outputs so
far), E_Q[f(L)] ≤ E[f(L*)] for every convex f of the epoch's likelihood ratio,
where L* is that of the non-adaptive pair ((1/t) Σ N(e_i, σ₀²I), N(0, σ₀²I)).
f = (L − γ)₊ and (1 − γL)₊ are the hockey-sticks of the remove and add
directions; f = L^α the remove direction's Rényi moment.

Checked here at t = 2, where everything is a one-dimensional integral: under
Q the first step's term is X₁ = exp(s·z₁ − s²/2) (s = 1/σ₀, the example at
full norm) and the second X₂ = exp(s₂·z₂ − s₂²/2) with s₂ = r(z₁)·s chosen
from the first output. Given z₁, the expectation over z₂ has a closed form
(log-normal call/put prices; a binomial sum of log-normal moments at integer
α), and the outer integral over z₁ is a Riemann sum on [−12, 24] with 30,001
points (the integrands are smooth, and the moments' peak at z₁ ≈ α·s stays
inside: at α ≤ 8 it matches the exact expansion of §15 to 1e−9 relative). A rule
with s₂ > s somewhere (not allowed: σ below σ₀ or a gradient above the clip
norm) is NOT dominated: the last test shows these checks can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import comb, logsumexp, ndtr

from privguard import mechanisms as M
from privguard._mechanisms import _allocation as A

GAMMAS = np.exp(np.array([-1.0, -0.3, 0.0, 0.2, 0.5, 1.0, 2.0, 3.0]))
_Z = np.linspace(-12.0, 24.0, 30_001)
_W = np.exp(-_Z ** 2 / 2) / np.sqrt(2 * np.pi) * (_Z[1] - _Z[0])

RULES = {
    "non-adaptive": lambda z: np.ones_like(z),
    "smooth": lambda z: 1.0 / (1.0 + np.exp(-3.0 * z)),
    "threshold": lambda z: np.where(z > 0.5, 1.0, 0.2),
    "vanishing": lambda z: np.where(z < -0.3, 0.0, 1.0),
}


def _call(a, b, s2, gamma):
    """E[(a + b·X − γ)₊], X ~ LN(−s₂²/2, s₂²) (E X = 1; X = 1 where s₂ = 0)."""
    k = gamma - a
    k_pos = np.where(k > 0, k, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d2 = (np.log(b / k_pos) - s2 ** 2 / 2) / s2
        price = b * ndtr(d2 + s2) - k_pos * ndtr(d2)
    price = np.where(s2 > 0, price, np.maximum(b - k, 0.0))
    return np.where(k > 0, price, a + b - gamma)


def _put(a, b, s2, gamma):
    """E[(1 − γ(a + b·X))₊], X as in :func:`_call`."""
    k = 1.0 - gamma * a
    k_pos = np.where(k > 0, k, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d2 = (np.log(gamma * b / k_pos) - s2 ** 2 / 2) / s2
        price = k_pos * ndtr(-d2) - gamma * b * ndtr(-d2 - s2)
    price = np.where(s2 > 0, price, np.maximum(k - gamma * b, 0.0))
    return np.where(k > 0, price, 0.0)


def hockey_sticks(sigma, rule):
    """(H_γ(P‖Q), H_γ(Q‖P)) over GAMMAS of the t = 2 epoch whose second step uses s·rule(z₁)."""
    s = 1.0 / sigma
    a = np.exp(s * _Z - s * s / 2) / 2
    s2 = rule(_Z) * s
    remove = np.array([np.sum(_W * _call(a, 0.5, s2, g)) for g in GAMMAS])
    add = np.array([np.sum(_W * _put(a, 0.5, s2, g)) for g in GAMMAS])
    return remove, add


def log_moment(sigma, rule, alpha):
    """log E_Q[L^α] at an integer α: E over z₂ by the binomial theorem, E[X^k] = e^(k(k−1)s₂²/2)."""
    s = 1.0 / sigma
    log_a = s * _Z - s * s / 2 - np.log(2)
    s2 = rule(_Z) * s
    k = np.arange(alpha + 1)[:, None]
    terms = (np.log(comb(alpha, k[:, 0]))[:, None] + (alpha - k) * log_a
             + k * np.log(0.5) + k * (k - 1) * s2 ** 2 / 2)
    return float(logsumexp(logsumexp(terms, axis=0), b=_W))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("rule", ["smooth", "threshold", "vanishing"])
def test_adaptive_epoch_hockey_sticks_are_below_the_pair(sigma, rule):
    base_remove, base_add = hockey_sticks(sigma, RULES["non-adaptive"])
    remove, add = hockey_sticks(sigma, RULES[rule])
    assert np.all(remove <= base_remove * (1 + 1e-9) + 1e-15)
    assert np.all(add <= base_add * (1 + 1e-9) + 1e-15)


def test_the_non_adaptive_pair_is_consistent():
    # H_1 is the total variation in both directions, and H_γ(P‖Q) ≥ (1 − γ)₊.
    for sigma in (0.5, 1.0, 2.0):
        remove, add = hockey_sticks(sigma, RULES["non-adaptive"])
        one = list(GAMMAS).index(1.0)
        assert remove[one] == pytest.approx(add[one], rel=1e-9)
        assert np.all(remove >= np.maximum(1 - GAMMAS, 0) - 1e-12)


@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0])
def test_adaptive_epoch_renyi_is_below_the_charged_curve(sigma):
    # the remove direction at integer orders: the adaptive epoch's D_α is at most
    # the non-adaptive value (§15's exact expansion, which this quadrature
    # reproduces), and that is at most RandomAllocation(σ, 2)'s charge.
    orders = np.array([2.0, 3.0, 5.0, 8.0])
    charged = M.RandomAllocation(sigma, 2)._rdp_checked(orders)
    exact = A.log_moments(8, sigma, 2)
    for alpha, eps in zip(orders, charged):
        n = int(alpha)
        assert log_moment(sigma, RULES["non-adaptive"], n) == pytest.approx(exact[n], rel=1e-9)
        assert exact[n] / (alpha - 1) <= eps * (1 + 1e-12)
        for rule in ("smooth", "threshold", "vanishing"):
            assert log_moment(sigma, RULES[rule], n) <= exact[n] * (1 + 1e-9)


def test_a_step_above_the_envelope_breaks_domination():
    # s₂ up to 1.5·s (σ below σ₀): the same checks fail, in both directions.
    too_loud = lambda z: 1.0 + 0.5 / (1.0 + np.exp(-3.0 * z))
    base_remove, base_add = hockey_sticks(1.0, RULES["non-adaptive"])
    remove, add = hockey_sticks(1.0, too_loud)
    assert np.max(remove / base_remove) > 1.5
    assert np.max(add / base_add) > 1.05
    assert log_moment(1.0, too_loud, 3) > log_moment(1.0, RULES["non-adaptive"], 3) + 0.05


def test_poisson_at_rate_one_over_t_does_not_dominate_the_epoch():
    # docs/theory.md §2b.2: two Poisson(1/2) steps are not a dominating pair for
    # a t = 2 epoch, so the Poisson envelope of §2b cannot cover random
    # allocation. Remove: above the epoch near γ = 1 (1.096× at σ = 1). Add: the
    # Poisson pair's loss −log L is at most −t·log(1 − q) = log 4 (L ≥ (1 − q)^t),
    # so its H_γ(Q‖P) is 0 for γ ≥ 4, while the epoch's L = mean of the X_i takes
    # every positive value and its H_γ(Q‖P) is positive for every γ.
    s = 1.0
    x1 = np.exp(s * _Z - s * s / 2)
    s2 = np.full_like(_Z, s)
    c = 0.5 + 0.5 * x1  # Poisson: L = Π_i (1 − q + q·X_i), q = 1/2
    gammas = np.exp(np.array([-0.2, -0.12, -0.05, 1.5, 2.0]))
    epoch_remove = np.array([np.sum(_W * _call(x1 / 2, 0.5, s2, g)) for g in gammas])
    poisson_remove = np.array([np.sum(_W * _call(c / 2, c / 2, s2, g)) for g in gammas])
    epoch_add = np.array([np.sum(_W * _put(x1 / 2, 0.5, s2, g)) for g in gammas])
    poisson_add = np.array([np.sum(_W * _put(c / 2, c / 2, s2, g)) for g in gammas])
    assert np.max(epoch_remove[:3] / poisson_remove[:3]) > 1.09
    assert np.all(poisson_add[3:] == 0.0) and np.all(epoch_add[3:] > 1e-6)
