"""Random-K tuning of the learning rate (and clipping norm) under a ledger — seed 002.

Run: python examples/tune_random_k.py [--runs poisson|logarithmic] [--mean 8] [--quick]

Each candidate trains a small MLP on scikit-learn's digits with DP-SGD
(Opacus, σ = 1.0, batch 64, 8 epochs) and scores itself by a DP count of
correctly classified private validation examples (Gaussian noise, std 5):
both are its declared cost, enforced by its child ledger. The number of
candidates K is random (Poisson or logarithmic, from OS entropy), the whole
tuning bound is charged to the ledger before anything runs, and only the best
candidate comes back. Prints the selected hyperparameters, its test accuracy,
the tuning ε and, for comparison, the ε that naive composition over the same
expected number of runs would have charged.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import (
    accuracy,
    correct_count,
    digits,
    make_private,
    mlp,
    opacus_rate_and_steps,
    train_epoch,
)
from _fmt import up
from torch.utils.data import TensorDataset

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.opacus import attach
from privguard.tuning import Logarithmic, Poisson, RandomSearch

BATCH, SIGMA, EPOCHS, VAL_STD = 64, 1.0, 8, 5.0


def split_validation(train: TensorDataset, seed: int):
    x, y = train.tensors
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = len(y) * 4 // 5
    return (TensorDataset(x[idx[:cut]], y[idx[:cut]]), TensorDataset(x[idx[cut:]], y[idx[cut:]]))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", choices=["poisson", "logarithmic"], default="poisson")
    parser.add_argument("--mean", type=float, default=8.0)
    parser.add_argument("--epsilon", type=float, default=12.0, help="the ledger's budget")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--quick", action="store_true", help="CI: K with mean 3")
    parser.add_argument("--seed", type=int, default=None,
                        help="tests only: makes K predictable, which breaks the guarantee")
    args = parser.parse_args(argv)
    if args.quick:
        args.mean = 3.0
    start = time.time()

    train_all, test = digits(0)
    train, val = split_validation(train_all, 0)
    q, steps = opacus_rate_and_steps(len(train), BATCH, EPOCHS)  # what Opacus will charge
    per_candidate = M.Composed((M.SubsampledGaussian(SIGMA, q, steps), M.Gaussian(VAL_STD)))
    runs = Poisson(args.mean) if args.runs == "poisson" else Logarithmic(mean=args.mean)
    rng = np.random.default_rng(args.seed)  # OS entropy unless seeded (tests only)

    def objective(params: dict, child: Ledger):
        model, opt, loader = make_private(mlp(), train, BATCH, SIGMA, lr=params["lr"],
                                          clip=params["clip"], seed=int(rng.integers(1 << 30)))
        assert loader.sample_rate == q and len(loader) * EPOCHS == steps
        attach(opt, child, data_loader=loader)
        for _ in range(EPOCHS):
            train_epoch(model, opt, loader)
        child.charge(M.Gaussian(VAL_STD), label="noisy validation count")
        score = correct_count(model, val) + rng.normal(0.0, VAL_STD)
        return score, model

    tuner = RandomSearch({"lr": [0.05, 0.1, 0.2, 0.5, 1.0, 2.0], "clip": [0.5, 1.0, 2.0]},
                         runs, cost=per_candidate, seed=args.seed)
    plan = tuner.plan(args.delta)
    ledger = Ledger(epsilon=args.epsilon, delta=args.delta)
    print(f"digits MLP, DP-SGD σ={SIGMA}, batch {BATCH}, {EPOCHS} epochs per candidate; "
          f"K ~ {runs}")
    print(plan)
    result = tuner.run(objective, ledger)
    if not result.selected:
        print("no candidate selected")
        return {"selected": False}
    test_acc = accuracy(result.artifact, test)
    summary = {"selected": result.params, "test_accuracy": test_acc, "tuning_epsilon": plan.epsilon,
               "naive_composition_epsilon": plan.naive_epsilon, "delta": args.delta,
               "ledger_running_epsilon": ledger.epsilon()}
    print(f"\nselected {result.params} (the winner is all a tuning run releases: "
          f"not K, not failures)")
    print(f"test accuracy of the selected model: {test_acc:.4f}")
    print(f"tuning ε = {up(plan.epsilon)} at δ = {args.delta:g} (seed 002, charged up front); "
          f"naive composition of {int(np.ceil(runs.mean))} runs would charge ε = "
          f"{up(plan.naive_epsilon)}")
    print(f"(the ledger's running ε, an odometer over everything it was charged: "
          f"{up(ledger.epsilon())}; {time.time() - start:.0f} s)")
    return summary


if __name__ == "__main__":
    main()
