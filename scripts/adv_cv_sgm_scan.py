"""Task cv: privguard's subsampled-Gaussian curve against an independent mpmath reference.

For every (q, σ) of a wide grid, privguard's one-step curve on the default grid plus extra
orders (just above 1, just around integers, 100.5, 1023.5, 1025, 4096) is compared with
tests/_cv_exact.py (exact binomial sum at integer orders, quadrature at fractional ones),
Opacus' ``compute_rdp`` and dp-accounting's RDP accountant. Prints the worst relative margin
(privguard − exact)/exact (negative = under-count), every under-count beyond 1e-12, and the
monotonicity checks in α, q and 1/σ.

    python scripts/adv_cv_sgm_scan.py [--quick] [--qs Q ...]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
import warnings

import mpmath as mp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import _cv_exact as E  # tests/ on the path first

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M

QS = [1e-300, 1e-12, 1e-6, 1e-3, 0.01, 0.1, 0.5, 0.9, 0.999999, 1.0]
SIGMAS = [0.05, 0.3, 0.5, 0.8, 1.0, 2.0, 10.0, 1e3, 1e8, 1e150]
EXTRA = [1.00001, 1.0001, 1.01, 1.5, 2.000001, 2.999999, 3.000001, 63.5, 100.5, 1023.5,
         1025.0, 4096.0]
FRACTIONAL = [1.00001, 1.01, 1.1, 1.5, 2.000001, 2.999999, 3.000001, 5.5, 10.9, 63.5]


def opacus(q: float, sigma: float, orders: list[float]) -> list[float]:
    from opacus.accountants.analysis.rdp import compute_rdp
    out = []
    for a in orders:
        try:
            if a > 1024 or sigma > 1e100:
                raise OverflowError
            out.append(float(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[a])[0]))
        except (ArithmeticError, ValueError):
            out.append(math.nan)
    return out


def dp_accounting(q: float, sigma: float, orders: list[float]) -> list[float]:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as r
    acc = r.RdpAccountant(orders)
    try:
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)))
        return [float(v) for v in acc._rdp]
    except (ArithmeticError, ValueError):
        return [math.nan] * len(orders)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer (q, σ)")
    ap.add_argument("--qs", type=float, nargs="*", help="these sample rates only, in this order")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    grid = sorted(set(DEFAULT_ORDERS) | set(EXTRA))
    qs, sigmas = (QS[1::3], SIGMAS[1::3]) if args.quick else (QS, SIGMAS)
    if args.qs:
        qs = args.qs
    worst = (math.inf, None)
    n_points = under = 0
    start = time.time()
    by_pair = {}
    for q in qs:
        for sigma in sigmas:
            pg = M.SubsampledGaussian(sigma, q).rdp(grid)
            pg_default = M.SubsampledGaussian(sigma, q).rdp(DEFAULT_ORDERS)
            by_pair[(q, sigma)] = dict(zip(grid, pg.tolist()))
            # monotone in α, finite
            assert np.all(np.diff(pg) >= 0), (q, sigma)
            assert np.all(np.isfinite(pg)), (q, sigma)
            op = opacus(q, sigma, grid)
            da = dp_accounting(q, sigma, grid)
            for i, a in enumerate(grid):
                if not float(a).is_integer() and a not in FRACTIONAL:
                    continue
                exact = E.sgm(q, sigma, a)
                for label, v in (("grid+extra", pg[i]),
                                 ("default", pg_default[DEFAULT_ORDERS.index(a)]
                                  if a in DEFAULT_ORDERS else None)):
                    if v is None:
                        continue
                    n_points += 1
                    if exact == 0:
                        continue
                    rel = float((mp.mpf(v) - exact) / exact)
                    if rel < worst[0]:
                        worst = (rel, (q, sigma, a, label, float(v), mp.nstr(exact, 17)))
                    if rel < -1e-12:
                        under += 1
                        print(f"UNDER {label}: q={q:g} σ={sigma:g} α={a!r}: privguard {v!r} "
                              f"exact {mp.nstr(exact, 17)} rel {rel:.3g} opacus {op[i]!r} "
                              f"dp-acc {da[i]!r}", flush=True)
                rel_op = float((mp.mpf(op[i]) - exact) / exact) if math.isfinite(op[i]) else math.nan
                rel_da = float((mp.mpf(da[i]) - exact) / exact) if math.isfinite(da[i]) else math.nan
                if (rel_op < -1e-9) or (rel_da < -1e-9):
                    print(f"  ref-below: q={q:g} σ={sigma:g} α={a!r}: opacus rel {rel_op:.3g}, "
                          f"dp-accounting rel {rel_da:.3g}", flush=True)
        print(f"q={q:g} done, {time.time() - start:.0f}s, worst so far {worst}", flush=True)
    # monotone in q (σ fixed) and in 1/σ (q fixed), order by order (privguard's output need not
    # be where a fallback over-counts: tests/test_adv_cv_curves.py)
    qs = sorted(qs)
    for sigma in sigmas:
        for lo, hi in itertools.pairwise(qs):
            a, b = np.array(list(by_pair[(lo, sigma)].values())), np.array(list(by_pair[(hi, sigma)].values()))
            if np.any(a > b):
                print(f"NOT MONOTONE in q: σ={sigma:g} q {lo:g}→{hi:g}")
    for q in qs:
        for s_small, s_big in itertools.pairwise(sigmas):
            a = np.array(list(by_pair[(q, s_big)].values()))
            b = np.array(list(by_pair[(q, s_small)].values()))
            if np.any(a > b):
                print(f"NOT MONOTONE in 1/σ: q={q:g} σ {s_small:g}→{s_big:g}")
    print(f"points {n_points}, under-counts beyond 1e-12: {under}, worst relative margin {worst}")


if __name__ == "__main__":
    main()
