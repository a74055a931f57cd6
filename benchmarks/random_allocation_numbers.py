"""ε of random allocation against Poisson subsampling at q = 1/t, by privguard's own curves.

Run: python benchmarks/random_allocation_numbers.py
Prints, for σ = 1 and δ = 1e-5 on the default grid, the ε of 10 and 100 epochs of
``RandomAllocation(σ, t)`` (the certified curve, docs/theory.md §15), of its remove
direction alone (exact at integer orders; not a certified curve by itself), and of
``SubsampledGaussian(σ, 1/t, steps=t·epochs)`` (Poisson, same expected batch), for
t ∈ {10, 100, 1000}. The figures are recorded in docs/performance.md.
"""

from __future__ import annotations

import numpy as np

from privguard import DEFAULT_ORDERS, RDPCurve
from privguard import mechanisms as M
from privguard._mechanisms import _allocation

SIGMA, DELTA = 1.0, 1e-5
ORDERS = np.array(DEFAULT_ORDERS)


def _eps(values: np.ndarray) -> float:
    return RDPCurve(ORDERS, np.maximum.accumulate(values)).epsilon(DELTA)


def main() -> None:
    print(f"sigma={SIGMA} delta={DELTA}; epsilon on privguard's default grid")
    print(f"{'t':>6} {'epochs':>6} {'allocation':>11} {'remove only':>11} {'poisson':>9} {'ratio':>7}")
    for t in (10, 100, 1000):
        remove = _allocation.remove_bound(ORDERS, SIGMA, t)
        for epochs in (10, 100):
            alloc = _eps(M.RandomAllocation(SIGMA, t, epochs=epochs).rdp(ORDERS))
            rem = _eps(remove * epochs)
            pois = _eps(M.SubsampledGaussian(SIGMA, 1.0 / t, steps=t * epochs).rdp(ORDERS))
            print(f"{t:>6} {epochs:>6} {alloc:>11.3f} {rem:>11.3f} {pois:>9.3f} {alloc / pois:>7.2f}")


if __name__ == "__main__":
    main()
