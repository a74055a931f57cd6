"""The odometer: the paper's formula, never below non-adaptive, monotone, tight <= paper."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, Ledger, Odometer
from privguard import mechanisms as M

ORDERS = np.array(DEFAULT_ORDERS)


def paper_formula(spent, orders, delta):
    """seed 001 eq. 5 with the §4.5 schedule, written independently (loops)."""
    n = len(orders)
    best = math.inf
    for a, s in zip(orders, spent):
        first = math.log(2 * n / delta) / (a - 1)
        f = 1
        while s > first * 2 ** (f - 1):
            f += 1
        best = min(best, first * 2 ** (f - 1) + math.log(n * 2 * f * f / delta) / (a - 1))
    return best


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.3, 5.0, 80.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-6])
def test_paper_mode_reproduces_the_paper(rho, delta):
    spent = rho * ORDERS
    assert Odometer(ORDERS, "paper").epsilon(spent, delta) == pytest.approx(
        paper_formula(spent, ORDERS, delta), rel=1e-12)


def dp_sgd_epochs(mode, delta=1e-6):
    """50 epochs, σ = 1, q = 0.01, checked every epoch (the issue's typical run)."""
    ledger = Ledger(delta=delta, odometer=mode)
    step = M.SubsampledGaussian(1.0, 0.01)
    running, naive = [], []
    for _ in range(50):
        for _ in range(100):
            ledger.charge(step)
        running.append(ledger.epsilon())
        naive.append(ledger.nonadaptive_epsilon())
    return np.array(running), np.array(naive)


@pytest.fixture(scope="module")
def runs():
    return {m: dp_sgd_epochs(m) for m in ("tight", "paper")}


@pytest.mark.parametrize("mode", ["tight", "paper"])
def test_never_below_nonadaptive_and_monotone(runs, mode):
    running, naive = runs[mode]
    assert np.all(running >= naive)
    assert np.all(np.diff(running) >= 0)


def test_tight_never_above_paper_on_dp_sgd(runs):
    assert np.all(runs["tight"][0] <= runs["paper"][0])
    assert runs["tight"][0].mean() < runs["paper"][0].mean()


def test_tight_never_above_paper_on_monte_carlo_workload():
    rhos = np.geomspace(1e-4, 400.0, 2000)  # the Monte-Carlo test's range of spends
    spent = rhos[:, None] * ORDERS[None, :]
    tight = Odometer(ORDERS, "tight").epsilon_batch(spent, 1e-2)
    paper = Odometer(ORDERS, "paper").epsilon_batch(spent, 1e-2)
    assert np.all(tight <= paper)


def test_monotone_under_mixed_adaptive_charges():
    ledger = Ledger(delta=1e-5)
    rng = np.random.default_rng(0)
    last = 0.0
    for _ in range(300):
        sigma, q = rng.uniform(0.6, 3.0), rng.uniform(0.001, 0.05)
        ledger.charge(M.SubsampledGaussian(sigma, q))
        eps = ledger.epsilon()
        assert eps >= last
        last = eps


def test_the_running_epsilon_is_the_odometer_alone_even_under_a_filter():
    # The filter's (2, δ)-DP and the odometer's tail bound each hold at δ; the smaller
    # of the two would hold only at 2δ, so epsilon() is never capped by the target.
    ledger = Ledger(2.0, 1e-5)
    report_only = Ledger(delta=1e-5)
    step = M.SubsampledGaussian(1.0, 0.01)
    for _ in range(ledger.remaining(step).repeats):
        ledger.charge(step)
        report_only.charge(step)
    assert not ledger.can_afford(step) and ledger.target == (2.0, 1e-5)
    assert ledger.epsilon() == report_only.epsilon() > 2.0
    assert ledger.remaining().epsilon_spent == ledger.epsilon()
