"""The budget meter costs at most what the running ε costs (issue 25).

Run: python -m pytest benchmarks/test_bench_budget.py --benchmark-only
Each group compares ``ledger.budget()`` with ``ledger.epsilon()`` on the same
ledger in the same run (the baseline).
"""

from __future__ import annotations

import pytest

from privguard import Ledger, Plan
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


@pytest.fixture(scope="module")
def rdp_ledger():
    ledger = Ledger(epsilon=3.0, delta=1e-5)
    ledger.charge(STEP, times=2000)
    return ledger


@pytest.fixture(scope="module")
def hybrid_ledger():
    ledger = Ledger(epsilon=3.0, delta=1e-5, plan=Plan(STEP, steps=2600), filter="hybrid")
    ledger.charge(STEP, times=2600)
    ledger.budget()  # part A's PLD ε at this grid count: computed once, then cached
    return ledger


@pytest.mark.parametrize("kind", ["rdp", "hybrid"])
@pytest.mark.parametrize("query", ["budget", "epsilon"])
def test_meter_vs_running_epsilon(benchmark, request, kind, query):
    ledger = request.getfixturevalue(f"{kind}_ledger")
    benchmark.group = f"meter vs running ε ({kind} filter)"
    benchmark(getattr(ledger, query))
