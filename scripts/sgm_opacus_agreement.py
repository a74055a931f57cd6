"""Task sg: where privguard's subsampled-Gaussian curve differs from Opacus' ``compute_rdp``.

For ordinary (σ, q) on the default grid, prints how many of the 157 orders differ (of them,
how many integer orders), the largest relative difference (privguard − Opacus)/Opacus, and
the smallest (never negative: privguard's value is the higher wherever they differ).

    python scripts/sgm_opacus_agreement.py
"""

from __future__ import annotations

import warnings

import numpy as np
from opacus.accountants.analysis.rdp import compute_rdp

from privguard import DEFAULT_ORDERS
from privguard._curves import _sgm

SIGMAS = [0.5, 0.8, 1.0, 1.1, 2.0, 5.0, 10.0]
QS = [1e-4, 1e-3, 0.004, 0.01, 0.1]


def main() -> None:
    warnings.simplefilter("ignore")
    orders = np.array(DEFAULT_ORDERS, dtype=float)
    integer = orders == np.round(orders)
    for sigma in SIGMAS:
        for q in QS:
            ours = _sgm.curve(q, sigma, orders)
            theirs = np.array(compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                          orders=orders.tolist()))
            differ = ours != theirs
            rel = (ours - theirs) / theirs
            print(f"σ={sigma:g} q={q:g}: {int(differ.sum())}/{len(orders)} differ "
                  f"({int((differ & integer).sum())} integer), max rel {float(rel.max()):.3g}, "
                  f"min rel {float(rel.min()):.3g}")


if __name__ == "__main__":
    main()
