"""The numbers behind tests/test_montecarlo.py, printed.

Run: python benchmarks/montecarlo_report.py   (about a minute)
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from _montecarlo import (  # noqa: E402
    filter_rho_cap,
    lookup_lower,
    lookup_upper,
    naive_curve,
    odometer_curve,
    r_grid,
    run_filter_adversary,
    run_stopping_adversary,
)

from privguard import Concentrated, Ledger, Uniform  # noqa: E402
from privguard import mechanisms as M  # noqa: E402

DELTA, N = 1e-2, 100_000
STEPS, RHO0, GROWTH = 300, 1e-3, 1.025


def main() -> None:
    grid = r_grid(1e-4, 400.0)
    print(f"δ = {DELTA}, {N} runs; odometer adversary: {STEPS} adaptive steps, ρ growing ~1,600x,"
          " stops at its first loss > reported ε")
    for mode in ("tight", "paper"):
        eps = odometer_curve(mode, DELTA, grid)
        crossed, _, _ = run_stopping_adversary(lambda r: lookup_lower(grid, eps, r),
                                               N, STEPS, RHO0, GROWTH, seed=7)
        print(f"  odometer {mode:5s}: P(loss > running ε) = {crossed.mean():.4f}")
    g = grid[::10]
    naive = naive_curve(DELTA, g)
    crossed, _, _ = run_stopping_adversary(lambda r: lookup_upper(g, naive, r),
                                           N, STEPS, RHO0, GROWTH, seed=11)
    print(f"  naive conversion: P(loss > naive ε)  = {crossed.mean():.4f}  (NOT a valid running bound)")
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
