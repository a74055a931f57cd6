"""The README's quick start, in memory and with ``path=``: the cost of a durable budget.

Issue 26 asks for the quick start with ``path=`` within 1.5× of its in-memory time.
The loop below is the README's (100 epochs of 234 steps, σ 1.1 then 0.9, ε = 3),
without its prints; it stops at the first refusal, as the README's does. Each
variant runs ``--rounds`` times, alternating, in a fresh ledger (and a fresh file).

Run: python benchmarks/quickstart_cost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M


def quick_start(path: str | None) -> tuple[float, int]:
    """(seconds, charges admitted) for one run of the README's quick start."""
    t0 = time.perf_counter()
    q = 256 / 60_000
    step = M.SubsampledGaussian(noise_multiplier=1.1, sample_rate=q)
    ledger = Ledger(epsilon=3.0, delta=1e-5, plan=Plan(step, steps=234 * 100), path=path)
    for epoch in range(100):
        sigma = 1.1 if epoch < 10 else 0.9
        try:
            for _ in range(234):
                ledger.charge(M.SubsampledGaussian(sigma, q), label="step")
        except BudgetExhausted:
            break
        ledger.epsilon()
    ledger.guarantee()
    charges = len(ledger.history)
    ledger.close()
    return time.perf_counter() - t0, charges


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"in memory": [], "path=": []}
    counts = set()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            t, n = quick_start(None)
            times["in memory"].append(t)
            counts.add(n)
            t, n = quick_start(os.path.join(tmp, f"quick{r}.db"))
            times["path="].append(t)
            counts.add(n)
    assert len(counts) == 1, counts  # the same charges admitted either way
    mem, disk = (statistics.median(times[k]) for k in ("in memory", "path="))
    print(f"README quick start, {counts.pop()} charges; medians of {args.rounds} "
          "alternating runs")
    print(f"| in memory | {mem:.2f} s |\n| path= | {disk:.2f} s |\n| ratio | {disk / mem:.1f}× |")


if __name__ == "__main__":
    main()
