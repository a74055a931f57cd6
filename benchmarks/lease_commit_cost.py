"""What a lease commit costs, fsync and the rest apart (review lc).

The README quick start's loop (``quickstart_cost.quick_start``: σ 1.1 then 0.9, ε = 3,
to the first refusal) on a SQLite file with leases (the default), each charge timed
alone and sorted by whether it committed a lease or took a step from memory. Run as
shipped (``synchronous=FULL``) and, to separate the fsync from a commit's own work
(Python, SQL, digests), with ``synchronous=OFF`` set on the ledger's connection after
it opened (a diagnosis only: not durable). The SQL statements of each commit are
counted with ``sqlite3``'s trace callback, without the lines it shows for a statement's
nested ones (``-- PRAGMA schema_version``, the one read's schema cookie: review sq), and
printed as the median commit's and the mean over the commits. The mean is above the
median by two commits that do more: the first (a new mechanism's row: 8 statements) and
the one where σ changes (the old lease's ``lease-unused`` event and a new mechanism's
row: 9). The charge the budget refuses and the close are not commits and are not counted
(until task lo6 the callback stayed on through both after the refusal, 5 trace lines, and
with the nested lines the column printed 6.03 for 5 statements a commit). Medians of
``--rounds`` runs, the two modes alternating.

To compare two checkouts, run the script of one with the other's package first on the
path: ``PYTHONPATH=/path/to/checkout python benchmarks/lease_commit_cost.py``.

Run: python benchmarks/lease_commit_cost.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import privguard
from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M


def run(path: str, synchronous: str) -> tuple[list[float], list[float], list[int]]:
    """(seconds of each committing charge, of each leased step, SQL statements of each
    commit) for one run of the quick start's loop."""
    q = 256 / 60_000
    ledger = Ledger(epsilon=3.0, delta=1e-5, plan=Plan(M.SubsampledGaussian(1.1, q),
                                                       steps=234 * 100), path=path)
    conn = ledger._store._conn
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    statements: list[int] = []
    commits: list[float] = []
    steps: list[float] = []
    for epoch in range(100):
        sigma = 1.1 if epoch < 10 else 0.9
        try:
            for _ in range(234):
                step = M.SubsampledGaussian(sigma, q)
                lease = ledger._lease
                leased = lease is not None and lease.left > 0 and lease.mechanism == step
                traced: list[str] = []
                if not leased:
                    conn.set_trace_callback(traced.append)
                t0 = time.perf_counter()
                try:
                    ledger.charge(step, label="step")
                    (steps if leased else commits).append(time.perf_counter() - t0)
                finally:  # a refused charge's lines (and the close's) are not a commit's
                    conn.set_trace_callback(None)
                if not leased:  # "-- ..." lines: a statement's nested ones, not statements
                    statements.append(sum(not line.startswith("--") for line in traced))
        except BudgetExhausted:
            break
    ledger.close()
    return commits, steps, statements


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"privguard from {os.path.dirname(privguard.__file__)}; load average "
          f"{os.getloadavg()[0]:.2f}")
    out: dict[str, dict[str, list[float]]] = {
        mode: {"commit": [], "step": [], "total": [], "n": [], "steps": [], "sql": [],
               "sql_mean": []}
        for mode in ("FULL", "OFF")}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode, acc in out.items():
                commits, steps, sql = run(os.path.join(tmp, f"c{r}{mode}.db"), mode)
                acc["commit"].append(statistics.median(commits))
                acc["step"].append(statistics.median(steps))
                acc["total"].append(sum(commits) + sum(steps))
                acc["n"].append(len(commits))
                acc["steps"].append(len(steps))
                acc["sql"].append(statistics.median(sql))
                acc["sql_mean"].append(statistics.fmean(sql))
    print(f"Medians of {args.rounds} runs of the quick start with path= (leases)")
    print("| synchronous | lease commits | leased steps | SQL statements a commit (mean) | "
          "commit (median) | leased step (median) | all charges |")
    print("|---|---|---|---|---|---|---|")
    for mode, acc in out.items():
        med = {k: statistics.median(v) for k, v in acc.items()}
        print(f"| {mode} | {med['n']:.0f} | {med['steps']:.0f} | {med['sql']:.0f} ({med['sql_mean']:.2f}) | {med['commit'] * 1e6:.0f} µs | "
              f"{med['step'] * 1e6:.1f} µs | {med['total']:.3f} s |")


if __name__ == "__main__":
    main()
