"""Tuner overhead and σ calibration time, against Opacus' own calibration, same run.

Run: python -m pytest benchmarks/test_bench_tuning.py --benchmark-only \
        --benchmark-json=bench_tuning.json
     python benchmarks/report.py bench_tuning.json
"""

from __future__ import annotations

import warnings

import pytest
from opacus.accountants.utils import get_noise_multiplier

from privguard import DEFAULT_ORDERS, Ledger
from privguard import mechanisms as M
from privguard._mechanisms._base import _cached_curve
from privguard.tuning import (
    Poisson,
    RandomSearch,
    calibrate_noise_multiplier,
    calibrate_tuning_noise,
)

warnings.filterwarnings("ignore")
RUN = M.SubsampledGaussian(1.0, 0.004, steps=2000)


def _objective(params, child):
    child.charge(RUN)  # the candidate's whole declared run, in one charge
    return params["lr"]


@pytest.mark.benchmark(group="tuning: 50 candidates whose objective does no training")
def test_random_search_run(benchmark):
    tuner = RandomSearch({"lr": [0.01, 0.1, 1.0]}, Poisson(50.0), cost=RUN, seed=0, progress=False)
    benchmark.pedantic(lambda: tuner.run(_objective, Ledger(epsilon=1e6, delta=1e-5)),
                       rounds=20, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="tuning: 50 candidates whose objective does no training")
def test_objective_alone(benchmark):
    ledger = Ledger(delta=1e-5)

    def fifty():
        for _ in range(55):  # K drawn with seed 0 from Poisson(50)
            _objective({"lr": 0.1}, ledger.child(RUN))

    benchmark.pedantic(fifty, rounds=20, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="σ calibration: q = 0.004, 10,000 steps, (ε = 3, δ = 1e-5)")
def test_privguard_calibrate(benchmark):
    benchmark.pedantic(calibrate_noise_multiplier, args=(0.004, 10_000, 3.0, 1e-5),
                       setup=_cached_curve.cache_clear, rounds=3, iterations=1)


@pytest.mark.benchmark(group="σ calibration: q = 0.004, 10,000 steps, (ε = 3, δ = 1e-5)")
def test_opacus_get_noise_multiplier_rdp(benchmark):
    benchmark.pedantic(get_noise_multiplier,
                       kwargs=dict(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.004,
                                   steps=10_000, accountant="rdp", epsilon_tolerance=0.003),
                       rounds=3, iterations=1)


@pytest.mark.benchmark(group="σ calibration: q = 0.004, 10,000 steps, (ε = 3, δ = 1e-5)")
def test_privguard_calibrate_whole_tuning(benchmark):
    benchmark.pedantic(calibrate_tuning_noise, args=(0.004, 10_000, Poisson(10.0), 3.0, 1e-5),
                       setup=_cached_curve.cache_clear, rounds=3, iterations=1)


def test_calibrations_agree():
    ours = calibrate_noise_multiplier(0.004, 10_000, 3.0, 1e-5, orders=DEFAULT_ORDERS)
    theirs = get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.004,
                                  steps=10_000, accountant="rdp", epsilon_tolerance=0.003)
    assert abs(ours - theirs) / theirs < 0.01
