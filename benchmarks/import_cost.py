"""What importing privguard and running ``privguard report`` cost, as ratios in one run.

    python benchmarks/import_cost.py [--repeat 7]

Each command runs in a fresh interpreter ``--repeat`` times; the table shows
the median wall time, the peak resident memory (ru_maxrss of that process),
and the ratio to the baseline, ``import numpy, scipy.special,
scipy.optimize, sqlite3`` (what privguard's core needs), measured in the
same run. ``privguard report`` reads a ledger file of 100 charges written by
this script (90 DP-SGD steps in two runs and 10 noisy counts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

BASELINE = "import numpy, scipy.special, scipy.optimize, sqlite3"


def _run(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return seconds, usage.ru_maxrss / 1024


def _ledger_file(folder: str) -> str:
    from privguard import Ledger
    from privguard import mechanisms as M

    path = os.path.join(folder, "budget.db")
    ledger = Ledger(8.0, 1e-5, path=path)
    for i in range(100):
        if i % 10 == 9:
            ledger.charge(M.Gaussian(20.0), label="noisy count")
        else:
            ledger.charge(M.SubsampledGaussian(1.1 if i < 50 else 0.9, 0.01), label="step")
    ledger.close()
    return path


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        db = _ledger_file(folder)
        cli = [sys.executable, "-c", "import sys; from privguard._cli._cli import main; "
               "sys.exit(main(sys.argv[1:]))", "report", db]
        commands = {
            "baseline: " + BASELINE: [sys.executable, "-c", BASELINE],
            "import privguard": [sys.executable, "-c", "import privguard"],
            "privguard report (100 charges)": cli,
        }
        rows: dict[str, dict[str, float]] = {}
        for name, cmd in commands.items():
            runs = [_run(cmd) for _ in range(args.repeat)]
            rows[name] = {"seconds": statistics.median(r[0] for r in runs),
                          "peak_mib": max(r[1] for r in runs)}
    base = next(iter(rows.values()))["seconds"]
    print(f"{'command':58s} {'median s':>9s} {'× baseline':>11s} {'peak MiB':>9s}")
    for name, row in rows.items():
        row["ratio"] = row["seconds"] / base
        print(f"{name:58s} {row['seconds']:9.3f} {row['ratio']:11.2f} {row['peak_mib']:9.1f}")
    return rows


if __name__ == "__main__":
    main()
