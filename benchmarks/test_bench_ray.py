"""Per-candidate overhead of the Ray backend against the serial one (local Ray, 2 CPUs).

Run: python -m pytest benchmarks/test_bench_ray.py --benchmark-only --benchmark-json=bench_ray.json
     python benchmarks/report.py bench_ray.json
The speed-up on a real workload is printed by python examples/tune_on_ray.py.
"""

from __future__ import annotations

import pytest
import ray

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.ray import RayExecutor
from privguard.tuning import Poisson, RandomSearch

RUN = M.SubsampledGaussian(1.0, 0.01, steps=50)


def make_trivial():
    """Defined in a closure so that cloudpickle ships it by value to Ray's workers."""
    run = RUN

    def trivial(params, child):
        child.charge(run)
        return params["x"]

    return trivial


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def _tuner():
    return RandomSearch({"x": [1, 2, 3]}, Poisson(40.0), cost=RUN, seed=0, progress=False)


@pytest.mark.benchmark(group="trivial candidates, K = 43 (Poisson(40), seed 0)")
def test_serial_backend(benchmark):
    benchmark.pedantic(lambda: _tuner().run(make_trivial(), Ledger(epsilon=1e6, delta=1e-5)),
                       rounds=10, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="trivial candidates, K = 43 (Poisson(40), seed 0)")
def test_ray_backend_warm(benchmark):
    ex = RayExecutor()
    benchmark.pedantic(lambda: _tuner().run(make_trivial(), Ledger(epsilon=1e6, delta=1e-5),
                                                       backend=ex),
                       rounds=10, iterations=1, warmup_rounds=2)
