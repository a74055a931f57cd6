"""Task lo7, item 7: ``Concentrated``'s choice of order among exact ties of b_α / plan(α).
Not a defect (the grid is strictly increasing and ``np.argmax`` takes the first maximum,
so the smallest tied order, deterministically); the rule is now documented and pinned."""

from __future__ import annotations

import numpy as np
import pytest

from privguard._accounting._shares import Concentrated
from privguard._curves import _conversion as conv

ORDERS = np.array([2.0, 3.0, 5.0, 8.0, 16.0])


@pytest.mark.parametrize("tied", [(1, 3), (0, 4), (2, 3, 4)])
def test_an_exact_tie_goes_to_the_smallest_order(tied):
    shares = Concentrated(share=0.9)
    w_top = 0.9 + 0.1 / ORDERS.size
    budget = conv.rdp_budget_per_order(ORDERS, 50.0, w_top * 1e-5)
    # a plan whose ratio budget/plan is exactly 4 at the tied orders and 1 elsewhere
    ratio = np.ones(ORDERS.size)
    ratio[list(tied)] = 4.0
    plan = budget / ratio
    got = budget / plan
    assert all(got[i] == got[tied[0]] for i in tied)  # an exact tie, as constructed
    assert shares._index(ORDERS, 50.0, 1e-5, plan) == min(tied)
    w = shares.weights(ORDERS, 50.0, 1e-5, plan)
    assert int(np.argmax(w)) == min(tied)


def test_a_plan_of_zero_at_several_orders_goes_to_the_smallest():
    plan = np.array([0.5, 0.0, 0.2, 0.0, 0.0])
    assert Concentrated(share=0.9)._index(ORDERS, 50.0, 1e-5, plan) == 1
