"""Write tests/data/ledger-curves6-5a474ed.db: a ledger file as privguard main 5a474ed
(checkpoints of curve version 6, before task sr) writes it, for tests/test_spent_upper_bound.py.

Run with main's code, not this branch's (task sr, 2026-11-27 11:02 UTC; the second argument
is a checkout of main, put before the venv's editable install of this branch):

    git worktree add --detach /tmp/sr-base 5a474ed
    ln -s /tmp/sr-base/integrations /tmp/sr-base/privguard/integrations
    python scripts/make_curves6_fixture.py tests/data/ledger-curves6-5a474ed.db /tmp/sr-base

``Ledger(epsilon=1e4, delta=1e-5)`` (leases on), 530 charges: three mechanisms in turn
(Gaussian(3), Gaussian(7.1), SubsampledGaussian(1.1, 0.013): every charge starts a run, the
case where main's round-to-nearest sums lie farthest below the exact ones) and, every 23rd
charge, SubsampledGaussian(0.9, 0.3, steps=7) (a k-step curve, rounded up since); one
checkpoint, at row 512.
"""

from __future__ import annotations

import sys


def main(path: str, checkout: str) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, checkout)
    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard._stores import _rows

    assert _rows.CHECKPOINT_CURVES == 6, "run with main's code (curve version 6) on the path"
    turn = [M.Gaussian(3.0), M.Gaussian(7.1), M.SubsampledGaussian(1.1, 0.013)]
    ledger = Ledger(epsilon=1e4, delta=1e-5, path=path)
    for i in range(530):
        if i % 23 == 22:
            ledger.charge(M.SubsampledGaussian(0.9, 0.3, steps=7), label="k")
        else:
            ledger.charge(turn[i % 3], label="abc"[i % 3])
    ledger.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
