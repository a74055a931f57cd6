"""Review sa: the -shm check (review rl, commit 01d77e5) ran at each transaction only; a
ledger closed after its index was deleted (with no transaction between) still checkpointed
through the old, unlinked index with TRUNCATE, which emptied the -wal that another, still
open process had committed its charges to: 30 returned charges lost, no error anywhere."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

SMALL = M.SubsampledGaussian(noise_multiplier=5.0, sample_rate=0.001)


def test_close_never_checkpoints_through_an_index_deleted_since_the_last_transaction(tmp_path):
    path = tmp_path / "l.db"
    ledger = Ledger(epsilon=8.0, delta=1e-5, path=path, lease=1)
    if not ledger._store._wal:
        pytest.skip("the rollback journal has no -shm index (a network filesystem)")
    for _ in range(20):
        ledger.charge(SMALL, label="a")
    (tmp_path / "l.db-shm").unlink()
    other = ("import sys\n"
             "from privguard import Ledger, mechanisms as M\n"
             "step = M.SubsampledGaussian(noise_multiplier=5.0, sample_rate=0.001)\n"
             f"ledger = Ledger.open({str(path)!r}, lease=1)\n"
             "for _ in range(30):\n"
             "    ledger.charge(step, label='b')\n"
             "print('charged', flush=True)\n"
             "sys.stdin.readline()\n"  # still open while the first ledger closes
             "ledger.close()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", other], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "charged"
        with contextlib.suppress(LedgerStateError):
            ledger.close()
    finally:
        proc.communicate("\n", timeout=120)
    assert proc.returncode == 0
    held = Ledger.open(path, read_only=True)
    assert len(held.history) == 20 + 30  # was 20: the other process's charges were lost
    held.close()
