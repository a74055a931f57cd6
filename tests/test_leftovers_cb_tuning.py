"""Leftovers of the last stop in the tuners and their executors (task cb)."""

from __future__ import annotations

import threading

import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.tuning import Poisson, RandomSearch

RUN = M.SubsampledGaussian(1.0, 0.01, steps=10)


# ---- 6. another thread using the tuned ledger while the candidates run

def test_another_threads_charge_during_tuning_is_refused_saying_why_and_what_to_do():
    # The ledger is held in every thread while candidates run (docs/theory.md §7: a
    # candidate may start threads; a thread-specific hold would let one charge per candidate
    # through). The refusal said only that a tuner held it: it says that no thread is exempt
    # and what the other thread does (wait for tuner.run, or charge a separate ledger).
    ledger = Ledger(epsilon=20.0, delta=1e-5)
    running, probed, refused = threading.Event(), threading.Event(), []

    def objective(params, child):
        running.set()
        probed.wait(60)
        return 1.0

    def probe():
        running.wait(60)
        try:
            ledger.charge(M.Gaussian(10.0), label="evaluation")
        except LedgerStateError as exc:
            refused.append(str(exc))
        finally:
            probed.set()

    thread = threading.Thread(target=probe)
    thread.start()
    result = RandomSearch({"x": [1]}, Poisson(2.0), cost=RUN, seed=0, progress=False).run(
        objective, ledger)
    thread.join()
    assert result.selected and len(ledger.history) == 1  # the tuning bound only
    assert len(refused) == 1
    assert "no thread is exempt" in refused[0] and "tuner.run(...) has returned" in refused[0]
    ledger.charge(M.Gaussian(10.0), label="evaluation")  # after the run: admitted


# ---- 7. RayExecutor.run without prepare

def test_ray_executor_run_without_prepare_is_refused_before_ray_starts(tmp_path):
    # prepare(objective) refuses an objective that carries a file-backed ledger (every
    # worker would reopen it); run() without prepare shipped it unchecked.
    ray = pytest.importorskip("ray")
    from privguard.integrations.ray import RayExecutor

    stored = Ledger(delta=1e-5, path=str(tmp_path / "ledger.json"))

    def objective(params, child):
        stored.charge(M.Gaussian(10.0))
        return 1.0

    seen = []
    task = (objective, {"x": 1}, stored.orders, stored.orders * 0 + 1.0)
    executor = RayExecutor(num_cpus=1)
    was_running = ray.is_initialized()
    with pytest.raises(InvalidArgumentError, match="prepare"):
        executor.run([task], lambda *outcome: seen.append(outcome))
    assert seen == [] and len(stored.history) == 0
    assert ray.is_initialized() == was_running
    executor._prepared = (lambda params, child: 0.0, None)  # another objective prepared
    with pytest.raises(InvalidArgumentError, match="not the one given to prepare"):
        executor.run([task], lambda *outcome: seen.append(outcome))
    assert seen == [] and len(stored.history) == 0
