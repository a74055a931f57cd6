"""An accumulated step's charge against a SubsampledGaussian charge, same machine, same run.

Run: python -m pytest benchmarks/test_bench_accumulation.py --benchmark-only
Issue 27 asks: a cached curve's charge ≤ 2× a SubsampledGaussian charge, and
the first curve of a new (σ, q, k) fast; compare the groups' means.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, Ledger
from privguard import mechanisms as M
from privguard._curves import _sgm
from privguard._mechanisms import _accumulated as acc

GRID = np.array(DEFAULT_ORDERS)


@pytest.mark.benchmark(group="per-charge (cached mechanism)")
def test_charge_subsampled_gaussian(benchmark):
    ledger = Ledger(epsilon=1e9, delta=1e-5)
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger.charge(step)
    benchmark(ledger.charge, step)


@pytest.mark.benchmark(group="per-charge (cached mechanism)")
def test_charge_accumulated(benchmark):
    ledger = Ledger(epsilon=1e9, delta=1e-5)
    step = M.AccumulatedSubsampledGaussian(1.0, 0.01, 4)
    ledger.charge(step)
    benchmark(ledger.charge, step)


_sigmas = itertools.count()


@pytest.mark.benchmark(group="first curve (uncached)")
def test_first_curve_subsampled_gaussian(benchmark):
    benchmark(lambda: _sgm.curve(0.01, 1.0 + next(_sigmas) * 1e-9, GRID))


@pytest.mark.benchmark(group="first curve (uncached)")
def test_first_curve_accumulated(benchmark):
    benchmark(lambda: acc.curve(0.01, 1.0 + next(_sigmas) * 1e-9, 4, GRID))
