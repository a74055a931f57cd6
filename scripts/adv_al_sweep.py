"""Review al's sweep: charged curves against their theorems in 50 digits (docs/theory.md §7, §10).

    PYTHONPATH=. python scripts/adv_al_sweep.py

Prints, for random-K tuning with a truncated negative binomial (seed 002 Theorem 2) and
for subset tuning (seed 000 Theorem 4 and Theorem 6), how many (base, law, order) points
were checked, the largest amount (relative) by which the charged value is below the
theorem's value from the same float inputs (≤ 0: nowhere below) and the largest amount
above it. tests/test_adv_al_mechanisms.py checks a subset of these points.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mpmath as mp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_adv_al_mechanisms import subset_theorem, theorem_2

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M
from privguard.tuning import Geometric, Poisson, TruncatedNegativeBinomial

ORDERS = np.array(DEFAULT_ORDERS)


def _rel(charged: float, exact: mp.mpf) -> float:
    with mp.workdps(50):
        return float((exact - mp.mpf(charged)) / exact)


def main() -> None:
    bases = [M.Gaussian(0.5), M.Gaussian(3.0), M.Gaussian(30.0), M.SubsampledGaussian(1.0, 0.01, 1000),
             M.SubsampledGaussian(0.7, 0.1, 20), M.ZCDP(0.0123)]
    below, above, n = -np.inf, -np.inf, 0
    for base in bases:
        curve = base.rdp(ORDERS)
        for eta in [-0.9, -0.5, 0.0, 0.5, 1.0, 2.0, 7.0]:
            for mean in [1.01, 1.5, 3.0, 10.0, 77.7, 1000.0, 1e5]:
                runs = TruncatedNegativeBinomial(eta, mean=mean)
                charged = M.RepeatAndSelect(base, runs).rdp(ORDERS)
                for c, e in zip(charged, theorem_2(ORDERS, curve, runs)):
                    r = _rel(float(c), e)
                    below, above, n = max(below, r), max(above, -r), n + 1
    print(f"truncated negative binomial, Theorem 2: {n} points, charged below by at most "
          f"{below:.3g}, above by at most {above:.3g} (relative)")
    ints = np.arange(2, 41, dtype=float)
    run = M.SubsampledGaussian(1.0, 0.01, 1000)
    pairs = [(M.RepeatAndSelect(run, Poisson(15.0)), run), (M.Gaussian(3.0), M.Gaussian(10.0)),
             (M.PureDP(0.1), M.ZCDP(0.001)), (M.Gaussian(0.7), M.SubsampledGaussian(2.0, 0.001, 10)),
             (M.Gaussian(3.0), M.Gaussian(1e6)), (M.PureDP(0.5), M.Gaussian(1e3)),
             (M.RepeatAndSelect(M.Gaussian(2.0), Geometric(mean=3.0)), M.Gaussian(1e6))]
    below, above, n = -np.inf, -np.inf, 0
    for tuning, final in pairs:
        eps_t, eps_b = [0.0, 0.0, *tuning.rdp(ints)], [0.0, 0.0, *final.rdp(ints)]
        for q in [1e-9, 1e-6, 1e-4, 0.01, 0.1, 0.5, 0.99]:
            for variant in (1, 2):
                charged = M.SubsetTuning(tuning, final, q, variant).integer_curve(40)
                for a in range(2, 41):
                    r = _rel(float(charged[a]), subset_theorem(eps_t, eps_b, q, variant, a))
                    below, above, n = max(below, r), max(above, -r), n + 1
    print(f"subset tuning, Theorems 4 and 6: {n} points, charged below by at most "
          f"{below:.3g}, above by at most {above:.3g} (relative)")


if __name__ == "__main__":
    main()
