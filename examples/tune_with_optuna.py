"""Tuning an Opacus model on digits with Optuna's API, privately — RandomSampler vs DPHyPOSampler.

Run: python examples/tune_with_optuna.py [--mean 8] [--quick]      (CI=true implies --quick)

The objective is plain Optuna: ``trial.suggest_float("lr", ..., log=True)``
and ``trial.suggest_categorical("clip", ...)``; it trains a small MLP on
scikit-learn's digits with DP-SGD (Opacus, σ = 1.0, batch 64), charges every
step to its child ledger through ``attach``, and scores itself by a DP count
of correctly classified private validation examples (Gaussian noise, std 5).
``private_optimize`` draws the number of trials K at random (geometric),
charges the whole tuning bound before the first trial, and returns the best
trial only.

Two arms at the same total ε and the same K ~ Geometric(mean --mean):
``RandomSampler`` (i.i.d. trials, random-K bound, seed 002) with σ = 1, and
``DPHyPOSampler`` (GP rule, C = 2, c = 0.75, DP-HyPO Theorem 1, seed 003) on
the discretised grid, with the smallest σ whose bound does not exceed the
random arm's (it pays for adaptivity with more noise in every trial, the
paper's white-box setting). Each arm runs on its own ledger of ε = 12. Prints each arm's winner, its test accuracy, the tuning ε
charged and the ε of composing ⌈E[K]⌉ trials naively.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
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
from tune_random_k import split_validation  # the same private validation split

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.opacus import attach
from privguard.integrations.optuna import DPHyPOSampler, private_optimize, tuning_plan
from privguard.tuning import Geometric

BATCH, SIGMA, VAL_STD, DELTA = 64, 1.0, 5.0, 1e-5
LRS, CLIPS = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0], [0.5, 1.0, 2.0]


def cost_of(sigma: float, q: float, steps: int) -> M.Composed:
    """One trial: DP-SGD with noise ``sigma`` and the noisy validation count."""
    return M.Composed((M.SubsampledGaussian(sigma, q, steps), M.Gaussian(VAL_STD)))


def matched_sigma(runs, q: float, steps: int, target: float) -> float:
    """The smallest σ whose DP-HyPO bound stays ≤ ``target`` (bisection on σ)."""
    sampler = DPHyPOSampler({"lr": LRS, "clip": CLIPS}, rule=lambda h, x: np.ones(len(x)))

    def eps(sigma: float) -> float:
        return tuning_plan(runs=runs, cost=cost_of(sigma, q, steps), delta=DELTA,
                           sampler=sampler).epsilon

    lo, hi = SIGMA, 50.0
    if eps(hi) > target:
        raise SystemExit("DP-HyPO cannot match the random arm's ε with any σ <= 50")
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if eps(mid) <= target else (mid, hi)
    return hi


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mean", type=float, default=8.0, help="E[K] of the random arm")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="CI: E[K] = 3, 2 epochs")
    parser.add_argument("--seed", type=int, default=None,
                        help="tests only: makes K predictable, which breaks the guarantee")
    args = parser.parse_args(argv)
    if args.quick or os.environ.get("CI") == "true":
        args.mean, args.epochs = 3.0, 2
    start = time.time()

    train_all, test = digits(0)
    train, val = split_validation(train_all, 0)
    q, steps = opacus_rate_and_steps(len(train), BATCH, args.epochs)  # what Opacus will charge
    rng = np.random.default_rng(args.seed)  # OS entropy unless seeded (tests only)

    def objective_with(sigma: float):
        def objective(trial, child: Ledger):
            lr = trial.suggest_float("lr", LRS[0], LRS[-1], log=True)
            clip = trial.suggest_categorical("clip", CLIPS)
            model, opt, loader = make_private(mlp(), train, BATCH, sigma, lr=lr, clip=clip,
                                              seed=int(rng.integers(1 << 30)))
            attach(opt, child, data_loader=loader)
            for _ in range(args.epochs):
                train_epoch(model, opt, loader)
            child.charge(M.Gaussian(VAL_STD), label="noisy validation count")
            score = correct_count(model, val) + rng.normal(0.0, VAL_STD)
            trial.set_user_attr("noisy_validation_count", round(float(score), 1))
            return score, model

        return objective

    runs = Geometric(mean=args.mean)
    random_plan = tuning_plan(runs=runs, cost=cost_of(SIGMA, q, steps), delta=DELTA)
    hypo_sigma = matched_sigma(runs, q, steps, random_plan.epsilon)
    arms = {
        "RandomSampler": (None, SIGMA),
        "DPHyPOSampler": (DPHyPOSampler({"lr": LRS, "clip": CLIPS}), hypo_sigma),
    }
    print(f"digits MLP, DP-SGD batch {BATCH}, {args.epochs} epochs per trial, K ~ {runs}")
    summary: dict = {"delta": DELTA}
    for name, (sampler, sigma) in arms.items():
        per_trial = cost_of(sigma, q, steps)
        plan = tuning_plan(runs=runs, cost=per_trial, delta=DELTA, sampler=sampler)
        ledger = Ledger(epsilon=12.0, delta=DELTA)
        result = private_optimize(objective_with(sigma), ledger, runs=runs, cost=per_trial,
                                  sampler=sampler, direction="maximize", seed=args.seed,
                                  progress=False)
        test_acc = accuracy(result.artifact, test) if result.selected else None
        summary[name] = {"sigma": sigma, "tuning_epsilon": plan.epsilon,
                         "naive_composition_epsilon": plan.naive_epsilon,
                         "selected": result.best_params, "test_accuracy": test_acc,
                         "user_attrs": result.best_user_attrs}
        shown = "no trial selected" if not result.selected else (
            f"best_params {result.best_params}, test accuracy {test_acc:.4f}")
        print(f"\n{name} (σ = {sigma:.3f}): {shown}")
        print(f"  tuning ε = {up(plan.epsilon)} at δ = {DELTA:g}, charged before the first "
              f"trial; naive composition of {math.ceil(runs.mean)} trials: ε = "
              f"{up(plan.naive_epsilon)}")
    print(f"\n(the winner is all a run releases: not K, not failed or pruned trials; "
          f"{time.time() - start:.0f} s)")
    return summary


if __name__ == "__main__":
    main()
