"""SIGKILL at every point of a commit, in the rollback journal (TRUNCATE) and in WAL.

Issue 26, item 3. A child process opens a ledger file and makes ``--charges`` charges,
printing each one's count after ``charge`` returned (the caller then acts on it).
strace kills it (``--inject=...:signal=KILL:when=K``) at its K-th write, pwrite,
fsync, fdatasync, ftruncate, unlink or rename touching the database or its side files
(``-P``), for every K from the first such call to the last of an uninterrupted run.
After each kill the file is reopened and must

* open and verify (a crash never corrupts the journal), and
* hold every charge the child saw returned, and at most one more (the one in
  flight: committed, but killed before ``charge`` returned).

A process crash only: the kernel keeps what was written, so this says nothing of
power loss (SQLite's guarantee there rests on fsync, which both modes call with
``synchronous=FULL``). A copy of the files taken mid-commit is a snapshot test, not
this one.

Run: python benchmarks/commit_crash.py [--charges 4]
Needs strace on PATH; Linux only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SYSCALLS = "write,pwrite64,fsync,fdatasync,ftruncate,unlink,unlinkat,rename,renameat,renameat2"

CHILD = r"""
import sys
sys.path.insert(0, {here!r})
from journal_mode import STEP, use_mode
from privguard import Ledger
path, mode, charges = sys.argv[1], sys.argv[2], int(sys.argv[3])
with use_mode(mode):
    ledger = Ledger(epsilon=1e6, delta=1e-5, path=path)
    for i in range(charges):
        ledger.charge(STEP)
        print(i + 1, flush=True)
"""


def _strace(db: str, mode: str, charges: int, when: int | None) -> tuple[int, str]:
    """Run the child under strace; returns (charges it saw returned, strace's log)."""
    log = db + ".strace"
    cmd = ["strace", "-f", "-qq", "-o", log, f"--trace={SYSCALLS}"]
    for side in ("", "-journal", "-wal", "-shm"):
        cmd += ["-P", db + side]
    if when is not None:
        cmd.append(f"--inject={SYSCALLS}:signal=KILL:when={when}")
    cmd += [sys.executable, "-c", CHILD.format(here=HERE), db, mode, str(charges)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    lines = [ln for ln in out.stdout.split() if ln.isdigit()]
    with open(log) as f:
        text = f.read()
    return (int(lines[-1]) if lines else 0), text


def check(mode: str, charges: int) -> tuple[int, int, list[int]]:
    """(kill points tried, kill points after which every check held, charges returned
    before each kill)."""
    sys.path.insert(0, HERE)
    from journal_mode import use_mode

    from privguard import Ledger

    with tempfile.TemporaryDirectory() as tmp:
        seed = os.path.join(tmp, "seed.db")
        with use_mode(mode):
            Ledger(epsilon=1e6, delta=1e-5, path=seed).close()
        db = os.path.join(tmp, "t.db")
        shutil.copy(seed, db)
        done, log = _strace(db, mode, charges, None)
        assert done == charges, log
        points = sum(1 for ln in log.splitlines() if "(" in ln and "resumed" not in ln)
        good, seen = 0, []
        for k in range(1, points + 1):
            for side in ("", "-journal", "-wal", "-shm"):
                if os.path.exists(db + side):
                    os.remove(db + side)
            shutil.copy(seed, db)
            returned, _ = _strace(db, mode, charges, k)
            with use_mode(mode):
                ledger = Ledger.open(db)
                held = len(ledger.history)
                ledger._store.verify()  # replays the whole chain from the genesis
                ledger.close()
            ok = returned <= held <= returned + 1
            seen.append(returned)
            good += ok
            if not ok:
                print(f"  {mode}: kill at point {k}: {returned} returned, {held} in the journal")
        return points, good, seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--charges", type=int, default=4)
    args = parser.parse_args()
    print(f"{args.charges} charges per child, SIGKILL at each traced call ({SYSCALLS})")
    print("| journal mode | kill points | charges returned before the kill | reopened, "
          "verified, no returned charge lost |")
    print("|---|---|---|---|")
    for mode in ("TRUNCATE", "WAL"):
        points, good, seen = check(mode, args.charges)
        spread = ", ".join(f"{n}: {seen.count(n)}×" for n in sorted(set(seen)))
        print(f"| {mode} | {points} | {spread} | {good} of {points} |")


if __name__ == "__main__":
    main()
