"""Running ε of each odometer mode against the non-adaptive ε, on a typical DP-SGD run.

Run: python benchmarks/odometer_comparison.py
The run: 50 epochs of DP-SGD with σ = 1.0, q = 0.01 (100 steps per epoch),
δ = 1e-6, the running ε read after every epoch (the issue's typical run).
"""

from __future__ import annotations

import numpy as np

from privguard import Ledger
from privguard import mechanisms as M


def main() -> None:
    delta = 1e-6
    ledgers = {mode: Ledger(delta=delta, odometer=mode) for mode in ("paper", "tight")}
    step = M.SubsampledGaussian(1.0, 0.01)
    rows = []
    for epoch in range(1, 51):
        for ledger in ledgers.values():
            for _ in range(100):
                ledger.charge(step)
        rows.append((epoch, ledgers["tight"].nonadaptive_epsilon(),
                     ledgers["paper"].epsilon(), ledgers["tight"].epsilon()))
    print(f"{'epoch':>5} {'non-adaptive':>12} {'paper':>8} {'tight':>8} {'tight/paper':>11}")
    for epoch, na, paper, tight in rows:
        if epoch in (1, 2, 5, 10, 20, 30, 40, 50):
            print(f"{epoch:5d} {na:12.3f} {paper:8.3f} {tight:8.3f} {tight / paper:11.3f}")
    arr = np.array(rows)
    print(f"mean over the 50 epochs: paper/non-adaptive = {np.mean(arr[:, 2] / arr[:, 1]):.3f}, "
          f"tight/non-adaptive = {np.mean(arr[:, 3] / arr[:, 1]):.3f}, "
          f"tight/paper = {np.mean(arr[:, 3] / arr[:, 2]):.3f} (max {np.max(arr[:, 3] / arr[:, 2]):.3f})")


if __name__ == "__main__":
    main()
