"""The README's quick start, in memory and with ``path=``: the cost of a durable budget.

Issue 26 asks for the quick start with ``path=`` within 1.5× of its in-memory time.
The loop below is the README's (100 epochs of 234 steps, σ 1.1 then 0.9, ε = 3),
without its prints; it stops at the first refusal, as the README's does. Each
variant runs ``--rounds`` times, alternating, in a fresh ledger (and a fresh file).

With leases (docs/theory.md §13, the default for ``path=``) the journal holds the
released charges plus a lease's unused remainder; the count compared below is the
charges the loop released. ``path=, lease=1`` is a durable commit per charge.
Direct charges take no prefetch by default (it is on under ``attach``): the
``prefetch=True`` variant shows what it costs where nothing runs between charges.

``--against DIR`` also runs every variant with the package of another checkout DIR (a
``git worktree add /tmp/base main``), in a subprocess with DIR first on ``PYTHONPATH``,
alternating with this checkout's (also in a subprocess) round by round: before/after
ratios measured in one run, at one load.

With ``TMPDIR=/dev/shm`` (a tmpfs, where an fsync returns at once) the files' runs show
the Python and SQLite work alone, without the disk's fsync (a diagnosis only).

Run: python benchmarks/quickstart_cost.py [--rounds 3] [--against DIR] [--skip-lease-1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M


def quick_start(path: str | None, lease: int | None = None,
                prefetch: bool | None = None) -> tuple[float, int]:
    """(seconds, charges released) for one run of the README's quick start."""
    t0 = time.perf_counter()
    q = 256 / 60_000
    step = M.SubsampledGaussian(noise_multiplier=1.1, sample_rate=q)
    ledger = Ledger(epsilon=3.0, delta=1e-5, plan=Plan(step, steps=234 * 100), path=path,
                    lease=lease, prefetch=prefetch)
    charges = 0
    for epoch in range(100):
        sigma = 1.1 if epoch < 10 else 0.9
        try:
            for _ in range(234):
                ledger.charge(M.SubsampledGaussian(sigma, q), label="step")
                charges += 1
        except BudgetExhausted:
            break
        ledger.epsilon()
    ledger.guarantee()
    ledger.close()
    return time.perf_counter() - t0, charges


VARIANTS = {"in memory": (False, None, None), "path=, lease=1": (True, 1, None),
            "path= (leases, the default)": (True, None, None),
            "path=, leases, prefetch=True": (True, None, True)}


def _in_subprocess(checkout: str, variant: str, path: str | None) -> tuple[float, int]:
    """One run of ``variant`` with the package of ``checkout`` first on the path."""
    _, lease, prefetch = VARIANTS[variant]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            "import quickstart_cost as q, privguard; "
            f"assert privguard.__file__.startswith({os.path.abspath(checkout)!r}); "
            f"print(*q.quick_start({path!r}, {lease!r}, {prefetch!r}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=checkout,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", metavar="DIR", default=None,
                        help="another checkout, run alternately (each run in a subprocess)")
    parser.add_argument("--skip-lease-1", action="store_true",
                        help="leave out the variant path=, lease=1 (a commit per charge)")
    args = parser.parse_args()
    variants = {v: k for v, k in VARIANTS.items()
                if not (args.skip_lease_1 and v == "path=, lease=1")}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = [("", None)] if args.against is None else \
        [("base: ", args.against), ("this: ", here)]
    names = [side + v for side, _ in sides for v in variants]
    times: dict[str, list[float]] = {v: [] for v in names}
    counts: dict[str, set[int]] = {v: set() for v in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side, checkout in sides:
                for v, (durable, lease, prefetch) in variants.items():
                    path = os.path.join(tmp, f"quick{r}{side[:4]}{lease}{prefetch}.db") \
                        if durable else None
                    t, n = quick_start(path, lease, prefetch) if checkout is None \
                        else _in_subprocess(checkout, v, path)
                    times[side + v].append(t)
                    counts[side + v].add(n)
    print(f"README quick start; medians of {args.rounds} alternating runs")
    print("| | charges released | time | vs in memory |\n|---|---|---|---|")
    for side, _ in sides:
        mem = statistics.median(times[side + "in memory"])
        for v in variants:
            t = statistics.median(times[side + v])
            print(f"| {side}{v} | {sorted(counts[side + v])} | {t:.2f} s | {t / mem:.2f}× |")


if __name__ == "__main__":
    main()
