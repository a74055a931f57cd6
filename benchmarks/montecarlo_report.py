"""The numbers behind tests/test_montecarlo.py, printed.

Run: python benchmarks/montecarlo_report.py   (a few minutes of CPU)
Same constructions, strategies and seeds as the test; also runs "aim"
against every bound (the test runs it against the required ones only).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from _montecarlo import (
    DELTA,
    INVALID,
    PLAN_EVERY,
    RHO0,
    RUNS,
    STEPS,
    STRATEGIES,
    VALID,
    binomial_tolerance,
    filter_rho_cap,
    odometer_bounds,
    run_adversary,
    run_filter_adversary,
)

from privguard import DEFAULT_ORDERS, Concentrated, Ledger, Plan, Uniform
from privguard import mechanisms as M
from privguard._accounting._odometer import mixture_weights, paper_excess_bound

SEEDS = {"plan": 101, "ahead": 202, "aim": 303}  # as in tests/test_montecarlo.py


def main() -> None:
    bounds = odometer_bounds()
    print(f"odometer: δ = {DELTA}, {RUNS:,} runs of {STEPS:,} adaptive steps (ρ0 = {RHO0}; "
          f"plan: {STEPS:,} steps of ρ0, read every {PLAN_EVERY}); ε read after every step; "
          "the adversary stops at its first loss > ε")
    print(f"pass: P(∃t: loss > ε_t) <= δ + 4 s.e. = {DELTA + binomial_tolerance(DELTA, RUNS):.5f}")
    results = {s: run_adversary(s, bounds, SEEDS[s]) for s in ("plan", "ahead")}
    aim = {name: run_adversary("aim", {name: bounds[name]}, SEEDS["aim"] + i)
           for i, name in enumerate(VALID + INVALID)}
    plan_weights = mixture_weights(np.array(DEFAULT_ORDERS),
                                   Plan(M.ZCDP(rho=RHO0), steps=STEPS, every=PLAN_EVERY), DELTA)
    print(f"mixture with this plan <= {paper_excess_bound(plan_weights, DELTA):.4f} x paper "
          "for any spend (proven, docs/theory.md §3.6)")
    growth = min([r.growth for r in results.values()] + [r.growth for r in aim.values()])
    print(f"min over strategies and non-stopping runs of R_final / R_first = {growth:,.0f}")
    print(f"| bound | {' | '.join(STRATEGIES)} |")
    print("|---|" + "---|" * len(STRATEGIES))
    for name in VALID + INVALID:
        cells = [results[s].crossed[name] for s in ("plan", "ahead")] + [aim[name].crossed[name]]
        tag = "" if name in VALID else " (NOT valid)"
        print(f"| {name}{tag} | " + " | ".join(f"{p:.5f}" for p in cells) + " |")
    eps_t = 4.0
    print(f"(ε = {eps_t}, δ = {DELTA}) filter, adaptive σ, adversary stops at its first loss > ε:")
    for name, shares in [("default", Concentrated()), ("uniform", Uniform()),
                         ("single order", Concentrated(1.0))]:
        cap = filter_rho_cap(Ledger(eps_t, DELTA, plan=M.Gaussian(10.0), shares=shares))
        L = run_filter_adversary(cap, eps_t, 200_000, 0.002, seed=3)
        hockey = np.mean(np.maximum(0.0, 1 - np.exp(eps_t - L)))
        print(f"  {name:12s}: E[(1 - e^(ε-L))+] = {hockey:.5f} (the (ε,δ)-DP statement, ≤ δ);"
              f" P(L > ε) = {np.mean(L > eps_t):.4f} (a tail the filter does not promise)")


if __name__ == "__main__":
    main()
