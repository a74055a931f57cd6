"""A repeated identical charge, with the fast path (privguard/_accounting/_fastpath.py) and without.

The fast path decides another charge of the current streak with an integer comparison
instead of the filter's arithmetic over the grid: its cost does not grow with the grid.
Both variants run in the same session; compare them with benchmarks/report.py.

Run: python -m pytest benchmarks/test_bench_fastpath.py --benchmark-only \
        --benchmark-json=bench_fastpath.json
     python benchmarks/report.py bench_fastpath.json
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, Ledger, Plan
from privguard import mechanisms as M
from privguard._accounting._accounting import Accounting

DELTA = 1e-5
STEP = M.SubsampledGaussian(1.1, 0.004)
GRIDS = {"default grid": list(DEFAULT_ORDERS), "2,000 orders": list(np.geomspace(1.01, 1e4, 2000))}
FILTERS = {"rdp": {}, "hybrid": {"filter": "hybrid", "plan": Plan(STEP)}}


@pytest.mark.parametrize("filter_name", list(FILTERS))
@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "grid arithmetic"])
def test_repeated_charge(benchmark, monkeypatch, fast, grid, filter_name):
    benchmark.group = f"repeated charge, {filter_name} filter, {grid}"
    monkeypatch.setattr(Accounting, "fast", fast)
    # ε = 3 admits more than the 5,021 charges below (RDP: about 12,000), within T_A too
    ledger = Ledger(epsilon=3.0, delta=DELTA, orders=GRIDS[grid], **FILTERS[filter_name])
    ledger.charge(STEP)
    benchmark.pedantic(ledger.charge, (STEP,), rounds=5000, iterations=1, warmup_rounds=20)
