"""The demo's random-K tuning, serially and on a local Ray instance with 2 workers.

Run: python examples/tune_on_ray.py [--quick]

Tunes the learning rate of a DP-SGD model on scikit-learn's digits with a
Poisson number of runs (mean 12; as `privguard demo` does), once in this process and
once as Ray tasks on a local Ray instance with 2 CPUs. Both runs use the same
seed — for this comparison only; a seeded K breaks the guarantee — so they
draw the same candidates and select the same one. The same tuning bound is
charged to each ledger before anything runs. Ray runs twice: with fresh
workers (which first import torch and Opacus) and again with warm ones.
Prints the results and the wall times.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray
from _common import correct_count, digits, make_private, mlp, opacus_rate_and_steps, train_epoch
from _fmt import up

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.opacus import attach
from privguard.integrations.ray import RayExecutor
from privguard.tuning import Poisson, RandomSearch

BATCH, SIGMA, EPOCHS, VAL_STD, SEED, MEAN_RUNS = 64, 1.0, 10, 5.0, 1, 12.0


def objective(params, child):
    """One candidate: DP-SGD on digits, scored by a noisy validation count (both charged)."""
    train, test = digits(0)
    model, opt, loader = make_private(mlp(), train, BATCH, SIGMA, lr=params["lr"],
                                      seed=params["seed"])
    attach(opt, child, data_loader=loader)
    for _ in range(EPOCHS):
        train_epoch(model, opt, loader)
    child.charge(M.Gaussian(VAL_STD), label="noisy validation count")
    noise = np.random.default_rng(params["seed"]).normal(0.0, VAL_STD)
    return correct_count(model, test) + noise


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: a Poisson number of runs of mean 4")
    args = parser.parse_args(argv)
    mean_runs = 4.0 if args.quick else MEAN_RUNS
    train, _ = digits(0)
    q, steps = opacus_rate_and_steps(len(train), BATCH, EPOCHS)
    cost = M.Composed((M.SubsampledGaussian(SIGMA, q, steps), M.Gaussian(VAL_STD)))
    space = {"lr": [0.05, 0.1, 0.2, 0.5, 1.0, 2.0], "seed": list(range(100))}
    out = {}
    t0 = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    ray_start = time.time() - t0
    try:
        out = _compare(space, cost, mean_runs)
    finally:
        ray.shutdown()
    same = all(out["serial"]["selected"] == out[k]["selected"]
               and (out["serial"]["spent"] == out[k]["spent"]).all() for k in out)
    print(f"same selection and same ledger charge on every backend: {same}")
    print(f"speed-up over serial on this machine's 2 cores: "
          f"{out['serial']['seconds'] / out['ray']['seconds']:.2f}× with fresh workers, "
          f"{out['serial']['seconds'] / out['ray (warm workers)']['seconds']:.2f}× with warm ones "
          f"(starting the local Ray instance took another {ray_start:.1f} s)")
    return {"same": same, "ray_start_seconds": ray_start, "serial_seconds": out["serial"]["seconds"],
            "ray_seconds": out["ray"]["seconds"],
            "ray_warm_seconds": out["ray (warm workers)"]["seconds"],
            "selected": out["ray"]["selected"]}


def _compare(space, cost, mean_runs: float) -> dict:
    out = {}
    for name in ("serial", "ray", "ray (warm workers)"):
        tuner = RandomSearch(space, Poisson(mean_runs), cost=cost, seed=SEED, progress=False)
        ledger = Ledger(epsilon=12.0, delta=1e-5)
        start = time.time()
        backend = RayExecutor(num_cpus=1) if name.startswith("ray") else None
        result = tuner.run(objective, ledger, backend=backend)
        out[name] = {"seconds": time.time() - start, "selected": result.params,
                     "tuning_epsilon": tuner.plan(1e-5).epsilon}
        out[name]["spent"] = ledger.spent
        print(f"{name:18s}: selected lr = {result.params['lr']} "
              f"(candidate seed {result.params['seed']}), tuning ε = "
              f"{up(out[name]['tuning_epsilon'])} at δ = 1e-5 (rounded up), {out[name]['seconds']:.1f} s")
    return out


if __name__ == "__main__":
    main()
