"""Rollback journal (privguard's TRUNCATE mode) against WAL, both with synchronous=FULL.

Issue 26, item 3: the cost of one durable commit in each journal mode, for

* a single charge of a file-backed ledger (``Ledger(..., path=...).charge(step)``), and
* a block of identical steps committed at once (``charge(step, times=64)``, what a
  lease of 64 steps would write: one row, one commit),

and, as the floor both modes are measured against, an fsync'd one-row INSERT into a
bare table. The ledger's mode is switched by a PRAGMA right after privguard opens
its connection (nothing else differs). Every variant runs in the same process,
alternating, and the table gives medians per commit and the ratio to WAL.

Run: python benchmarks/journal_mode.py [--commits 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from unittest import mock

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores._sqlite import SQLiteStore

STEP = M.SubsampledGaussian(1.1, 0.004)
MODES = ("TRUNCATE", "WAL")


def use_mode(mode: str):
    """A patch under which privguard's SQLite connections use journal ``mode``."""
    original = SQLiteStore._connect

    def connect(self: SQLiteStore) -> sqlite3.Connection:
        fresh = self._conn is None
        conn = original(self)
        if fresh and not self.read_only:
            got = conn.execute(f"PRAGMA journal_mode = {mode}").fetchone()[0]
            assert got.upper() == mode, got
            conn.execute("PRAGMA synchronous = FULL")
        return conn

    return mock.patch.object(SQLiteStore, "_connect", connect)


def _ledger(path: str, mode: str) -> Ledger:
    with use_mode(mode):
        ledger = Ledger(epsilon=1e6, delta=1e-5, path=path)
        ledger.charge(STEP)  # the connection is open from here on
    return ledger


def _bare(path: str, mode: str) -> Callable[[], None]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode = {mode}")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (x INTEGER)")

    def insert() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("COMMIT")

    return insert


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        variants: dict[tuple[str, str], Callable[[], None]] = {}
        for mode in MODES:
            led = _ledger(os.path.join(tmp, f"single-{mode}.db"), mode)
            variants[("single charge", mode)] = lambda led=led: led.charge(STEP)
            blk = _ledger(os.path.join(tmp, f"block-{mode}.db"), mode)
            variants[("block of 64 steps", mode)] = lambda blk=blk: blk.charge(STEP, times=64)
            variants[("bare fsync'd INSERT", mode)] = _bare(os.path.join(tmp, f"b-{mode}.db"),
                                                             mode)
        times: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for key, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(args.commits):
                    fn()
                times[key].append((time.perf_counter() - t0) / args.commits)
    print(f"medians of {args.rounds} alternating rounds of {args.commits} commits, "
          "synchronous=FULL")
    print("| commit | TRUNCATE (rollback) | WAL | rollback / WAL |\n|---|---|---|---|")
    for what in ("single charge", "block of 64 steps", "bare fsync'd INSERT"):
        t, w = (statistics.median(times[(what, m)]) for m in MODES)
        print(f"| {what} | {t * 1e3:.3f} ms | {w * 1e3:.3f} ms | {t / w:.2f}× |")


if __name__ == "__main__":
    main()
