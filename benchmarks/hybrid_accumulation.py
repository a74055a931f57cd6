"""Numbers for docs/theory.md §2b.1 and README: the hybrid filter on an accumulated plan.

Run: ``python benchmarks/hybrid_accumulation.py``. For each plan step
``AccumulatedSubsampledGaussian(σ, q, k, aligned=True)`` (the §2b.1 envelope is
proved for aligned steps only) and target (ε, δ = 1e-5), prints the
steps a ledger admits on plan with ``filter="hybrid"`` (counted by charging
until refused), with the RDP filter (``filter="rdp"``, the default), the
non-adaptive RDP count at the full δ (the curve's optimum over orders), and
dp-accounting's pessimistic PLD count at the full δ (a non-adaptive
reference no filter can beat), and the seconds it took to certify T_A.
"""

from __future__ import annotations

import time

import numpy as np

from privguard import DEFAULT_ORDERS, BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M
from privguard._accounting._hybrid import envelope_of, envelope_steps
from privguard._curves import _conversion as conv

DELTA = 1e-5
CASES = [(1.0, 0.01, 2, 3.0), (2.0, 0.05, 4, 3.0), (1.1, 256 / 60000, 4, 3.0),
         (0.8, 0.002, 8, 8.0)]


def on_plan(ledger: Ledger, step: M.Mechanism, first: int) -> int:
    """Steps admitted charging ``step`` until refused (``first`` at once, then one by one)."""
    n = 0
    if first:
        ledger.charge(step, times=first)
        n = first
    while True:
        try:
            ledger.charge(step)
        except BudgetExhausted:
            return n
        n += 1


def main() -> None:
    grid = np.array(DEFAULT_ORDERS)
    print("sigma q k eps | hybrid (T_A) | RDP filter | RDP non-adaptive | PLD non-adaptive "
          "| hybrid/RDP filter | certify s")
    for sigma, q, k, eps in CASES:
        step = M.AccumulatedSubsampledGaussian(sigma, q, k, aligned=True)
        start = time.perf_counter()
        hybrid = Ledger(eps, DELTA, plan=Plan(step, 1), filter="hybrid")
        certify = time.perf_counter() - start
        t_a = hybrid._acc.filter.steps_a
        n_hybrid = on_plan(hybrid, step, t_a)
        rdp = Ledger(eps, DELTA, plan=Plan(step, 1))
        n_rdp = rdp.remaining(step).repeats
        one = step.rdp(grid)
        budget = conv.rdp_budget_per_order(grid, eps, DELTA)
        n_naive = int(np.nanmax(np.where(one > 0, budget / one, 0)))
        n_pld = envelope_steps(envelope_of(step), eps, DELTA)
        print(f"{sigma:g} {q:.5g} {k} {eps:g} | {n_hybrid} ({t_a}) | {n_rdp} | {n_naive} | "
              f"{n_pld} | {n_hybrid / max(n_rdp, 1):.2f}x | {certify:.1f}")


if __name__ == "__main__":
    main()
