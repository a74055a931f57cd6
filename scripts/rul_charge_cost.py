"""CPU time of ``Ledger.charge`` in two source trees, interleaved (review rul): each round
runs one subprocess per tree (order alternating), each the best of 6 blocks of 600
charges. ``new``: a new mechanism every charge (the grid arithmetic and the filter's
comparison each time); ``same``: one mechanism repeated (the fast path).

    python scripts/rul_charge_cost.py ROUNDS TREE_A TREE_B [new|same]
"""

from __future__ import annotations

import statistics
import subprocess
import sys

CODE = r'''
import sys, time, privguard
from privguard import Ledger, mechanisms as M
assert privguard.__file__.startswith(sys.argv[1]), privguard.__file__
if sys.argv[2] == "new":
    mechs = [M.Gaussian(1000.0 + i) for i in range(650)]
else:
    mechs = [M.SubsampledGaussian(1.0, 0.01)] * 650
best = 1e9
for _ in range(6):
    ledger = Ledger(epsilon=1e9, delta=1e-5)
    for m in mechs[:50]:
        ledger.charge(m)
    t = time.process_time()
    for m in mechs[50:]:
        ledger.charge(m)
    best = min(best, (time.process_time() - t) / 600 * 1e6)
print(best)
'''


def main(rounds: str, tree_a: str, tree_b: str, mode: str = "new") -> None:
    trees = [tree_a, tree_b]
    res: dict[str, list[float]] = {t: [] for t in trees}
    for r in range(int(rounds)):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            out = subprocess.run([sys.executable, "-c", CODE, tree, mode], capture_output=True,
                                 text=True, check=True, env={"PYTHONPATH": tree})
            res[tree].append(float(out.stdout))
    for tree, values in res.items():
        print(f"{tree}: median {statistics.median(values):.1f}, min {min(values):.1f} µs CPU "
              f"per charge ({mode}), "
              f"runs {', '.join(f'{v:.1f}' for v in values)}")
    a, b = res[tree_a], res[tree_b]
    print(f"B/A: ratio of medians {statistics.median(b) / statistics.median(a):.3f}, "
          f"of minima {min(b) / min(a):.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
