"""The lease sizing's meter cap searches from a guess (task qs, issue 26): the same count as
the bisection it replaced, with fewer meter evaluations near the end of a budget.

``_lease.largest_fitting`` is compared with the bisection (written out below) on every
threshold and every guess of small ranges; ``meter_room`` with the frozen code before
task lc in ``tests/test_lease_cost.py`` (hypothesis and whole file runs), which this
change leaves as it was. Here: how many meter evaluations the cap of a lease near the
end of the budget takes (the README quick start's last leases, 1 step each, took 8 or 9).
"""

from __future__ import annotations

import pytest

from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M
from privguard._accounting import _budget, _lease


def _bisection(fits, lo: int, hi: int) -> int:
    """The search before task qs: lo kept, hi refused."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@pytest.mark.parametrize("lo,hi", [(1, 2), (1, 3), (1, 17), (3, 40), (0, 129)])
def test_largest_fitting_is_the_bisection_for_every_threshold_and_guess(lo, hi):
    for threshold in range(lo - 1, hi):  # fits(m) iff m <= threshold (hi never fits)
        probed: list[int] = []

        def fits(m: int, threshold: int = threshold) -> bool:
            assert lo < m < hi, m  # lo is kept unprobed, hi known refused
            probed.append(m)
            return m <= threshold

        want = _bisection(lambda m, t=threshold: m <= t, lo, hi)
        for guess in (-5, lo, lo + 1, (lo + hi) // 2, threshold, threshold + 1, hi, 10 * hi):
            probed.clear()
            assert _lease.largest_fitting(fits, lo, hi, guess) == want
            assert len(probed) == len(set(probed))  # no count probed twice


def test_largest_fitting_takes_two_probes_at_an_exact_guess():
    probed: list[int] = []

    def fits(m: int) -> bool:
        probed.append(m)
        return m <= 98

    assert _lease.largest_fitting(fits, 1, 101, 98) == 98
    assert probed == [98, 99]
    probed.clear()
    assert _lease.largest_fitting(fits, 1, 1000, 99) == 98
    assert probed == [99, 98]


def _near_the_end() -> Ledger:
    """An in-memory ledger with room for fewer than 64 more steps, whose meter cap binds a
    lease of 17 steps or more (the last leases of the README's quick start: σ = 0.9,
    q = 256/60000, ε = 3)."""
    q = 256 / 60_000
    ledger = Ledger(epsilon=3.0, delta=1e-5, plan=Plan(M.SubsampledGaussian(1.1, q),
                                                       steps=23_400))
    step = M.SubsampledGaussian(0.9, q)
    for times in (256, 64):  # blocks of 256 steps to the first refusal, then of 64
        try:
            while True:
                ledger.charge(step, times=times)
        except BudgetExhausted:
            pass
    return ledger


def test_a_lease_near_the_end_of_the_budget_takes_few_meter_evaluations(monkeypatch):
    """Task qs: the cap bisected [1, n] (7 more evaluations for n ≈ 117); from the secant
    guess it takes at most four in all (m0, f(n), the guess and its neighbour)."""
    ledger = _near_the_end()
    acc = ledger._acc
    step = M.SubsampledGaussian(0.9, 256 / 60_000)
    flt, spent, curve = acc.filter, acc.spent(), acc.curve(step)
    calls = []
    real = _budget.meter_from_terms
    monkeypatch.setattr(_budget, "meter_from_terms",
                        lambda *a: calls.append(1) or real(*a))
    for n in (17, 117, 300, 1000):
        calls.clear()
        got = _lease.meter_room(flt, spent, curve, 1, n)
        assert 1 <= got < n  # the meter binds here
        assert len(calls) <= 4, (n, len(calls))
