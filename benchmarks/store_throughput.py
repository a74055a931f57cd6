"""Charges per second and per-charge latency: the PostgreSQL store against the SQLite store.

Run: python benchmarks/store_throughput.py [--charges 400] [--clients 1 4 8]

Both stores on this machine, in one run: a SQLite file in a temporary
directory, and a PostgreSQL 15 server started for the run by
tests/_pgserver.py (127.0.0.1, fsync and synchronous_commit on, the ledger
made by ``server-init`` and charged by its charging role). For each store and
each number of client processes, every client opens the ledger, waits for a
common start, then makes ``--charges`` charges of one DP-SGD step, each its
own durable transaction that first replays the other clients' charges
(labels differ per client, so concurrent clients append a row per charge).
Reported: total charges per second (all clients, start to last finish), the
median and 99th-percentile latency of one ``charge()`` call, and the
PostgreSQL/SQLite ratios of the same run. Needs PostgreSQL's server binaries
(Debian's postgresql-15) and ``privguard[postgres]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import _pgserver

# One durable transaction per charge, what this script measures: file and server ledgers
# lease ahead by default (README "Leases"), and a lease's unused remainder, spent at close,
# made the journal hold more charges than were made (the check below refused the run).
PER_CHARGE = {"lease": 1}


def _worker(path: str, charges: int, start, done, kwargs=None, env=None) -> None:
    os.environ.update(env or {})  # e.g. PRIVGUARD_SQLITE_JOURNAL (shared_ledger.py)
    from privguard import Ledger
    from privguard import mechanisms as M

    ledger = Ledger(epsilon=1e6, delta=1e-5, path=path, **(kwargs or {}))
    step = M.SubsampledGaussian(1.1, 0.004)
    label = f"pid {os.getpid()}"
    start.wait()
    latencies = []
    for _ in range(charges):
        t0 = time.perf_counter()
        ledger.charge(step, label=label)
        latencies.append(time.perf_counter() - t0)
    ledger.close()
    done.put(latencies)


def _run(path: str, clients: int, charges: int, kwargs=None, env=None) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, charges, start, done, kwargs, env))
             for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(2.0 + 0.7 * clients)  # let every client import and open the ledger
    t0 = time.perf_counter()
    start.set()
    latencies = [x for _ in procs for x in done.get(timeout=900)]
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    latencies.sort()
    return {"per_second": clients * charges / elapsed,
            "p50_ms": 1e3 * statistics.median(latencies),
            "p99_ms": 1e3 * latencies[int(0.99 * (len(latencies) - 1))],
            "p999_ms": 1e3 * latencies[int(0.999 * (len(latencies) - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=400, help="charges per client")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()

    from privguard import Ledger
    from privguard._stores._pgadmin import server_init

    if _pgserver.binaries() is None:
        sys.exit(_pgserver.SKIP_REASON)
    srv = _pgserver.server()
    try:
        db = srv.new_database()
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for clients in args.clients:
                sqlite_path = os.path.join(tmp, f"c{clients}.db")
                Ledger(epsilon=1e6, delta=1e-5, path=sqlite_path).close()
                ledger = f"bench{clients}"
                server_init(srv.url(db=db), ledger, 1e6, 1e-5, charger=_pgserver.CHARGER,
                            owner=_pgserver.OWNER)
                srv.set_passwords()
                lite = _run(sqlite_path, clients, args.charges, PER_CHARGE)
                pg = _run(srv.url(_pgserver.CHARGER, db, ledger), clients, args.charges,
                          PER_CHARGE)
                assert len(Ledger.open(sqlite_path).history) == clients * args.charges
                assert len(Ledger.open(srv.url(_pgserver.OWNER, db, ledger)).history) == \
                    clients * args.charges
                rows.append((clients, lite, pg))
    finally:
        _pgserver.stop()
    print(f"{args.charges} charges per client; each charge a durable transaction "
          f"(fsync'd commit)\n")
    print(f"{'clients':>7} | {'SQLite/s':>9} {'p50 ms':>7} {'p99 ms':>7} | "
          f"{'Postgres/s':>10} {'p50 ms':>7} {'p99 ms':>7} | {'ratio/s':>7} {'p50':>5} "
          f"{'p99':>5}")
    for clients, lite, pg in rows:
        print(f"{clients:>7} | {lite['per_second']:>9.0f} {lite['p50_ms']:>7.2f} "
              f"{lite['p99_ms']:>7.2f} | {pg['per_second']:>10.0f} {pg['p50_ms']:>7.2f} "
              f"{pg['p99_ms']:>7.2f} | {pg['per_second'] / lite['per_second']:>7.2f} "
              f"{pg['p50_ms'] / lite['p50_ms']:>5.2f} {pg['p99_ms'] / lite['p99_ms']:>5.2f}")
    print(f"\n(Postgres/SQLite ratios; {os.cpu_count()} CPU cores shared by the clients, "
          "the server and SQLite)")


if __name__ == "__main__":
    main()
