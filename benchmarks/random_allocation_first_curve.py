"""CPU time of RandomAllocation's first curve for a new (σ, t) on the default grid.

Run: python benchmarks/random_allocation_first_curve.py
Prints, for t ∈ {10, 100, 1000, 10^4}, the median and the minimum over 15 new σ
of the process CPU time (``time.process_time``: on a shared machine wall time also
counts waiting for a core) and of the wall time, in milliseconds.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M

ORDERS = np.array(DEFAULT_ORDERS)


def main() -> None:
    M.RandomAllocation(0.9, 7).rdp(ORDERS)  # imports and first-call costs
    print(f"{'t':>6} {'cpu median':>11} {'cpu min':>8} {'wall median':>12} {'wall min':>9}  (ms)")
    for t in (10, 100, 1000, 10_000):
        cpu, wall = [], []
        for k in range(15):
            sigma = 1.0 + (k + 1) * 1e-7 + t * 1e-12  # never cached
            c0, w0 = time.process_time(), time.perf_counter()
            M.RandomAllocation(sigma, t).rdp(ORDERS)
            cpu.append(1e3 * (time.process_time() - c0))
            wall.append(1e3 * (time.perf_counter() - w0))
        print(f"{t:>6} {statistics.median(cpu):>11.1f} {min(cpu):>8.1f} "
              f"{statistics.median(wall):>12.1f} {min(wall):>9.1f}")


if __name__ == "__main__":
    main()
