"""A process that forks a child (which only sleeps), then holds its ledger's head lock in
a write transaction until it is killed (tests/test_review_pgf.py)."""

import os
import sys
import time

from privguard import Ledger
from privguard import mechanisms as M


def main() -> None:
    ledger = Ledger.open(sys.argv[1])
    ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    with ledger._txn, ledger._lock, ledger._store.transaction(ledger._acc, True):
        print(child, flush=True)  # the head is locked
        time.sleep(120)


if __name__ == "__main__":  # a script: --doctest-modules imports this file too
    main()
