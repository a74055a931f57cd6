"""Task sg: the uncached cost of the subsampled Gaussian's curve on the default grid.

Prints the best of 7 evaluations of ``privguard._curves._sgm.curve`` (no cache) at six
ordinary (σ, q), and their total. With a checkout's path as argument, that checkout's
privguard is timed instead of the installed one (e.g. a worktree of main, with
``integrations`` linked into its ``privguard``: scripts/make_curves5_fixture.py).

    python scripts/sgm_curve_cost.py [CHECKOUT]
"""

from __future__ import annotations

import sys
import time

if len(sys.argv) > 1:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, sys.argv[1])

import numpy as np

import privguard
from privguard import DEFAULT_ORDERS
from privguard._curves import _sgm

POINTS = [(0.8, 0.01), (1.1, 0.004), (2.0, 0.001), (5.0, 0.004), (10.0, 0.001), (1.0, 1e-4)]


def _best(q: float, sigma: float, orders: np.ndarray) -> float:
    times = []
    for _ in range(7):
        start = time.perf_counter()
        _sgm.curve(q, sigma, orders)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    orders = np.array(DEFAULT_ORDERS, dtype=float)
    total = 0.0
    for sigma, q in POINTS:
        best = _best(q, sigma, orders)
        total += best
        print(f"σ={sigma:g} q={q:g}: {best * 1e3:.1f} ms")
    print(f"{privguard.__file__}: total {total * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
