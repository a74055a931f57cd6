"""Epochs admitted on plan: the RDP filter against the hybrid filter with the certified
random-allocation envelope (docs/theory.md §2b.3; docs/performance.md).

Run: ``nice -n 19 python benchmarks/hybrid_allocation_pld.py [sigma,t ...]``. For each plan
``RandomAllocation(σ, t)`` and ε (δ = 1e-5), real ledgers: the RDP filter
(``filter="rdp"``, the default, at δ), the hybrid filter's T_A (part A, δ_A = 0.99δ) and
the epochs the hybrid ledger admits on plan in all (A, then its RDP fallback at δ_B;
``remaining(step).repeats``, equal to charging one by one: checked at σ = 2, t = 10);
and the seconds of the first certification of each (σ, t) (the epoch PMF, then the
T_A search at the first ε; later ε reuse the PMF).
"""

from __future__ import annotations

import sys
import time

from privguard import Ledger, Plan
from privguard import mechanisms as M

DELTA = 1e-5
CELLS = [(1.0, 10), (1.0, 100), (1.0, 1000), (2.0, 10), (2.0, 100), (2.0, 1000)]
EPSILONS = (1.0, 2.0, 4.0)


def main(cells: list[tuple[float, int]]) -> None:
    print(f"delta = {DELTA:g}; epochs admitted on plan")
    print("sigma t eps | RDP filter | hybrid T_A (part A) | hybrid total | seconds (first ε: "
          "PMF + search; later: search)")
    for sigma, t in cells:
        step = M.RandomAllocation(sigma, t)
        for eps in EPSILONS:
            start = time.perf_counter()
            hybrid = Ledger(eps, DELTA, plan=Plan(step, 1), filter="hybrid")
            seconds = time.perf_counter() - start
            flt = hybrid._acc.filter
            t_a = flt.steps_a if flt.kind == "hybrid" else 0
            total = hybrid.remaining(step).repeats
            rdp = Ledger(eps, DELTA, plan=Plan(step, 1)).remaining(step).repeats
            print(f"{sigma:g} {t} {eps:g} | {rdp} | {t_a} | {total} | {seconds:.1f}", flush=True)


if __name__ == "__main__":
    chosen = [(float(a), int(b)) for a, b in (v.split(",") for v in sys.argv[1:])] or CELLS
    main(chosen)
