"""Build the cached accuracy landscape used by examples/dp_hypo_digits.py (run once; ~2–3 min).

Run: python examples/dp_hypo_landscape.py   → writes examples/data/dp_hypo_landscape.json

DP-SGD on scikit-learn's digits (MLP 64-64-10, batch 64, 5 epochs) over a
grid of learning rates (13, log-spaced 1e-3..10 by a factor 10^(1/3)) and
clipping norms (10, 0.3..3.0 by 0.3), for the two noise multipliers the
comparison needs: σ_gp and σ_uniform are calibrated (never overshooting) so
that DP-HyPO with C = 2, c = 0.75 and uniform random search, both with a
geometric number of runs of mean 10, each cost ε = 8 at δ = 1e-5 in total —
the uniform tuner's base runs get the budget the adaptive one pays for
adaptivity, as in seed 003 §4.2.1. Mean and standard deviation of the test
accuracy over 3 training seeds per grid point.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from _common import accuracy, digits, make_private, mlp, train_epoch

from privguard import DEFAULT_ORDERS, RDPCurve
from privguard import mechanisms as M
from privguard.tuning import Geometric
from privguard.tuning._calibration import smallest_sigma

BATCH, EPOCHS, SEEDS = 64, 5, 3
TOTAL_EPS, DELTA, C, c = 8.0, 1e-5, 2.0, 0.75
LRS = [float(x) for x in np.round(np.logspace(-3, 1, 13), 6)]
CLIPS = [float(x) for x in np.round(np.arange(0.3, 3.01, 0.3), 2)]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "dp_hypo_landscape.json")


def base(sigma: float, q: float, steps: int) -> M.SubsampledGaussian:
    return M.SubsampledGaussian(sigma, q, steps)


def calibrated_sigmas(q: float, steps: int) -> dict:
    runs = Geometric(mean=10.0)
    grid = np.array(DEFAULT_ORDERS)
    eps = lambda mech: RDPCurve(grid, mech.rdp(grid)).epsilon(DELTA)
    return {
        "uniform": smallest_sigma(lambda s: eps(M.RepeatAndSelect(base(s, q, steps), runs)) <= TOTAL_EPS),
        "gp": smallest_sigma(lambda s: eps(M.DPHyPO(base(s, q, steps), runs, C, c)) <= TOTAL_EPS),
    }


def main() -> None:
    start = time.time()
    train, test = digits(0)
    q = BATCH / len(train)
    steps = EPOCHS * round(len(train) / BATCH)
    sigmas = calibrated_sigmas(q, steps)
    print(f"σ_uniform = {sigmas['uniform']:.4f}, σ_gp = {sigmas['gp']:.4f} (q = {q:.5f}, {steps} steps)")
    out = {"lr": LRS, "clip": CLIPS, "sigma": sigmas, "sample_rate": q, "steps": steps,
           "total_epsilon": TOTAL_EPS, "delta": DELTA, "C": C, "c": c, "mean_runs": 10.0,
           "command": "python examples/dp_hypo_landscape.py", "mean": {}, "std": {}}
    for method, sigma in sigmas.items():
        mean, std = [], []
        for lr in LRS:
            for clip in CLIPS:
                accs = []
                for seed in range(SEEDS):
                    model, opt, loader = make_private(mlp(), train, BATCH, sigma, lr=lr, clip=clip,
                                                      seed=seed)
                    for _ in range(EPOCHS):
                        train_epoch(model, opt, loader)
                    acc = accuracy(model, test)
                    accs.append(acc if np.isfinite(acc) else 0.0)
                mean.append(float(np.mean(accs)))
                std.append(float(np.std(accs)))
        out["mean"][method], out["std"][method] = mean, std
        print(f"{method}: best mean accuracy {max(mean):.4f} ({time.time() - start:.0f} s)")
    with open(OUT, "w") as fh:
        json.dump(out, fh)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
