"""Code run in child processes by the lease crash tests (tests/test_leases.py)."""

from __future__ import annotations

import os


def release_and_log(path: str, log_path: str, epsilon: float, steps: int) -> None:
    """Charge a shared file ledger with leases (its default) and, after each released
    step, append one byte to a worker log and fsync it: the log never holds a step that
    was not released. Stops at the first refusal or after ``steps`` steps; may be killed
    at any point."""
    from privguard import BudgetExhausted, Ledger
    from privguard import mechanisms as M

    ledger = Ledger(epsilon, 1e-5, path=path)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    step = M.SubsampledGaussian(1.0, 0.01)
    for _ in range(steps):
        try:
            ledger.charge(step, label="w")
        except BudgetExhausted:
            break
        os.write(fd, b".")
        os.fsync(fd)
    os.close(fd)
    ledger.close()


def crash_round(path: str, tmp: str, rnd: int, epsilon: float, rng, logs: dict) -> dict:
    """One round of the lease crash test: 8 workers charge ``path`` with leases, a random
    subset is SIGKILLed at a random time; then the file is reopened and checked. ``logs``
    (pid -> log path) accumulates over rounds. Returns what was found: ``over`` lists the
    workers whose durably logged releases exceed what the journal holds as spent for them.
    """
    import multiprocessing
    import signal
    import time

    from privguard import Ledger

    ctx = multiprocessing.get_context("fork")
    procs = []
    for w in range(8):
        log = os.path.join(tmp, f"r{rnd}w{w}.log")
        p = ctx.Process(target=release_and_log, args=(path, log, epsilon, 400))
        p.start()
        procs.append((p, log))
    time.sleep(rng.uniform(0.3, 1.5))
    killed = 0
    for p, _ in procs:
        if rng.random() < 0.75 and p.pid is not None:
            try:
                os.kill(p.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    for p, log in procs:
        p.join(120)
        assert p.pid is not None
        logs[p.pid] = log
    ledger = Ledger.open(path, lease=1)
    spent: dict[int, int] = {}
    for run in ledger.runs:
        spent[run.pid] = spent.get(run.pid, 0) + run.count
    released = {pid: os.path.getsize(log) if os.path.exists(log) else 0
                for pid, log in logs.items()}
    meter = ledger.budget()
    ledger.close()
    assert meter is not None
    return {"killed": killed, "released": sum(released.values()),
            "spent": sum(spent.values()), "meter": meter.spent,
            "over": [pid for pid in released if released[pid] > spent.get(pid, 0)]}
