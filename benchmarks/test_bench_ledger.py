"""Ledger cost against Opacus' RDPAccountant doing the same work, same machine, same run.

Run: python -m pytest benchmarks/test_bench_ledger.py --benchmark-only
     python benchmarks/report.py .benchmarks-latest.json   (ratios)
(see docs/performance.md for the full command and the recorded figures).
"""

from __future__ import annotations

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from privguard import DEFAULT_ORDERS, Ledger
from privguard import mechanisms as M

DELTA = 1e-5
ALPHAS = list(DEFAULT_ORDERS)


# --- per-charge cost for a cached mechanism --------------------------------
@pytest.mark.benchmark(group="per-charge (cached mechanism)")
def test_privguard_charge_with_filter(benchmark):
    ledger = Ledger(epsilon=1e6, delta=DELTA)
    step = M.SubsampledGaussian(1.1, 0.004)
    ledger.charge(step)
    benchmark(ledger.charge, step)


@pytest.mark.benchmark(group="per-charge (cached mechanism)")
def test_privguard_charge_odometer_only(benchmark):
    ledger = Ledger(delta=DELTA)
    step = M.SubsampledGaussian(1.1, 0.004)
    ledger.charge(step)
    benchmark(ledger.charge, step)


@pytest.mark.benchmark(group="per-charge (cached mechanism)")
def test_opacus_rdp_accountant_step(benchmark):
    acc = RDPAccountant()
    benchmark(acc.step, noise_multiplier=1.1, sample_rate=0.004)


# --- running-ε query after an adaptive-noise run ---------------------------
def _adaptive_schedule():
    """5,000 steps cycling through 50 distinct (σ, q): an adaptive-noise run."""
    rng = np.random.default_rng(0)
    params = [(float(s), float(q)) for s, q in zip(rng.uniform(0.7, 2.0, 50),
                                                    rng.uniform(0.002, 0.02, 50))]
    return [params[(i // 100) % 50] for i in range(5000)]


@pytest.fixture(scope="module")
def adaptive_ledger():
    ledger = Ledger(delta=DELTA)
    for s, q in _adaptive_schedule():
        ledger.charge(M.SubsampledGaussian(s, q))
    return ledger


@pytest.fixture(scope="module")
def adaptive_accountant():
    acc = RDPAccountant()
    for s, q in _adaptive_schedule():
        acc.step(noise_multiplier=s, sample_rate=q)
    return acc


@pytest.mark.benchmark(group="running-eps query after 5,000 charges, 50 distinct (sigma, q)")
def test_privguard_running_epsilon(benchmark, adaptive_ledger):
    benchmark(adaptive_ledger.epsilon)


@pytest.mark.benchmark(group="running-eps query after 5,000 charges, 50 distinct (sigma, q)")
def test_privguard_nonadaptive_epsilon(benchmark, adaptive_ledger):
    benchmark(adaptive_ledger.nonadaptive_epsilon)


@pytest.mark.benchmark(group="running-eps query after 5,000 charges, 50 distinct (sigma, q)")
def test_opacus_get_epsilon(benchmark, adaptive_accountant):
    benchmark(adaptive_accountant.get_epsilon, DELTA, alphas=ALPHAS)


# --- the whole adaptive run: 5,000 charges, then one query ------------------
@pytest.mark.benchmark(group="adaptive run: 5,000 charges + 1 query")
def test_privguard_adaptive_run(benchmark):
    sched = [M.SubsampledGaussian(s, q) for s, q in _adaptive_schedule()]

    def run():
        ledger = Ledger(delta=DELTA)
        for m in sched:
            ledger.charge(m)
        return ledger.epsilon()

    def cold():  # every round computes its curves again, as Opacus does
        from privguard._mechanisms._base import _cached_curve

        _cached_curve.cache_clear()

    benchmark.pedantic(run, setup=cold, rounds=3, iterations=1)


@pytest.mark.benchmark(group="adaptive run: 5,000 charges + 1 query")
def test_opacus_adaptive_run(benchmark):
    sched = _adaptive_schedule()

    def run():
        acc = RDPAccountant()
        for s, q in sched:
            acc.step(noise_multiplier=s, sample_rate=q)
        return acc.get_epsilon(DELTA, alphas=ALPHAS)

    benchmark.pedantic(run, rounds=3, iterations=1)


@pytest.mark.benchmark(group="per-charge (cached mechanism)")
def test_privguard_charge_sqlite_durable(benchmark, tmp_path):
    ledger = Ledger(epsilon=1e6, delta=DELTA, path=tmp_path / "bench.db")
    step = M.SubsampledGaussian(1.1, 0.004)
    ledger.charge(step)
    benchmark.pedantic(ledger.charge, args=(step,), rounds=2000, iterations=1)
