"""A fix entry derived before Composed's sums were rounded up (4fcbec5) still loads (task
lo6): ``Concentrated`` puts δ's share on the order where the plan is cheapest against its
budget (an argmax of budget / plan), and the rounded-up sum moved the plan by an ulp at
some orders, which moves that argmax where two orders nearly tie. Such an entry is an
older data-independent choice (docs/theory.md §1.1), as those of the curve revisions."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from privguard import Ledger
from privguard import mechanisms as M
from privguard._accounting._shares import Concentrated
from privguard._curves._orders import DEFAULT_ORDERS

PLAN = M.Composed((M.ZCDP(0.3), M.ZCDP(0.07)))
EPSILON, DELTA = 17.259052598691074, 1e-6  # where the two sums' argmax differ (2.9, 2.8)

_WRITE_WITH_NEAREST_SUMS = r"""
import sys
import numpy as np
from privguard import Ledger, Plan
from privguard import mechanisms as M

def nearest(self, orders):  # Composed._rdp before 4fcbec5: numpy's sum, to nearest
    return np.sum([m._rdp_checked(orders) for m in self.mechanisms], axis=0)

M.Composed._rdp = nearest
M.ZCDP._rdp = lambda self, o: self.rho * o  # fl(ρα), to nearest before version 8 (radv8)
plan = M.Composed((M.ZCDP(0.3), M.ZCDP(0.07)))
ledger = Ledger(epsilon=float(sys.argv[2]), delta=float(sys.argv[3]), path=sys.argv[1],
                plan=Plan(plan, steps=3))
ledger.charge(plan)
ledger.close()
"""


def test_the_case_is_a_flip_of_the_concentrated_order():
    orders = np.asarray(DEFAULT_ORDERS, dtype=float)
    parts = [m.rdp(orders) for m in PLAN.mechanisms]
    old = Concentrated()._index(orders, EPSILON, DELTA, np.sum(parts, axis=0))
    new = Concentrated()._index(orders, EPSILON, DELTA, PLAN.rdp(orders))
    assert old != new


def test_a_ledger_fixed_with_the_nearest_sums_opens(tmp_path):
    path = str(tmp_path / "old.db")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _WRITE_WITH_NEAREST_SUMS, path, repr(EPSILON),
                    repr(DELTA)], env=env, check=True, timeout=300)
    ledger = Ledger.open(path)  # refused: "the choices fixed from the plan are not ..."
    try:
        assert len(ledger.history) == 1
        ledger.charge(PLAN)
        assert len(ledger.history) == 2
    finally:
        ledger.close()
