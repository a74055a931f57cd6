"""private_optimize's overhead per trial over bare Optuna (RandomSampler), same run.

Run: python -m pytest benchmarks/test_bench_optuna.py --benchmark-only \
        --benchmark-json=bench_optuna.json
     python benchmarks/report.py bench_optuna.json
     python benchmarks/test_bench_optuna.py      # the interleaved per-trial figures

Both sides run the same objective (three suggestions, no training), 53 trials
(K drawn with seed 0 from Poisson(50), which private_optimize's side uses;
Optuna's side runs n_trials=53). What is measured on privguard's side is
everything it adds: the bound computed and charged, a child ledger, a
restricted trial and a freshly seeded RandomSampler per trial, the reducer.
The issue's target: at most 2 ms per trial over bare Optuna.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import optuna
import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.optuna import private_optimize
from privguard.tuning import Poisson

warnings.filterwarnings("ignore")
optuna.logging.set_verbosity(optuna.logging.WARNING)
COST = M.Gaussian(10.0)
RUNS, TRIALS = Poisson(50.0), 53  # K drawn with seed 0 from Poisson(50)


def _suggest(trial) -> float:
    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    batch = trial.suggest_int("batch", 16, 256, step=16)
    act = trial.suggest_categorical("act", ["relu", "tanh"])
    return lr * batch * (1.0 if act == "relu" else 0.5)


def bare() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler())
    study.optimize(_suggest, n_trials=TRIALS)


def private() -> None:
    private_optimize(lambda trial, child: _suggest(trial), Ledger(epsilon=1e6, delta=1e-5),
                     runs=RUNS, cost=COST, seed=0, progress=False)


@pytest.mark.benchmark(group="53 trials, three suggestions each, no training")
def test_bare_optuna(benchmark):
    benchmark.pedantic(bare, rounds=20, iterations=1, warmup_rounds=2)


@pytest.mark.benchmark(group="53 trials, three suggestions each, no training")
def test_private_optimize(benchmark):
    benchmark.pedantic(private, rounds=20, iterations=1, warmup_rounds=2)


def interleaved(rounds: int = 30) -> tuple[float, float, float]:
    """Median time per trial of each side in ms, the two alternated in one loop so that
    load on a shared machine hits both alike: (bare, private, private − bare)."""
    counted = []
    private_optimize(lambda trial, child: counted.append(1) or 0.0, Ledger(epsilon=1e6, delta=1e-5),
                     runs=RUNS, cost=COST, seed=0, progress=False)
    assert len(counted) == TRIALS  # both sides run the same number of trials
    for _ in range(2):
        bare(), private()
    a, b = [], []
    for i in range(rounds):
        for fn, out in ((bare, a), (private, b)) if i % 2 else ((private, b), (bare, a)):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) / TRIALS * 1e3)
    ma, mb = float(np.median(a)), float(np.median(b))
    return ma, mb, mb - ma


def test_overhead_per_trial_is_at_most_2_ms():
    plain, ours, overhead = interleaved()
    print(f"\nper trial: bare Optuna {plain:.3f} ms, private_optimize {ours:.3f} ms, "
          f"overhead {overhead:.3f} ms ({ours / plain:.2f}×)")
    assert overhead <= 2.0


if __name__ == "__main__":
    _a, _b, _o = interleaved()
    print(f"per trial (medians of 30 interleaved runs of {TRIALS} trials): bare Optuna "
          f"{_a:.3f} ms, private_optimize {_b:.3f} ms, overhead {_o:.3f} ms ({_b / _a:.2f}×)")
