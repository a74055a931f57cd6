"""Write tests/data/ledger-curves5-e0b2a80.db: a ledger file as privguard main e0b2a80
(checkpoints of curve version 5, before task sg) writes it, for tests/test_sgm_checkpoint.py.

Run with main's code, not this branch's (task sg, 2026-11-27 07:58 UTC; the second argument
is a checkout of main, put before the venv's editable install of this branch):

    git worktree add --detach /tmp/sg-base e0b2a80
    ln -s /tmp/sg-base/integrations /tmp/sg-base/privguard/integrations
    python scripts/make_curves5_fixture.py tests/data/ledger-curves5-e0b2a80.db /tmp/sg-base

``Ledger(epsilon=1e4, delta=1e-5)``, 530 charges: DP-SGD at (σ, q) = (10, 1e-3) and
(1.1, 4e-3) on labels a and b (Opacus' own values there lie up to 7.7e-7 relative below
privguard's; task sg raised some of main's by up to 2e-9), and every 23rd charge a Laplace
or a Gaussian; one
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

    assert _rows.CHECKPOINT_CURVES == 5, "run with main's code (curve version 5) on the path"
    steps = [M.SubsampledGaussian(10.0, 1e-3), M.SubsampledGaussian(1.1, 4e-3)]
    others = [M.Laplace(50.0), M.Gaussian(30.0)]
    ledger = Ledger(epsilon=1e4, delta=1e-5, path=path)
    for i in range(530):
        if i % 23 == 22:
            ledger.charge(others[(i // 23) % 2], label="o")
        else:
            ledger.charge(steps[i % 2], label="ab"[i % 2])
    ledger.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
