"""The (ε, δ) filter against Opacus' accountant; the strict filter; refusals."""

from __future__ import annotations

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from privguard import (
    DEFAULT_ORDERS,
    BudgetExhausted,
    Concentrated,
    Ledger,
    Uniform,
    single_order,
)
from privguard import mechanisms as M

EPS, DELTA = 3.0, 1e-5
ORDERS = list(DEFAULT_ORDERS)
CASES = [(1.1, 256 / 60000), (1.0, 0.01)]


def steps_admitted(ledger: Ledger, step) -> int:
    n = 0
    while True:
        try:
            ledger.charge(step)
        except BudgetExhausted:
            return n
        n += 1


def nonadaptive_max_steps(sigma, q, order=None) -> int:
    """Largest T with ε(T) <= EPS by Opacus' conversion (at one order, or the best)."""
    one = np.array(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=ORDERS))
    if order is not None:
        i = ORDERS.index(order)
        ok = lambda t: get_privacy_spent(orders=[order], rdp=[one[i] * t], delta=DELTA)[0] <= EPS
    else:
        ok = lambda t: get_privacy_spent(orders=ORDERS, rdp=one * t, delta=DELTA)[0] <= EPS
    lo, hi = 0, 1
    while ok(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


@pytest.mark.parametrize("order", [2.0, 8.0, 16.0])
def test_all_delta_on_one_order_admits_exactly_the_nonadaptive_steps_at_that_order(order):
    step = M.SubsampledGaussian(1.0, 0.01)
    # counted through remaining() (the same decision path) to keep the test fast
    t = Ledger(EPS, DELTA, shares=single_order(order)).remaining(step).repeats
    assert t == nonadaptive_max_steps(1.0, 0.01, order)


@pytest.mark.parametrize("sigma,q", CASES)
def test_optimal_order_filter_equals_opacus_accountant(sigma, q):
    step = M.SubsampledGaussian(sigma, q)
    ledger = Ledger(EPS, DELTA, shares=Concentrated(1.0), plan=step)
    t = ledger.remaining(step).repeats
    assert t == nonadaptive_max_steps(sigma, q)
    # and Opacus' own accountant, stepped t times, sits within the target
    acc = RDPAccountant()
    acc.history = [(sigma, q, t)]
    assert acc.get_epsilon(DELTA, alphas=ORDERS) <= EPS
    acc.history = [(sigma, q, t + 1)]
    assert acc.get_epsilon(DELTA, alphas=ORDERS) > EPS


def test_charging_step_by_step_admits_what_remaining_predicts():
    step = M.SubsampledGaussian(1.0, 0.01)
    predicted = Ledger(EPS, DELTA, plan=step).remaining(step).repeats
    assert steps_admitted(Ledger(EPS, DELTA, plan=step), step) == predicted


@pytest.mark.parametrize("sigma,q", CASES)
def test_default_shares_admit_at_least_90_percent_and_uniform_fewer(sigma, q):
    step = M.SubsampledGaussian(sigma, q)
    best = nonadaptive_max_steps(sigma, q)
    default = Ledger(EPS, DELTA).remaining(step).repeats  # plan = first charge
    uniform = Ledger(EPS, DELTA, shares=Uniform()).remaining(step).repeats
    assert 0.9 * best <= default <= best
    assert uniform < default
    assert uniform < 0.8 * best  # docs/theory.md §2 reports the exact figures


def test_weights_are_fixed_by_the_first_charge():
    ledger = Ledger(EPS, DELTA)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    w = ledger._acc.filter.weights.copy()
    assert w.sum() == pytest.approx(1.0) and w.max() == pytest.approx(0.9 + 0.1 / w.size)
    ledger.charge(M.Gaussian(50.0))
    np.testing.assert_array_equal(ledger._acc.filter.weights, w)


def test_strict_filter_refuses_if_any_order_would_exceed():
    orders = [2.0, 4.0, 8.0]
    ledger = Ledger(orders=orders, rdp_budget=[1.0, 10.0, 10.0])
    ledger.charge(M.RDPCurve(orders, [0.5, 0.5, 0.5]))
    assert not ledger.can_afford(M.RDPCurve(orders, [0.6, 0.6, 0.6]))  # only order 2 exceeds
    assert ledger.can_afford(M.RDPCurve(orders, [0.5, 9.5, 9.5]))  # exactly at budget is fine
    with pytest.raises(BudgetExhausted):
        ledger.charge(M.RDPCurve(orders, [0.6, 0.6, 0.6]))
    assert len(ledger.history) == 1


def test_refusal_records_nothing_and_says_what_remains():
    events = []
    ledger = Ledger(1.0, DELTA, listeners=[events.append])
    ledger.charge(M.Gaussian(10.0), label="small")
    before = ledger.spent
    big = M.Gaussian(0.5)
    assert not ledger.can_afford(big)
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge(big, label="big")
    np.testing.assert_array_equal(ledger.spent, before)
    assert len(ledger.history) == 1
    assert info.value.requested == big and info.value.label == "big"
    assert info.value.remaining.repeats == 0 and info.value.remaining.epsilon_target == 1.0
    assert [e.kind for e in events] == ["charge", "refused"]


def test_child_admits_exactly_its_declared_run():
    parent = Ledger(8.0, DELTA)
    for sigma, q, t in [(1.1, 0.004, 1000), (0.7, 0.3, 37), (2.5, 1.0, 3)]:
        kid = parent.child(M.SubsampledGaussian(sigma, q, steps=t))
        step = M.SubsampledGaussian(sigma, q)
        assert steps_admitted(kid, step) == t
    assert parent.history == ()  # the child never charges the parent
