"""Where a leased step's time goes: a step of a lease on a SQLite file against the same
step in memory (the repeat lane), and the share of a streak's mean that is lease commits.

Part 1 times ``ledger.charge(step)`` per call (medians of ``--calls`` calls, the
variants in alternating blocks, one ledger each, after a long streak so that no call
commits): in memory (the repeat lane), a leased step of a SQLite file as shipped, and,
as a diagnosis only, the same leased step with the per-step check of the file
(``SQLiteStore.check_lease``: one ``os.fstat`` of the open file, whose link count
tells whether it still has a name and whose size and times tell whether it changed,
plus, in rollback-journal mode only, one ``pread`` of the header's change counter;
before t26 an ``os.stat`` of the path, before y26 with the ``pread`` in WAL mode too)
replaced by the check before t26, the one before y26, by one of its two system calls or
by nothing. The two system calls
are also timed alone. The check is what keeps a leased step fail-closed (README "On disk":
a file replaced, deleted or changed under an open ledger is detected at every step);
the variants without it exist here to measure it, never in the library.

Part 2 charges a new streak of ``--steps`` steps on a fresh file ledger (lease cap 16,
the default) and splits the time into the steps that commit a lease and those handed out
from memory: the commits' share of the mean, with ``synchronous=FULL`` (as shipped) and,
to separate the fsync from the commit's own CPU work, ``synchronous=OFF`` (a diagnosis
only; not durable).

Part 3 times attach's step hook inside real DP-SGD steps of the issue-26 MLP
(``attach_overhead.make_step``; medians over ``--hook-steps`` steps, the variants
alternating over ``--rounds`` rounds): in memory, a SQLite file with leases as shipped,
and the same three diagnoses. Inside a step the hook runs with cold caches (after the
backward pass), where a system call costs several times what it costs in part 1's tight
loop: this is the measure of what the per-step check adds to a step.

Part 4 (t26) times a commit's own work: every charge commits (``lease=1``),
``synchronous=OFF``, as shipped, without the read-back of the journal's last row, and
with the code before t26 rebuilt for the measurement (``part4``'s docstring).

Run: python benchmarks/lease_step_profile.py [--calls 20000] [--steps 600] [--rounds 3]
     [--hook-steps 400] [--commits 200] [--only 1|2|3|4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attach_overhead as ao  # torch and Opacus (part 3)

from privguard import Ledger
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(noise_multiplier=1.0, sample_rate=128 / 8192)  # the MLP's step
LABEL = "step"


HOW = ("as shipped", "before t26: os.stat(path)", "before y26: os.stat + pread",
       "check = os.stat only", "check = pread only", "no check")


def _check_before_t26(st) -> bool:
    """The per-step check as shipped before t26: ``os.stat`` of the path (identity and
    the change test) instead of ``os.fstat`` of the open descriptor (diagnosis only)."""
    s = st._check_identity()
    if st._seen is None or (s.st_size, s.st_mtime_ns, s.st_ctime_ns) != st._seen_stat:
        return False
    return st._wal or st._change_counter() == st._seen


def _diagnose(ledger: Ledger, how: str) -> None:
    """Replace a file ledger's per-step check for a diagnosis (never in the library)."""
    st = ledger._store
    ledger._check_lease = {
        "as shipped": st.check_lease,
        "before t26: os.stat(path)": lambda: _check_before_t26(st),
        "before y26: os.stat + pread": lambda: (
            st._check_identity(), st._seen is not None and st._change_counter() == st._seen)[1],
        "check = os.stat only": lambda: (st._check_identity(), True)[1],
        "check = pread only": lambda: st._seen is not None and st._change_counter() == st._seen,
        "no check": None}[how]


def part1(calls: int, rounds: int, tmp: str) -> None:
    mem = Ledger(delta=1e-5)
    files = {}
    for i, how in enumerate(HOW):
        ledger = Ledger(delta=1e-5, path=os.path.join(tmp, f"p1_{i}.db"))
        _diagnose(ledger, how)  # diagnosis only (see the docstring)
        files[f"SQLite file, leased step, {how}"] = ledger
    variants = {"in memory (repeat lane)": mem} | files
    for ledger in variants.values():  # a long streak: leases of r/64 steps, no commit below
        for _ in range(200 * 64):
            ledger.charge(STEP, label=LABEL)
    med: dict[str, list[float]] = {v: [] for v in variants}
    block = max(1, calls // 10)
    for _ in range(rounds):
        for _ in range(10):
            for v, ledger in variants.items():  # a commit every ~200 calls: not the median
                med[v].append(ao.median_call(lambda: ledger.charge(STEP, label=LABEL), block))
    st = files["SQLite file, leased step, as shipped"]._store
    fd = os.open(st.path, os.O_RDONLY)
    sys_stat = ao.median_call(lambda: os.stat(st.path), calls)
    sys_pread = ao.median_call(lambda: os.pread(fd, 4, 24), calls)
    sys_fstat = ao.median_call(lambda: os.fstat(fd), calls)
    os.close(fd)
    base = statistics.median(med["in memory (repeat lane)"])
    print(f"Part 1: ledger.charge(step) per call, medians of {rounds}x10 alternating blocks "
          f"of {block} calls")
    print("| variant | per call | minus in memory |\n|---|---|---|")
    for v, ts in med.items():
        t = statistics.median(ts)
        print(f"| {v} | {t * 1e6:.2f} µs | {(t - base) * 1e6:+.2f} µs |")
    print(f"| os.stat(path) alone | {sys_stat * 1e6:.2f} µs | |")
    print(f"| os.pread(fd, 4, 24) alone | {sys_pread * 1e6:.2f} µs | |")
    print(f"| os.fstat(fd) alone | {sys_fstat * 1e6:.2f} µs | |")
    for ledger in files.values():
        ledger.close()


def part2(steps: int, rounds: int, tmp: str) -> None:
    print(f"\nPart 2: a new streak of {steps} steps on a fresh file ledger (cap 16), "
          f"{rounds} rounds alternating")
    print("| synchronous | commits | commit median | commit mean | other steps median "
          "| mean per step | commits' share of the mean |")
    print("|---|---|---|---|---|---|---|")
    rows: dict[str, list[tuple[int, float, float, float, float, float]]] = {"FULL": [],
                                                                             "OFF": []}
    for r in range(rounds):
        for sync in rows:
            ledger = Ledger(delta=1e-5, path=os.path.join(tmp, f"p2_{sync}_{r}.db"))
            if sync == "OFF":  # diagnosis only: the commit's CPU without its fsync
                ledger._store._connect().execute("PRAGMA synchronous = OFF")
            commits, others = [], []
            for _ in range(steps):
                lease = ledger._lease
                commit = lease is None or lease.left == 0
                t0 = time.perf_counter_ns()
                ledger.charge(STEP, label=LABEL)
                (commits if commit else others).append((time.perf_counter_ns() - t0) / 1e9)
            ledger.close()
            if not others:  # the first steps of a streak all commit
                sys.exit(f"--steps {steps}: every step committed a lease; take more steps")
            total = sum(commits) + sum(others)
            rows[sync].append((len(commits), statistics.median(commits),
                               statistics.mean(commits), statistics.median(others),
                               total / steps, sum(commits) / total))
    for sync, rs in rows.items():
        n, cm, cmean, om, mean, share = (statistics.median(x) for x in zip(*rs))
        print(f"| {sync} | {n:.0f} | {cm * 1e6:,.0f} µs | {cmean * 1e6:,.0f} µs | "
              f"{om * 1e6:.1f} µs | {mean * 1e6:,.1f} µs | {share:.1%} |")


def part3(steps: int, rounds: int, tmp: str) -> None:
    variants = [("attach, in memory", None)] + [
        ("attach, SQLite file, leases", how)
        for how in HOW]
    med: dict[tuple[str, str | None], list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant, how in variants:
            prepare = None if how is None else (lambda ledger, how=how: _diagnose(ledger, how))
            med[(variant, how)].append(ao.hook_cost(variant, steps, tmp, prepare)[0])
    base = statistics.median(med[variants[0]])
    print(f"\nPart 3: attach's step hook inside real steps (the MLP), medians of {steps} "
          f"steps, median of {rounds} alternating rounds")
    print("| variant | hook per step | minus in memory | rounds |\n|---|---|---|---|")
    for (variant, how), ts in med.items():
        t = statistics.median(ts)
        name = variant if how is None else f"{variant}, {how}"
        print(f"| {name} | {t * 1e6:.1f} µs | {(t - base) * 1e6:+.1f} µs | "
              f"{', '.join(f'{x * 1e6:.0f}' for x in ts)} |")


def part4(commits: int, rounds: int, tmp: str) -> None:
    """A commit's own work (t26): every charge commits (``lease=1``), ``synchronous=OFF``
    (no fsync: a diagnosis only), in alternating blocks of ``commits`` charges: as shipped;
    as shipped without the read-back of the journal's last row (review rl); and the code
    before t26 (every digest through ``json.dumps``, no memo of the last head MAC or run
    digest, no read-back), rebuilt here by replacing those functions (never in the
    library)."""
    from privguard._stores import _integrity, _rows, _sqlite

    shipped = (_integrity._canonical_flat, _sqlite.SQLiteStore._head_mac,
               _sqlite.SQLiteStore._run_digest, _rows.check_last_row)

    def before_mac(self, c):  # the head MAC before t26: json.dumps each time
        return self.integrity.digest("head", self.file_id, *c.as_tuple())

    def before_run(self, prev, idx, md, label, pid, count, first, last):
        return self.integrity.digest_text(
            f"entry\x1e{prev}\x1e{idx}\x1erun\x1e{md}\x1e{_sqlite._atom(label)}\x1e{pid:d}"
            f"\x1e{count:d}\x1e{float(first)!r}\x1e{float(last)!r}")

    variants = {
        "as shipped": shipped,
        "as shipped, without the last-row read-back": (*shipped[:3], lambda *a: None),
        "before t26 (diagnosis)": (lambda parts: None, before_mac, before_run,
                                   lambda *a: None)}
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for r in range(rounds):
            for v, fns in variants.items():
                (_integrity._canonical_flat, _sqlite.SQLiteStore._head_mac,
                 _sqlite.SQLiteStore._run_digest, _rows.check_last_row) = fns
                ledger = Ledger(delta=1e-5, path=os.path.join(tmp, f"p4_{r}_{len(wall[v])}"
                                                              f"{v[:6]}.db"), lease=1)
                ledger._store._connect().execute("PRAGMA synchronous = OFF")
                for _ in range(20):
                    ledger.charge(STEP, label=LABEL)
                times = []
                c0 = time.process_time_ns()
                for _ in range(commits):
                    t0 = time.perf_counter_ns()
                    ledger.charge(STEP, label=LABEL)
                    times.append(time.perf_counter_ns() - t0)
                cpu[v].append((time.process_time_ns() - c0) / commits / 1e3)
                wall[v].append(statistics.median(times) / 1e3)
                ledger.close()
    finally:
        (_integrity._canonical_flat, _sqlite.SQLiteStore._head_mac,
         _sqlite.SQLiteStore._run_digest, _rows.check_last_row) = shipped
    print(f"\nPart 4: a commit (lease=1: every charge commits; synchronous=OFF), "
          f"{rounds} rounds of {commits} charges alternating, medians")
    print("| variant | charge (wall, median) | CPU per charge |\n|---|---|---|")
    for v in variants:
        print(f"| {v} | {statistics.median(wall[v]):.1f} µs | "
              f"{statistics.median(cpu[v]):.1f} µs |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=ao.at_least(1), default=20000)
    parser.add_argument("--steps", type=ao.at_least(1), default=600)
    parser.add_argument("--rounds", type=ao.at_least(1), default=3)
    parser.add_argument("--hook-steps", type=ao.at_least(ao.WARMUP + 1), default=400,
                        help=f"steps per variant in part 3; the first {ao.WARMUP} are not "
                             "timed")
    parser.add_argument("--commits", type=ao.at_least(1), default=200)
    parser.add_argument("--only", choices=["1", "2", "3", "4"], default=None)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        parts = {"1": lambda: part1(args.calls, args.rounds, tmp),
                 "2": lambda: part2(args.steps, args.rounds, tmp),
                 "3": lambda: part3(args.hook_steps, args.rounds, tmp),
                 "4": lambda: part4(args.commits, 3 * args.rounds, tmp)}
        for key, part in parts.items():
            if args.only in (None, key):
                part()
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
