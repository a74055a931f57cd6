"""A tuning run on Ray whose losing candidate returns an artifact that fails to unpickle at
the driver (tests/test_ray.py, review tl). Run as a script: Ray's loggers then print as they
do for a user (no pytest handlers). Prints the result; argv[1] is Ray's temp folder."""

import sys

import ray

from privguard import Ledger
from privguard import mechanisms as M
from privguard.tuning import Poisson, RandomSearch


def _rebuild():
    raise ValueError("loser artifact 0.987654321")


class FailsAtTheDriver:
    def __reduce__(self):
        return _rebuild, ()


def objective(params, child):
    if params["lr"] == 0.2:
        return 0.5, FailsAtTheDriver()  # a loser's artifact
    return 1.0


if __name__ == "__main__":
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=sys.argv[1],
             _node_ip_address="127.0.0.1", configure_logging=False)
    tuner = RandomSearch({"lr": [0.1, 0.2]}, Poisson(6.0), cost=M.Gaussian(50.0), seed=3,
                         progress=False)
    print(tuner.run(objective, Ledger(epsilon=80.0, delta=1e-5), backend="ray"), flush=True)
    ray.shutdown()
