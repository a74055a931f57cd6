"""Leases under SIGKILL: 8 processes share one SQLite ledger, killed at random points.

Issue 26's crash test at full length (tests/test_leases.py runs 3 rounds): in every
round 8 workers charge one file with leases (the default), each appending one fsync'd
byte to its own log per released step; a random subset is SIGKILLed at a random time.
After each round the file is reopened and checked: the steps each worker durably logged
as released never exceed the steps the journal holds as spent for it, and the budget
meter never exceeds the target. Prints one line per round and exits non-zero on a
violation.

Run: python benchmarks/lease_crash.py [--rounds 20] [--epsilon 16]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import _lease_workers

from privguard import Ledger


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=16.0)
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "shared.db")
        Ledger(args.epsilon, 1e-5, path=path).close()
        logs: dict[int, str] = {}
        for rnd in range(args.rounds):
            found = _lease_workers.crash_round(path, tmp, rnd, args.epsilon, rng, logs)
            ok = not found["over"] and found["meter"] <= args.epsilon
            bad += not ok
            print(f"round {rnd + 1}: {found['killed']} killed; released {found['released']}, "
                  f"spent {found['spent']} steps; meter {found['meter']:.4f} of "
                  f"{args.epsilon:g}; {'ok' if ok else 'VIOLATION ' + str(found['over'])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
