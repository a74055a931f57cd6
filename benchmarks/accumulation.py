"""Numbers for docs/theory.md §14: accumulated steps against the old charge and the PLD.

Run: ``python benchmarks/accumulation.py``. Prints, for each (σ, q, k):
one step's RDP at α = 4 and 8 (the issue's points), the ε of ``steps``
steps at δ = 1e-5 by privguard's RDP curve, by the old under-charge
SubsampledGaussian(σ, k·q), and by dp-accounting's PLD of
MixtureOfGaussiansDpEvent (a tighter, non-adaptive reference that must
never be above ours), and the time of the first curve on the default grid.
The curves are ``aligned=True`` (one gradient per example and step, §14
Lemmas 14.1–14.4); ``benchmarks/accumulation_per_draw.py`` compares them with
the default ``aligned=False`` curve (any per-draw gradients).
"""

from __future__ import annotations

import math
import time

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant as pld

from privguard import DEFAULT_ORDERS, RDPCurve
from privguard import mechanisms as M

GRID = np.array(DEFAULT_ORDERS)
CASES = [(1.0, 0.125, 2, 10), (1.0, 0.05, 2, 100), (1.0, 0.01, 2, 1000), (2.0, 0.05, 4, 50),
         (1.0, 0.01, 4, 1000), (0.8, 0.002, 8, 300)]


def main() -> None:
    print("sigma q k steps | rdp(4) rdp(8) old rdp(4) old rdp(8) | eps ours eps old eps PLD "
          "| first curve ms")
    for sigma, q, k, steps in CASES:
        step = M.AccumulatedSubsampledGaussian(sigma, q, k, aligned=True)
        start = time.perf_counter()
        step.rdp(GRID)
        first = (time.perf_counter() - start) * 1e3
        old = M.SubsampledGaussian(sigma, min(1.0, k * q))
        ours = RDPCurve(GRID, M.AccumulatedSubsampledGaussian(sigma, q, k, steps,
                                                              aligned=True).rdp(GRID))
        was = RDPCurve(GRID, M.SubsampledGaussian(sigma, min(1.0, k * q), steps).rdp(GRID))
        probs = [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]
        acct = pld.PLDAccountant(value_discretization_interval=1e-3)
        acct.compose(dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs), steps)
        r4, r8 = step.rdp([4.0, 8.0])
        o4, o8 = old.rdp([4.0, 8.0])
        print(f"{sigma} {q} {k} {steps} | {r4:.3f} {r8:.3f} {o4:.3f} {o8:.3f} | "
              f"{ours.epsilon(1e-5):.3f} {was.epsilon(1e-5):.3f} {acct.get_epsilon(1e-5):.3f} | "
              f"{first:.0f}")


if __name__ == "__main__":
    main()
