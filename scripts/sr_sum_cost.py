"""The cost of one spent-curve sum on the default grid (157 orders): base + n × curve
rounded to nearest (main 5a474ed's journal) against rounded up (task sr,
``privguard._accounting._journal.scaled_sum``; docs/theory.md §6, docs/performance.md).
Only the ordinary path and the fast path's limit search evaluate it; the repeat lane does
not. Prints the best of five timings of 2,000 calls each, per call.

    python scripts/sr_sum_cost.py
"""

from __future__ import annotations

import timeit

import numpy as np

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M
from privguard._accounting._journal import scaled_sum


def main() -> None:
    orders = np.array(DEFAULT_ORDERS)
    curve = M.SubsampledGaussian(1.1, 0.01).rdp(orders)
    base = M.Gaussian(3.0).rdp(orders) * 7
    base_bound, curve_bound = float(base.max()), float(curve.max())

    def nearest() -> np.ndarray:
        return base + 17 * curve

    def rounded_up() -> np.ndarray:
        return scaled_sum(base, base_bound, 17, curve, curve_bound)

    for name, fn in (("to nearest", nearest), ("rounded up", rounded_up)) * 2:
        best = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000
        print(f"{name}: {best * 1e6:.1f} µs per sum")


if __name__ == "__main__":
    main()
