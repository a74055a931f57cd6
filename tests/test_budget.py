"""The budget meter (docs/theory.md §12): admission equivalence, monotonicity, references."""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privguard import Budget, BudgetExhausted, Ledger
from privguard import mechanisms as M
from privguard._accounting._budget import PART_A, PART_B, PART_RDP, grid_count, meter_after
from privguard._curves import _conversion as conv

ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]
EPS, DELTA = 3.0, 1e-5
#: A hybrid plan with a small T_A (8 steps at (3, 0.99e-5)): the PLD ε of every count is cheap.
PLAN_STEP = M.SubsampledGaussian(2.0, 0.4)
T_A = 8

# A charge: (σ, q, steps, times). Inside the (2.0, 0.4) envelope when σ ≥ 2 and q ≤ 0.4.
charges = st.tuples(st.floats(0.7, 8.0), st.floats(0.01, 0.6), st.integers(1, 3),
                    st.integers(1, 2))


def _check_sequence(ledger: Ledger, seq) -> None:
    """For each charge: admitted ⟺ meter after ≤ target; the meter never decreases."""
    eps = ledger.target[0]
    last = ledger.budget().spent
    assert last == 0.0
    for sigma, q, steps, times in seq:
        mech = M.SubsampledGaussian(sigma, q, steps=steps)
        verdict = ledger._acc.decide(mech, None, os.getpid(), times)
        spent = verdict.spent_after  # None on the fast path: the journal's floats, computed here
        if spent is None:
            spent = ledger._acc.journal.spent_after(mech, verdict.curve, times)
        after, part = meter_after(verdict.filter, spent, mech, times)
        assert verdict.admitted == (after <= eps), (mech, times, after)
        try:
            ledger.charge(mech, times=times)
            assert verdict.admitted
        except BudgetExhausted:
            assert not verdict.admitted
        b = ledger.budget()
        if verdict.admitted:
            assert (b.spent, b.part) == (after, part)
        assert last <= b.spent <= eps  # never decreases, never above the target
        last = b.spent


@settings(max_examples=60, deadline=None)
@given(st.lists(charges, min_size=1, max_size=30), st.floats(0.5, 8.0))
def test_rdp_meter_admits_exactly_when_it_stays_within_the_target(seq, eps):
    _check_sequence(Ledger(eps, DELTA, orders=ORDERS), seq)


@settings(max_examples=15, deadline=None)
@given(st.lists(charges, min_size=1, max_size=20))
def test_hybrid_meter_admits_exactly_when_it_stays_within_the_target(seq):
    ledger = Ledger(EPS, DELTA, orders=ORDERS, plan=PLAN_STEP, filter="hybrid")
    assert ledger._acc.filter.kind == "hybrid" and ledger._acc.filter.steps_a == T_A
    _check_sequence(ledger, seq)


def test_rdp_meter_is_the_improved_conversion_at_the_fixed_shares():
    ledger = Ledger(EPS, DELTA)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=1000))
    w = ledger._acc.filter.weights
    # independent: the per-order improved conversion (formulas.md §1) at w_α·δ
    ref = conv.epsilon_per_order(ledger.orders, ledger.spent, w * DELTA).min()
    b = ledger.budget()
    assert b.part == PART_RDP and b.spent == pytest.approx(ref, rel=1e-12)
    assert b.left == pytest.approx(1 - ref / EPS)


def test_rdp_meter_ends_within_one_percent_of_the_target_when_refused():
    ledger = Ledger(EPS, DELTA)
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger.charge(step, times=int(ledger.remaining(step).repeats))
    assert not ledger.can_afford(step)
    b = ledger.budget()
    assert 0.99 * EPS <= b.spent <= EPS
    assert ledger.epsilon() > EPS  # the any-time ε exceeds the target; the meter does not


def test_hybrid_meter_is_the_pld_epsilon_of_part_a_and_closes_with_a():
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    ledger = Ledger(EPS, DELTA, plan=PLAN_STEP, filter="hybrid")
    flt = ledger._acc.filter
    ledger.charge(PLAN_STEP, times=5)
    b = ledger.budget()
    assert b.part == PART_A
    # independent: dp-accounting's PLD of 5 steps (its default discretisation) at δ_A
    ref = pld_lib.from_gaussian_mechanism(2.0, sampling_prob=0.4).self_compose(5) \
        .get_epsilon_for_delta(flt.delta_a)
    assert b.spent == pytest.approx(ref, rel=2e-3)
    ledger.charge(PLAN_STEP, times=flt.steps_a - 5)  # the whole of T_A
    end = ledger.budget()
    assert end.part == PART_A and b.spent < end.spent <= EPS
    # leaving the envelope closes A: the meter is part B's from then on
    ledger2 = Ledger(EPS, DELTA, plan=PLAN_STEP, filter="hybrid")
    ledger2.charge(M.SubsampledGaussian(8.0, 0.5))  # q > 0.4: outside
    b2 = ledger2.budget()
    assert b2.part == PART_B and not ledger2._acc.filter.a_alive
    w = ledger2._acc.filter.weights
    ref_b = conv.epsilon_per_order(ledger2.orders, ledger2.spent, w * flt.delta_b).min()
    assert b2.spent == pytest.approx(ref_b, rel=1e-12)


def test_grid_count_is_the_smallest_grid_point_at_or_above_the_count():
    for t in (1, 37, 100, 3000):
        grid = sorted({grid_count(c, t) for c in range(t + 1)})
        assert grid[0] == 0 and grid[-1] == t
        for c in range(t + 1):
            g = grid_count(c, t)
            assert g >= c and all(x < c for x in grid if x < g)
        ratios = [b / a for a, b in itertools.pairwise(grid[1:])]
        assert all(r <= 2.0 for r in ratios) and (t < 100 or max(ratios[-10:]) < 1.03)


def test_a_ledger_without_an_epsilon_delta_filter_has_no_meter():
    assert Ledger(delta=1e-5).budget() is None
    child = Ledger(EPS, DELTA).child(M.Gaussian(5.0))
    assert child.budget() is None


def test_budget_value_reads_and_is_frozen():
    b = Budget(3.0, 1e-5, 2.991, PART_A)
    # spent rounded up (the float 2.991 is 2.99100000000000010...), what is left rounded down:
    # exactly 0.29999999999999966...% (the float 1 − spent/ε, 0.0030000000000000027, read
    # 0.3% before left was rounded down)
    assert str(b) == "budget 2.992 of ε = 3 spent (hybrid: PLD on plan) — 0.299% left"
    with pytest.raises(AttributeError):
        b.spent = 0.0  # type: ignore[misc]
    assert Budget(3.0, 1e-5, math.inf, PART_B).left == 0.0
    assert np.isfinite(Budget(3.0, 1e-5, 0.0, PART_RDP).left)


def test_membership_tpr_bound_is_the_dp_tradeoff_and_holds_for_a_gaussian():
    from scipy.stats import norm

    from privguard._cli._risk import membership_tpr_bound, risk_sentence

    for eps, delta, fpr in [(3.0, 1e-5, 0.01), (1.0, 1e-6, 0.05), (0.5, 0.0 + 1e-9, 0.3)]:
        # Dong, Roth & Su 2022, eq. (5): f_{ε,δ}(α) = max(0, 1−δ−e^ε α, e^−ε (1−δ−α)); TPR ≤ 1 − f
        f = max(0.0, 1 - delta - math.exp(eps) * fpr, math.exp(-eps) * (1 - delta - fpr))
        assert membership_tpr_bound(eps, delta, fpr) == pytest.approx(1 - f, rel=1e-12)
        # a μ-GDP Gaussian mechanism is (ε, δ(ε))-DP (Dong, Roth & Su 2022, Cor. 2.13); its best
        # test at this FPR (Neyman-Pearson) has TPR = 1 − Φ(Φ⁻¹(1 − FPR) − μ) ≤ the bound
        for mu in (0.5, 1.0, 2.0):
            d = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
            tpr = 1 - norm.cdf(norm.ppf(1 - fpr) - mu)
            assert tpr <= membership_tpr_bound(eps, max(d, 1e-300), fpr) + 1e-12
    assert "20.1%" in risk_sentence(3.0, 1e-5) and "does not limit" in risk_sentence(10.0, 1e-5)
    # ε beyond exp's range (a ledger's target of 1e9 in `report`): OverflowError before
    assert membership_tpr_bound(1e9, 1e-5, 0.01) == 1.0
    assert "does not limit" in risk_sentence(1e9, 1e-5)


def test_report_leads_with_the_meter_and_explains_every_epsilon_above_the_target(capsys):
    import re

    from privguard._cli._report import print_report, report

    ledger = Ledger(EPS, DELTA)
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger.charge(step, times=int(ledger.remaining(step).repeats))
    ledger.charge(M.Gaussian(300.0), label="count", times=3)
    print_report(report(ledger))
    lines = capsys.readouterr().out.splitlines()
    first = "\n".join(lines[:5])
    assert lines[0].startswith("budget") and "% left" in lines[0]  # how much is left
    assert lines[1].startswith("report") and "(ε = 3, δ = 1e-05)-DP" in lines[1]  # what to report
    assert lines[2].startswith("any-time ε") and "any stopping time without the filter" in first
    assert ledger.epsilon() > EPS  # the any-time ε is above the target here, and says why
    for line in lines:
        values = [float(x) for x in re.findall(r"(?<![\d.-])\d+\.\d+(?![\d%])", line)]
        if "ε" in line and any(v > EPS for v in values):
            assert "above the target" in line, line
