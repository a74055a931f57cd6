"""A version-7 fix entry over a ``Composed`` plan of Gaussian and zCDP parts still loads
(task lo9; review radv8 left it untested). Version 7 summed a ``Composed``'s curves rounding
up (4fcbec5) but computed its parts' α/(2σ²) and ρα to nearest (rounded up since version 8).
The plan below puts ``Concentrated``'s order elsewhere with those curves than with today's
and than with ``_legacy.pre_sum_up``'s (parts and sums to nearest), so only
``_legacy.pre_gaussian_up`` re-derives its entry (found by bisecting ε at each boundary)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from test_radv8_gaussian_up_legacy import opens_and_goes_on

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting._shares import Concentrated
from privguard._curves import _legacy
from privguard._curves._orders import DEFAULT_ORDERS

ORDERS = np.asarray(DEFAULT_ORDERS, dtype=float)
PLAN = M.Composed((M.Gaussian(0.5), M.ZCDP(0.3)))
EPSILON, DELTA = 2.449071997179299, 1e-6  # Concentrated: order index 94 (today), 95 (v7)

_WRITE_VERSION_7 = r"""
import sys
import numpy as np
from privguard import Ledger, Plan
from privguard import mechanisms as M
from privguard._stores import _rows

# version 7: the parts' curves to nearest (α/fl(2σ²), fl(ρα)), Composed's sum rounded up
M.Gaussian._rdp = lambda self, o: np.maximum(o / (2 * self.noise_multiplier**2), 5e-324)
M.ZCDP._rdp = lambda self, o: self.rho * o
_rows.CHECKPOINT_CURVES = 7  # what privguard wrote before review radv8
plan = M.Composed((M.Gaussian(0.5), M.ZCDP(0.3)))
ledger = Ledger(epsilon=float(sys.argv[2]), delta=float(sys.argv[3]), path=sys.argv[1],
                plan=Plan(plan))
ledger.charge(M.Gaussian(30.0))
ledger.close()
"""


def _index(context=None) -> int:
    if context is None:
        curve = PLAN.rdp(ORDERS)
    else:
        with context():
            curve = PLAN._rdp_checked(ORDERS)
    return int(Concentrated()._index(ORDERS, EPSILON, DELTA, curve))


def test_the_case_needs_the_version_7_curves_and_no_other():
    version_7 = _index(_legacy.pre_gaussian_up)
    assert version_7 != _index() and version_7 != _index(_legacy.pre_sum_up)


@pytest.fixture
def version_7_file(tmp_path) -> str:
    path = str(tmp_path / "v7.db")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _WRITE_VERSION_7, path, repr(EPSILON), repr(DELTA)],
                   env=env, check=True, timeout=300)
    return path


def test_a_version_7_composed_fix_entry_opens(version_7_file):
    opens_and_goes_on(version_7_file)


def test_it_is_refused_without_pre_gaussian_up(version_7_file, monkeypatch):
    # the premise: no other legacy context re-derives this entry
    monkeypatch.setattr(_legacy, "pre_gaussian_up", _legacy.pre_sum_up)
    with pytest.raises(LedgerStateError, match="choices fixed from the plan"):
        Ledger.open(version_7_file)
