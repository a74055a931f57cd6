"""Property-based tests (hypothesis): monotonicity and no overspend."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from privguard import BudgetExhausted, Ledger, Odometer, single_order
from privguard import mechanisms as M
from privguard._accounting._journal import scaled_sum
from privguard._curves import _conversion as conv

steps = st.tuples(st.floats(0.5, 5.0), st.floats(1e-3, 1.0))
ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(steps, min_size=1, max_size=40), st.floats(0.5, 10.0))
def test_filter_never_overspends_and_epsilon_is_monotone(seq, eps):
    delta = 1e-5
    ledger = Ledger(eps, delta, orders=ORDERS)
    last = 0.0
    for sigma, q in seq:
        try:
            ledger.charge(M.SubsampledGaussian(sigma, q))
        except BudgetExhausted:
            pass
        now = ledger.epsilon()
        assert last <= now  # the running ε only grows (it is not capped by the target)
        last = now
    if ledger.history:
        # some order still converts within ε at its share of δ
        w = ledger._acc.filter.weights
        per_order = conv.epsilon_per_order(ledger.orders, ledger.spent, w * delta)
        assert per_order.min() <= eps


@settings(max_examples=60, deadline=None)
@given(st.lists(steps, min_size=1, max_size=30))
def test_single_order_filter_stays_within_its_rdp_budget(seq):
    eps, delta, order = 3.0, 1e-5, 8.0
    ledger = Ledger(eps, delta, orders=ORDERS, shares=single_order(order))
    for sigma, q in seq:
        if ledger.can_afford(M.SubsampledGaussian(sigma, q)):
            ledger.charge(M.SubsampledGaussian(sigma, q))
    i = ORDERS.index(order)
    budget = conv.rdp_budget_per_order(np.array([order]), eps, delta)[0]
    assert ledger.spent[i] <= budget * (1 + 1e-12)


@settings(max_examples=80, deadline=None)
@given(st.floats(1e-4, 1e3), st.floats(1e-4, 1e3), st.sampled_from(["tight", "paper"]),
       st.floats(1e-9, 0.1))
def test_odometer_is_monotone_in_the_spend(a, b, mode, delta):
    lo, hi = sorted((a, b))
    orders = np.array(ORDERS)
    odo = Odometer(orders, mode)
    assert odo.epsilon(lo * orders, delta) <= odo.epsilon(hi * orders, delta)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.3, 10.0), st.floats(1e-3, 1.0), st.integers(1, 5000))
def test_curves_are_non_decreasing_in_the_order(sigma, q, t):
    c = M.SubsampledGaussian(sigma, q, t).rdp(ORDERS)
    assert np.all(c[1:] >= c[:-1] * (1 - 1e-9))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.7, 1.0, 2.5]), st.sampled_from([0.01, 0.2]),
                          st.integers(1, 50)), min_size=1, max_size=30))
def test_the_kept_spent_curve_is_the_journal_recomputed_and_replays_bit_for_bit(seq):
    # The journal keeps the spent curve each admitted verdict computed instead of
    # recomputing it: that must be exactly base + count·curve (each operation rounded up,
    # scaled_sum: docs/theory.md §6), live and after a replay.
    ledger = Ledger(delta=1e-5, orders=ORDERS)
    for sigma, q, times in seq:
        ledger.charge(M.SubsampledGaussian(sigma, q), times=times)
        j = ledger._acc.journal
        assert np.array_equal(ledger.spent, scaled_sum(j._base, j._base_bound, j._streak_count,
                                                       j._streak_curve, j._streak_bound))
    again = Ledger.load_state_dict(ledger.state_dict())
    assert np.array_equal(again.spent, ledger.spent)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.7, 1.0]), st.sampled_from([0.01, 0.2]),
                          st.integers(1, 20), st.sampled_from(["a", "b", None, "é"])),
                min_size=1, max_size=40), st.sampled_from([3, 512]))
def test_a_journal_read_back_is_the_one_kept_live(seq, checkpoint_every):
    # Same mechanism under another label: a new run in the same streak. The totals the
    # journal keeps, the runs and the spent curve must be what a reopen (from the last
    # checkpoint, when one is written every 3 rows) and a verify (from the genesis)
    # rebuild from the file.
    import tempfile

    from privguard._stores import _sqlite, open_store

    saved, _sqlite.CHECKPOINT_EVERY = _sqlite.CHECKPOINT_EVERY, checkpoint_every
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = f"{folder}/ledger.db"
            ledger = Ledger(delta=1e-5, orders=ORDERS, path=path)
            for sigma, q, times, label in seq:
                ledger.charge(M.SubsampledGaussian(sigma, q), times=times, label=label)
            runs, spent, j = ledger.runs, ledger.spent, ledger._acc.journal
            assert (j.run_count, j.charges) == (len(runs), sum(r.count for r in runs))
            assert [r.index for r in runs] == list(range(len(runs)))
            assert all(b.start == a.start + a.count for a, b in itertools.pairwise(runs))
            ledger.close()
            again = Ledger.open(path)
            k = again._acc.journal
            assert (k.run_count, k.charges) == (j.run_count, j.charges)
            assert again.runs == runs and np.array_equal(again.spent, spent)
            again.close()
            store = open_store(path, read_only=True)
            store.open(None, None, None)
            try:
                result = store.verify()
            finally:
                store.close()
            assert (result["runs"], result["charges"]) == (len(runs), j.charges)
            assert result["checkpoints"] == (result["rows"] // checkpoint_every)
    finally:
        _sqlite.CHECKPOINT_EVERY = saved
