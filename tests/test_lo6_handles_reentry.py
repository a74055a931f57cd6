"""``_stores/_handles``'s lock and a garbage collection that runs under it (task lo6).

An object's ``__del__`` that opens a ledger runs wherever a garbage collection runs: one
that ran while this thread held the registry's lock (a collection triggered by an
allocation in :func:`register`, say) waited for that lock for ever.
"""

from __future__ import annotations

import os
import subprocess
import sys

_GC_UNDER_THE_LOCK = r"""
import gc, sys
from privguard import Ledger
from privguard._stores import _handles

path = sys.argv[1]
ledger = Ledger(epsilon=5.0, delta=1e-5, path=path)
opened = []

class Opens:
    # an object in a reference cycle whose finaliser opens the ledger's file
    def __del__(self):
        other = Ledger.open(path)
        opened.append(other._held)
        other.close()

cycle = Opens()
cycle.me = cycle
del cycle

in_force = _handles._in_force

def collecting(key):  # a collection while the lock is held (a finaliser runs in it)
    gc.collect()
    return in_force(key)

_handles._in_force = collecting
gc.disable()
assert ledger._hold("a tuner")
again = Ledger.open(path)  # register -> _in_force under the lock -> gc -> __del__ -> open
_handles._in_force = in_force
assert opened, "the finaliser did not run"
assert opened[0] is not None and "a tuner" in opened[0], opened  # held as it opened
assert again._held is not None
ledger._unhold()
assert again._held is None
again.close()
ledger.close()
print("ok")
"""


def test_a_finaliser_that_opens_a_ledger_under_the_registry_lock_does_not_deadlock(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = subprocess.run([sys.executable, "-c", _GC_UNDER_THE_LOCK,
                               str(tmp_path / "l.db")], env=env, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("deadlocked: the finaliser waited for the registry's lock")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
