"""Task sgr: how the subsampled Gaussian's curve moved against another checkout's (main's).

For the default grid at ordinary σ (those of scripts/sgm_opacus_agreement.py) and at
σ ∈ {100, 1e3, 1e4}, q ∈ {1e-4, 1e-3, 0.004, 0.01, 0.1}, prints how many values rose and
fell against CHECKOUT's privguard (e.g. a worktree of main, ``git worktree add --detach
/tmp/main-base main``), of them how many at integer orders, and the largest relative rise
and fall. A value that fell would make a ledger written by CHECKOUT replay below its
checkpoint (the ledger would go backwards): the count of falls must be 0.

    python scripts/sgm_against_main.py CHECKOUT
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np

from privguard import DEFAULT_ORDERS
from privguard._curves import _sgm

GROUPS = {"σ ≤ 10": [0.5, 0.8, 1.0, 1.1, 2.0, 5.0, 10.0], "σ ≥ 100": [100.0, 1e3, 1e4]}
QS = [1e-4, 1e-3, 0.004, 0.01, 0.1]

_OTHER = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])  # its privguard (the installed integrations stay)
warnings.simplefilter("ignore")
import numpy as np
from privguard import DEFAULT_ORDERS
from privguard._curves import _sgm
orders = np.array(DEFAULT_ORDERS, dtype=float)
print(json.dumps([_sgm.__file__] + [_sgm.curve(q, s, orders).tolist() for s, q in json.loads(sys.argv[2])]))
"""


def main() -> None:
    warnings.simplefilter("ignore")
    orders = np.array(DEFAULT_ORDERS, dtype=float)
    integer = orders == np.round(orders)
    points = [(s, q) for sigmas in GROUPS.values() for s in sigmas for q in QS]
    run = subprocess.run([sys.executable, "-c", _OTHER, sys.argv[1], json.dumps(points)],
                         check=True, capture_output=True, text=True)
    where, *curves = json.loads(run.stdout)
    print(f"against {where}")
    other = dict(zip(points, (np.array(c) for c in curves)))
    for name, sigmas in GROUPS.items():
        total = rose = fell = rose_int = fell_int = 0
        top_rise = top_fall = 0.0
        for s in sigmas:
            for q in QS:
                ours, theirs = _sgm.curve(q, s, orders), other[(s, q)]
                rel = (ours - theirs) / theirs
                total += len(orders)
                rose += int((ours > theirs).sum())
                fell += int((ours < theirs).sum())
                rose_int += int(((ours > theirs) & integer).sum())
                fell_int += int(((ours < theirs) & integer).sum())
                top_rise, top_fall = max(top_rise, float(rel.max())), min(top_fall, float(rel.min()))
        print(f"{name}: {rose}/{total} rose ({rose_int} integer), max rel {top_rise:.3g}; "
              f"{fell} fell ({fell_int} integer), min rel {top_fall:.3g}")


if __name__ == "__main__":
    main()
