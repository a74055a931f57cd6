"""Charges per second against one SQLite ledger: 1 process vs 4 concurrent processes.

Run: python benchmarks/sqlite_throughput.py
Each process opens the same file and makes 500 charges (WAL, synchronous=FULL,
one BEGIN IMMEDIATE transaction per charge, replaying the other processes'
charges before each decision).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time

from privguard import Ledger
from privguard import mechanisms as M

N = 500


def worker(path: str, start, done) -> None:
    ledger = Ledger(epsilon=1e6, delta=1e-5, path=path)
    start.wait()
    for _ in range(N):
        ledger.charge(M.SubsampledGaussian(1.1, 0.004), label=f"pid {os.getpid()}")
    done.put(os.getpid())


def run(processes: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.db")
        Ledger(epsilon=1e6, delta=1e-5, path=path).close()
        ctx = multiprocessing.get_context("spawn")
        start, done = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=worker, args=(path, start, done)) for _ in range(processes)]
        for p in procs:
            p.start()
        time.sleep(3.0)  # let every process import and open the ledger
        t0 = time.perf_counter()
        start.set()
        for _ in procs:
            done.get(timeout=600)
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join()
        assert len(Ledger.open(path).history) == processes * N
        return processes * N / elapsed


if __name__ == "__main__":
    for k in (1, 4):
        print(f"{k} process(es): {run(k):8.0f} charges/s in total")
