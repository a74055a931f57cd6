"""RandomAllocation's cost: a cached charge against SubsampledGaussian's, and a first curve.

Run: python -m pytest benchmarks/test_bench_allocation.py --benchmark-only --benchmark-json=bench_allocation.json
     python benchmarks/report.py bench_allocation.json
The first group's reference entry is the SubsampledGaussian charge (its name contains
"opacus_like" so that report.py divides by it): the issue's bound is 2x.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, Ledger
from privguard import mechanisms as M

DELTA = 1e-5
ORDERS = np.array(DEFAULT_ORDERS)


def _charge_cached(benchmark, mechanism):
    ledger = Ledger(epsilon=1e9, delta=DELTA)
    ledger.charge(mechanism)  # the curve is now cached
    benchmark(ledger.charge, mechanism)


@pytest.mark.benchmark(group="per-charge, cached curve")
def test_charge_subsampled_gaussian_opacus_like(benchmark):
    _charge_cached(benchmark, M.SubsampledGaussian(1.0, 0.001))


@pytest.mark.benchmark(group="per-charge, cached curve")
def test_charge_random_allocation_epoch(benchmark):
    _charge_cached(benchmark, M.RandomAllocation(1.0, 1000))


_fresh = (1.0 + k * 1e-9 for k in itertools.count(1))  # a new σ each round: never cached


@pytest.mark.parametrize("steps", [10, 1000, 10_000])
@pytest.mark.benchmark(group="first curve of a new (sigma, t), default grid")
def test_first_curve(benchmark, steps):
    def run():
        return M.RandomAllocation(next(_fresh), steps).rdp(ORDERS)

    curve = benchmark.pedantic(run, rounds=20, iterations=1, warmup_rounds=2)
    assert curve.shape == ORDERS.shape
