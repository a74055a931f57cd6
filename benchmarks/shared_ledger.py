"""8 processes charging one shared ledger: a SQLite file and a PostgreSQL ledger.

Issue 26, item 4. Every worker process opens the same ledger, waits for a common
start, then charges one DP-SGD step ``--charges`` times (the same mechanism each
time, under its own label, as an attached optimizer does). Reported per store:
charges per second (all workers, start to last finish) and the median, p99 and
p99.9 latency (the workers and the clock are ``store_throughput.py``'s) of one ``charge()`` call, with ``lease=1`` (one durable transaction
per charge) and with the Ledger's default. ``lease=`` is passed only where
``Ledger`` accepts it (``inspect.signature(Ledger).parameters``), so the script
runs before and after leases land; before, "default" is one transaction per
charge too. The SQLite file is measured in WAL (privguard's mode on a local
filesystem) and in the rollback journal (``PRIVGUARD_SQLITE_JOURNAL=rollback``,
its mode on a network filesystem); all variants run in the same invocation, and
the table gives each one's throughput relative to SQLite WAL with ``lease=1``.
The PostgreSQL server is started for the run by tests/_pgserver.py (as root it
runs as the ``postgres`` system user), fsync and synchronous_commit on.

Run: python benchmarks/shared_ledger.py [--workers 8] [--charges 200]
Needs PostgreSQL's server binaries (Debian's postgresql-15) and
``privguard[postgres]``; without them the PostgreSQL rows are left out.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]

import _pgserver  # noqa: E402
from store_throughput import _run as measure  # noqa: E402  (the same workers and clock)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--charges", type=int, default=200, help="charges per worker")
    args = parser.parse_args()

    from privguard import Ledger

    leases = "lease" in inspect.signature(Ledger).parameters
    settings: list[tuple[str, dict[str, Any]]] = [("lease=1", {"lease": 1} if leases else {}),
                                                  ("default", {})]
    rows: list[tuple[str, str, dict[str, float]]] = []
    srv = None
    if _pgserver.binaries() is not None:
        srv = _pgserver.server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, kwargs in settings:
                for store, env in (("SQLite, WAL", {}),
                                   ("SQLite, rollback", {"PRIVGUARD_SQLITE_JOURNAL": "rollback"})):
                    path = os.path.join(tmp, f"{len(rows)}.db")
                    rows.append((store, name, measure(path, args.workers, args.charges,
                                                      kwargs, env)))
                    with Ledger.open(path) as check:  # every released charge is spent
                        assert len(check.history) >= args.workers * args.charges
                if srv is not None:
                    from privguard._stores._pgadmin import server_init

                    db, ledger = srv.new_database(), f"bench{len(rows)}"
                    server_init(srv.url(db=db), ledger, 1e6, 1e-5, charger=_pgserver.CHARGER,
                                owner=_pgserver.OWNER)
                    srv.set_passwords()
                    rows.append(("PostgreSQL", name, measure(
                        srv.url(_pgserver.CHARGER, db, ledger), args.workers, args.charges,
                        kwargs, {})))
                    with Ledger.open(srv.url(_pgserver.OWNER, db, ledger)) as check:
                        assert len(check.history) >= args.workers * args.charges
    finally:
        if srv is not None:
            _pgserver.stop()
    base = rows[0][2]["per_second"]
    print(f"{args.workers} processes × {args.charges} charges of one step, one shared ledger; "
          f"Ledger {'accepts' if leases else 'has no'} lease= "
          f"({'default: leases on' if leases else 'default: one transaction per charge'}); "
          f"{os.cpu_count()} CPU cores\n")
    print("| store | lease | charges/s | p50 | p99 | p99.9 | charges/s vs SQLite WAL, lease=1 |")
    print("|---|---|---|---|---|---|---|")
    for store, name, r in rows:
        print(f"| {store} | {name} | {r['per_second']:,.0f} | {r['p50_ms']:.2f} ms | "
              f"{r['p99_ms']:.2f} ms | {r['p999_ms']:.2f} ms | {r['per_second'] / base:.2f}× |")
    if srv is None:
        print("\n(no PostgreSQL server binaries: " + _pgserver.SKIP_REASON + ")")


if __name__ == "__main__":
    main()
