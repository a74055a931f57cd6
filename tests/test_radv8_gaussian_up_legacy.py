"""Review radv8 (checkpoint curves version 8): the Gaussian's α/(2σ²) and zCDP's ρα are
rounded up (task adv8 found them rounded to nearest, up to about 2u below the exact value).

A ledger written before keeps loading: its fix entry (δ shares derived from the plan's
curve) is re-derived with the older curves where today's differ (``_legacy.pre_gaussian_up``,
as ``pre_sum_up`` for version 7: tests/test_lo6_sum_up_fix.py), and a charge it admitted
within ulps of its budget is re-read through the fallbacks for older files
(``_accounting._admitted_at_weighted_deltas`` admits the case below; with it and
``_admitted_at_nearest_sums`` both off the file is refused). Exact values in mpmath.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys

import mpmath as mp
import numpy as np
import pytest
from test_checkpoint_v2_resume import replayed  # noqa: F401  (a fixture)
from test_sqlite import cli_verify

from privguard import Ledger, Plan
from privguard import mechanisms as M
from privguard._accounting._shares import Concentrated
from privguard._curves import _legacy
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._stores import _rows

mp.mp.dps = 60
ORDERS = np.asarray(DEFAULT_ORDERS, dtype=float)

_WRITE_WITH_NEAREST_CURVES = r"""
import sys
import numpy as np
from privguard import Ledger, Plan
from privguard import mechanisms as M

# the curves before checkpoint curves version 8: α/fl(2σ²) and fl(ρα), to nearest
M.Gaussian._rdp = lambda self, o: np.maximum(o / (2 * self.noise_multiplier**2), 5e-324)
M.ZCDP._rdp = lambda self, o: self.rho * o
path, eps, delta, plan_sigma, sigma = sys.argv[1:]
ledger = Ledger(epsilon=float(eps), delta=float(delta), path=path,
                plan=Plan(M.Gaussian(float(plan_sigma))))
ledger.charge(M.Gaussian(float(sigma)))
ledger.close()
"""


def _write_old(path, *args) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _WRITE_WITH_NEAREST_CURVES, str(path),
                    *map(repr, args)], env=env, check=True, timeout=300)


def _old(mechanism) -> np.ndarray:
    with _legacy.pre_gaussian_up():
        return mechanism._rdp(ORDERS)


@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.1, 3.0, 1e3, 1e155, 1e160])
def test_gaussian_curve_is_the_smallest_float_at_or_above_exact_unless_opacus_was_above(sigma):
    new, old = M.Gaussian(sigma).rdp(ORDERS), _old(M.Gaussian(sigma))
    raised = 0
    for a, v, o in zip(ORDERS.tolist(), new.tolist(), old.tolist()):
        exact = mp.mpf(a) / (2 * mp.mpf(sigma) ** 2)
        assert mp.mpf(v) >= exact and v >= o
        if v != o:  # raised: o was below, and v is the first float at or above
            raised += 1
            assert mp.mpf(o) < exact and mp.mpf(math.nextafter(v, 0.0)) < exact
    # about half the values were below; 2σ² overflows from σ ≈ 9.5e153, where the smallest
    # positive float was below α/(2σ²) (up to σ ≈ 1e161·√α)
    assert raised > 0


def test_curves_built_on_the_gaussian_bound_are_not_below_it():
    sigma = 0.7
    exact = [mp.mpf(a) / (2 * mp.mpf(sigma) ** 2) for a in ORDERS.tolist()]
    for mech in (M.SubsampledGaussian(sigma, 1.0), M.RandomAllocation(sigma, 1)):
        assert all(mp.mpf(v) >= e for v, e in zip(mech.rdp(ORDERS).tolist(), exact)), mech


def test_zcdp_curve_is_not_below_rho_alpha():
    for rho in (1e-300, 1e-10, 0.1, 0.3, 7.0):
        curve = M.ZCDP(rho).rdp(ORDERS)
        assert all(mp.mpf(v) >= mp.mpf(rho) * mp.mpf(a)
                   for a, v in zip(ORDERS.tolist(), curve.tolist()))
        assert (curve >= _old(M.ZCDP(rho))).all()


# a plan whose Concentrated order moves with the rounding: 118 → 117 (found by bisecting ε)
PLAN_SIGMA, EPSILON, DELTA = 0.7, 0.718083225922598, 1e-6


def test_the_case_is_a_flip_of_the_concentrated_order():
    plan = M.Gaussian(PLAN_SIGMA)
    old = Concentrated()._index(ORDERS, EPSILON, DELTA, _old(plan))
    new = Concentrated()._index(ORDERS, EPSILON, DELTA, plan.rdp(ORDERS))
    assert old != new


def opens_and_goes_on(path) -> None:
    """Open the ledger at ``path`` (one charge in it) and charge once more (also used by
    tests/test_lo9_composed_version_7.py)."""
    ledger = Ledger.open(str(path))  # refused without pre_gaussian_up: "the choices fixed ..."
    try:
        assert len(ledger.history) == 1
        ledger.charge(M.Gaussian(30.0))
        assert len(ledger.history) == 2
    finally:
        ledger.close()


def test_a_ledger_fixed_with_the_nearest_curves_opens(tmp_path):
    path = tmp_path / "old.db"
    _write_old(path, EPSILON, DELTA, PLAN_SIGMA, 30.0)
    opens_and_goes_on(path)


# a charge admitted at the edge of its budget with the nearest curves, refused with today's
EDGE_EPSILON, EDGE_PLAN, EDGE_SIGMA = 7.609, 1.3, 0.7220709764375426


def test_a_charge_admitted_at_the_edge_with_the_nearest_curves_is_reread(tmp_path):
    today = Ledger(epsilon=EDGE_EPSILON, delta=DELTA, plan=Plan(M.Gaussian(EDGE_PLAN)))
    assert not today.can_afford(M.Gaussian(EDGE_SIGMA))  # the raise moved it past the edge
    path = tmp_path / "edge.db"
    _write_old(path, EDGE_EPSILON, DELTA, EDGE_PLAN, EDGE_SIGMA)
    ledger = Ledger.open(str(path))  # "would be refused by the recorded budget" without it
    try:
        assert len(ledger.history) == 1
        assert not ledger.can_afford(M.Gaussian(EDGE_SIGMA))  # new charges: today's curve
    finally:
        ledger.close()


_WRITE_VERSION_7 = r"""
import sys
import numpy as np
from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _rows

M.Gaussian._rdp = lambda self, o: np.maximum(o / (2 * self.noise_multiplier**2), 5e-324)
M.ZCDP._rdp = lambda self, o: self.rho * o
_rows.CHECKPOINT_CURVES = 7  # what privguard wrote before review radv8
ledger = Ledger(epsilon=1e4, delta=1e-5, path=sys.argv[1])
for i in range(600):
    ledger.charge(M.Gaussian(3.0) if i % 2 else M.ZCDP(0.013))
ledger.close()
"""


def test_a_version_7_checkpoint_is_replayed_to_todays_higher_totals(tmp_path, replayed):  # noqa: F811
    path = str(tmp_path / "v7.db")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _WRITE_VERSION_7, path], env=env, check=True,
                   timeout=300)
    conn = sqlite3.connect(path)
    try:
        versions = [json.loads(s)["curves"]
                    for (s,) in conn.execute("SELECT snapshot FROM checkpoints")]
    finally:
        conn.close()
    assert versions == [7]
    today = Ledger(epsilon=1e4, delta=1e-5)
    for i in range(600):
        today.charge(M.Gaussian(3.0) if i % 2 else M.ZCDP(0.013))
    replayed[0] = 0
    ledger = Ledger.open(path, read_only=True)
    try:
        assert replayed[0] == 601  # from the genesis, not from the version-7 checkpoint
        assert np.array_equal(ledger.spent, today.spent)
    finally:
        ledger.close()
    with pytest.MonkeyPatch.context() as patch:  # what resuming from it would have held
        patch.setattr(_rows, "changed", lambda data, version=2: False)
        patch.setattr(_rows, "RESUMABLE", frozenset({7}))
        ledger = Ledger.open(path, read_only=True)
        forced = ledger.spent
        ledger.close()
    assert np.all(forced <= today.spent) and np.any(forced < today.spent)  # older, lower
    assert cli_verify(path)["checkpoints"] == 1  # the old snapshot accepted as a revision up
