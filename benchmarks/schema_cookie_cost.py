"""What the schema cookie costs a transaction's one read (review rsq of review sq).

Every transaction of a SQLite ledger reads the file's identity, head and last row in one
statement (``_SYNC_READ`` in privguard/_stores/_sqlite.py); review sq added the schema
cookie to it (``pragma_schema_version``), so that a schema changed under an open ledger
(a trigger that skips its writes) is checked before anything is written. This times that
statement with and without the cookie's column, on one ledger file of 50 charges, inside
a read transaction, the two alternating; medians of ``--rounds`` rounds of ``--reads``
reads each.

Run: python benchmarks/schema_cookie_cost.py [--rounds 20] [--reads 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _sqlite

COOKIE = ", (SELECT schema_version FROM pragma_schema_version) "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()
    with_cookie = _sqlite._SYNC_READ
    without = with_cookie.replace(COOKIE, " ")
    if without == with_cookie:
        raise SystemExit("the one read has no schema cookie column to leave out")
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(1e9, 1e-5, path=os.path.join(tmp, "l.db"), lease=1)
        for _ in range(50):
            ledger.charge(M.SubsampledGaussian(1.0, 0.01), label="x")
        conn = ledger._store._conn
        assert conn is not None and ledger._store._cursor is not None
        last = ledger._store._cursor.entries - 1
        times: dict[str, list[float]] = {"with the cookie": [], "without": []}
        for r in range(args.rounds):
            pair = [("with the cookie", with_cookie), ("without", without)]
            for name, sql in pair if r % 2 else pair[::-1]:
                conn.execute("BEGIN")
                t0 = time.perf_counter()
                for _ in range(args.reads):
                    conn.execute(sql, (last,)).fetchone()
                times[name].append((time.perf_counter() - t0) / args.reads * 1e6)
                conn.execute("COMMIT")
        ledger.close()
    print(f"privguard from {os.path.dirname(_sqlite.__file__)}; load average "
          f"{os.getloadavg()[0]:.2f}")
    for name, values in times.items():
        print(f"{name}: {statistics.median(values):.2f} µs a read (median of {args.rounds}, "
              f"min {min(values):.2f})")


if __name__ == "__main__":
    main()
