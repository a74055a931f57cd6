"""Numbers for docs/theory.md §14.2: what a curve valid for any per-draw gradients costs.

Run: ``python benchmarks/accumulation_per_draw.py``. For σ ∈ {0.8, 1, 1.5},
q ∈ {0.004, 0.01, 0.05}, k ∈ {2, 4, 8} and 100, 300, 1000, 3000 steps, prints
the ε at δ = 1e-5 of ``AccumulatedSubsampledGaussian(σ, q, k, T)`` with
``aligned=True`` (one gradient per example and step, §14 Lemmas 14.1–14.4)
and with the default ``aligned=False`` (any vectors, Lemmas 14.5–14.7), the
relative difference, and the time of the first default curve on the default
grid. The last line is the largest difference.
"""

from __future__ import annotations

import time

import numpy as np

from privguard import DEFAULT_ORDERS, RDPCurve
from privguard import mechanisms as M

GRID = np.array(DEFAULT_ORDERS)
STEPS = (100, 300, 1000, 3000)


def main() -> None:
    print("sigma q k | steps: eps aligned -> eps default (difference) | first curve ms")
    worst = 0.0
    for sigma in (0.8, 1.0, 1.5):
        for q in (0.004, 0.01, 0.05):
            for k in (2, 4, 8):
                start = time.perf_counter()
                default = M.AccumulatedSubsampledGaussian(sigma, q, k).rdp(GRID)
                first = (time.perf_counter() - start) * 1e3
                aligned = M.AccumulatedSubsampledGaussian(sigma, q, k, aligned=True).rdp(GRID)
                cells = []
                for steps in STEPS:
                    a = RDPCurve(GRID, aligned * steps).epsilon(1e-5)
                    d = RDPCurve(GRID, default * steps).epsilon(1e-5)
                    worst = max(worst, d / a - 1.0)
                    cells.append(f"{steps}: {a:.3f} -> {d:.3f} ({100 * (d / a - 1):+.1f}%)")
                print(f"{sigma} {q} {k} | " + " | ".join(cells) + f" | {first:.0f}")
    print(f"largest difference: {100 * worst:+.1f}%")


if __name__ == "__main__":
    main()
