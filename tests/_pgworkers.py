"""Code run in child processes by the server-store tests (tests/test_postgres.py)."""

from __future__ import annotations

import os
import sys
import time

from _workers import record_applied


def charge_through_restarts(url: str, seconds: float, log_path: str) -> None:
    """Charge for ``seconds``; on LedgerStateError reopen and go on. Log every outcome.

    Each line of the log is ``ok INDEX`` (the charge returned its record) or
    ``lost MESSAGE`` (the charge raised LedgerStateError).
    """
    from privguard import Ledger, LedgerStateError
    from privguard import mechanisms as M

    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger.open(url, lease=1)
    deadline = time.monotonic() + seconds
    with open(log_path, "w") as log:
        while time.monotonic() < deadline:
            try:
                record = ledger.charge(step, label=f"pid {os.getpid()}")
                log.write(f"ok {record.index}\n")
            except LedgerStateError as exc:
                log.write("lost " + str(exc).replace("\n", " ") + "\n")
                ledger.close()
                while True:  # the server may still be restarting
                    try:
                        ledger = Ledger.open(url, lease=1)
                        break
                    except LedgerStateError:
                        time.sleep(0.2)
            log.flush()


def train_forever(url: str, counter_path: str) -> None:
    """Charge a step, then "apply" it and durably count it; forever, until refused."""
    from privguard import BudgetExhausted, Ledger
    from privguard import mechanisms as M

    applied = int(open(counter_path).read()) if os.path.exists(counter_path) else 0
    ledger = Ledger.open(url)
    print("ready", flush=True)
    try:
        while True:
            ledger.charge(M.SubsampledGaussian(1.0, 16 / 1024), label="train")
            applied += 1  # the update is applied only after the charge returned
            record_applied(counter_path, applied)
    except BudgetExhausted:
        print("exhausted", flush=True)


if __name__ == "__main__":
    train_forever(sys.argv[1], sys.argv[2])
