"""How far the ledger's float spent curve lies from the exact (rational) sum of the charged
float curves (review rul, task sr; docs/theory.md §6, "Rounding up"). Main 5a474ed kept spent
as base + n·curve in round-to-nearest floats, up to about u = 2⁻⁵³ (relative) per run below
the exact sum (486 u after 3,000 charges of three mechanisms in turn); since task sr each
product and sum is rounded up, so the float spent curve is never below the exact sum, and
the over-count is at most an ulp per operation. Prints the extreme relative differences over
the grid (≥ 0 since task sr).

    python scripts/rul_spent_rounding.py [charges]
"""

from __future__ import annotations

import sys
from fractions import Fraction

from privguard import Ledger
from privguard import mechanisms as M


def main(charges: int = 3000) -> None:
    ledger = Ledger(epsilon=1e6, delta=1e-5)
    mechanisms = [M.Gaussian(3.0), M.Gaussian(7.1), M.SubsampledGaussian(1.1, 0.013)]
    curves = [m.rdp(ledger.orders).tolist() for m in mechanisms]
    exact = [Fraction(0)] * ledger.orders.size
    for i in range(charges):  # three mechanisms in turn: every charge starts a new run
        k = i % 3
        ledger.charge(mechanisms[k])
        exact = [e + Fraction(c) for e, c in zip(exact, curves[k])]
    rel = [float((Fraction(s) - e) / e) for s, e in zip(ledger.spent.tolist(), exact) if e]
    print(f"{charges} charges: (float spent - exact sum) / exact sum from {min(rel):.3g} "
          f"({min(rel) / 2**-53:.0f} u) to {max(rel):.3g} ({max(rel) / 2**-53:.0f} u); "
          f"{'never below' if min(rel) >= 0 else 'BELOW'} the exact sum")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
