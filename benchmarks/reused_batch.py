"""Numbers for docs/theory.md §14.5 (task adv7): one Poisson draw summed or released twice.

Run: ``python benchmarks/reused_batch.py``. Prints the ε at δ = 1e-5 of 4 steps at
σ = 1, q = 1/4 that backpropagate one batch twice (the draw at weight 2: the curve of
``SubsampledGaussian(σ/2, q)``) against the ``AccumulatedSubsampledGaussian(σ, q, 2)``
they were charged as, and of 4 pairs of steps on one batch each (the curve of
``SubsampledGaussian(σ/√2, q)`` per pair) against 8 independent steps.
"""

from __future__ import annotations

import math

from privguard import Ledger
from privguard import mechanisms as M

SIGMA, Q, DELTA = 1.0, 0.25, 1e-5


def epsilon(mechanism: M.Mechanism) -> float:
    """The ε at δ = 1e-5 of ``mechanism`` charged alone."""
    ledger = Ledger(delta=DELTA)
    ledger.charge(mechanism)
    return ledger.epsilon(DELTA)


def main() -> None:
    rows = [("two backward on one batch, truth", M.SubsampledGaussian(SIGMA / 2, Q, steps=4)),
            ("two backward on one batch, charged before adv7",
             M.AccumulatedSubsampledGaussian(SIGMA, Q, 2, steps=4)),
            ("two steps on one batch, truth",
             M.SubsampledGaussian(SIGMA / math.sqrt(2), Q, steps=4)),
            ("two steps on one batch, charged before adv7", M.SubsampledGaussian(SIGMA, Q, steps=8))]
    for name, mechanism in rows:
        print(f"{name:48s} eps={epsilon(mechanism):.2f}  {mechanism}")


if __name__ == "__main__":
    main()
