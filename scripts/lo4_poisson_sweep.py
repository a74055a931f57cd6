"""Task lo4's sweep: Poisson random-K tuning's charged curve against its exact value.

    PYTHONPATH=. python scripts/lo4_poisson_sweep.py

Prints how many (base, μ, order) points of ``RepeatAndSelect(base, Poisson(μ))`` on the
default grid were checked, the largest amount (relative) by which the charged curve is
below its exact value from the same float base curve (tests/_poisson_exact.py, 50 digits;
≤ 0: nowhere below) and the largest amount above it, and the worst point. Run with an older
privguard first on PYTHONPATH to see its values. tests/test_leftovers_lo4.py checks a
subset of these points on a shorter grid. Review rlo4: also the largest amount (relative) by
which the charged curve is below main's formula at the same points (tests/test_review_rlo4.py,
``_main_curve``; a stored total may lie below today's curve, never above it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _poisson_exact import exact_poisson_curve
from test_review_rlo4 import _main_curve

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M
from privguard.tuning import Poisson

ORDERS = np.array(DEFAULT_ORDERS)
BASES = ([M.SubsampledGaussian(s, q, steps=1) for s in (0.4, 0.7, 1.0)
          for q in (1e-8, 1e-6, 1e-4, 1e-2)]
         + [M.Gaussian(s) for s in (0.5, 5.0, 700.0)] + [M.PureDP(e) for e in (0.01, 3.0)])
MEANS = (1e-3, 0.5, 1.0, 3.0, 100.0, 1e4)  # review rlo4: q = 1e-8 and μ = 1e4 added


def main() -> None:
    points, below, above, worst, fall, rise = 0, -np.inf, 0.0, None, 0.0, 0.0
    for base in BASES:
        curve = base.rdp(ORDERS)
        for mu in MEANS:
            charged = M.RepeatAndSelect(base, Poisson(mu)).rdp(ORDERS)
            before = _main_curve(base, mu, ORDERS)  # review rlo4: main's (5a474ed) formula
            ok = np.isfinite(before) & (before > 0)
            fall = max(fall, float(np.max(((before - charged) / np.where(ok, before, 1))[ok],
                                          initial=0.0)))
            rise = max(rise, float(np.max(((charged - before) / np.where(ok, before, 1))[ok],
                                          initial=0.0)))
            for lam, c, e in zip(ORDERS, charged, exact_poisson_curve(ORDERS, curve, mu)):
                if e == 0 or not np.isfinite(c):
                    continue
                rel = float((e - c) / e)  # > 0: the charge is below the exact value
                points += 1
                above = max(above, -rel)
                if rel > below:
                    below, worst = rel, (base, mu, float(lam))
    print(f"{points} points; charged below exact by at most {below:.3g} (relative; <= 0: "
          f"nowhere below), above by at most {above:.3g}; worst: {worst}; below main's "
          f"formula (5a474ed) by at most {fall:.3g}, above it by at most {rise:.3g} (relative)")


if __name__ == "__main__":
    main()
